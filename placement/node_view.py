"""A read-only view of one node, for code outside the engine.

``ClusterState.node(name)`` and ``ClusterState.nodes()`` return these
instead of the engine's ``NodeEntry``: callers read what a node is and what
is held on it, and change it only through ``ClusterState`` (allocate,
release, apply, ...), which keeps the table's arrays and answer caches in
step. The view is live (it reads the node as it is when a property is read)
and every value it returns is immutable, so a caller can keep one but not
change the engine through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from placement.islands import Island
from placement.node_entry import NodeEntry
from placement.snapshot import NodeSnapshot


class NodeView:
    __slots__ = ("_entry",)

    def __init__(self, entry: NodeEntry) -> None:
        self._entry = entry

    @property
    def name(self) -> str:
        return self._entry.snapshot.name

    @property
    def snapshot(self) -> NodeSnapshot:
        return self._entry.snapshot

    @property
    def available(self) -> bool:
        """False while cordoned or stale: the node gets no placements."""
        return self._entry.available

    @property
    def held_gpus(self) -> frozenset[str]:
        """UUIDs of the GPUs held whole."""
        return frozenset(self._entry.busy)

    @property
    def held_migs(self) -> frozenset[str]:
        """UUIDs of the MIG instances held."""
        return frozenset(self._entry.busy_mig)

    @property
    def held_cpus(self) -> frozenset[int]:
        return frozenset(self._entry.used_cpus)

    @property
    def shares(self) -> Mapping[str, int]:
        """GPU UUID -> thousandths held, for every GPU holding shares."""
        return MappingProxyType(dict(self._entry.shares))

    @property
    def shares_by_index(self) -> Mapping[int, int]:
        """GPU index -> thousandths held, for every GPU holding shares."""
        return MappingProxyType(self._entry.shares_by_index())

    def has_gpu(self, uuid: str) -> bool:
        """Whether the node's snapshot lists a GPU with this UUID."""
        return uuid in self._entry.bit_of

    @property
    def free_mask(self) -> int:
        """Bit i set: GPU i is free for a whole-GPU request (healthy, not MIG, not held)."""
        return self._entry.free_mask()

    @property
    def healthy_mask(self) -> int:
        """Bit i set: GPU i is healthy and not in MIG mode."""
        return self._entry.healthy

    @property
    def islands(self) -> tuple[Island, ...]:
        return self._entry.island_list

    @property
    def island_of(self) -> tuple[str, ...]:
        """The island name of each GPU, by GPU index."""
        return self._entry.island_of
