"""The engine's cluster state and its public entry points.

Contract (where the engine meets the service):

1. ``ClusterState`` is owned by one writer. ``upsert``, ``remove``,
   ``set_available``, ``allocate`` and ``release`` change it and must not
   run concurrently with anything else on the same instance (the service
   holds one lock around them).
2. ``place`` and ``evaluate`` never change nodes or allocations; they only
   fill answer caches whose entries are pure functions of their keys. They
   may run concurrently with each other, not with a writer.
3. ``place`` does not reserve: it returns a plan. The caller commits it
   (e.g. in a database transaction) and then calls ``allocate`` with the
   same GPUs; ``allocate`` refuses GPUs already held, so a stale plan fails
   loudly instead of double-booking.
4. Everything is deterministic: the same sequence of calls gives the same
   answers. Among nodes that rank equal, the one added first wins (callers
   that rebuild a state add nodes in name order, so replicas agree).
   Inputs (snapshots, requests) are immutable values, never modified.
5. Errors: unknown nodes or GPUs raise ``UnknownNodeError`` /
   ``AllocationError`` (a ValueError); nothing is changed when they do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from numpy.typing import NDArray

from placement.bandwidth import DEFAULT_BANDWIDTH, BandwidthTable
from placement.class_registry import ClassRegistry
from placement.fast_path import ShapeCaches
from placement.node_entry import NodeEntry
from placement.outcome import Cause, NodeVerdict, Outcome, Placement, TaskPlacement
from placement.request import PlacementRequest
from placement.snapshot import NodeSnapshot
from placement.what_is_left import DEFAULT_SIZE_MIX, size_weights

if TYPE_CHECKING:
    from placement.screen import NodeScreen

# Node labels naming the network block a node sits in, most specific first.
DEFAULT_BLOCK_LABELS: tuple[str, ...] = (
    "topoplace.io/block",
    "topoplace.io/rack",
    "topology.kubernetes.io/block",
    "topology.kubernetes.io/rack",
)


_CHANGE_LOG = 32_768
Row = TypeVar("Row")


class UnknownNodeError(ValueError):
    pass


class AllocationError(ValueError):
    """An allocate/release that does not match the node's state."""


class SharesUnsupported(ValueError):
    """A GPU-share request (``gpu_fraction``) to a state built with ``shares=False``."""


SHARES_UNSUPPORTED = (
    "GPU shares are planned by the engine and in `topoplace sim`;"
    " the service does not reserve them yet"
)
FULL_SHARE = 1000  # a GPU in thousandths, as the trace's gpu_milli


class ClusterState:
    def __init__(
        self,
        bandwidth: BandwidthTable = DEFAULT_BANDWIDTH,
        block_labels: Sequence[str] = DEFAULT_BLOCK_LABELS,
        size_mix: Mapping[int, float] = DEFAULT_SIZE_MIX,
        shares: bool = True,
    ) -> None:
        """``size_mix``: GPUs per request -> how often (any scale), the request mix the
        engine keeps GPUs free for (``placement.what_is_left``). ``shares=False``: refuse
        ``gpu_fraction`` requests with ``SharesUnsupported`` (a caller that cannot hold them)."""
        self.shares_enabled = shares
        # slot -> GPU index -> thousandths held, for every GPU that holds shares.
        self.shared: dict[int, dict[int, int]] = {}
        self.bandwidth = bandwidth
        self.block_labels = tuple(block_labels)
        size_weights(size_mix, 1)  # refuse a bad mix here, not at the first node
        self.registry = ClassRegistry(bandwidth, size_mix)
        self.entries: dict[str, NodeEntry] = {}
        self._slots: list[NodeEntry | None] = []
        self.slot_names: list[str] = []  # "" for a free slot; read per request by screen()
        self.slot_of: dict[str, int] = {}
        self._free_slots: list[int] = []
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
        self._clock = 0
        # Slots touched, in clock order: changes[i] was touched at clock
        # changes_base + i + 1. Bounded: old entries are dropped, and a reader
        # that fell further behind compares every slot's version instead.
        self.changes: list[int] = []
        self.changes_base = 0
        self._static_cache: dict[object, NDArray[np.generic]] = {}
        # The last candidate list a request named and its slots (analysis.requested_slots):
        # schedulers send the same thousands of names pod after pod.
        self.last_candidates: tuple[tuple[str, ...], NDArray[np.int64]] | None = None
        self.shape_caches = ShapeCaches()
        # request shape -> slot -> (slot version, GPU mask, task): see decide.verdict_rows.
        self.task_cache: dict[
            tuple[object, ...], dict[int, tuple[int, int, TaskPlacement | None]]
        ] = {}

    # Membership ----------------------------------------------------------

    def upsert(self, snapshot: NodeSnapshot) -> None:
        """Add a node or replace its snapshot, keeping its allocations (by UUID)."""
        cid = self.registry.class_for(snapshot)
        entry = self.entries.get(snapshot.name)
        if entry is None:
            slot = self._free_slots.pop() if self._free_slots else self._grow()
            entry = NodeEntry(slot=slot, snapshot=snapshot, cid=cid)
            self.entries[snapshot.name] = entry
            self._slots[slot] = entry
            self.slot_names[slot] = snapshot.name
            self.slot_of[snapshot.name] = slot
        else:
            entry.snapshot = snapshot
            entry.cid = cid
            entry.shares = {u: m for u, m in entry.shares.items() if u in entry.bit_of}
            entry.refresh()
            self._index_shares(entry)
        self.version += 1
        self._static_cache.clear()
        self.last_candidates = None
        self.every_gpu[entry.slot] = entry.every_gpu
        self.cpu_count[entry.slot] = entry.cpu_count
        self._sync(entry)

    def remove(self, name: str) -> None:
        entry = self._entry(name)
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
        self._static_cache.clear()
        self.last_candidates = None

    def set_available(self, name: str, available: bool) -> None:
        """Cordon/uncordon, or mark stale: unavailable nodes get no placements."""
        entry = self._entry(name)
        entry.available = available
        self.available[entry.slot] = available
        self._touch(entry.slot)

    def node(self, name: str) -> NodeEntry:
        return self._entry(name)

    def names(self) -> list[str]:
        return sorted(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    # Allocations ---------------------------------------------------------

    def allocate(
        self,
        node: str,
        gpu_uuids: Iterable[str] = (),
        mig_uuids: Iterable[str] = (),
        cpus: Iterable[int] = (),
    ) -> None:
        """Mark GPUs / MIG instances / CPUs held. All or nothing: conflicts change nothing."""
        entry = self._entry(node)
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
        if clash := sorted(cpu_set & entry.used_cpus):
            raise AllocationError(f"CPU {clash[0]} on {node} is already allocated")
        entry.hold(gpus)
        entry.busy_mig |= migs
        entry.used_cpus |= cpu_set
        self._sync(entry)

    def release(
        self,
        node: str,
        gpu_uuids: Iterable[str] = (),
        mig_uuids: Iterable[str] = (),
        cpus: Iterable[int] = (),
    ) -> None:
        """Free what an allocation held; releasing something not held is a no-op."""
        entry = self.entries.get(node)
        if entry is None:
            return  # the node left; its allocations went with it
        gpus = set(gpu_uuids) & entry.busy
        migs = set(mig_uuids) & entry.busy_mig
        cpu_set = set(cpus) & entry.used_cpus
        if not (gpus or migs or cpu_set):
            return  # nothing held changes: the node's answers stay cached
        entry.drop(gpus)
        entry.busy_mig -= migs
        entry.used_cpus -= cpu_set
        self._sync(entry)

    def allocate_share(
        self, node: str, gpu_uuid: str, fraction: float, cpus: Iterable[int] = ()
    ) -> None:
        """Hold a share of one GPU: refused on a GPU a whole-GPU job holds and past a full GPU."""
        entry = self._entry(node)
        milli = _milli(fraction)
        cpu_set = set(cpus)
        if gpu_uuid not in entry.bit_of:
            raise AllocationError(f"node {node} has no GPU {gpu_uuid}")
        if gpu_uuid in entry.busy:
            raise AllocationError(f"GPU {gpu_uuid} on {node} is held whole")
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

    def release_share(
        self, node: str, gpu_uuid: str, fraction: float, cpus: Iterable[int] = ()
    ) -> None:
        """Give a share back; a GPU whose last share goes is whole and free again."""
        entry = self.entries.get(node)
        if entry is None or gpu_uuid not in entry.shares:
            return
        entry.drop_share(gpu_uuid, _milli(fraction))
        entry.used_cpus -= set(cpus)
        self._index_shares(entry)
        self._sync(entry)

    def apply(self, placement: Placement) -> None:
        """Allocate every task of a placement, all or nothing."""
        done: list[int] = []
        try:
            for i, task in enumerate(placement.tasks):
                if task.gpu_fraction is not None:
                    self.allocate_share(task.node, task.gpu_uuids[0], task.gpu_fraction, task.cpus)
                else:
                    self.allocate(task.node, _whole_gpus(task), task.mig_uuids, task.cpus)
                done.append(i)
        except AllocationError:
            for i in done:
                self._release_task(placement.tasks[i])
            raise

    def unapply(self, placement: Placement) -> None:
        for task in placement.tasks:
            self._release_task(task)

    def _release_task(self, task: TaskPlacement) -> None:
        if task.gpu_fraction is not None:
            self.release_share(task.node, task.gpu_uuids[0], task.gpu_fraction, task.cpus)
        else:
            self.release(task.node, _whole_gpus(task), task.mig_uuids, task.cpus)

    # Decisions -----------------------------------------------------------

    def place(self, request: PlacementRequest, waiting: Sequence[PlacementRequest] = ()) -> Outcome:
        """Choose node(s) and GPUs for a request; reserves nothing (see contract)."""
        from placement.decide import decide

        self.refuse_shares(request)
        return decide(self, request, waiting)

    def evaluate(self, request: PlacementRequest) -> list[NodeVerdict]:
        """Every requested node's verdict for one task of the request, best first."""
        from placement.decide import verdicts

        self.refuse_shares(request, verdicts=True)
        return verdicts(self, request)

    def verdict_rows(
        self,
        request: PlacementRequest,
        fit: Callable[[str, int, float, TaskPlacement], Row],
        refused: Callable[[str, Cause], Row],
    ) -> list[Row]:
        """``evaluate`` with the caller building each node's row (whole-GPU requests)."""
        from placement.decide import verdict_rows

        self.refuse_shares(request, verdicts=True)
        return verdict_rows(self, request, fit, refused)

    def screen(self, request: PlacementRequest, full_rank: bool = True) -> NodeScreen:
        """Every requested node's verdict as arrays (no TaskPlacement per node): see screen.py."""
        from placement.screen import screen

        self.refuse_shares(request, verdicts=True)
        return screen(self, request, full_rank)

    def refuse_shares(self, request: PlacementRequest, verdicts: bool = False) -> None:
        """Raise SharesUnsupported for a share this state does not take (see __init__).

        Per-node verdicts (evaluate, screen) answer whole GPUs and MIG only:
        a share's answer is one GPU chosen by ``place``.
        """
        if request.gpu_fraction is None:
            return
        if not self.shares_enabled:
            raise SharesUnsupported(SHARES_UNSUPPORTED)
        if verdicts:
            raise SharesUnsupported("per-node verdicts answer whole GPUs; place() plans a share")

    # Internals -----------------------------------------------------------

    def entry_at(self, slot: int) -> NodeEntry:
        entry = self._slots[slot]
        assert entry is not None
        return entry

    def static_cache(self) -> dict[object, NDArray[np.generic]]:
        return self._static_cache

    def _entry(self, name: str) -> NodeEntry:
        entry = self.entries.get(name)
        if entry is None:
            raise UnknownNodeError(f"no node named {name!r}")
        return entry

    def _grow(self) -> int:
        slot = len(self._slots)
        self._slots.append(None)
        self.slot_names.append("")
        if slot >= self.cid.size:
            cap = max(16, self.cid.size * 2)
            for attr in (
                "cid",
                "free",
                "healthy",
                "potential",
                "every_gpu",
                "cpu_count",
                "present",
                "available",
                "slot_version",
            ):
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
        if entry.shares:
            self.shared[entry.slot] = {
                entry.bit_of[uuid].bit_length() - 1: milli for uuid, milli in entry.shares.items()
            }
        else:
            self.shared.pop(entry.slot, None)

    def _touch(self, slot: int) -> None:
        self._clock += 1
        self.slot_version[slot] = self._clock
        self.changes.append(slot)
        if len(self.changes) > 2 * _CHANGE_LOG:
            drop = len(self.changes) - _CHANGE_LOG
            del self.changes[:drop]
            self.changes_base += drop

    @property
    def clock(self) -> int:
        return self._clock

    def touched_since(self, clock: int) -> list[int] | None:
        """Slots changed after `clock`, or None when the log no longer reaches back that far."""
        if clock < self.changes_base:
            return None
        return sorted(set(self.changes[clock - self.changes_base :]))

    @property
    def slot_count(self) -> int:
        return len(self._slots)


def _milli(fraction: float) -> int:
    if not 0.0 < fraction < 1.0:
        raise AllocationError(f"a GPU share is between 0 and 1, not {fraction}")
    return max(1, round(fraction * FULL_SHARE))


def _whole_gpus(task: TaskPlacement) -> tuple[str, ...]:
    """A MIG task names its parent GPU for information; it holds only the instance."""
    return () if task.mig_uuids else task.gpu_uuids
