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
    # Held MIG instance UUID -> its GPU's UUID, as the latest snapshot listing it said:
    # a report without the instance (MIG turned off) must not free the GPU under its job.
    mig_parents: dict[str, str] = field(default_factory=dict)
    used_cpus: set[int] = field(default_factory=set)
    shares: dict[str, int] = field(default_factory=dict)  # GPU UUID -> thousandths held
    island_list: tuple[Island, ...] = ()
    island_of: tuple[str, ...] = ()
    # Derived from the snapshot once, so that allocate/release stay O(GPUs held).
    bit_of: dict[str, int] = field(default_factory=dict)
    every_gpu: int = 0  # bits of all the node's GPUs, MIG-enabled ones too
    potential: int = 0  # GPUs whole-GPU requests could ever get: all but MIG-enabled
    healthy: int = 0  # ... and healthy
    busy_bits: int = 0  # bits of busy GPUs present in this snapshot
    cpu_count: int = 0  # CPUs the node reports (0 without NUMA nodes: none can be reserved)

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Recompute everything derived from the snapshot (after a new one arrives)."""
        snap = self.snapshot
        self.island_list = islands(snap)
        names = [""] * snap.gpu_count
        for island in self.island_list:
            for gpu in island.gpus:
                names[gpu] = island.name
        self.island_of = tuple(names)
        self.bit_of = {g.uuid: 1 << g.index for g in snap.gpus}
        self.every_gpu = sum(1 << g.index for g in snap.gpus)
        self.cpu_count = len({cpu for numa in snap.numa_nodes for cpu in numa.cpu_list})
        self.potential = sum(1 << g.index for g in snap.gpus if not g.mig_enabled)
        self.healthy = sum(
            1 << g.index for g in snap.gpus if not g.mig_enabled and g.health is Health.HEALTHY
        )
        self._learn_parents(self.busy_mig)
        self.busy_bits = self.held_bits()

    @property
    def name(self) -> str:
        return self.snapshot.name

    def free_mask(self) -> int:
        return self.healthy & ~self.busy_bits

    def _learn_parents(self, migs: set[str]) -> None:
        """Note the GPU of each of these held instances that the snapshot lists; one it
        no longer lists keeps the GPU an earlier snapshot gave."""
        gpus = self.snapshot.gpus
        for inst in self.snapshot.mig_instances:
            if inst.uuid in migs and inst.parent_gpu < len(gpus):
                self.mig_parents[inst.uuid] = gpus[inst.parent_gpu].uuid

    def held_bits(self) -> int:
        """Bits of the GPUs not free for whole-GPU requests: a GPU held whole, holding
        shares, or whose UUID is held as a MIG instance (an earlier report listed it so:
        the store keys holds by UUID, and the holding job may still run on it), and the
        GPU of a held MIG instance (reported since with MIG off, its job still runs)."""
        bit_of = self.bit_of
        bits = 0
        for uuid in self.held_any_way():
            bits |= bit_of.get(uuid, 0)
        for gpu in self.mig_parents.values():
            bits |= bit_of.get(gpu, 0)
        return bits

    def hold(self, gpus: set[str]) -> None:
        self.busy |= gpus
        for uuid in gpus:
            self.busy_bits |= self.bit_of.get(uuid, 0)

    def drop(self, gpus: set[str]) -> None:
        self.busy -= gpus
        self.busy_bits = self.held_bits()

    def hold_migs(self, migs: set[str]) -> None:
        self.busy_mig |= migs
        self._learn_parents(migs)
        self.busy_bits = self.held_bits()

    def drop_migs(self, migs: set[str]) -> None:
        self.busy_mig -= migs
        for uuid in migs:
            self.mig_parents.pop(uuid, None)
        self.busy_bits = self.held_bits()

    def mig_parent_held(self, gpu_uuid: str) -> bool:
        """Whether a held MIG instance is (or was, when last listed) on this GPU."""
        return gpu_uuid in self.mig_parents.values()

    def held_any_way(self) -> set[str]:
        """Every device UUID held: whole, in shares or as a MIG instance."""
        return self.busy | self.shares.keys() | self.busy_mig

    def shares_by_index(self) -> dict[int, int]:
        """GPU index -> thousandths held, for the shared GPUs this snapshot lists."""
        bit_of = self.bit_of
        return {
            bit_of[uuid].bit_length() - 1: milli
            for uuid, milli in self.shares.items()
            if uuid in bit_of
        }

    def hold_share(self, uuid: str, milli: int) -> None:
        self.shares[uuid] = self.shares.get(uuid, 0) + milli
        self.busy_bits |= self.bit_of.get(uuid, 0)

    def drop_share(self, uuid: str, milli: int) -> None:
        left = self.shares.get(uuid, 0) - milli
        if left > 0:
            self.shares[uuid] = left
            return
        self.shares.pop(uuid, None)
        self.busy_bits = self.held_bits()
