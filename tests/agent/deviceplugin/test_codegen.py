"""The committed generated code is what the kubelet's committed .proto files give."""

from __future__ import annotations

from agent.deviceplugin import codegen


def test_generated_code_is_current() -> None:
    files = codegen.generate()
    assert {
        "deviceplugin/v1beta1/api_pb2.py",
        "deviceplugin/v1beta1/api_pb2_grpc.py",
        "podresources/v1/api_pb2.py",
        "podresources/v1/api_pb2_grpc.py",
    } <= set(files)
    assert codegen.stale_files(files) == [], "run: python -m agent.deviceplugin.codegen"


def test_a_changed_proto_is_noticed() -> None:
    files = codegen.generate()
    files["podresources/v1/api_pb2.py"] += "# drift\n"
    assert codegen.stale_files(files) == ["podresources/v1/api_pb2.py"]


def test_generated_imports_point_into_the_package() -> None:
    for name, text in codegen.generate().items():
        for package in ("deviceplugin.v1beta1", "podresources.v1"):
            bare = text.replace(f"agent.deviceplugin.gen.{package}", "")
            assert f"from {package} " not in bare and f"import {package}." not in bare, name


def test_the_wire_names_are_the_kubelets() -> None:
    from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2

    request = api_pb2.ContainerPreferredAllocationRequest.DESCRIPTOR
    fields = {f.name: f.number for f in request.fields}
    assert fields == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    assert [m.name for m in api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
