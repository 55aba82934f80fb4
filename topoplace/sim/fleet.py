"""Cluster descriptions for ``topoplace sim``: profiles x counts, trace node lists, exports.

- ``--cluster 100xdgx1-v100,8xgb200-nvl72``: built-in profiles times counts;
  ``gb200-nvl72`` is one NVL72 rack (18 trays of 4 GPUs in one NVLink
  clique), so ``8xgb200-nvl72`` is 8 racks;
- ``--nodes openb_node_list_gpu_node.csv``: the Alibaba trace's nodes, wired
  by ``bench.trace``'s documented mapping;
- ``--snapshots FILE``: ``{"nodes": [snapshot, ...]}`` as ``topoplace export``
  writes it from a live service.

Each node carries its host capacity, milli-CPU and MiB of memory, for the
CPU and memory checks: trace nodes the node list's ``cpu_milli`` and
``memory_mib``; profiles and exported snapshots what the snapshot knows (its
NUMA nodes' CPUs, 1000 milli-CPU each, and their memory). A figure the
snapshot lacks (no NUMA nodes, memory 0) is None: not known, never short.

A what-if (``+8 gb200-nvl72``, ``-16 pcie-8x-l40s``) adds nodes of a
profile or removes the last ones (in name order) of a design; a node's
design is its profile, for trace nodes the profile its wiring comes from,
for exported snapshots the ``topoplace.io/profile`` label or else the GPU
model.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from placement.profiles import PROFILE_NAMES, build_profile, gb200_nvl72_rack
from placement.profiles.gb200 import TRAYS_PER_RACK
from placement.snapshot import NodeSnapshot
from topoplace.sim.jobs import file_text, whole_amount

NVL72 = "gb200-nvl72"
PROFILE_LABEL = "topoplace.io/profile"
_TERM = re.compile(r"^\s*(\d+)\s*[xX*]\s*([A-Za-z0-9._-]+)\s*$")
_WHAT_IF = re.compile(r"^\s*([+-])\s*(\d+)\s*[xX*]?\s*([A-Za-z0-9._-]+)\s*$")


# A fleet's nodes, at most: a profile node takes ~2 ms and ~50 KiB to build, so 100,000
# is minutes; a count beyond it (a typo, 100000000xdgx1-v100) built for days, unbounded
# by --max-seconds, and ran out of memory.
MAX_FLEET_NODES = 100_000


def _fits(have: int, design: str, count: int, where: str) -> None:
    nodes = count * (TRAYS_PER_RACK if design == NVL72 else 1)
    if have + nodes > MAX_FLEET_NODES:
        raise FleetError(f"{where}: {have + nodes} nodes; a fleet has at most {MAX_FLEET_NODES}")


class FleetError(ValueError):
    """A cluster description or what-if that cannot be built; the message says which part."""


@dataclass(frozen=True, slots=True)
class FleetNode:
    snapshot: NodeSnapshot
    design: str
    cpu_milli: int | None = None  # None: not known (unlimited)
    memory_mib: int | None = None


def host_of(snapshot: NodeSnapshot) -> tuple[int | None, int | None]:
    """(milli-CPU, MiB) a snapshot knows: its NUMA nodes' CPUs and memory; None if not."""
    cpus = sum(len(n.cpu_list) for n in snapshot.numa_nodes)
    memory = sum(n.memory_mib for n in snapshot.numa_nodes)
    return (cpus * 1000 or None), (memory or None)


def _node(snapshot: NodeSnapshot, design: str) -> FleetNode:
    cpu, memory = host_of(snapshot)
    return FleetNode(snapshot, design, cpu, memory)


def known_designs() -> tuple[str, ...]:
    return (*PROFILE_NAMES, NVL72)


def build_design(design: str, count: int, prefix: str) -> list[FleetNode]:
    if design == NVL72:
        out = []
        for r in range(count):
            rack = f"{prefix}{NVL72}-{r:03d}"
            out += [_node(s, NVL72) for s in gb200_nvl72_rack(rack, clique_id=r + 1)]
        return out
    if design not in PROFILE_NAMES:
        raise FleetError(f"unknown profile {design!r}; known: {', '.join(known_designs())}")
    return [_node(build_profile(design, f"{prefix}{design}-{i:04d}"), design) for i in range(count)]


def parse_cluster(spec: str) -> list[FleetNode]:
    """``100xdgx1-v100,8xgb200-nvl72`` -> nodes, in name order."""
    nodes: list[FleetNode] = []
    for term in filter(None, (t.strip() for t in spec.split(","))):
        m = _TERM.match(term)
        if not m:
            raise FleetError(f"--cluster: {term!r} is not COUNTxPROFILE (e.g. 100xdgx1-v100)")
        _fits(len(nodes), m.group(2), int(m.group(1)), f"--cluster: {term!r}")
        nodes += build_design(m.group(2), int(m.group(1)), "")
    if not nodes:
        raise FleetError("--cluster: no nodes")
    return sorted(nodes, key=lambda n: n.snapshot.name)


def trace_nodes(path: Path) -> list[FleetNode]:
    from bench.trace import TraceNode, build_cluster, profile_for

    try:
        text = file_text(path)
    except ValueError as exc:
        raise FleetError(f"--nodes: {path}: {exc}") from None
    try:
        rows = [row for row in csv.DictReader(io.StringIO(text, newline="")) if int(row["gpu"]) > 0]
        listed = [
            TraceNode(name=row["sn"], gpus=int(row["gpu"]), model=row["model"].strip())
            for row in rows
        ]
        hosts = [_host(row) for row in rows]
        snaps = build_cluster(listed)
    except (KeyError, ValueError) as exc:
        raise FleetError(f"--nodes: {path}: not an openb node list ({exc})") from exc
    return checked(
        f"--nodes: {path}",
        [
            FleetNode(s, profile_for(n.gpus, n.model), cpu, memory)
            for s, n, (cpu, memory) in zip(snaps, listed, hosts, strict=True)
        ],
    )


def snapshot_nodes(path: Path) -> list[FleetNode]:
    try:
        text = file_text(path)
    except ValueError as exc:
        raise FleetError(f"--snapshots: {path}: {exc}") from None
    try:
        data = json.loads(text)
        items = data["nodes"] if isinstance(data, dict) else data
        snaps = [NodeSnapshot.model_validate(item) for item in items]
    except (json.JSONDecodeError, KeyError, TypeError, ValidationError) as exc:
        raise FleetError(f"--snapshots: {path}: not a snapshot export: {exc}") from exc
    out = []
    for s in sorted(snaps, key=lambda s: s.name):
        design = s.labels.get(PROFILE_LABEL) or (s.gpus[0].model if s.gpus else "no-gpu")
        out.append(_node(s, design))
    return checked(f"--snapshots: {path}", out)


def checked(source: str, nodes: list[FleetNode]) -> list[FleetNode]:
    """``nodes`` when there is one and every name is its own. The engine keeps one node per
    name and the baselines every row, so a name listed twice replayed the policies over
    different fleets; no node at all failed in the middle of the replay."""
    if not nodes:
        raise FleetError(f"{source}: no GPU nodes to replay the trace over")
    seen: set[str] = set()
    for n in nodes:
        if n.snapshot.name in seen:
            raise FleetError(f"{source}: node {n.snapshot.name!r} is listed twice")
        seen.add(n.snapshot.name)
    return nodes


def apply_what_if(nodes: list[FleetNode], change: str) -> list[FleetNode]:
    """The fleet after one change; refuses removing more nodes of a design than there are."""
    m = _WHAT_IF.match(change)
    if not m:
        raise FleetError(f"--what-if: {change!r} is not +N PROFILE or -N DESIGN")
    sign, count, design = m.group(1), int(m.group(2)), m.group(3)
    if sign == "+":
        # A second change adding the same design gets names of its own (whatif2-...).
        taken = [n.snapshot.name for n in nodes]
        prefix, k = "whatif-", 1
        while any(name.startswith(prefix) for name in taken):
            k += 1
            prefix = f"whatif{k}-"
        _fits(len(nodes), design, count, f"--what-if: {change!r}")
        added = build_design(design, count, prefix)
        return sorted([*nodes, *added], key=lambda n: n.snapshot.name)
    if design == NVL72:
        racks = sorted({_rack(n) for n in nodes if n.design == NVL72})
        if count > len(racks):
            raise FleetError(f"--what-if: {change!r}: the fleet has {len(racks)} {NVL72} racks")
        gone = set(racks[len(racks) - count :])
        left = [n for n in nodes if not (n.design == NVL72 and _rack(n) in gone)]
        return checked(f"--what-if: {change!r}", left)
    of_design = [n for n in nodes if n.design == design]
    if count > len(of_design):
        have = sorted({n.design for n in nodes})
        raise FleetError(
            f"--what-if: {change!r}: the fleet has {len(of_design)} {design} nodes"
            f" (designs: {', '.join(have)})"
        )
    gone_names = {n.snapshot.name for n in of_design[len(of_design) - count :]}
    return checked(
        f"--what-if: {change!r}", [n for n in nodes if n.snapshot.name not in gone_names]
    )


def _rack(node: FleetNode) -> str:
    return node.snapshot.name.rsplit("-tray", 1)[0]


def describe(nodes: list[FleetNode]) -> str:
    counts: dict[str, list[int]] = {}
    for n in nodes:
        c = counts.setdefault(n.design, [0, 0])
        c[0] += 1
        c[1] += n.snapshot.gpu_count
    parts = [f"{c[0]}x {d} ({c[1]} GPUs)" for d, c in sorted(counts.items())]
    total = sum(n.snapshot.gpu_count for n in nodes)
    return f"{len(nodes)} nodes, {total} GPUs: " + ", ".join(parts)


def _host(row: dict[str, str]) -> tuple[int | None, int | None]:
    """A node row's (milli-CPU, MiB); 0 or empty is not known, and never short."""
    try:
        return whole_amount(row, "cpu_milli") or None, whole_amount(row, "memory_mib") or None
    except ValueError as exc:
        raise ValueError(f"{row.get('sn')}: {exc}") from None
