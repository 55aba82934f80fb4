"""Topology classes and the cache of per-node answers.

Every exact topology class owns a contiguous range of a flat "state" space:
state = offset[class] + free_mask. The best set for a (query, state) pair
never changes, so answers are memoised in one int64 array per query, indexed
by state (UNKNOWN until first asked). Scoring a 10,000-node cluster is then
one gather plus the few states nobody asked about before.

Cost, stated on purpose: an answer table costs 8 bytes per state (2 KB for
an 8-GPU class, 512 KB for a 16-GPU one) per distinct query shape; there
are few shapes (k x locality x NUMA x objective) in practice.

Contract: not thread-safe for writers. ``class_for`` may add a class and
must be called by the single writer; ``choose`` only fills caches with
values that are a pure function of their key, so concurrent readers under
the GIL at worst compute the same entry twice. ``prepare`` changes nothing
and may run beside anything: a new design's tables (0.6 s for 16 GPUs) are
built there, outside whatever the caller serializes writers with, and
``class_for`` then only installs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from placement.bandwidth import BandwidthTable
from placement.large_node import LargeClass
from placement.node_choice import NO_SET, SetQuery, best_set
from placement.snapshot import NodeSnapshot
from placement.topology_class import (
    EXACT_LIMIT,
    TopologyClass,
    Wiring,
    build_class,
    wiring_of,
)
from placement.what_is_left import DEFAULT_SIZE_MIX

UNKNOWN = -2

AnyClass = TopologyClass | LargeClass


@dataclass(frozen=True, eq=False)
class Design:
    """A snapshot's design worked out by ``ClassRegistry.prepare``, nothing changed."""

    snapshot: NodeSnapshot  # the very snapshot it was worked out for
    key: str
    built: AnyClass | None  # None: the registry had the design when prepared
    bandwidth: BandwidthTable
    size_mix: Mapping[int, float]


class ClassRegistry:
    def __init__(
        self, bandwidth: BandwidthTable, size_mix: Mapping[int, float] = DEFAULT_SIZE_MIX
    ) -> None:
        self.bandwidth = bandwidth
        self.size_mix = dict(size_mix)
        self.classes: list[AnyClass] = []
        self._by_key: dict[str, int] = {}
        self.offsets = np.zeros(0, dtype=np.int64)  # -1 for large classes
        self._exact_offsets: list[int] = []  # sorted offsets of exact classes
        self._exact_ids: list[int] = []
        self._size = 0
        self.ring = np.zeros(0)
        self.pair = np.zeros(0)
        self.capability = np.zeros(0)
        self.connected = np.zeros(0, dtype=np.bool_)
        self.numa_span = np.zeros(0, dtype=np.int8)
        self._answers: dict[SetQuery, NDArray[np.int64]] = {}

    def prepare(self, snapshot: NodeSnapshot) -> Design:
        """The snapshot's design key, and its class built when this registry lacks it.
        Changes nothing: reading ``_by_key`` beside a writer at worst builds a class
        the writer has just added (``class_for`` then keeps the one it has)."""
        wiring = wiring_of(snapshot, self.bandwidth)
        key = wiring.key()
        built = None if key in self._by_key else self._build(key, wiring)
        return Design(snapshot, key, built, self.bandwidth, dict(self.size_mix))

    def class_for(self, snapshot: NodeSnapshot, design: Design | None = None) -> int:
        """The class id of a snapshot's design, added when new: from ``design`` when it
        was prepared for this snapshot and this registry's bandwidth and size mix,
        built here otherwise."""
        if design is not None and not self._fits(snapshot, design):
            design = None
        if design is not None:
            found = self._by_key.get(design.key)
            if found is not None:
                return found
            if design.built is not None:
                return self._add(design.key, design.built)
        wiring = wiring_of(snapshot, self.bandwidth)
        key = wiring.key()
        found = self._by_key.get(key)
        if found is not None:
            return found
        return self._add(key, self._build(key, wiring))

    def knows(self, key: str) -> bool:
        return key in self._by_key

    def _fits(self, snapshot: NodeSnapshot, design: Design) -> bool:
        return (
            design.snapshot is snapshot
            and design.bandwidth == self.bandwidth
            and design.size_mix == self.size_mix
        )

    def _build(self, key: str, wiring: Wiring) -> AnyClass:
        if wiring.n <= EXACT_LIMIT:
            return build_class(wiring, self.size_mix)
        return LargeClass(key, wiring)

    def keeping(self, used: set[int]) -> tuple[ClassRegistry, dict[int, int]]:
        """A registry of only the classes ``used`` names (their tables reused, not
        rebuilt), and each kept class's id in it. Answers are found again as asked."""
        fresh = ClassRegistry(self.bandwidth, self.size_mix)
        key_of = {cid: key for key, cid in self._by_key.items()}
        moved = {cid: fresh._add(key_of[cid], self.classes[cid]) for cid in sorted(used)}
        return fresh, moved

    def _add(self, key: str, tc: AnyClass) -> int:
        cid = len(self.classes)
        if isinstance(tc, TopologyClass):
            self.classes.append(tc)
            self.offsets = np.append(self.offsets, self._size)
            self._exact_offsets.append(self._size)
            self._exact_ids.append(cid)
            self._size += 1 << tc.n
            self.ring = np.concatenate([self.ring, tc.ring])
            self.pair = np.concatenate([self.pair, tc.pair])
            self.capability = np.concatenate([self.capability, tc.capability])
            self.connected = np.concatenate([self.connected, tc.nvlink_connected])
            self.numa_span = np.concatenate([self.numa_span, tc.numa_span])
            grow = np.full(1 << tc.n, UNKNOWN, dtype=np.int64)
            for query, table in self._answers.items():
                self._answers[query] = np.concatenate([table, grow])
        else:
            self.classes.append(tc)
            self.offsets = np.append(self.offsets, -1)
        self._by_key[key] = cid
        return cid

    def _table(self, query: SetQuery) -> NDArray[np.int64]:
        table = self._answers.get(query)
        if table is None:
            table = np.full(self._size, UNKNOWN, dtype=np.int64)
            self._answers[query] = table
        return table

    def choose(self, query: SetQuery, states: NDArray[np.int64]) -> NDArray[np.int64]:
        """Best set mask for each flat state (exact classes only); NO_SET where none."""
        table = self._table(query)
        out = table[states]
        missing = out == UNKNOWN
        if missing.any():
            for state in np.unique(states[missing]).tolist():
                table[state] = self._solve(query, int(state))
            out = table[states]
        return out

    def _solve(self, query: SetQuery, state: int) -> int:
        pos = int(np.searchsorted(self._exact_offsets, state, side="right")) - 1
        tc = self.classes[self._exact_ids[pos]]
        assert isinstance(tc, TopologyClass)
        return best_set(tc, state - self._exact_offsets[pos], query)

    def choose_one(self, cid: int, free: int, query: SetQuery) -> int:
        """Best set on one node of class cid, exact or large."""
        tc = self.classes[cid]
        if isinstance(tc, TopologyClass):
            table = self._table(query)
            state = int(self.offsets[cid]) + free
            answer = int(table[state])
            if answer == UNKNOWN:
                answer = best_set(tc, free, query)
                table[state] = answer
            return answer
        return tc.best_set(free, query)

    def set_metrics(self, cid: int, mask: int) -> tuple[float, float, bool, int]:
        """(ring, pair, nvlink_connected, numa_span) of one GPU set."""
        tc = self.classes[cid]
        if isinstance(tc, TopologyClass):
            return (
                float(tc.ring[mask]),
                float(tc.pair[mask]),
                bool(tc.nvlink_connected[mask]),
                int(tc.numa_span[mask]),
            )
        return tc.metrics(mask)

    def capability_of(self, cid: int, mask: int) -> float:
        tc = self.classes[cid]
        if isinstance(tc, TopologyClass):
            return float(tc.capability[mask])
        return tc.capability(mask)


__all__ = ["NO_SET", "UNKNOWN", "ClassRegistry", "Design"]
