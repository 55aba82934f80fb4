"""A node's wiring laid out as a picture: where each box and line goes. Pure: no I/O.

The picture is what an operator draws on a whiteboard: one band per NUMA node,
in it one box per PCIe switch group (the GPUs and NICs behind one switch), each
GPU coloured by the allocation holding it, and the NVLink wiring on top. Direct
NVLink (``NV<n>``) is drawn as one line per GPU pair, labelled with its lane
count; an island wired through NVSwitches (``NVS<n>`` between every pair) would
be a line from each GPU to each other one, so it is drawn as a switch bar the
island's GPUs connect to, with their lane count.

service/console/topology_svg.py turns the layout into SVG; the console shows that
same SVG, so the picture in a ticket and in the browser is one drawing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from placement import Health, NodeSnapshot
from placement.links import LinkKind, parse_link

GPU_W, GPU_H = 104, 64
NIC_W, NIC_H = 76, 22
GAP = 18  # between boxes in a group, and between groups in a band
PAD = 12  # inside a group
BAND_HEAD = 22  # the band's label, under its boxes (the arcs run above them)
BAND_GAP = 70  # between bands: room for NVLink lines and their labels
LEFT = 20
TOP = 54  # the title
SWITCH_H = 26
ARC_ROOM = 40  # above the first band, for the arcs between GPUs of one row

# Near PCIe levels: devices this close sit behind one switch (nvidia-smi's PIX, PXB).
_SAME_SWITCH = frozenset({LinkKind.PIX, LinkKind.PXB})
# The colours of the allocations holding GPUs on one node, in the order they first hold one.
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#b07aa1",
    "#edc948",
    "#76b7b2",
    "#ff9da7",
    "#9c755f",
    "#e15759",
    "#bab0ac",
)


@dataclass(frozen=True, slots=True)
class Holder:
    """The allocation holding a GPU."""

    allocation_id: str
    job_id: str | None
    state: str


@dataclass(frozen=True, slots=True)
class Box:
    x: float
    y: float
    w: float
    h: float

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2


@dataclass(frozen=True, slots=True)
class GpuBox:
    index: int
    box: Box
    model: str
    island: str
    health: str
    mig_enabled: bool
    holder: Holder | None
    colour: str | None  # the holder's colour; None when free


@dataclass(frozen=True, slots=True)
class NicBox:
    name: str
    box: Box


@dataclass(frozen=True, slots=True)
class Group:
    """The devices behind one PCIe switch (or one GPU alone)."""

    box: Box
    gpus: tuple[int, ...]
    nics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Band:
    """One NUMA node (``numa`` None: GPUs whose NUMA node is not known; -1: host NICs)."""

    numa: int | None
    label: str
    box: Box
    groups: tuple[Group, ...]


@dataclass(frozen=True, slots=True)
class Edge:
    """Direct NVLink between two GPUs: a line from ``a`` to ``b`` through ``via``."""

    a: int
    b: int
    lanes: int
    start: tuple[float, float]
    via: tuple[float, float]  # a quadratic curve's control point
    end: tuple[float, float]
    label_at: tuple[float, float]


@dataclass(frozen=True, slots=True)
class Switch:
    """An island wired through NVSwitches: a bar its GPUs connect to."""

    island: str
    box: Box
    ports: tuple[tuple[int, int], ...]  # (GPU index, lanes)


@dataclass(frozen=True, slots=True)
class Legend:
    holder: Holder
    colour: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Picture:
    node: str
    width: float
    height: float
    bands: tuple[Band, ...]
    gpus: tuple[GpuBox, ...]
    nics: tuple[NicBox, ...]
    edges: tuple[Edge, ...]
    switches: tuple[Switch, ...]
    islands: tuple[tuple[str, tuple[int, ...]], ...]
    legend: tuple[Legend, ...]


def _switch_groups(snap: NodeSnapshot) -> list[list[int]]:
    """GPUs sharing a PCIe switch: near each other, or near the same NIC, on one NUMA node.

    The GPU matrix shows only the best path, so two NVLinked GPUs behind one switch
    read as ``NV<n>`` there; the NICs' rows still show them both ``PIX``."""
    n = snap.gpu_count
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    def join(i: int, j: int) -> None:
        if snap.gpus[i].numa_node == snap.gpus[j].numa_node:
            a, b = find(i), find(j)
            parent[max(a, b)] = min(a, b)

    for i in range(n):
        for j in range(i + 1, n):
            if snap.link(i, j).kind in _SAME_SWITCH:
                join(i, j)
    for nic in snap.nics:
        near = [g for g, label in enumerate(nic.links) if parse_link(label).kind in _SAME_SWITCH]
        for g in near[1:]:
            join(near[0], g)
    groups: dict[int, list[int]] = {}
    for g in range(n):
        groups.setdefault(find(g), []).append(g)
    return list(groups.values())


def _nic_home(snap: NodeSnapshot, links: Sequence[str]) -> tuple[int | None, int | None]:
    """(the GPU whose switch group a NIC sits in, or None; the NUMA node it is near)."""
    best: tuple[int, int] | None = None
    for g, label in enumerate(links):
        kind = parse_link(label).kind
        if kind in _SAME_SWITCH:
            return g, snap.gpus[g].numa_node
        if kind in (LinkKind.PHB, LinkKind.NODE):
            rank = 0 if kind is LinkKind.PHB else 1
            if best is None or rank < best[0]:
                best = (rank, g)
    if best is not None:
        return None, snap.gpus[best[1]].numa_node
    return None, -1  # only SYS: reached across the CPUs' interconnect


def _switched_islands(snap: NodeSnapshot, island_of: Sequence[str]) -> dict[str, dict[int, int]]:
    """Islands of three or more GPUs where every pair is NVLink through a switch."""
    members: dict[str, list[int]] = {}
    for g, name in enumerate(island_of):
        members.setdefault(name, []).append(g)
    switched: dict[str, dict[int, int]] = {}
    for name, gpus in members.items():
        if len(gpus) < 3:
            continue
        links = [snap.link(i, j) for i in gpus for j in gpus if i != j]
        if all(link.kind is LinkKind.NVSWITCH for link in links):
            switched[name] = {g: max(snap.link(g, o).lanes for o in gpus if o != g) for g in gpus}
    return switched


def _short_model(model: str) -> str:
    for prefix in ("NVIDIA ", "Tesla "):
        model = model.removeprefix(prefix)
    return model if len(model) <= 16 else model[:15] + "…"


def lay_out(snap: NodeSnapshot, island_of: Sequence[str], holders: Mapping[int, Holder]) -> Picture:
    """The picture of ``snap``: ``island_of[g]`` names GPU g's island, ``holders[g]`` the
    allocation holding it (absent: free)."""
    colours: dict[str, str] = {}
    for g in sorted(holders):
        colours.setdefault(holders[g].allocation_id, PALETTE[len(colours) % len(PALETTE)])

    groups = _switch_groups(snap)
    nics_by_gpu: dict[int, list[str]] = {}
    nics_by_numa: dict[int | None, list[str]] = {}
    for nic in snap.nics:
        gpu, numa = _nic_home(snap, nic.links)
        if gpu is not None:
            nics_by_gpu.setdefault(gpu, []).append(nic.name)
        else:
            nics_by_numa.setdefault(numa, []).append(nic.name)

    cpus = {numa.id: numa.cpus for numa in snap.numa_nodes}
    known = sorted({g.numa_node for g in snap.gpus if g.numa_node is not None})
    numas: list[int | None] = list(known)
    if any(g.numa_node is None for g in snap.gpus):
        numas.append(None)
    numas += [n for n in nics_by_numa if n is not None and n >= 0 and n not in numas]
    if -1 in nics_by_numa:
        numas.append(-1)

    switched = _switched_islands(snap, island_of)
    direct = any(
        snap.link(i, j).kind is LinkKind.NVLINK and island_of[i] not in switched
        for i in range(snap.gpu_count)
        for j in range(i + 1, snap.gpu_count)
    )
    y: float = TOP + len(switched) * (SWITCH_H + 30) + (ARC_ROOM if direct else 0)
    bands: list[Band] = []
    gpu_boxes: dict[int, Box] = {}
    nic_boxes: list[NicBox] = []
    width = 0.0
    for numa in numas:
        band_groups: list[Group] = []
        x = LEFT + PAD
        in_band = [grp for grp in groups if snap.gpus[grp[0]].numa_node == numa and numa != -1]
        loose = nics_by_numa.get(numa, [])
        units: list[tuple[list[int], list[str]]] = [
            (grp, [n for g in grp for n in nics_by_gpu.get(g, [])]) for grp in in_band
        ]
        if loose:
            units.append(([], loose))
        has_nics = any(nics for _, nics in units)
        group_h = PAD * 2 + (GPU_H if any(gpus for gpus, _ in units) else 0.0)
        group_h += (NIC_H + GAP / 2) if has_nics else 0.0
        top = y + PAD
        for gpus, nics in units:
            cols = max(len(gpus), (len(nics) * (NIC_W + GAP) + GPU_W) // (GPU_W + GAP), 1)
            w = PAD * 2 + cols * GPU_W + (cols - 1) * GAP
            for k, g in enumerate(gpus):
                gpu_boxes[g] = Box(x + PAD + k * (GPU_W + GAP), top + PAD, GPU_W, GPU_H)
            nic_y = top + PAD + (GPU_H + GAP / 2 if gpus else 0)
            for k, name in enumerate(nics):
                nic_boxes.append(
                    NicBox(name, Box(x + PAD + k * (NIC_W + GAP), nic_y, NIC_W, NIC_H))
                )
            band_groups.append(Group(Box(x, top, w, group_h), tuple(gpus), tuple(nics)))
            x += w + GAP
        if numa == -1:
            label = "host: NICs across the CPU interconnect"
        elif numa is None:
            label = "NUMA node unknown"
        else:
            label = f"NUMA {numa}" + (f" · CPUs {cpus[numa]}" if numa in cpus else "")
        band_w = x - GAP + PAD - LEFT
        bands.append(
            Band(numa, label, Box(LEFT, y, band_w, PAD + group_h + BAND_HEAD), tuple(band_groups))
        )
        width = max(width, LEFT + band_w)
        y += PAD + group_h + BAND_HEAD + BAND_GAP

    switches: list[Switch] = []
    for row, (name, ports) in enumerate(sorted(switched.items())):
        xs = [gpu_boxes[g].cx for g in ports]
        box = Box(
            min(xs) - GPU_W / 2, TOP + row * (SWITCH_H + 30), max(xs) - min(xs) + GPU_W, SWITCH_H
        )
        switches.append(Switch(name, box, tuple(sorted(ports.items()))))

    edges: list[Edge] = []
    for i in range(snap.gpu_count):
        for j in range(i + 1, snap.gpu_count):
            link = snap.link(i, j)
            if link.kind is not LinkKind.NVLINK or island_of[i] in switched:
                continue
            edges.append(_edge(i, j, link.lanes, gpu_boxes[i], gpu_boxes[j]))

    gpu_views = tuple(
        GpuBox(
            index=g.index,
            box=gpu_boxes[g.index],
            model=_short_model(g.model),
            island=island_of[g.index],
            health=g.health.value if isinstance(g.health, Health) else str(g.health),
            mig_enabled=g.mig_enabled,
            holder=holders.get(g.index),
            colour=colours[holders[g.index].allocation_id] if g.index in holders else None,
        )
        for g in snap.gpus
    )
    island_list: dict[str, list[int]] = {}
    for g, name in enumerate(island_of):
        island_list.setdefault(name, []).append(g)
    legend: dict[str, Legend] = {}
    for g in sorted(holders):
        holder = holders[g]
        before = legend.get(holder.allocation_id)
        held = (*before.gpus, g) if before else (g,)
        legend[holder.allocation_id] = Legend(holder, colours[holder.allocation_id], held)
    height = y - BAND_GAP + 30 + 18 * (len(legend) + 1)
    return Picture(
        node=snap.name,
        width=max(width + LEFT, 560),
        height=height,
        bands=tuple(bands),
        gpus=gpu_views,
        nics=tuple(nic_boxes),
        edges=tuple(edges),
        switches=tuple(switches),
        islands=tuple((name, tuple(members)) for name, members in island_list.items()),
        legend=tuple(legend.values()),
    )


def _edge(a: int, b: int, lanes: int, one: Box, two: Box) -> Edge:
    """A line between two GPU boxes: straight across bands, an arc within a row (so it
    does not run through the boxes between them)."""
    if abs(one.cy - two.cy) < 1:
        bulge = 10 + 0.28 * abs(two.cx - one.cx)
        start, end = (one.cx, one.y), (two.cx, two.y)
        via = ((one.cx + two.cx) / 2, one.y - bulge)
        label = ((one.cx + two.cx) / 2, one.y - bulge / 2)
    else:
        upper, lower = (one, two) if one.cy < two.cy else (two, one)
        start, end = (upper.cx, upper.y + upper.h), (lower.cx, lower.y)
        if upper is two:
            start, end = end, start
        via = ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
        label = via
    return Edge(a, b, lanes, start, via, end, label)
