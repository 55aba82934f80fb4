"""Read and write the GPU topology matrix that ``nvidia-smi topo -m`` prints.

``parse_topo_matrix`` turns that text into a ``NodeSnapshot`` (GPU links, NIC
relations, GPU-to-NUMA map); ``render_topo_matrix`` prints a snapshot back in
the same tab-separated layout. Both work on strings only: this module does no
I/O and runs no commands.

The parser accepts what the tool prints in the wild: cells separated by tabs
or by runs of spaces, ANSI underline codes around names, NIC rows and the
``NIC Legend:`` block, optional ``CPU Affinity`` / ``NUMA Affinity`` /
``GPU NUMA ID`` columns, ``N/A`` cells, ``SOC`` for ``SYS``, Windows line
endings and surrounding blank lines. Malformed text raises ``TopoParseError``
naming the 1-based line at fault.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import TypeAlias

from pydantic import ValidationError

from placement.cpuset import CpusetError, format_cpuset, parse_cpuset
from placement.links import LinkKind, LinkLabelError, parse_link
from placement.snapshot import Gpu, Nic, NodeSnapshot, NumaNode

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Data cells never contain spaces, but three header names do; naming them
# first lets a header whose cells are separated by single spaces still split.
_CELL_RE = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID|\S+")
_GPU_COLUMN_RE = re.compile(r"GPU\d+")
_LEGEND_ENTRY_RE = re.compile(r"^\s*(\S+?)\s*:\s*(\S.*?)\s*$")
_CPU_AFFINITY, _NUMA_AFFINITY = "CPU Affinity", "NUMA Affinity"
_ATTRIBUTE_COLUMNS = frozenset({_CPU_AFFINITY, _NUMA_AFFINITY, "GPU NUMA ID"})
_NA = "N/A"
_HUGE_NUMBER_RE = re.compile(r"\d{6}")
_MAX_GPUS = 256
_MAX_NIC_NAME = 64
# Fixed so that the placeholder GPU UUIDs are the same on every run.
_UUID_NAMESPACE = uuid.UUID("6b1f3c2e-5d0a-4e8f-9c71-2a4d8e0f1b37")
_LEGEND = (
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes"
    " (e.g., QPI/UPI)",
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges"
    " within a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host"
    " Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
)


# A GPU row's CPU Affinity (CPU numbers) and NUMA Affinity (one node, or None).
_Affinity: TypeAlias = tuple[tuple[int, ...], int | None]


class TopoParseError(ValueError):
    """Text that is not a topology matrix; ``line`` is the 1-based line at fault."""

    def __init__(self, line: int, expected: str, found: str) -> None:
        super().__init__(f"line {line}: expected {expected}, found {found}")
        self.line = line


@dataclass(frozen=True, slots=True)
class _Row:
    line: int
    name: str
    cells: list[str]


@dataclass(frozen=True, slots=True)
class _Header:
    line: int
    gpus: int
    devices: list[str]  # NIC columns (NIC0, or mlx5_0 on old drivers), in order
    columns: list[str]  # every column, GPUs first, then devices, then attributes


def parse_topo_matrix(
    text: str,
    *,
    node_name: str = "node",
    region: str = "default",
    labels: dict[str, str] | None = None,
    gpu_model: str = "unknown",
) -> NodeSnapshot:
    """Parse ``nvidia-smi topo -m`` output into a snapshot of node ``node_name``.

    GPUs get index i, model ``gpu_model`` and a placeholder UUID derived from
    ``node_name`` and i (the matrix prints no UUIDs). A GPU's ``numa_node`` is
    its ``NUMA Affinity`` when that is one integer; ``N/A``, or a range of
    several nodes, gives ``None``. Each NUMA node named there gets the union of
    the ``CPU Affinity`` sets of its GPUs. When the text names no NUMA node at
    all (``N/A`` everywhere, or no such column, as older drivers print), each
    distinct ``CPU Affinity`` set is taken as one NUMA node, numbered from 0 in
    order of first appearance: a GPU's CPU affinity is its socket's CPUs, and a
    snapshot keeps CPUs per NUMA node only. Sets that overlap another are not
    nodes (their GPUs get none). Otherwise a ``CPU Affinity`` of a GPU without
    a NUMA node is dropped. ``GPU NUMA ID`` (the GPU memory's own node on
    coherent systems) is ignored. NICs are named from the NIC legend when it
    has them, else by their column name; NIC-to-NIC cells are checked, not kept.

    Bad arguments (e.g. an invalid node name) raise pydantic's ValidationError
    before the text is read; bad text raises ``TopoParseError``.
    """
    NodeSnapshot(name=node_name, region=region, labels=labels or {})
    Gpu(index=0, uuid="probe", model=gpu_model)
    lines = [_ANSI_RE.sub("", line) for line in re.split(r"\r\n|\r|\n", text.lstrip("\ufeff"))]
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None:
        raise TopoParseError(1, "a header naming GPU0 GPU1 ...", "no text")
    header = _parse_header(start + 1, _cells(lines[start]))
    rows, end = _matrix_rows(lines, start + 1)
    links, gpu_nic, affinity = _read_gpu_rows(rows, header, end)
    if _names_no_numa_node(rows[: header.gpus], header):
        affinity = _nodes_from_cpus(affinity)
    nic_links = _read_nic_rows(rows[header.gpus :], header, gpu_nic, end)
    names = _nic_legend(lines, end)
    try:
        return NodeSnapshot(
            name=node_name,
            region=region,
            labels=labels or {},
            numa_nodes=_numa_nodes(affinity),
            gpus=[
                Gpu(index=i, uuid=_placeholder_uuid(node_name, i), model=gpu_model, numa_node=node)
                for i, (_, node) in enumerate(affinity)
            ],
            links=links,
            nics=[
                Nic(name=names.get(col, col), links=nic_links[k])
                for k, col in enumerate(header.devices)
            ],
        )
    except ValidationError as exc:
        # The checks above should leave nothing for the model to refuse; if
        # one is missed, the text is still at fault, so report it as such.
        raise TopoParseError(header.line, "a valid topology matrix", str(exc)) from None


def render_topo_matrix(snapshot: NodeSnapshot) -> str:
    """Print ``snapshot`` the way ``nvidia-smi topo -m`` does, tab-separated.

    NVSwitch links print as ``NV<n>``, as the tool prints them. NIC-to-NIC
    relations are not in a snapshot and print as ``N/A``; a GPU without a NUMA
    node prints ``N/A`` for both affinities. A snapshot without GPUs has no
    matrix and raises ValueError.
    """
    if not snapshot.gpus:
        raise ValueError(f"node {snapshot.name} has no GPUs, so no topology matrix")
    n, nics = snapshot.gpu_count, snapshot.nics
    cpus = {node.id: format_cpuset(node.cpu_list) for node in snapshot.numa_nodes}
    gpu_cols = [f"GPU{i}" for i in range(n)]
    nic_cols = [f"NIC{k}" for k in range(len(nics))]
    lines = ["\t".join(["", *gpu_cols, *nic_cols, _CPU_AFFINITY, _NUMA_AFFINITY])]
    for i, gpu in enumerate(snapshot.gpus):
        numa = gpu.numa_node
        affinity = [_NA, _NA] if numa is None else [cpus.get(numa) or _NA, str(numa)]
        links = [_printed(label) for label in [*snapshot.links[i], *(nic.links[i] for nic in nics)]]
        lines.append("\t".join([gpu_cols[i], *links, *affinity]))
    for k, nic in enumerate(nics):
        peers = [" X " if m == k else _NA for m in range(len(nics))]
        lines.append("\t".join([nic_cols[k], *(_printed(label) for label in nic.links), *peers]))
    lines += ["", "Legend:", "", *_LEGEND]
    if nics:
        legend = [f"  {nic_cols[k]}: {nic.name}" for k, nic in enumerate(nics)]
        lines += ["", "NIC Legend:", "", *legend]
    return "\n".join(lines) + "\n"


def _placeholder_uuid(node_name: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"


def _numa_nodes(affinity: list[_Affinity]) -> list[NumaNode]:
    """One NUMA node per distinct GPU NUMA affinity, with the union of those GPUs' CPUs.

    A CPU that the GPUs of two NUMA nodes both list (nvidia-smi prints a CPU affinity
    wider than the GPU's NUMA node on some machines) belongs to one of them, but the
    text does not say which: it is given to neither, as overlapping CPU sets without a
    NUMA column make no node, and a snapshot refuses a CPU in two NUMA nodes."""
    merged: dict[int, set[int]] = {}
    for cpus, node in affinity:
        if node is not None:
            merged.setdefault(node, set()).update(cpus)
    claims = Counter(cpu for cpus in merged.values() for cpu in cpus)
    return [
        NumaNode(id=node, cpus=format_cpuset(cpu for cpu in merged[node] if claims[cpu] == 1))
        for node in sorted(merged)
    ]


def _names_no_numa_node(gpu_rows: list[_Row], header: _Header) -> bool:
    if _NUMA_AFFINITY not in header.columns:
        return True
    column = header.columns.index(_NUMA_AFFINITY)
    return all(row.cells[column] == _NA for row in gpu_rows)


def _nodes_from_cpus(affinity: list[_Affinity]) -> list[_Affinity]:
    """Each distinct CPU set one NUMA node (for text that names no NUMA node at all)."""
    distinct = list(dict.fromkeys(cpus for cpus, _ in affinity if cpus))
    alone = [
        cpus
        for cpus in distinct
        if not any(set(cpus) & set(other) for other in distinct if other != cpus)
    ]
    ids = {cpus: node for node, cpus in enumerate(alone)}
    return [(cpus, ids.get(cpus)) for cpus, _ in affinity]


def _printed(label: str) -> str:
    link = parse_link(label)
    if link.kind is LinkKind.SELF:
        return " X "
    return f"NV{link.lanes}" if link.is_nvlink else link.label


def _cells(line: str) -> list[str]:
    if "\t" in line:
        return [cell.strip() for cell in line.split("\t") if cell.strip()]
    return _CELL_RE.findall(line)


def _parse_header(line: int, cells: list[str]) -> _Header:
    gpus = 0
    while gpus < len(cells) and cells[gpus] == f"GPU{gpus}":
        gpus += 1
    if gpus == 0:
        raise TopoParseError(line, "a header naming GPU0 GPU1 ...", repr(" ".join(cells[:4])))
    if gpus > _MAX_GPUS:
        raise TopoParseError(line, f"at most {_MAX_GPUS} GPU columns", str(gpus))
    devices: list[str] = []
    for cell in cells[gpus:]:
        if _GPU_COLUMN_RE.fullmatch(cell):
            raise TopoParseError(line, f"GPU columns in order, GPU{gpus} after GPU{gpus - 1}", cell)
        if cell in _ATTRIBUTE_COLUMNS:
            break
        if cell in devices:
            raise TopoParseError(line, "distinct column names", f"{cell} twice")
        devices.append(cell)
    return _Header(line, gpus, devices, cells)


def _matrix_rows(lines: list[str], first: int) -> tuple[list[_Row], int]:
    """The rows after the header, up to a blank line or a legend; and the line that ends them."""
    rows: list[_Row] = []
    index = first
    while index < len(lines):
        cells = _cells(lines[index])
        # No cell ends with a colon; "Legend:" and "NIC Legend:" do.
        if not cells or cells[-1].endswith(":"):
            break
        rows.append(_Row(index + 1, cells[0], cells[1:]))
        index += 1
    return rows, index + 1


def _expect_link(row: _Row, column: str, cell: str, diagonal: bool) -> str:
    try:
        label: str | None = parse_link(cell).label
    except LinkLabelError:
        label = None
    if label is None or (label == "X") != diagonal:
        expected = "X (the diagonal)" if diagonal else "a link label (NV<n>, PIX, ..., SYS)"
        raise TopoParseError(row.line, f"{expected} in column {column}", repr(cell))
    return label


def _read_gpu_rows(
    rows: list[_Row], header: _Header, end: int
) -> tuple[list[list[str]], list[list[str]], list[_Affinity]]:
    """GPU-GPU labels, GPU-NIC labels, and (CPU affinity, NUMA node) of each GPU row."""
    n, cols = header.gpus, header.columns
    links: list[list[str]] = []
    gpu_nic: list[list[str]] = []
    affinity: list[_Affinity] = []
    for i in range(n):
        if i >= len(rows):
            raise TopoParseError(end, f"row GPU{i}", "the end of the matrix")
        row = rows[i]
        if row.name != f"GPU{i}":
            raise TopoParseError(row.line, f"row GPU{i}", repr(row.name))
        if len(row.cells) != len(cols):
            raise TopoParseError(row.line, f"{len(cols)} cells after GPU{i}", str(len(row.cells)))
        links.append([_expect_link(row, cols[j], row.cells[j], i == j) for j in range(n)])
        for j in range(i):
            if links[i][j] != links[j][i]:
                mirror = f"{links[j][i]} in column GPU{j}, as in row GPU{j}"
                raise TopoParseError(row.line, mirror, links[i][j])
        devices = range(n, n + len(header.devices))
        gpu_nic.append([_expect_link(row, cols[j], row.cells[j], False) for j in devices])
        cells = dict(zip(cols, row.cells, strict=True))
        affinity.append(
            _affinity(row, cells.get(_CPU_AFFINITY, _NA), cells.get(_NUMA_AFFINITY, _NA))
        )
    return links, gpu_nic, affinity


def _affinity(row: _Row, cpus: str, numa: str) -> _Affinity:
    cpu_list = _cpuset(row, cpus, "CPU Affinity", "0-19,40-59")
    nodes = _cpuset(row, numa, "NUMA Affinity", "0")
    # Several nodes (e.g. 0-1): the GPU is equally near each, so none is its own.
    return cpu_list, nodes[0] if len(nodes) == 1 else None


def _cpuset(row: _Row, cell: str, column: str, example: str) -> tuple[int, ...]:
    if cell == _NA:
        return ()
    try:
        # Ranges are expanded, so a huge number in bad text would make a huge list.
        if _HUGE_NUMBER_RE.search(cell) is None:
            return parse_cpuset(cell)
    except CpusetError:
        pass
    raise TopoParseError(row.line, f"{column} such as {example} or N/A", repr(cell))


def _read_nic_rows(
    rows: list[_Row], header: _Header, gpu_nic: list[list[str]], end: int
) -> list[list[str]]:
    """Each NIC's relation to each GPU, checked against the GPU rows' NIC columns."""
    n, devices = header.gpus, header.devices
    if len(rows) > len(devices):
        extra = rows[len(devices)]
        expected = f"the end of the matrix after {len(devices)} NIC rows"
        raise TopoParseError(extra.line, expected, f"row {extra.name!r}")
    if rows and len(rows) < len(devices):
        raise TopoParseError(end, f"row {devices[len(rows)]}", "the end of the matrix")
    for k, row in enumerate(rows):
        if row.name != devices[k]:
            raise TopoParseError(row.line, f"row {devices[k]}", repr(row.name))
        if len(row.cells) not in (n + len(devices), len(header.columns)):
            expected = f"{n + len(devices)} cells after {row.name}"
            raise TopoParseError(row.line, expected, str(len(row.cells)))
        for g in range(n):
            label = _expect_link(row, f"GPU{g}", row.cells[g], False)
            if label != gpu_nic[g][k]:
                raise TopoParseError(
                    row.line, f"{gpu_nic[g][k]} in column GPU{g}, as in row GPU{g}", label
                )
        for m, cell in enumerate(row.cells[n : n + len(devices)]):
            # NIC-to-NIC relations are not kept; N/A is what render prints for them.
            if cell != _NA or m == k:
                _expect_link(row, devices[m], cell, m == k)
    return [[gpu_nic[g][k] for g in range(n)] for k in range(len(devices))]


def _nic_legend(lines: list[str], end: int) -> dict[str, str]:
    """Column name -> NIC name, from the ``NIC Legend:`` block after the matrix."""
    names: dict[str, str] = {}
    start = next((i for i in range(end - 1, len(lines)) if lines[i].strip() == "NIC Legend:"), None)
    for index in range(len(lines) if start is None else start + 1, len(lines)):
        match = _LEGEND_ENTRY_RE.match(lines[index])
        if match is None:
            if lines[index].strip():
                break  # the legend is over
            continue
        column, name = match.groups()
        if len(name) > _MAX_NIC_NAME:
            expected = f"a NIC name of at most {_MAX_NIC_NAME} characters"
            raise TopoParseError(index + 1, expected, repr(name))
        names[column] = name
    return names
