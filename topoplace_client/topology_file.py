"""Reading a node's topology from a file: `nvidia-smi topo -m` text or snapshot JSON.

A name of one of the shipped samples (``topoplace_client.samples``, e.g.
``dgx1-v100``) reads that sample, unless a file of that name exists.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from placement.snapshot import NodeSnapshot
from placement.topo_text import TopoParseError, parse_topo_matrix
from topoplace_client.samples import is_sample, sample_names, sample_text


class TopologyFileError(ValueError):
    """The file cannot be read as a topology; the message says where and why."""


def read_topology_text(path: Path) -> str:
    """The text of the file at ``path``, or of the sample it names."""
    if is_sample(path):
        return sample_text(str(path))
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        samples = ", ".join(sample_names())
        raise TopologyFileError(f"{path}: no such file (or a sample name: {samples})") from None
    except OSError as exc:
        raise TopologyFileError(f"{path}: {exc.strerror or exc}") from None


def load_topology(
    path: Path, *, node_name: str = "node", gpu_model: str = "unknown"
) -> NodeSnapshot:
    text = read_topology_text(path)
    if text.lstrip().startswith("{"):
        try:
            return NodeSnapshot.model_validate(json.loads(text))
        except json.JSONDecodeError as exc:
            raise TopologyFileError(f"{path}: line {exc.lineno}: invalid JSON: {exc.msg}") from None
        except RecursionError:
            # The reader recurses per nesting level: a file of brackets would be a traceback.
            raise TopologyFileError(f"{path}: invalid JSON: nested too deeply") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "snapshot"
            raise TopologyFileError(f"{path}: {where}: {first['msg']}") from None
    try:
        return parse_topo_matrix(text, node_name=node_name, gpu_model=gpu_model)
    except TopoParseError as exc:
        raise TopologyFileError(f"{path}: {exc}") from None
