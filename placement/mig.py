"""MIG: a task gets one free MIG instance of the requested profile.

Instances are created by the operator (e.g. with a MIG partition manager);
the engine chooses among the ones a node reports. Inside a node it keeps the
largest free slice runs whole: it prefers the instance after whose
allocation its GPU still has the longest run of free slices, then the GPU
with the fewest free slices (fill partly used GPUs first), then the lowest
slice. Across nodes ``pack`` prefers the node with the fewest free slices
left, ``spread`` the most. A gang of MIG tasks is all or nothing.

``gpu_models`` and ``min_gpu_memory_mib`` are read of an instance's GPU, as for
whole GPUs; ``cpus_per_task`` reserves CPUs near it (placement.numa), counting
those the gang's earlier tasks on the node take; ``cpu_milli`` and
``memory_mib`` need the node's free host room (placement.host), the gang's
earlier tasks on the node counted, and the task holds them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from placement.capacity import refuse
from placement.eligibility import gpu_eligible, model_matches
from placement.explain import refusal
from placement.host import free_room
from placement.node_entry import NodeEntry
from placement.numa import CpuChoice, choose_cpus, gpus_beside_free_cpus
from placement.outcome import Cause, NodeVerdict, Outcome, Placement, ScoreParts, TaskPlacement
from placement.request import PlacementRequest
from placement.snapshot import Health, MigInstance
from placement.table import NodeTable


@dataclass
class _Plan:
    """Per node, what the request's earlier tasks took: instances (with the node's own
    holds), CPUs, and how many tasks."""

    held: dict[str, set[str]] = field(default_factory=dict)
    cpus: dict[str, set[int]] = field(default_factory=dict)
    tasks: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class _Pick:
    instance: MigInstance
    key: tuple[int, int, int, int]  # smaller is better
    free_slices_after: int


def _longest_run(free: list[bool]) -> int:
    best = run = 0
    for ok in free:
        run = run + 1 if ok else 0
        best = max(best, run)
    return best


def _free_slices(entry: NodeEntry, held: set[str]) -> dict[int, list[bool]]:
    """Each MIG GPU's slices, True where free (no held or unhealthy instance covers it).

    One walk over the node's instances for all its GPUs: walking them again for
    each candidate instance was quadratic (4,032 instances on one report made a
    /place take 2.6 s; 0.1 s read once)."""
    ends: dict[int, int] = {}
    busy: dict[int, list[tuple[int, int]]] = {}
    for inst in entry.snapshot.mig_instances:
        gpu, start, end = (
            inst.parent_gpu,
            inst.placement_start,
            inst.placement_start + inst.placement_size,
        )
        ends[gpu] = max(ends.get(gpu, 0), end)
        if inst.uuid in held or inst.health is not Health.HEALTHY:
            busy.setdefault(gpu, []).append((start, end))
    free = {gpu: [True] * end for gpu, end in ends.items()}
    for gpu, spans in busy.items():
        for start, end in spans:
            free[gpu][start:end] = [False] * (end - start)
    return free


def best_instance(
    entry: NodeEntry, profile: str, held: set[str], accepted: int = -1
) -> _Pick | None:
    """``accepted``: mask of the GPUs whose instances may be given (-1: all)."""
    snap = entry.snapshot
    free_by_gpu = _free_slices(entry, held)
    picks: list[_Pick] = []
    for inst in snap.mig_instances:
        gpu = snap.gpus[inst.parent_gpu]
        if inst.profile != profile or inst.uuid in held or inst.health is not Health.HEALTHY:
            continue
        if not accepted >> inst.parent_gpu & 1:
            continue
        if gpu.health is not Health.HEALTHY or _held_whole_or_shared(entry, gpu.uuid):
            continue
        free = free_by_gpu[inst.parent_gpu]
        after = list(free)
        after[inst.placement_start : inst.placement_start + inst.placement_size] = [
            False
        ] * inst.placement_size
        key = (-_longest_run(after), sum(free), inst.parent_gpu, inst.placement_start)
        picks.append(_Pick(inst, key, sum(after)))  # its GPU's free slices once taken
    if not picks:
        return None
    best = min(picks, key=lambda p: p.key)
    chosen_gpu = best.instance.parent_gpu
    total_free = sum(
        best.free_slices_after if g.index == chosen_gpu else sum(free_by_gpu.get(g.index, ()))
        for g in snap.gpus
        if g.mig_enabled and not _held_whole_or_shared(entry, g.uuid)
    )
    return _Pick(best.instance, best.key, total_free)


def _held_whole_or_shared(entry: NodeEntry, gpu_uuid: str) -> bool:
    """A GPU an allocation holds whole or in shares, reported since in MIG mode: none of
    its instances is free (the jobs on it hold the GPU; the store cannot tell, as MIG
    holds name instances and those name the GPU)."""
    return gpu_uuid in entry.busy or gpu_uuid in entry.shares


def _static_cause(
    table: NodeTable, entry: NodeEntry, request: PlacementRequest, accepted: int
) -> Cause | None:
    snap = entry.snapshot
    if request.regions and snap.region not in request.regions:
        return Cause.REGION
    if any(snap.labels.get(k) != v for k, v in request.node_labels.items()):
        return Cause.LABELS
    parents = {i.parent_gpu for i in snap.mig_instances if i.profile == request.mig_profile}
    if not parents:
        return Cause.NO_MIG_PROFILE
    if not any(accepted >> gpu & 1 for gpu in parents):
        models = int(model_matches(table, request)[entry.slot])
        return Cause.GPU_MEMORY if any(models >> gpu & 1 for gpu in parents) else Cause.GPU_MODEL
    if request.cpus_per_task and int(table.cpu_count[entry.slot]) < request.cpus_per_task:
        return Cause.TOO_FEW_CPUS
    if not entry.available:
        return Cause.UNAVAILABLE
    return None


def _candidates(table: NodeTable, request: PlacementRequest) -> list[NodeEntry]:
    names = request.nodes if request.nodes is not None else table.names()
    skip = set(request.exclude_nodes)
    return [table.entries[n] for n in dict.fromkeys(names) if n in table.entries and n not in skip]


Option = tuple[tuple[int, ...], NodeEntry, _Pick, CpuChoice | None]


def _assess(
    table: NodeTable, request: PlacementRequest, plan: _Plan
) -> tuple[list[Option], list[tuple[NodeEntry, Cause]]]:
    """Every candidate node's best instance with its rank key (smaller first) and its CPUs
    (None where none are asked), or its cause."""
    profile = request.mig_profile or ""
    eligible = gpu_eligible(table, request)
    options: list[Option] = []
    refused: list[tuple[NodeEntry, Cause]] = []
    for entry in _candidates(table, request):
        accepted = int(eligible[entry.slot])
        cause = _static_cause(table, entry, request, accepted)
        if cause is None and not _host_fits(table, entry.slot, request, plan.tasks[entry.name]):
            cause = Cause.HOST
        pick = None
        cpus = None
        if cause is None:
            # Whole and shared holds too: an instance whose UUID a GPU hold has (an
            # earlier report listed it as a GPU) is that held device.
            taken = plan.held.setdefault(entry.name, entry.held_any_way())
            pick, cpus, cause = _pick_with_cpus(
                entry, request, profile, taken, accepted, plan.cpus.get(entry.name, set())
            )
        if pick is None:
            refused.append((entry, cause or Cause.NO_FREE_MIG))
            continue
        after = pick.free_slices_after
        order = (after if request.policy == "pack" else -after, *pick.key)
        options.append(((*order, entry.slot), entry, pick, cpus))
    options.sort(key=lambda option: option[0])
    return options, refused


def _host_fits(table: NodeTable, slot: int, request: PlacementRequest, planned: int) -> bool:
    """Whether the node's known free host room holds one more task of the request, its
    ``planned`` earlier ones on the node counted (as placement.analysis does)."""
    if not request.counts_host:
        return True
    cpu, memory = request.cpu_milli or 0, request.memory_mib or 0
    at = slice(slot, slot + 1)
    cpu_free = float(free_room(table.host_cpu_cap[at], table.host_cpu_used[at])[0])
    memory_free = float(free_room(table.host_memory_cap[at], table.host_memory_used[at])[0])
    return cpu_free - planned * cpu >= cpu and memory_free - planned * memory >= memory


def _pick_with_cpus(
    entry: NodeEntry,
    request: PlacementRequest,
    profile: str,
    taken: set[str],
    accepted: int,
    planned_cpus: set[int],
) -> tuple[_Pick | None, CpuChoice | None, Cause | None]:
    """The node's best instance and the CPUs its task reserves, or why there is none: an
    instance free but without the CPUs asked beside it is refused for CPUs."""
    if not request.cpus_per_task:
        pick = best_instance(entry, profile, taken, accepted)
        return pick, None, None if pick is not None else Cause.NO_FREE_MIG
    snap = entry.snapshot
    used = entry.used_cpus | planned_cpus
    near = accepted
    if request.numa == "required":  # only GPUs whose own NUMA node has the CPUs
        near &= gpus_beside_free_cpus(snap, request.cpus_per_task, used)
    pick = best_instance(entry, profile, taken, near)
    if pick is not None:
        parent = (pick.instance.parent_gpu,)
        cpus = choose_cpus(snap, parent, request.cpus_per_task, used, request.numa)
        if cpus is not None:
            return pick, cpus, None
    if best_instance(entry, profile, taken, accepted) is None:
        return None, None, Cause.NO_FREE_MIG
    return None, None, Cause.CPUS


def _task(
    entry: NodeEntry, pick: _Pick, task: int, cpus: CpuChoice | None, request: PlacementRequest
) -> TaskPlacement:
    inst = pick.instance
    gpu = entry.snapshot.gpus[inst.parent_gpu]
    numa: tuple[int, ...] = (gpu.numa_node,) if gpu.numa_node is not None else ()
    cpuset = entry.snapshot.numa_cpuset(numa)
    if cpus is not None:
        numa, cpuset = cpus.numa_nodes, cpus.cpuset
    parts = ScoreParts(
        ring_gbps=0.0,
        pair_sum_gbps=0.0,
        bandwidth=1.0,
        fragmentation=1.0,
        numa_nodes=len(numa),
        free_after=pick.free_slices_after,
    )
    return TaskPlacement(
        task=task,
        node=entry.name,
        gpu_indices=(gpu.index,),
        gpu_uuids=(gpu.uuid,),
        mig_uuids=(inst.uuid,),
        cpuset=cpuset,
        cpus=() if cpus is None else cpus.cpus,
        numa_nodes=numa,
        islands=(entry.island_of[gpu.index],),
        nvlink_connected=True,
        score=parts,
        reason=(
            f"MIG {inst.profile} at slice {inst.placement_start} of GPU {gpu.index}"
            f" on {entry.name}; {pick.free_slices_after} free slices left on the node"
        ),
        cpu_milli=request.cpu_milli or 0,
        memory_mib=request.memory_mib or 0,
    )


def place_mig(table: NodeTable, request: PlacementRequest) -> Outcome:
    """Tasks one by one, each on the best node at that point; all or nothing."""
    plan = _Plan()
    options, refused = _assess(table, request, plan)
    causes = Counter(cause for _, cause in refused)
    tasks: list[TaskPlacement] = []
    while options and len(tasks) < request.tasks:
        _, entry, pick, cpus = options[0]
        plan.held[entry.name].add(pick.instance.uuid)
        if cpus is not None:
            plan.cpus.setdefault(entry.name, set()).update(cpus.cpus)
        plan.tasks[entry.name] += 1
        tasks.append(_task(entry, pick, len(tasks), cpus, request))
        options, _ = _assess(table, request, plan)
    if len(tasks) < request.tasks:
        if tasks:
            causes[Cause.GANG] += 1
        return refuse(table, request, causes)
    profile = request.mig_profile
    reason = (
        tasks[0].reason
        if len(tasks) == 1
        else f"{len(tasks)} MIG {profile} instances: " + "; ".join(t.reason for t in tasks)
    )
    return Outcome(
        status="placed", placement=Placement(tasks=tuple(tasks), ring_gbps=0.0, reason=reason)
    )


def mig_verdicts(table: NodeTable, request: PlacementRequest) -> list[NodeVerdict]:
    options, refused = _assess(table, request, _Plan())
    total = len(options)
    ranked = [
        NodeVerdict(
            node=entry.name,
            fits=True,
            rank=i + 1,
            score=round(100.0 * (total - i) / total, 3),
            task=_task(entry, pick, 0, cpus, request),
        )
        for i, (_, entry, pick, cpus) in enumerate(options)
    ]
    return ranked + [refusal(entry.name, cause, request) for entry, cause in refused]
