"""One protoc run with the plugins both committed gRPC code trees are made with.

`service.grpc.codegen` (the project's own API) and `agent.deviceplugin.codegen`
(the kubelet's protos) generate the same four outputs from a .proto: message
and gRPC modules and their mypy stubs. Both call :func:`compile_proto`, so the
two trees cannot drift apart in how they are generated.
"""

from __future__ import annotations

import sys
from pathlib import Path


def compile_proto(proto_root: Path, proto: str, out: Path) -> list[Path]:
    """Run protoc on ``proto_root / proto`` into ``out``; the .py and .pyi files it
    wrote beside the proto's path, in name order."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    plugins = Path(sys.executable).parent  # mypy-protobuf's plugins sit beside the interpreter
    args = [
        "protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={plugins / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugins / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        str(proto_root / proto),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {proto}")
    produced = out / Path(proto).parent
    return [p for p in sorted(produced.iterdir()) if p.suffix in (".py", ".pyi")]
