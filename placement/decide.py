"""From a request to an outcome: dispatch and the single-task case."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from placement.analysis import CAUSES, Analysis, analyse, requested_slots, unknown_names
from placement.capacity import refuse
from placement.explain import refusal
from placement.fast_path import fast_place
from placement.gang import place_gang, protected_slots
from placement.mig import mig_verdicts, place_mig
from placement.outcome import Cause, NodeVerdict, Outcome, Placement, TaskPlacement
from placement.ranking import best_of, rank_order, rank_words, scores
from placement.request import PlacementRequest
from placement.shape_cache import shape_key
from placement.shares import on_shared_gpu, opened_for_sharing, whole_gpu
from placement.table import FULL_SHARE, NodeTable
from placement.task_builder import build_task, score_parts


def decide(
    table: NodeTable,
    request: PlacementRequest,
    waiting: Sequence[PlacementRequest],
    need: float | None = None,
) -> Outcome:
    """``need``: the GPU capacity the task takes where it is not its whole GPUs (a
    share opening a whole GPU), for the host term (placement.host)."""
    if request.mig_profile is not None:
        return place_mig(table, request)
    if request.gpu_fraction is not None:
        shared = on_shared_gpu(table, request)
        if shared is not None:
            return shared
        need = request.share_milli / FULL_SHARE
        return opened_for_sharing(request, decide(table, whole_gpu(request), waiting, need))
    # The hot path caches each node's answer per request shape; host figures make it
    # depend on every node's host use and the observed mix too, and model pressure on the
    # demand seen (placement.model_demand), so those take the full path.
    fast = not request.counts_host and not table.model_demand.active
    if request.tasks == 1 and not waiting and fast:
        task = fast_place(table, request)
        if task is not None:
            return placed_one(task)
    protected = protected_slots(table, waiting)
    if request.tasks > 1:
        return place_gang(table, request, protected)
    slots = requested_slots(table, request)
    analysis = analyse(table, request, request.gpus, slots, need=need)
    fits = analysis.fits()
    where = np.flatnonzero(fits)
    if where.size:
        inputs = analysis.rank_inputs(fits, table, protected)
        words = rank_words(inputs, request)
        remaining = np.arange(where.size, dtype=np.int64)
        while remaining.size:
            best = best_of(words, remaining)
            index = int(where[best])
            task = task_at(table, analysis, index, request, 0)
            if task is not None:
                return placed_one(task)
            analysis.set_cause(index, Cause.CPUS)
            remaining = remaining[remaining != best]
    return refuse(table, request, analysis.cause_counts())


def placed_one(task: TaskPlacement) -> Outcome:
    placement = Placement(tasks=(task,), ring_gbps=task.score.ring_gbps, reason=task.reason)
    return Outcome(status="placed", placement=placement)


def ranked(
    table: NodeTable, analysis: Analysis, request: PlacementRequest, protected: np.ndarray
) -> list[tuple[int, float]]:
    """(index into analysis, 0..100 score) of fitting nodes, best first."""
    fits = analysis.fits()
    where = np.flatnonzero(fits)
    if not where.size:
        return []
    inputs = analysis.rank_inputs(fits, table, protected)
    order = rank_order(inputs, request)
    summary = scores(inputs, request)
    return list(zip(where[order].tolist(), summary[order].tolist(), strict=True))


def task_at(
    table: NodeTable, analysis: Analysis, index: int, request: PlacementRequest, task: int
) -> TaskPlacement | None:
    slot = int(analysis.slots[index])
    return build_task(
        table, slot, int(analysis.chosen[index]), request, task, score_parts(analysis, index)
    )


def task_table(
    table: NodeTable, request: PlacementRequest
) -> dict[int, tuple[int, int, TaskPlacement | None]]:
    """slot -> (slot version, GPU mask, task) remembered for the request's shape
    (see verdict_rows); bounded by the shapes kept, each by the slots."""
    shapes = table.task_cache
    # The shape leaves the CPUs asked out (they do not change the GPU set chosen), but
    # the task reserves them: a task built for 4 CPUs is no answer to a request for 0.
    key = (*shape_key(request), request.cpus_per_task)
    tasks = shapes.get(key)
    if tasks is None:
        if len(shapes) >= MAX_TASK_SHAPES:
            shapes.pop(next(iter(shapes)))  # the oldest shape goes
        tasks = shapes[key] = {}
    return tasks


Row = TypeVar("Row")
MAX_TASK_SHAPES = 64


def verdicts(table: NodeTable, request: PlacementRequest) -> list[NodeVerdict]:
    """Per requested node: fits (with the task it would get, rank, score) or why not."""
    if request.mig_profile is not None:
        return mig_verdicts(table, request)

    def fit(node: str, rank: int, score: float, task: TaskPlacement) -> NodeVerdict:
        return NodeVerdict(node=node, fits=True, rank=rank, score=score, task=task)

    def refused(node: str, cause: Cause) -> NodeVerdict:
        whole = None
        if cause is Cause.MIG_MODE:
            whole = table.entry_at(table.slot_of[node]).potential.bit_count()
        return refusal(node, cause, request, whole)

    return verdict_rows(table, request, fit, refused)


def verdict_rows(
    table: NodeTable,
    request: PlacementRequest,
    fit: Callable[[str, int, float, TaskPlacement], Row],
    refused: Callable[[str, Cause], Row],
) -> list[Row]:
    """``verdicts`` for whole-GPU requests, each verdict made by the caller's function:
    best first ``fit(node, rank, score, task)``, then ``refused(node, cause)``.

    A service answering /score for hundreds of nodes builds its rows
    directly instead of building a NodeVerdict per node and converting it.
    """
    if request.mig_profile is not None:
        raise ValueError("verdict_rows() answers whole-GPU requests; use verdicts() for MIG")
    analysis = analyse(table, request, request.gpus, requested_slots(table, request))
    protected = np.zeros(table.slot_count, dtype=np.bool_)
    out: list[Row] = []
    rank = 0
    # The task a node would give depends only on the node's state (its slot
    # version), the set chosen and the request's shape: a scheduler scoring
    # pod after pod against the same nodes gets the tasks built last time for
    # every node that has not changed since.
    remembered = task_table(table, request)
    best_first = ranked(table, analysis, request, protected)
    indices = np.asarray([index for index, _ in best_first], dtype=np.int64)
    slots = analysis.slots[indices]
    for (index, score), slot, mask, version in zip(
        best_first,
        slots.tolist(),
        analysis.chosen[indices].tolist(),
        table.slot_version[slots].tolist(),
        strict=True,
    ):
        hit = remembered.get(slot)
        if hit is not None and hit[0] == version and hit[1] == mask:
            task = hit[2]
        else:
            task = task_at(table, analysis, index, request, 0)
            remembered[slot] = (version, mask, task)
        if task is None:
            analysis.set_cause(index, Cause.CPUS)
            continue
        rank += 1
        out.append(fit(task.node, rank, score, task))
    unfit = np.flatnonzero(~analysis.fits())
    slot_names = table.slot_names
    for slot, code in zip(
        analysis.slots[unfit].tolist(), analysis.cause[unfit].tolist(), strict=True
    ):
        out.append(refused(slot_names[slot], CAUSES[code]))
    out += [refused(name, Cause.NOT_REGISTERED) for name in unknown_names(table, request)]
    return out
