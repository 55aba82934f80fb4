"""The engine's facade: ``ClusterState``, every entry point the service calls.

It owns one ``NodeTable`` (placement.table) and is the only code that changes
it; decisions are the search modules' (decide, screen) over that table, and
readers outside the engine get read-only node views (placement.node_view).

Contract (where the engine meets the service):

1. ``ClusterState`` is owned by one writer. ``upsert``, ``remove``,
   ``set_available``, ``allocate`` and ``release`` change it and must not
   run concurrently with anything else on the same instance (the service
   holds one lock around them). ``prepare`` changes nothing and may run
   beside anything: it does the slow part of an ``upsert`` of a new machine
   design (building its tables) before the caller takes its lock.
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

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

from placement.bandwidth import DEFAULT_BANDWIDTH, BandwidthTable
from placement.class_registry import AnyClass, Design
from placement.decide import decide, verdict_rows, verdicts
from placement.host import UNKNOWN
from placement.node_view import NodeView
from placement.outcome import Cause, NodeVerdict, Outcome, Placement, TaskPlacement
from placement.request import PlacementRequest
from placement.screen import NodeScreen, screen
from placement.snapshot import NodeSnapshot
from placement.table import FULL_SHARE, AllocationError, NodeTable, UnknownNodeError, share_milli
from placement.task_mix import TaskType
from placement.what_is_left import DEFAULT_SIZE_MIX
from placement.workload_mix import WorkloadMix

# Node labels naming the network block a node sits in, most specific first.
DEFAULT_BLOCK_LABELS: tuple[str, ...] = (
    "topoplace.io/block",
    "topoplace.io/rack",
    "topology.kubernetes.io/block",
    "topology.kubernetes.io/rack",
)

Row = TypeVar("Row")


class SharesUnsupported(ValueError):
    """A GPU-share request (``gpu_fraction``) to a state built with ``shares=False``."""


SHARES_UNSUPPORTED = "this cluster state was built without GPU shares (shares=False)"


class ClusterState:
    def __init__(
        self,
        bandwidth: BandwidthTable = DEFAULT_BANDWIDTH,
        block_labels: Sequence[str] = DEFAULT_BLOCK_LABELS,
        size_mix: Mapping[int, float] = DEFAULT_SIZE_MIX,
        shares: bool = True,
        host_mix: tuple[float, float] | None = None,
        task_mix: Mapping[TaskType, float] | None = None,
        model_demand: Mapping[tuple[str, ...], float] | None = None,
    ) -> None:
        """``size_mix``: GPUs per request -> how often (any scale), the request mix the
        engine keeps GPUs free for (``placement.what_is_left``). ``shares=False``: refuse
        ``gpu_fraction`` requests with ``SharesUnsupported`` (a caller that cannot hold them).
        ``host_mix``: (milli-CPU, MiB) per GPU of the requests served, for the GPUs a choice
        strands (``placement.host``); None: observed from the tasks applied with host figures.
        ``task_mix``: (GPUs, thousandths per GPU, milli-CPU, MiB) -> how often (any scale),
        the task types whose expected fragmentation the ranking weighs
        (``placement.task_mix``); None: observed as ``host_mix`` is.
        ``model_demand``: GPU model list (() for any model) -> GPUs asked (any scale), the
        demand whose pressure on each model the ranking weighs (``placement.model_demand``);
        None: observed from the requests decided."""
        self._shares = shares
        # As configured, so that a state built beside this one (the service's probe of a
        # snapshot, a rebuild) can be configured the same (``from_mix``).
        self._mix = WorkloadMix(
            size_mix=dict(size_mix),
            host_mix=host_mix,
            task_mix=None if task_mix is None else dict(task_mix),
            model_demand=None if model_demand is None else dict(model_demand),
        )
        self._table = NodeTable(bandwidth, block_labels, size_mix, host_mix, task_mix, model_demand)

    @classmethod
    def from_mix(
        cls,
        mix: WorkloadMix,
        bandwidth: BandwidthTable = DEFAULT_BANDWIDTH,
        block_labels: Sequence[str] = DEFAULT_BLOCK_LABELS,
    ) -> ClusterState:
        """A state weighing its choices by ``mix`` (``placement.workload_mix``): its
        parts that are None stay the constructor's defaults (the default size mix; the
        others observed)."""
        return cls(
            bandwidth,
            block_labels,
            DEFAULT_SIZE_MIX if mix.size_mix is None else mix.size_mix,
            host_mix=mix.host_mix,
            task_mix=mix.task_mix,
            model_demand=mix.model_demand,
        )

    @property
    def mix(self) -> WorkloadMix:
        """The mix this state was configured with (the size mix always given: the
        default one if none was); ``from_mix`` of it weighs choices the same."""
        return self._mix

    # Membership ----------------------------------------------------------

    def prepare(self, snapshot: NodeSnapshot) -> Design:
        """Work out a snapshot's design for a later ``upsert`` of it, changing nothing.

        A design not seen before needs its tables built (0.6 s for a 16-GPU one);
        ``upsert`` of an unprepared snapshot builds them itself, inside whatever
        serializes the writer (the service's lock), stalling every decision. This
        may run beside readers and the writer (see the contract): it only reads
        which designs the state has. Raises what ``upsert`` would raise for a
        design the engine cannot hold."""
        return self._table.registry.prepare(snapshot)

    def upsert(self, snapshot: NodeSnapshot, design: Design | None = None) -> None:
        """Add a node or replace its snapshot, keeping its allocations (by UUID).
        ``design``: ``prepare(snapshot)``'s answer; one prepared for another snapshot or
        another state is ignored (the design is worked out here instead)."""
        self._table.upsert(snapshot, design)

    def has_design(self, design: Design) -> bool:
        """Whether ``upsert`` of ``design``'s snapshot builds nothing: this state has the
        design, or the design carries its tables built for this state's bandwidth."""
        registry = self._table.registry
        return (
            design.bandwidth == registry.bandwidth
            and design.size_mix == registry.size_mix
            and (design.built is not None or registry.knows(design.key))
        )

    def remove(self, name: str) -> None:
        self._table.remove(name)

    def set_available(self, name: str, available: bool) -> None:
        """Cordon/uncordon, or mark stale: unavailable nodes get no placements."""
        self._table.set_available(name, available)

    def node(self, name: str) -> NodeView:
        """A read-only view of one node (its snapshot and what is held on it), live."""
        return NodeView(self._table.entry(name))

    def nodes(self) -> Iterator[NodeView]:
        """Every node's view, in the order the nodes were added (one added again comes last)."""
        return map(NodeView, list(self._table.entries.values()))

    def names(self) -> list[str]:
        return self._table.names()

    def __len__(self) -> int:
        return len(self._table.entries)

    def __contains__(self, name: object) -> bool:
        return name in self._table.entries

    # What the cluster is built from (read-only) ----------------------------

    @property
    def bandwidth(self) -> BandwidthTable:
        return self._table.bandwidth

    @property
    def block_labels(self) -> tuple[str, ...]:
        return self._table.block_labels

    @property
    def version(self) -> int:
        """Bumps when membership, labels or wiring change (not on allocations)."""
        return self._table.version

    @property
    def clock(self) -> int:
        """Bumps on every change to any node (membership, availability, holds)."""
        return self._table.clock

    @property
    def slot_names(self) -> Sequence[str]:
        """Node name per slot ("" for a free slot), as ``NodeScreen.slots`` index them."""
        return self._table.slot_names

    def slot_of(self, name: str) -> int:
        """The slot a node holds while it is a member (``UnknownNodeError`` otherwise)."""
        return self._table.entry(name).slot

    @property
    def class_count(self) -> int:
        """Topology classes built so far (one per distinct node design)."""
        return len(self._table.registry.classes)

    def topology_class(self, name: str) -> AnyClass:
        """The answer tables (or the large-node search) of a node's design."""
        return self._table.registry.classes[self._table.entry(name).cid]

    def set_host_capacity(self, name: str, cpu_milli: int | None, memory_mib: int | None) -> None:
        """A node's host CPU (milli-CPU) and memory (MiB) as the caller knows them (the
        sim, from a trace's node list), in place of the snapshot's (its NUMA nodes' CPUs
        x 1000 and their memory, where it reports them); None: not known, so unlimited."""
        self._table.set_host_capacity(name, cpu_milli, memory_mib)

    def host_room(self, name: str) -> tuple[int | None, int | None]:
        """(milli-CPU, MiB) free on a node's host, as far as known (None: not known)."""
        table = self._table
        slot = table.entry(name).slot
        cpu, memory = int(table.host_cpu_cap[slot]), int(table.host_memory_cap[slot])
        return (
            None if cpu == UNKNOWN else cpu - int(table.host_cpu_used[slot]),
            None if memory == UNKNOWN else memory - int(table.host_memory_used[slot]),
        )

    def host_used(self, name: str) -> tuple[int, int]:
        """(milli-CPU, MiB) held on a node by the tasks that carried host figures."""
        slot = self._table.entry(name).slot
        return int(self._table.host_cpu_used[slot]), int(self._table.host_memory_used[slot])

    def set_host_use(self, name: str, cpu_milli: int, memory_mib: int) -> None:
        """Put a node's counted host use at exactly these figures, for a caller keeping
        this state in step with a store that holds the tasks' requests (the service
        counts its live allocations' ``cpu_milli`` and ``memory_mib``)."""
        self._table.set_host_use(name, cpu_milli, memory_mib)

    # Allocations ---------------------------------------------------------

    def allocate(
        self,
        node: str,
        gpu_uuids: Iterable[str] = (),
        mig_uuids: Iterable[str] = (),
        cpus: Iterable[int] = (),
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> None:
        """Mark GPUs / MIG instances / CPUs held, and the task's host CPU and memory.
        All or nothing: conflicts change nothing."""
        gpus, migs = tuple(gpu_uuids), tuple(mig_uuids)
        self._table.allocate(node, gpus, migs, cpus)
        self._table.hold_host(node, cpu_milli, memory_mib, len(gpus) + len(migs))

    def keep_unlisted_migs(self, node: str, parents: dict[str, str]) -> None:
        """Hold MIG instances (UUID -> their GPU's UUID) the node's snapshot no longer
        lists: a process that never saw them listed learns their GPU from the store."""
        self._table.keep_unlisted_migs(node, parents)

    def keep_unlisted_gpus(self, node: str, uuids: Iterable[str]) -> None:
        """Hold devices (UUIDs) the node's snapshot lists neither as GPUs nor as MIG
        instances, as held whole: a process that never saw them listed learns from the
        store what a process that did keeps across snapshots."""
        self._table.keep_unlisted_gpus(node, uuids)

    def release(
        self,
        node: str,
        gpu_uuids: Iterable[str] = (),
        mig_uuids: Iterable[str] = (),
        cpus: Iterable[int] = (),
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> None:
        """Free what an allocation held; releasing something not held is a no-op (host
        use never goes below 0)."""
        self._table.release(node, gpu_uuids, mig_uuids, cpus)
        self._table.drop_host(node, cpu_milli, memory_mib)

    def allocate_share(
        self,
        node: str,
        gpu_uuid: str,
        fraction: float,
        cpus: Iterable[int] = (),
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> None:
        """Hold a share of one GPU: refused on a GPU a whole-GPU job holds and past a full GPU."""
        self._table.allocate_share(node, gpu_uuid, fraction, cpus)
        self._table.hold_host(node, cpu_milli, memory_mib, fraction)

    def release_share(
        self,
        node: str,
        gpu_uuid: str,
        fraction: float,
        cpus: Iterable[int] = (),
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> None:
        """Give a share back; a GPU whose last share goes is whole and free again."""
        self._table.release_share(node, gpu_uuid, fraction, cpus)
        self._table.drop_host(node, cpu_milli, memory_mib)

    def set_share(self, node: str, gpu_uuid: str, milli: int) -> None:
        """Set a GPU's shares to exactly ``milli`` thousandths in all (0: none, the GPU whole
        and free again), CPUs untouched: for a caller keeping this state in step with a
        store that counts shares per GPU (the service's database). Refused on a GPU held
        whole and outside 0..1000."""
        self._table.set_share(node, gpu_uuid, milli)

    def apply(self, placement: Placement) -> None:
        """Allocate every task of a placement, all or nothing."""
        table = self._table
        done: list[int] = []
        try:
            for i, task in enumerate(placement.tasks):
                if task.gpu_fraction is not None:
                    table.allocate_share(task.node, task.gpu_uuids[0], task.gpu_fraction, task.cpus)
                    gpus = task.gpu_fraction
                else:
                    table.allocate(task.node, _whole_gpus(task), task.mig_uuids, task.cpus)
                    gpus = len(task.gpu_indices)
                table.hold_host(task.node, task.cpu_milli, task.memory_mib, gpus)
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
            self._table.release_share(task.node, task.gpu_uuids[0], task.gpu_fraction, task.cpus)
        else:
            self._table.release(task.node, _whole_gpus(task), task.mig_uuids, task.cpus)
        self._table.drop_host(task.node, task.cpu_milli, task.memory_mib)

    # Decisions -----------------------------------------------------------

    def place(self, request: PlacementRequest, waiting: Sequence[PlacementRequest] = ()) -> Outcome:
        """Choose node(s) and GPUs for a request; reserves nothing (see contract)."""
        if request.gpu_fraction is not None:
            self._refuse_shares(request)
        if request.mig_profile is None:  # MIG profiles name their model already
            gpus = request.gpu_fraction if request.gpu_fraction is not None else request.total_gpus
            self._table.model_demand.observe(request.gpu_models, gpus)
        return decide(self._table, request, waiting)

    def evaluate(self, request: PlacementRequest) -> list[NodeVerdict]:
        """Every requested node's verdict for one task of the request, best first."""
        self._refuse_shares(request, verdicts=True)
        return verdicts(self._table, request)

    def verdict_rows(
        self,
        request: PlacementRequest,
        fit: Callable[[str, int, float, TaskPlacement], Row],
        refused: Callable[[str, Cause], Row],
    ) -> list[Row]:
        """``evaluate`` with the caller building each node's row (whole-GPU requests)."""
        self._refuse_shares(request, verdicts=True)
        return verdict_rows(self._table, request, fit, refused)

    def screen(self, request: PlacementRequest, full_rank: bool = True) -> NodeScreen:
        """Every requested node's verdict as arrays (no TaskPlacement per node): see screen.py."""
        self._refuse_shares(request, verdicts=True)
        return screen(self._table, request, full_rank)

    def _refuse_shares(self, request: PlacementRequest, verdicts: bool = False) -> None:
        """Raise SharesUnsupported for a share this state does not take (see __init__).

        Per-node verdicts (evaluate, screen) answer whole GPUs and MIG only:
        a share's answer is one GPU chosen by ``place``.
        """
        if request.gpu_fraction is None:
            return
        if not self._shares:
            raise SharesUnsupported(SHARES_UNSUPPORTED)
        if verdicts:
            raise SharesUnsupported("per-node verdicts answer whole GPUs; place() plans a share")


def _whole_gpus(task: TaskPlacement) -> tuple[str, ...]:
    """A MIG task names its parent GPU for information; it holds only the instance."""
    return () if task.mig_uuids else task.gpu_uuids


__all__ = [
    "DEFAULT_BLOCK_LABELS",
    "FULL_SHARE",
    "SHARES_UNSUPPORTED",
    "AllocationError",
    "ClusterState",
    "Design",
    "NodeView",
    "SharesUnsupported",
    "UnknownNodeError",
    "share_milli",
]
