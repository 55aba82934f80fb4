"""The engine's view of one node: its snapshot plus what is allocated on it."""

from __future__ import annotations

from dataclasses import dataclass, field

from placement.islands import Island, islands
from placement.snapshot import Health, NodeSnapshot


@dataclass
class NodeEntry:
    slot: int
    snapshot: NodeSnapshot
    cid: int
    available: bool = True
    busy: set[str] = field(default_factory=set)  # GPU UUIDs held by allocations
    busy_mig: set[str] = field(default_factory=set)  # MIG instance UUIDs held
    used_cpus: set[int] = field(default_factory=set)
    island_list: tuple[Island, ...] = ()
    island_of: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.refresh_islands()

    def refresh_islands(self) -> None:
        self.island_list = islands(self.snapshot)
        names = [""] * self.snapshot.gpu_count
        for island in self.island_list:
            for gpu in island.gpus:
                names[gpu] = island.name
        self.island_of = tuple(names)

    @property
    def name(self) -> str:
        return self.snapshot.name

    def potential_mask(self) -> int:
        """GPUs that whole-GPU requests could ever get: all but MIG-enabled ones."""
        return sum(1 << g.index for g in self.snapshot.gpus if not g.mig_enabled)

    def healthy_mask(self) -> int:
        return sum(
            1 << g.index
            for g in self.snapshot.gpus
            if not g.mig_enabled and g.health is Health.HEALTHY
        )

    def free_mask(self) -> int:
        return sum(
            1 << g.index
            for g in self.snapshot.gpus
            if not g.mig_enabled and g.health is Health.HEALTHY and g.uuid not in self.busy
        )

    def uuid_index(self) -> dict[str, int]:
        return {g.uuid: g.index for g in self.snapshot.gpus}
