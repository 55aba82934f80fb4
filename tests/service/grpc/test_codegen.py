"""The committed generated code is what the committed .proto gives."""

from __future__ import annotations

from service.grpc import codegen


def test_generated_code_is_current() -> None:
    files = codegen.generate()
    assert set(files) == {
        "topoplace_pb2.py",
        "topoplace_pb2.pyi",
        "topoplace_pb2_grpc.py",
        "topoplace_pb2_grpc.pyi",
    }
    assert codegen.stale_files(files) == [], "run: python -m service.grpc.codegen"


def test_a_changed_proto_is_noticed() -> None:
    files = codegen.generate()
    files["topoplace_pb2.py"] += "# drift\n"
    assert codegen.stale_files(files) == ["topoplace_pb2.py"]


def test_generated_imports_point_into_the_package() -> None:
    for name, text in codegen.generate().items():
        assert "from topoplace.v1" not in text and "import topoplace.v1" not in text, name
