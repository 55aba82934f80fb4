"""Placing a share of one GPU (``gpu_fraction``).

Rules, in order:

1. a GPU that already holds shares and has room, before any whole free GPU:
   sharing fills shared GPUs first, so whole GPUs stay whole for whole-GPU
   jobs (the point of FGD's result on the Alibaba trace);
2. among those, the tightest fit (the least room left afterwards), then the
   node added first and the lowest GPU: best fit keeps the larger remainders
   for larger shares;
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
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from placement.analysis import requested_slots
from placement.eligibility import gpu_eligible, labels_ok, region_ok
from placement.outcome import Outcome, Placement, ScoreParts, TaskPlacement
from placement.request import PlacementRequest
from placement.task_builder import build_task

if TYPE_CHECKING:
    from placement.cluster import ClusterState

FULL = 1000


def place_share(
    state: ClusterState, request: PlacementRequest, waiting: Sequence[PlacementRequest]
) -> Outcome:
    milli = request.share_milli
    found = _shared_gpu(state, request, milli)
    if found is not None:
        slot, gpu, room = found
        task = _share_task(state, slot, gpu, request, room - milli)
        if task is not None:
            return _placed(task)
    whole = request.model_copy(update={"gpu_fraction": None})
    outcome = state.place(whole, waiting)
    if outcome.placement is None:
        return outcome
    task = outcome.placement.tasks[0]
    shared = dataclasses.replace(
        task,
        gpu_fraction=request.gpu_fraction,
        reason=f"{milli}/1000 of {task.reason} (a whole GPU opened for sharing)",
    )
    return _placed(shared)


def _shared_gpu(
    state: ClusterState, request: PlacementRequest, milli: int
) -> tuple[int, int, int] | None:
    """(slot, GPU index, room before) of the tightest shared GPU with room, or None."""
    if not state.shared:
        return None
    slots = requested_slots(state, request)
    ok = np.zeros(state.slot_count, dtype=np.bool_)
    ok[slots] = True
    ok &= state.available[: state.slot_count] & state.present[: state.slot_count]
    if request.regions:
        ok &= region_ok(state, request.regions)
    if request.node_labels:
        ok &= labels_ok(state, request.node_labels)
    usable = gpu_eligible(state, request) & state.healthy[: state.slot_count]
    best: tuple[int, int, int] | None = None
    best_room = FULL + 1
    for slot in sorted(state.shared):
        if not ok[slot]:
            continue
        mask = int(usable[slot])
        for gpu, held in sorted(state.shared[slot].items()):
            room = FULL - held
            if milli <= room < best_room and mask >> gpu & 1:
                best, best_room = (slot, gpu, room), room
    return best


def _share_task(
    state: ClusterState, slot: int, gpu: int, request: PlacementRequest, room_after: int
) -> TaskPlacement | None:
    entry = state.entry_at(slot)
    parts = ScoreParts(
        ring_gbps=0.0,
        pair_sum_gbps=0.0,
        bandwidth=1.0,
        fragmentation=1.0,  # no whole GPU is taken: the node can serve what it could
        numa_nodes=1 if entry.snapshot.gpus[gpu].numa_node is not None else 0,
        free_after=int(state.free[slot]).bit_count(),
    )
    task = build_task(state, slot, 1 << gpu, request, 0, parts)
    if task is None:
        return None
    return dataclasses.replace(
        task,
        gpu_fraction=request.gpu_fraction,
        reason=f"{request.share_milli}/1000 of shared GPU {gpu} on {task.node}"
        f" ({room_after}/1000 left on it); {task.score.free_after} whole GPUs left free",
    )


def _placed(task: TaskPlacement) -> Outcome:
    placement = Placement(tasks=(task,), ring_gbps=0.0, reason=task.reason)
    return Outcome(status="placed", placement=placement)
