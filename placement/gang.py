"""Gangs: N tasks x k GPUs, all or nothing, possibly across nodes.

1. Capacity: each node is asked for its best k-set, then for the best k-set
   of what is left, and so on; the sets it gives are its capacity (greedy
   per node: each task still gets its node's exact best set at that point).
2. Group: a multi-node NVLink domain (NVML clique) that holds all N tasks
   wins; among several, the tightest fit, so larger domains stay whole for
   larger gangs. Then the fewest network blocks (node labels such as
   topoplace.io/block or rack): one block if one fits (tightest), else the
   largest blocks until the gang fits.
3. Inside the group, nodes that hold the most tasks come first, so the gang
   spans as few nodes as possible.

``protected_slots`` implements "never leave a clique unusable for a waiting
gang when another choice exists": for each waiting gang, the domain it
would get now is marked, and other requests rank its nodes last.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from placement.analysis import Analysis, analyse, requested_slots
from placement.capacity import refuse
from placement.node_choice import indices_to_mask, mask_to_indices
from placement.numa import choose_cpus
from placement.outcome import Cause, Outcome, Placement, ReasonGroup, TaskPlacement
from placement.request import PlacementRequest
from placement.table import NodeTable
from placement.task_builder import build_task, score_parts


@dataclass
class _NodeSets:
    """A node's planned sets: (GPU mask, the round's analysis, the node's row in it).

    A set's score is built only when the gang takes it: capacity plans every set of
    every node (up to 8 per node for 1-GPU tasks) and a gang takes a few of them. Building
    all 78,000 scores of a 4,096-task gang over 10,000 nodes held the state lock for
    about a second."""

    slot: int
    sets: list[tuple[int, Analysis, int]] = field(default_factory=list)

    @property
    def capacity(self) -> int:
        return len(self.sets)

    @property
    def quality(self) -> float:
        if not self.sets:
            return 0.0
        _, analysis, row = self.sets[0]
        return round(float(analysis.quality[row]), 6)  # as ScoreParts.bandwidth rounds it


@dataclass
class _Capacity:
    nodes: dict[int, _NodeSets]
    first_causes: dict[Cause, int]


def _capacity(table: NodeTable, request: PlacementRequest, slots: NDArray[np.int64]) -> _Capacity:
    free = table.free.copy()
    nodes: dict[int, _NodeSets] = {}
    active = slots
    first_causes: dict[Cause, int] = {}
    # slot -> CPUs the sets planned there so far take: the next round's NUMA rule counts
    # them as used, as the tasks built from these sets will (build_task, in this order).
    planned_cpus: dict[int, set[int]] = defaultdict(set)
    for round_no in range(request.tasks):
        if not active.size:
            break
        # round r plans each node's (r+1)-th task: the r before it hold their host room
        analysis = analyse(
            table, request, request.gpus, active, free, planned=round_no, planned_cpus=planned_cpus
        )
        if request.cpus_per_task:
            _plan_cpus(table, request, analysis, planned_cpus)
        if round_no == 0:
            first_causes = analysis.cause_counts()
        fits = np.flatnonzero(analysis.fits())
        for i, slot, mask in zip(
            fits.tolist(),
            analysis.slots[fits].tolist(),
            analysis.chosen[fits].tolist(),
            strict=True,
        ):
            sets = nodes.get(slot)
            if sets is None:
                sets = nodes[slot] = _NodeSets(slot)
            sets.sets.append((mask, analysis, i))
        free[analysis.slots[fits]] &= ~analysis.chosen[fits]
        active = analysis.slots[fits]
    return _Capacity(nodes, first_causes)


def _plan_cpus(
    table: NodeTable,
    request: PlacementRequest,
    analysis: Analysis,
    planned_cpus: dict[int, set[int]],
) -> None:
    """Add to the plan the CPUs each fitting set takes beside those planned before it on its
    node; a set that cannot get them is refused for CPUs, and its node offers no more sets.
    Counting a set whose task cannot be built let a node with the CPUs of one task offer
    two, and a gang that chose that node alone was refused while other nodes had room."""
    for i in np.flatnonzero(analysis.fits()).tolist():
        slot = int(analysis.slots[i])
        entry = table.entry_at(slot)
        used = entry.used_cpus | planned_cpus[slot]
        indices = mask_to_indices(int(analysis.chosen[i]))
        cpus = choose_cpus(entry.snapshot, indices, request.cpus_per_task, used, request.numa)
        if cpus is None:
            analysis.set_cause(i, Cause.CPUS)
        else:
            planned_cpus[slot].update(cpus.cpus)


def _domain(table: NodeTable, slot: int) -> str | None:
    return table.entry_at(slot).snapshot.fabric_domain()


def _block(table: NodeTable, slot: int) -> str:
    snap = table.entry_at(slot).snapshot
    for key in table.block_labels:
        if key in snap.labels:
            return f"{key}={snap.labels[key]}"
    return f"node={snap.name}"  # unknown network position: a block of its own


def _node_order(table: NodeTable, cap: _Capacity, slots: list[int]) -> list[int]:
    return sorted(
        slots,
        key=lambda s: (-cap.nodes[s].capacity, -cap.nodes[s].quality, s),
    )


def _choose_group(
    table: NodeTable, cap: _Capacity, needed: int, protected: NDArray[np.bool_]
) -> tuple[list[int], str | None, tuple[str, ...]] | None:
    domains: dict[str, list[int]] = defaultdict(list)
    blocks: dict[str, list[int]] = defaultdict(list)
    for slot in cap.nodes:
        dom = _domain(table, slot)
        if dom is not None:
            domains[dom].append(slot)
        blocks[_block(table, slot)].append(slot)

    def total(members: list[int]) -> int:
        return sum(cap.nodes[s].capacity for s in members)

    def fit_key(name: str, members: list[int]) -> tuple[bool, int, float, str]:
        spare = total(members) - needed
        quality = float(np.mean([cap.nodes[s].quality for s in members]))
        return (any(bool(protected[s]) for s in members), spare, -quality, name)

    fitting = [(fit_key(d, m), d) for d, m in domains.items() if total(m) >= needed]
    if fitting:
        dom = min(fitting)[1]
        members = domains[dom]
        return members, dom, tuple(sorted({_block(table, s) for s in members}))
    fitting = [(fit_key(b, m), b) for b, m in blocks.items() if total(m) >= needed]
    if fitting:
        block = min(fitting)[1]
        return blocks[block], None, (block,)
    # Largest blocks first until the gang fits. The tasks taken so far are a running
    # sum: summing every chosen node again per block was quadratic in the blocks, and a
    # gang over 4,090 one-node blocks held the decision (and the event loop) for 775 ms.
    block_tasks = {block: total(members) for block, members in blocks.items()}
    chosen: list[int] = []
    used: list[str] = []
    held = 0
    for block in sorted(blocks, key=lambda b: (-block_tasks[b], b)):
        if held >= needed:
            break
        chosen += blocks[block]
        used.append(block)
        held += block_tasks[block]
    if held < needed:
        return None
    return chosen, None, tuple(used)


def place_gang(
    table: NodeTable, request: PlacementRequest, protected: NDArray[np.bool_]
) -> Outcome:
    slots = requested_slots(table, request)
    cap = _capacity(table, request, slots)
    group = _choose_group(table, cap, request.tasks, protected)
    if group is None:
        have = sum(n.capacity for n in cap.nodes.values())
        gang = ReasonGroup(
            cause=Cause.GANG,
            nodes=len(cap.nodes),
            message=(
                f"{'together they hold' if len(cap.nodes) > 1 else 'it holds'} only {have} of"
                f" {request.tasks} tasks of {request.gpus} GPUs"
            ),
            resolvable=True,
        )
        # Whether the gang could fit the idle cluster is placement.capacity's to say;
        # the gang group tells what the nodes with room hold now.
        return refuse(table, request, cap.first_causes, (gang,) if cap.nodes else ())
    members, domain, blocks = group
    tasks: list[TaskPlacement] = []
    reserved_cpus: dict[int, set[int]] = defaultdict(set)
    for slot in _node_order(table, cap, members):
        for mask, analysis, row in cap.nodes[slot].sets:
            if len(tasks) == request.tasks:
                break
            parts = score_parts(analysis, row)
            task = build_task(table, slot, mask, request, len(tasks), parts, reserved_cpus[slot])
            if task is None:
                continue  # this set's NUMA node is out of CPUs; try the next set
            reserved_cpus[slot] |= set(task.cpus)
            tasks.append(task)
    if len(tasks) < request.tasks:
        return refuse(table, request, {Cause.CPUS: len(members)})
    ring = gang_ring(table, tasks, domain, blocks)
    nodes = list(dict.fromkeys(t.node for t in tasks))
    where = f"fabric domain {domain}" if domain else f"{len(blocks)} network block(s)"
    summary = (
        f"{request.tasks} tasks x {request.gpus} GPUs on {len(nodes)} node(s) in {where}, "
        f"gang ring {ring:g} GB/s"
    )
    return Outcome(
        status="placed",
        placement=Placement(
            tasks=tuple(tasks),
            ring_gbps=ring,
            fabric_domain=domain,
            network_blocks=blocks,
            reason=summary,
        ),
    )


def gang_ring(
    table: NodeTable, tasks: Sequence[TaskPlacement], domain: str | None, blocks: tuple[str, ...]
) -> float:
    """Predicted ring over all the gang's GPUs: per node the ring of its share, then the network."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for task in tasks:
        by_node[task.node] += task.gpu_indices
    rings = []
    for node, indices in by_node.items():
        if len(indices) > 1:
            entry = table.entry(node)
            rings.append(table.registry.set_metrics(entry.cid, indices_to_mask(indices))[0])
    if len(by_node) > 1:
        if domain is None:
            bw = table.bandwidth
            rings.append(bw.network_gbps if len(blocks) == 1 else bw.cross_block_gbps)
        else:
            rings.append(min(_best_nvlink(table, node) for node in by_node))
    return float(min(rings)) if rings else 0.0


def _best_nvlink(table: NodeTable, node: str) -> float:
    """Inside one NVLink domain, nodes reach each other at their GPUs' NVLink rate."""
    entry = table.entry(node)
    tc = table.registry.classes[entry.cid]
    bw = tc.wiring.bw
    nv = bw[tc.wiring.nvlink]
    return float(nv.max()) if nv.size else float(bw.max())


def protected_slots(table: NodeTable, waiting: Sequence[PlacementRequest]) -> NDArray[np.bool_]:
    out = np.zeros(table.slot_count, dtype=np.bool_)
    for gang in waiting:
        if gang.tasks <= 1 or gang.mig_profile is not None:
            continue
        cap = _capacity(table, gang, requested_slots(table, gang))
        group = _choose_group(table, cap, gang.tasks, out)
        if group is not None and group[1] is not None:
            out[np.asarray(group[0], dtype=np.int64)] = True
    return out
