"""Reading a node's topology from a file: `nvidia-smi topo -m` text or snapshot JSON."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from placement.snapshot import NodeSnapshot
from placement.topo_text import TopoParseError, parse_topo_matrix


class TopologyFileError(ValueError):
    """The file cannot be read as a topology; the message says where and why."""


def load_topology(
    path: Path, *, node_name: str = "node", gpu_model: str = "unknown"
) -> NodeSnapshot:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TopologyFileError(f"{path}: {exc.strerror or exc}") from None
    if text.lstrip().startswith("{"):
        try:
            return NodeSnapshot.model_validate(json.loads(text))
        except json.JSONDecodeError as exc:
            raise TopologyFileError(f"{path}: line {exc.lineno}: invalid JSON: {exc.msg}") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "snapshot"
            raise TopologyFileError(f"{path}: {where}: {first['msg']}") from None
    try:
        return parse_topo_matrix(text, node_name=node_name, gpu_model=gpu_model)
    except TopoParseError as exc:
        raise TopologyFileError(f"{path}: {exc}") from None
