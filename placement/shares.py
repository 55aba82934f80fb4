"""Placing a share of one GPU (``gpu_fraction``).

Rules, in order:

1. a GPU that already holds shares and has room, before any whole free GPU:
   sharing fills shared GPUs first, so whole GPUs stay whole for whole-GPU
   jobs (the point of FGD's result on the Alibaba trace);
2. among those, with host figures (``cpu_milli``, ``memory_mib``), only nodes
   whose known free host CPU and memory hold the task, the fewest GPUs
   stranded for want of host room first (``placement.host``); then the
   tightest fit (the least room left afterwards), then the node added first
   and the lowest GPU: best fit keeps the larger remainders for larger shares;
3. otherwise a whole free GPU, chosen exactly as a 1-GPU job's (the node
   ranking, then the GPU whose loss costs the node least: no free NVLink
   pair is broken when another GPU would do); it becomes a shared GPU.

A GPU a whole-GPU job holds is never shared, and a shared GPU is never given
whole: its bit counts as busy for whole-GPU requests until its last share
goes. Shares are thousandths of a GPU (the trace's ``gpu_milli``); several
shares of one GPU sum to at most 1000. What enforces a share on the node
(MPS, HAMi-style limits) is not the engine's business.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from placement.analysis import requested_slots
from placement.eligibility import gpu_eligible, labels_ok, region_ok
from placement.host import free_room, stranded_added
from placement.outcome import Outcome, Placement, ScoreParts, TaskPlacement
from placement.request import PlacementRequest
from placement.table import NodeTable
from placement.task_builder import build_task

FULL = 1000


def on_shared_gpu(table: NodeTable, request: PlacementRequest) -> Outcome | None:
    """Rules 1 and 2: the share on the tightest shared GPU with room, or None.

    Rule 3 (a whole free GPU) is ``decide``'s: it places ``whole_gpu(request)``
    as any 1-GPU request and hands the outcome to ``opened_for_sharing``.
    """
    milli = request.share_milli
    # Best first, on to the next where the CPUs asked are not there: stopping at the
    # first opened a whole GPU while another shared GPU had room (rule 1 broken).
    for slot, gpu, room in _shared_gpus(table, request, milli):
        task = _share_task(table, slot, gpu, request, room - milli)
        if task is not None:
            return _placed(task)
    return None


def held(request: PlacementRequest) -> float:
    """The share the task is told it holds: what is counted (thousandths, rounded up),
    so that the fractions a GPU's shares are told sum to at most one GPU."""
    return request.share_milli / FULL


def whole_gpu(request: PlacementRequest) -> PlacementRequest:
    """The share's request for one whole GPU (rule 3)."""
    return request.model_copy(update={"gpu_fraction": None})


def opened_for_sharing(request: PlacementRequest, outcome: Outcome) -> Outcome:
    """The whole GPU ``outcome`` placed, turned into the share's task on it."""
    if outcome.placement is None:
        return outcome
    task = outcome.placement.tasks[0]
    shared = dataclasses.replace(
        task,
        gpu_fraction=held(request),
        reason=f"{request.share_milli}/1000 of {task.reason} (a whole GPU opened for sharing)",
    )
    return _placed(shared)


def _shared_gpus(
    table: NodeTable, request: PlacementRequest, milli: int
) -> Iterator[tuple[int, int, int]]:
    """(slot, GPU index, room before) of each shared GPU with room, best first: the
    fewest GPUs stranded, the tightest fit, then the node added first, the lowest GPU."""
    if not table.shared:
        return
    slots = requested_slots(table, request)
    ok = np.zeros(table.slot_count, dtype=np.bool_)
    ok[slots] = True
    ok &= table.available[: table.slot_count] & table.present[: table.slot_count]
    if request.regions:
        ok &= region_ok(table, request.regions)
    if request.node_labels:
        ok &= labels_ok(table, request.node_labels)
    usable = gpu_eligible(table, request) & table.healthy[: table.slot_count]
    stranded = _stranded(table, request, ok) if request.counts_host else None
    found: list[tuple[int, int, int, int, int]] = []  # (lost, room): the key; slot, GPU, room
    for slot in sorted(table.shared):
        if not ok[slot]:
            continue
        mask = int(usable[slot])
        lost = 0 if stranded is None else round(float(stranded[slot]))
        for gpu, held in table.shared[slot].items():
            room = FULL - held
            if milli <= room and mask >> gpu & 1:
                found.append((lost, room, slot, gpu, room))
    # The first is found in one pass; the rest are sorted only when it cannot be used.
    if not found:
        return
    first = min(found)
    yield first[2], first[3], first[4]
    for _, _, slot, gpu, room in sorted(found):
        if (slot, gpu) != (first[2], first[3]):
            yield slot, gpu, room


def _stranded(table: NodeTable, request: PlacementRequest, ok: np.ndarray) -> np.ndarray:
    """Per slot, the GPUs a share strands there (no whole GPU is taken); slots whose
    known free host room is short are cleared from ``ok`` (see analysis._host)."""
    n = table.slot_count
    cpu, memory = request.cpu_milli or 0, request.memory_mib or 0
    cpu_free = free_room(table.host_cpu_cap[:n], table.host_cpu_used[:n])
    memory_free = free_room(table.host_memory_cap[:n], table.host_memory_used[:n])
    ok &= (cpu_free >= cpu) & (memory_free >= memory)
    gpus = np.bitwise_count(table.free[:n]) + table.share_room[:n] / FULL
    added: np.ndarray = stranded_added(
        gpus,
        request.share_milli / FULL,
        cpu_free,
        memory_free,
        cpu,
        memory,
        table.host_mix.per_gpu(),
    )
    return added


def _share_task(
    table: NodeTable, slot: int, gpu: int, request: PlacementRequest, room_after: int
) -> TaskPlacement | None:
    entry = table.entry_at(slot)
    parts = ScoreParts(
        ring_gbps=0.0,
        pair_sum_gbps=0.0,
        bandwidth=1.0,
        fragmentation=1.0,  # no whole GPU is taken: the node can serve what it could
        numa_nodes=1 if entry.snapshot.gpus[gpu].numa_node is not None else 0,
        free_after=int(table.free[slot]).bit_count(),
    )
    task = build_task(table, slot, 1 << gpu, request, 0, parts)
    if task is None:
        return None
    return dataclasses.replace(
        task,
        gpu_fraction=held(request),
        reason=f"{request.share_milli}/1000 of shared GPU {gpu} on {task.node}"
        f" ({room_after}/1000 left on it); {task.score.free_after} whole GPUs left free",
    )


def _placed(task: TaskPlacement) -> Outcome:
    placement = Placement(tasks=(task,), ring_gbps=0.0, reason=task.reason)
    return Outcome(status="placed", placement=placement)
