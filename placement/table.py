"""The engine's table: one slot per node, the per-slot arrays the search reads, the change log.

This is the bottom of the engine's own layers (docs/engine.md): it imports
values (snapshots, requests, outcomes), the topology code and the answer
caches' storage, and nothing that scores or searches. The scoring and search
modules read it; ``placement.cluster.ClusterState`` owns one and is the only
code that changes it. What it keeps:

- ``entries`` / slots: each node's ``NodeEntry`` (its snapshot and what is
  held on it) at a slot that stays the node's until it leaves;
- per-slot arrays (class id, free / healthy / potential GPU masks, CPU
  counts, presence, availability) so a decision reads 10,000 nodes as a few
  numpy gathers;
- ``slot_version`` and the change log (``touched_since``): answer caches
  keyed per slot recompute exactly the slots that moved;
- the answer caches' storage (filters per membership version, per-shape
  answers, tasks per shape), whose entries are pure functions of their keys.

Writes keep every array in step with the entries; a write that would not
match the node's state raises ``AllocationError`` and changes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from placement.bandwidth import BandwidthTable
from placement.class_registry import ClassRegistry, Design
from placement.host import UNKNOWN, HostMix, snapshot_capacity
from placement.model_demand import ListColumns, ModelDemand
from placement.node_entry import NodeEntry
from placement.numbers import share_thousandths
from placement.outcome import TaskPlacement
from placement.shape_cache import ShapeCaches
from placement.snapshot import NodeSnapshot
from placement.task_mix import TaskMix, TaskType
from placement.what_is_left import size_weights

# (share sizes, room below each size per slot, largest room per slot, slot version)
RoomCache = tuple[tuple[int, ...], NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]

_CHANGE_LOG = 32_768
# Classes no node uses are kept (a node may come back with that wiring) until they
# outnumber this and the classes in use: each costs its subset tables, about 5 MB at
# 16 GPUs, and a node reporting a new wiring with every snapshot made one each time.
_SPARE_CLASSES = 32
FULL_SHARE = 1000  # a GPU in thousandths, as the trace's gpu_milli
# Per-slot filters kept at once (NodeTable.keep_filter): far more than the distinct
# selectors of a real workload, each an array of one value per node slot.
MAX_FILTERS = 128
# The per-slot arrays, grown together when the slots outgrow them.
_ARRAYS = (
    "cid",
    "free",
    "healthy",
    "potential",
    "every_gpu",
    "cpu_count",
    "present",
    "available",
    "slot_version",
    "host_cpu_cap",
    "host_memory_cap",
    "host_cpu_used",
    "host_memory_used",
    "share_room",
)


class UnknownNodeError(ValueError):
    pass


class AllocationError(ValueError):
    """An allocate/release that does not match the node's state."""


class NodeTable:
    def __init__(
        self,
        bandwidth: BandwidthTable,
        block_labels: Sequence[str],
        size_mix: Mapping[int, float],
        host_mix: tuple[float, float] | None = None,
        task_mix: Mapping[TaskType, float] | None = None,
        model_demand: Mapping[tuple[str, ...], float] | None = None,
    ) -> None:
        size_weights(size_mix, 1)  # refuse a bad mix here, not at the first node
        self.bandwidth = bandwidth
        self.block_labels = tuple(block_labels)
        self.registry = ClassRegistry(bandwidth, size_mix)
        self._class_users: Counter[int] = Counter()  # class id -> nodes of that class
        self.entries: dict[str, NodeEntry] = {}
        self._slots: list[NodeEntry | None] = []
        self.slot_names: list[str] = []  # "" for a free slot; read per request by screen()
        self.slot_of: dict[str, int] = {}
        self._free_slots: list[int] = []
        # slot -> GPU index -> thousandths held, for every GPU that holds shares.
        self.shared: dict[int, dict[int, int]] = {}
        self.version = 0  # bumps when membership, labels or wiring change
        cap = 0
        self.cid = np.zeros(cap, dtype=np.int64)
        self.free = np.zeros(cap, dtype=np.int64)
        self.healthy = np.zeros(cap, dtype=np.int64)
        self.potential = np.zeros(cap, dtype=np.int64)
        # Fixed by the snapshot, read only to tell "never" from "not now" (placement.capacity).
        self.every_gpu = np.zeros(cap, dtype=np.int64)
        self.cpu_count = np.zeros(cap, dtype=np.int64)
        self.present = np.zeros(cap, dtype=np.bool_)
        self.available = np.zeros(cap, dtype=np.bool_)
        # Bumped whenever anything about a slot changes: answer caches keyed
        # per slot (placement.fast_path) recompute exactly the slots that moved.
        self.slot_version = np.zeros(cap, dtype=np.int64)
        # Host capacity (milli-CPU, MiB; UNKNOWN: unlimited) and the use counted from the
        # tasks that carry host figures (placement.host).
        self.host_cpu_cap = np.zeros(cap, dtype=np.int64)
        self.host_memory_cap = np.zeros(cap, dtype=np.int64)
        self.host_cpu_used = np.zeros(cap, dtype=np.int64)
        self.host_memory_used = np.zeros(cap, dtype=np.int64)
        # Capacities the caller set, by node name: they outlive the node's snapshots.
        # Thousandths of GPU still free on the node's shared GPUs (their room).
        self.share_room = np.zeros(cap, dtype=np.int64)
        self.host_set: dict[str, tuple[int | None, int | None]] = {}
        self.host_mix = HostMix(host_mix)
        # The task types served (placement.task_mix), and per slot the statistics of its
        # shared GPUs' rooms for the mix's share sizes: (the sizes, the room below each
        # size, the largest room, the slot version they were computed at (-1: not yet)).
        # Filled by the search for the slots that changed (placement.analysis); replaced
        # whole, so decisions running side by side never mix two generations of it.
        self.task_mix = TaskMix(task_mix)
        self.room_cache: RoomCache | None = None
        # The models requests insist on (placement.model_demand; configured or observed),
        # its lists against the fleet: (membership version, demand epoch), columns; and the
        # per-slot pressure last computed: (version, epoch, clock), values. The pressure
        # reads the free GPUs, so it moves with every allocation; the lists do not.
        self.model_demand = ModelDemand(model_demand)
        self.pressure_lists: tuple[tuple[int, int], ListColumns] | None = None
        self.pressure_cache: tuple[tuple[int, int, int], NDArray[np.float64]] | None = None
        self._clock = 0
        # Slots touched, in clock order: changes[i] was touched at clock
        # changes_base + i + 1. Bounded: old entries are dropped, and a reader
        # that fell further behind compares every slot's version instead.
        self.changes: list[int] = []
        self.changes_base = 0
        # Per-slot filters (placement.eligibility), cleared when membership changes and
        # bounded (keep_filter): the filters are whatever callers ask for.
        self.static_cache: dict[object, NDArray[np.generic]] = {}
        # The last candidate list a request named and its slots (analysis.requested_slots):
        # schedulers send the same thousands of names pod after pod.
        self.last_candidates: tuple[tuple[str, ...], NDArray[np.int64]] | None = None
        self.shape_caches = ShapeCaches()
        # request shape -> slot -> (slot version, GPU mask, task): see decide.verdict_rows.
        self.task_cache: dict[
            tuple[object, ...], dict[int, tuple[int, int, TaskPlacement | None]]
        ] = {}

    # Reads ---------------------------------------------------------------

    def entry(self, name: str) -> NodeEntry:
        entry = self.entries.get(name)
        if entry is None:
            raise UnknownNodeError(f"no node named {name!r}")
        return entry

    def entry_at(self, slot: int) -> NodeEntry:
        entry = self._slots[slot]
        assert entry is not None
        return entry

    def names(self) -> list[str]:
        return sorted(self.entries)

    @property
    def slot_count(self) -> int:
        return len(self._slots)

    @property
    def clock(self) -> int:
        return self._clock

    def touched_since(self, clock: int) -> list[int] | None:
        """Slots changed after `clock`, or None when the log no longer reaches back that far."""
        if clock < self.changes_base:
            return None
        return sorted(set(self.changes[clock - self.changes_base :]))

    # Membership ----------------------------------------------------------

    def keep_filter(self, key: object, value: NDArray[np.generic]) -> None:
        """Remember a per-slot filter; the oldest goes past ``MAX_FILTERS``. A fleet that
        does not change kept one array per distinct filter ever asked, and the filters
        (model lists, regions, label selectors) are the callers' to choose."""
        if len(self.static_cache) >= MAX_FILTERS:
            self.static_cache.pop(next(iter(self.static_cache)))
        self.static_cache[key] = value

    def upsert(self, snapshot: NodeSnapshot, design: Design | None = None) -> None:
        """Add a node or replace its snapshot, keeping its allocations (by UUID);
        ``design``: the snapshot's, prepared beforehand (ClassRegistry.prepare)."""
        cid = self.registry.class_for(snapshot, design)
        entry = self.entries.get(snapshot.name)
        self._class_users[cid] += 1
        if entry is not None:
            self._class_users[entry.cid] -= 1
        if entry is None:
            slot = self._free_slots.pop() if self._free_slots else self._grow()
            entry = NodeEntry(slot=slot, snapshot=snapshot, cid=cid)
            self.entries[snapshot.name] = entry
            self._slots[slot] = entry
            self.slot_names[slot] = snapshot.name
            self.slot_of[snapshot.name] = slot
            self.host_cpu_used[slot] = self.host_memory_used[slot] = 0
        else:
            entry.snapshot = snapshot
            entry.cid = cid
            entry.refresh()
            self._index_shares(entry)
        self.version += 1
        self.static_cache.clear()
        self.last_candidates = None
        self.every_gpu[entry.slot] = entry.every_gpu
        self.cpu_count[entry.slot] = entry.cpu_count
        self._set_capacity(entry)
        self._sync(entry)
        self._drop_unused_classes()

    def remove(self, name: str) -> None:
        entry = self.entry(name)
        self._class_users[entry.cid] -= 1
        entry.shares.clear()
        self._index_shares(entry)
        del self.entries[name]
        del self.slot_of[name]
        self._slots[entry.slot] = None
        self.slot_names[entry.slot] = ""
        self._free_slots.append(entry.slot)
        self.present[entry.slot] = False
        self.available[entry.slot] = False
        self._touch(entry.slot)
        self.version += 1
        self.static_cache.clear()
        self.last_candidates = None

    def set_available(self, name: str, available: bool) -> None:
        entry = self.entry(name)
        entry.available = available
        self.available[entry.slot] = available
        self._touch(entry.slot)

    # Holds ---------------------------------------------------------------

    def allocate(
        self, node: str, gpu_uuids: Iterable[str], mig_uuids: Iterable[str], cpus: Iterable[int]
    ) -> None:
        entry = self.entry(node)
        gpus, migs, cpu_set = set(gpu_uuids), set(mig_uuids), set(cpus)
        if not (gpus or migs or cpu_set):
            return  # nothing to hold: the node's answers stay cached
        if unknown := sorted(gpus - entry.bit_of.keys()):
            raise AllocationError(f"node {node} has no GPU {unknown[0]}")
        if migs and (unknown := sorted(migs - {m.uuid for m in entry.snapshot.mig_instances})):
            raise AllocationError(f"node {node} has no MIG instance {unknown[0]}")
        if taken := sorted(gpus & entry.busy):
            raise AllocationError(f"GPU {taken[0]} on {node} is already allocated")
        if taken := sorted(gpus & entry.shares.keys()):
            raise AllocationError(f"GPU {taken[0]} on {node} holds shares; it is not whole")
        if taken := sorted(migs & entry.busy_mig):
            raise AllocationError(f"MIG instance {taken[0]} on {node} is already allocated")
        # A UUID reported once as a MIG instance and next as a GPU (or back) is one
        # device to the store, whatever kind it was held as.
        if taken := sorted((gpus | migs) & entry.held_any_way()):
            raise AllocationError(f"device {taken[0]} on {node} is held as another kind")
        if clash := sorted(cpu_set & entry.used_cpus):
            raise AllocationError(f"CPU {clash[0]} on {node} is already allocated")
        entry.hold(gpus)
        entry.hold_migs(migs)
        entry.used_cpus |= cpu_set
        self._sync(entry)

    def keep_unlisted_migs(self, node: str, parents: dict[str, str]) -> None:
        """Hold MIG instances the snapshot no longer lists (MIG turned off under them), each
        with the UUID of the GPU it was on, as the store says: that GPU is not free while
        the instance is held. Instances held already are left as they are."""
        entry = self.entry(node)
        listed = {m.uuid for m in entry.snapshot.mig_instances}
        new = {m: gpu for m, gpu in parents.items() if m not in entry.busy_mig and m not in listed}
        if not new:
            return
        entry.busy_mig |= new.keys()
        entry.mig_parents.update(new)
        entry.busy_bits = entry.held_bits()
        self._sync(entry)

    def keep_unlisted_gpus(self, node: str, uuids: Iterable[str]) -> None:
        """Hold by UUID the devices of ``uuids`` the snapshot lists neither as a GPU nor as
        a MIG instance (off the bus), as the store says: a process that saw them go keeps
        their holds across the snapshot (``upsert``); one started since learns them here.
        No GPU of this snapshot is taken. Devices held already are left as they are."""
        entry = self.entry(node)
        listed = entry.bit_of.keys() | {m.uuid for m in entry.snapshot.mig_instances}
        new = set(uuids) - listed - entry.held_any_way()
        if not new:
            return
        entry.busy |= new
        self._touch(entry.slot)

    def release(
        self, node: str, gpu_uuids: Iterable[str], mig_uuids: Iterable[str], cpus: Iterable[int]
    ) -> None:
        entry = self.entries.get(node)
        if entry is None:
            return  # the node left; its allocations went with it
        gpus = set(gpu_uuids) & entry.busy
        migs = set(mig_uuids) & entry.busy_mig
        cpu_set = set(cpus) & entry.used_cpus
        if not (gpus or migs or cpu_set):
            return  # nothing held changes: the node's answers stay cached
        entry.drop(gpus)
        entry.drop_migs(migs)
        entry.used_cpus -= cpu_set
        self._sync(entry)

    def allocate_share(
        self, node: str, gpu_uuid: str, fraction: float, cpus: Iterable[int]
    ) -> None:
        entry = self.entry(node)
        milli = share_milli(fraction)
        cpu_set = set(cpus)
        if gpu_uuid not in entry.bit_of:
            raise AllocationError(f"node {node} has no GPU {gpu_uuid}")
        if gpu_uuid in entry.busy or gpu_uuid in entry.busy_mig:
            raise AllocationError(f"GPU {gpu_uuid} on {node} is held whole")
        if entry.mig_parent_held(gpu_uuid):
            raise AllocationError(f"GPU {gpu_uuid} on {node} has a MIG instance held")
        held = entry.shares.get(gpu_uuid, 0)
        if held + milli > FULL_SHARE:
            raise AllocationError(
                f"GPU {gpu_uuid} on {node} has {FULL_SHARE - held}/1000 left, not {milli}"
            )
        if clash := sorted(cpu_set & entry.used_cpus):
            raise AllocationError(f"CPU {clash[0]} on {node} is already allocated")
        entry.hold_share(gpu_uuid, milli)
        entry.used_cpus |= cpu_set
        self._index_shares(entry)
        self._sync(entry)

    def release_share(self, node: str, gpu_uuid: str, fraction: float, cpus: Iterable[int]) -> None:
        entry = self.entries.get(node)
        if entry is None:
            return
        # The CPUs are the task's whether or not its GPU still counts the share: a store's
        # set_share(0) (another writer's hold came first) leaves them, and an undo that
        # skipped them kept them held under nobody.
        shared = gpu_uuid in entry.shares
        cpu_set = set(cpus) & entry.used_cpus
        if not (shared or cpu_set):
            return  # nothing held changes: the node's answers stay cached
        if shared:
            entry.drop_share(gpu_uuid, share_milli(fraction))
            self._index_shares(entry)
        entry.used_cpus -= cpu_set
        self._sync(entry)

    def set_share(self, node: str, gpu_uuid: str, milli: int) -> None:
        # A GPU the snapshot does not list is set too: the store says what is held on it
        # (a GPU gone from one report and back in the next), as for a whole-GPU hold.
        entry = self.entry(node)
        if not 0 <= milli <= FULL_SHARE:
            raise AllocationError(f"a GPU's shares are 0 to {FULL_SHARE} thousandths, not {milli}")
        if milli and (gpu_uuid in entry.busy or gpu_uuid in entry.busy_mig):
            raise AllocationError(f"GPU {gpu_uuid} on {node} is held whole")
        held = entry.shares.get(gpu_uuid, 0)
        if held == milli:
            return  # nothing held changes: the node's answers stay cached
        if milli > held:
            entry.hold_share(gpu_uuid, milli - held)
        else:
            entry.drop_share(gpu_uuid, held - milli)
        self._index_shares(entry)
        self._sync(entry)

    def set_host_capacity(self, node: str, cpu_milli: int | None, memory_mib: int | None) -> None:
        """A node's host capacity as the caller knows it, in place of the snapshot's;
        None: not known (unlimited)."""
        entry = self.entry(node)
        for value in (cpu_milli, memory_mib):
            if value is not None and value < 0:
                raise ValueError(f"a host capacity is >= 0, not {value}")
        self.host_set[node] = (cpu_milli, memory_mib)
        self._set_capacity(entry)
        self._touch(entry.slot)

    def hold_host(self, node: str, cpu_milli: int, memory_mib: int, gpus: float) -> None:
        """Count a task's host CPU and memory on its node, and observe them in the mix."""
        if not (cpu_milli or memory_mib):
            return
        entry = self.entries.get(node)
        if entry is None:
            return  # the node left; its allocations went with it
        if gpus > 0:  # the mix is per GPU: a task without GPUs is not of it
            self.host_mix.observe(gpus, cpu_milli, memory_mib)
            self.task_mix.observe(gpus, cpu_milli, memory_mib)
        self.host_cpu_used[entry.slot] += cpu_milli
        self.host_memory_used[entry.slot] += memory_mib
        self._touch(entry.slot)

    def drop_host(self, node: str, cpu_milli: int, memory_mib: int) -> None:
        if not (cpu_milli or memory_mib):
            return
        entry = self.entries.get(node)
        if entry is None:
            return
        # Never below 0: a release the counts never saw (held before a restart that did
        # not replay it) must not make room that is not there.
        s = entry.slot
        self.host_cpu_used[s] = max(0, int(self.host_cpu_used[s]) - cpu_milli)
        self.host_memory_used[s] = max(0, int(self.host_memory_used[s]) - memory_mib)
        self._touch(s)

    def set_host_use(self, node: str, cpu_milli: int, memory_mib: int) -> None:
        entry = self.entry(node)
        if cpu_milli < 0 or memory_mib < 0:
            raise AllocationError(f"host use is >= 0, not ({cpu_milli}, {memory_mib})")
        s = entry.slot
        if (self.host_cpu_used[s], self.host_memory_used[s]) == (cpu_milli, memory_mib):
            return  # nothing changes: the node's answers stay cached
        self.host_cpu_used[s] = cpu_milli
        self.host_memory_used[s] = memory_mib
        self._touch(s)

    # Internals -----------------------------------------------------------

    def _set_capacity(self, entry: NodeEntry) -> None:
        given = self.host_set.get(entry.name)
        if given is None:
            cpu, memory = snapshot_capacity(entry.snapshot)
        else:
            cpu, memory = (UNKNOWN if v is None else v for v in given)
        self.host_cpu_cap[entry.slot] = cpu
        self.host_memory_cap[entry.slot] = memory

    def _drop_unused_classes(self) -> None:
        """Start a registry of the classes in use once the unused ones outnumber them
        (and ``_SPARE_CLASSES``): every node's class id moves, so every cached answer
        goes and every slot is touched, as when membership changes."""
        used = {cid for cid, users in self._class_users.items() if users > 0}
        if len(self.registry.classes) - len(used) <= max(_SPARE_CLASSES, len(used)):
            return
        self.registry, moved = self.registry.keeping(used)
        self._class_users = Counter({moved[cid]: self._class_users[cid] for cid in used})
        for entry in self.entries.values():
            entry.cid = moved[entry.cid]
            self.cid[entry.slot] = entry.cid
            self._touch(entry.slot)
        self.version += 1
        self.static_cache.clear()
        self.shape_caches = ShapeCaches()
        self.task_cache.clear()
        self.last_candidates = None

    def _grow(self) -> int:
        slot = len(self._slots)
        self._slots.append(None)
        self.slot_names.append("")
        if slot >= self.cid.size:
            cap = max(16, self.cid.size * 2)
            for attr in _ARRAYS:
                old = getattr(self, attr)
                new = np.zeros(cap, dtype=old.dtype)
                new[: old.size] = old
                setattr(self, attr, new)
        return slot

    def _sync(self, entry: NodeEntry) -> None:
        s = entry.slot
        self.cid[s] = entry.cid
        self.free[s] = entry.free_mask()
        self.healthy[s] = entry.healthy
        self.potential[s] = entry.potential
        self.present[s] = True
        self.available[s] = entry.available
        self._touch(s)

    def _index_shares(self, entry: NodeEntry) -> None:
        # By GPU index, for the GPUs this snapshot lists: a shared GPU missing from a
        # report keeps its shares by UUID (as a whole-GPU hold does) until it is back.
        if shared := entry.shares_by_index():
            self.shared[entry.slot] = shared
        else:
            self.shared.pop(entry.slot, None)
        # Room on an unhealthy shared GPU is no capacity: no share goes there (shares.py
        # takes healthy GPUs only), so the ranking's figures must not count it either.
        self.share_room[entry.slot] = sum(
            FULL_SHARE - held for gpu, held in shared.items() if entry.healthy >> gpu & 1
        )

    def _touch(self, slot: int) -> None:
        self._clock += 1
        self.slot_version[slot] = self._clock
        self.changes.append(slot)
        if len(self.changes) > 2 * _CHANGE_LOG:
            drop = len(self.changes) - _CHANGE_LOG
            del self.changes[:drop]
            self.changes_base += drop


def share_milli(fraction: float) -> int:
    """A share of one GPU in thousandths, at least one."""
    if not 0.0 < fraction < 1.0:
        raise AllocationError(f"a GPU share is between 0 and 1, not {fraction}")
    return share_thousandths(fraction)
