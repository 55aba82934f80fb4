"""Every requested node's verdict as arrays, for schedulers that ask per node.

kube-scheduler's extender asks "which of these N nodes can take this pod, and
how good is each" for every pod, with N up to the whole cluster. Building a
full TaskPlacement (UUIDs, cpuset, reason text) for each of 10,000 nodes
would cost tens of milliseconds; a screen answers from the vectorised
analysis alone: fits or the cause, a 0..100 score, the rank among the nodes
that fit and the exact GPU set each would give (a bit mask over the node's
GPU list). Turning one node's answer into a TaskPlacement is
``ClusterState.place`` with ``nodes=[name]`` when the caller commits to it.

Only whole-GPU, single-task requests are screened; MIG and gangs go through
``ClusterState.evaluate``. The NUMA CPU rule (``cpus_per_task``) is checked
when a task is built, not here: a node the screen passes can still be
refused for CPUs at placement, never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from placement.analysis import CAUSES, FITS, analyse, requested_slots, unknown_names
from placement.explain import cause_message
from placement.node_choice import mask_to_indices
from placement.outcome import Cause
from placement.ranking import best_of, rank_order, rank_words, scores
from placement.request import PlacementRequest
from placement.table import NodeTable


@dataclass(frozen=True)
class NodeScreen:
    """Index i describes node ``names[i]``; requested names never reported are in ``unknown``."""

    slots: NDArray[np.int64]  # the cluster slot of each node
    slot_names: list[str]  # the cluster's slot names when screened (a copy: slots get reused)
    fits: NDArray[np.bool_]
    score: NDArray[np.float64]  # 0..100 where the node fits, 0 elsewhere
    rank: NDArray[np.int64]  # 1 = best among the nodes that fit, 0 where it does not fit
    # Every node the ranking cannot tell from the best one (equal on every rank key):
    # the best by slot order is only the first of them.
    tied_best: NDArray[np.bool_]
    masks: NDArray[np.int64]  # the GPU set each fitting node would give, over its GPU list
    cause_codes: NDArray[np.int64]
    unknown: tuple[str, ...]

    @cached_property
    def names(self) -> tuple[str, ...]:
        # Built on demand: callers that want only the fitting nodes' names (names_at) skip
        # a tuple of every candidate, 10,000 of them for a large scheduler call.
        return tuple(self.names_at(np.arange(self.slots.size)))

    def names_at(self, indices: NDArray[np.int64]) -> list[str]:
        """The names of the nodes at ``indices`` (into this screen), in that order."""
        return list(map(self.slot_names.__getitem__, self.slots[indices].tolist()))

    def cause(self, index: int) -> Cause | None:
        code = int(self.cause_codes[index])
        return None if code == FITS else CAUSES[code]

    def gpu_indices(self, index: int) -> tuple[int, ...]:
        return mask_to_indices(int(self.masks[index])) if self.fits[index] else ()

    def message(self, index: int, request: PlacementRequest) -> str:
        """Why node ``index`` cannot take the request, as a person reads it ('' if it can)."""
        cause = self.cause(index)
        return "" if cause is None else cause_message(cause, request)


def screen(table: NodeTable, request: PlacementRequest, full_rank: bool = True) -> NodeScreen:
    """``full_rank=False`` ranks only the best node (1; every other 0): the callers that
    want just "which one is best" skip sorting every node that fits."""
    if request.mig_profile is not None or request.tasks != 1:
        raise ValueError("screen() answers single-task whole-GPU requests; use evaluate()")
    slots = requested_slots(table, request)
    analysis = analyse(table, request, request.gpus, slots)
    fits = analysis.fits()
    where = np.flatnonzero(fits)
    score = np.zeros(slots.size, dtype=np.float64)
    rank = np.zeros(slots.size, dtype=np.int64)
    tied = np.zeros(slots.size, dtype=np.bool_)
    if where.size:
        protected = np.zeros(table.slot_count, dtype=np.bool_)
        inputs = analysis.rank_inputs(fits, table, protected)
        score[where] = scores(inputs, request)
        words = rank_words(inputs, request)
        if full_rank:
            order = rank_order(inputs, request)
            rank[where[order]] = np.arange(1, where.size + 1)
            best = int(order[0])
        else:
            best = best_of(words, np.arange(where.size))
            rank[where[best]] = 1
        same = np.ones(where.size, dtype=np.bool_)
        for word in words:
            same &= word == word[best]
        tied[where[same]] = True
    unknown: tuple[str, ...] = ()
    if request.nodes is not None and slots.size < len(request.nodes):
        unknown = unknown_names(table, request)
    return NodeScreen(
        slots=slots,
        slot_names=list(table.slot_names),
        fits=fits,
        score=score,
        rank=rank,
        tied_best=tied,
        masks=analysis.chosen,
        cause_codes=analysis.cause,
        unknown=unknown,
    )
