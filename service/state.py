"""The service's in-memory view: the engine's ClusterState plus what it needs to stay true.

Reads (/score, node listings) are served from here; writes go to the
database first or, for placements, tentatively here and then to the
database, undone if the commit fails. One lock serializes changes to the
engine state, which is the engine's contract (placement/cluster.py).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from placement import AllocationError, ClusterState, NodeSnapshot, PlacementRequest
from placement.cluster import FULL_SHARE, Design
from placement.snapshot import CPU_DEVICE_PREFIX
from service import schema
from service.allocations.group_commit import GroupCommitter
from service.allocations.score_cache import ScoreCache
from service.audit.refusals import RefusalGate
from service.events import EventHub
from service.metrics.registry import Metrics
from service.nodes.nvlink import NvlinkStore
from service.settings import Settings
from service.slurm.node_states import SlurmNodeStates
from service.workload_mix import describe as describe_mix
from service.workload_mix import read_workload_mix

Clock = Callable[[], datetime]
log = logging.getLogger("topoplace.state")
RESYNC_CHUNK = 200  # nodes read per hold of the state lock in a full resync
WARM_GPU_COUNTS = (1, 2, 4, 8)
# Passes of a sync that find a moved snapshot not prepared outside the lock (it moved
# again meanwhile) before the last one loads it under the lock (sync_nodes).
PREPARE_TRIES = 3


def utc_now() -> datetime:
    return datetime.now(UTC)


class ServiceState:
    def __init__(self, settings: Settings, engine: Engine, clock: Clock = utc_now) -> None:
        self.settings = settings
        self.engine = engine
        self.clock = clock
        # Read now, so that `serve` refuses a bad file before it starts (ValueError, one
        # line); every engine state below is built with it.
        self.mix = read_workload_mix(settings.workload_mix_file)
        if settings.workload_mix_file is not None:
            # Said once, so an operator sees which parts the file set (and which stay
            # observed per process) without reading it again.
            log.info(
                "ranking by the workload mix in %s (%s)",
                settings.workload_mix_file,
                describe_mix(self.mix),
            )
        self.cluster = ClusterState.from_mix(self.mix)
        self.metrics = Metrics()  # what /metrics counts; the rest it reads from here
        self.committer = GroupCommitter(
            engine, on_batch=self.metrics.batch, on_retry=self.metrics.retried
        )
        # Which refused placements write an audit row (service/audit/refusals.py).
        self.refusal_gate = RefusalGate(
            settings.audit_refusal_window_s, settings.audit_refusal_rows
        )
        # The same for refused node snapshots, bounded apart: an agent's flood of them
        # must not take the rows of refused placements, nor they its.
        self.snapshot_refusal_gate = RefusalGate(
            settings.audit_refusal_window_s, settings.audit_refusal_rows
        )
        self.lock = threading.RLock()
        self.heartbeats: dict[str, datetime] = {}
        # Each node's reported_at as the snapshot in memory was stored: with its seq, it
        # names that snapshot. A seq alone does not: a deleted node may be reported again
        # under its old seq with other content.
        self.reported: dict[str, datetime] = {}
        self.cordoned: set[str] = set()
        self.loaded = False
        # Devices chosen by this process whose commit is in flight: a sync from
        # the database must not free them under a request that is committing. By
        # allocation (node -> allocation id -> devices), as a sync counts them only
        # while the database has no row of that allocation: once it has, its holds are
        # the truth, and a reservation released before its request ended here (the job's
        # epilog, another replica) must not stay busy in memory.
        self.inflight: dict[str, dict[str, list[str]]] = defaultdict(dict)
        # The same for GPU shares: node -> allocation id -> (GPU, thousandths) of its
        # shares (a share committed but not yet ended here is in the pool read too; a
        # sum, unlike a set of held GPUs, would count it twice).
        self.inflight_shares: dict[str, dict[str, list[tuple[str, int]]]] = defaultdict(dict)
        # node -> allocation id -> (milli-CPU, MiB) its tasks there hold (host figures of
        # the request), while this process commits it.
        self.inflight_host: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
        # Idempotency-Keys of the reservations in flight: a retry of one finds the node
        # full of its own first try's GPUs, and must not be told nothing fits.
        self.inflight_keys: Counter[str] = Counter()
        self._next_stale_at = _EPOCH
        # What changed, for watchers (gRPC Watch) and for /metrics, which counts every event.
        self.events = EventHub(
            tally=self.metrics.published,
            max_watches=settings.max_watches,
            max_per_caller=settings.max_watches_per_caller,
        )
        self.nvlink = NvlinkStore(settings.nvlink_min_interval_s)  # the agents' latest readings
        self.score_cache = ScoreCache()  # /score rows per engine task (score_cache.py)
        # Nodes Slurm starts no job on (sinfo), read by the Slurm filter alone.
        self.slurm_nodes = SlurmNodeStates()

    def load(self) -> None:
        """Build the in-memory state from the database (start-up)."""
        with self.lock:
            self.cluster = ClusterState.from_mix(self.mix)
            self.heartbeats.clear()
            self.reported.clear()
            self.cordoned.clear()
        self.sync_nodes(None)
        self._check_pools()
        self._warm()
        self.loaded = True

    def _check_pools(self) -> None:
        """Log every share pool whose count is not the sum of its shares, and every MIG
        pool whose count is not its GPU's instance holds. Only the pool statements change
        either (service/allocations/pools.py), so a disagreement is a row written by hand
        or by another program: memory follows the pool's count for shares, the instances'
        holds for MIG."""
        holds, shares = schema.gpu_holds, schema.gpu_shares
        summed = (
            sa.select(shares.c.node, shares.c.device, sa.func.sum(shares.c.milli).label("milli"))
            .group_by(shares.c.node, shares.c.device)
            .subquery()
        )
        on = sa.and_(summed.c.node == holds.c.node, summed.c.device == holds.c.device)
        query = (
            sa.select(holds.c.node, holds.c.device, holds.c.share_milli, summed.c.milli)
            .select_from(holds.outerjoin(summed, on))
            .where(
                holds.c.kind == SHARED,
                sa.or_(summed.c.milli.is_(None), summed.c.milli != holds.c.share_milli),
            )
        )
        instances = (
            sa.select(holds.c.node, holds.c.parent, sa.func.count().label("held"))
            .where(holds.c.kind == "mig", holds.c.parent.is_not(None))
            .group_by(holds.c.node, holds.c.parent)
            .subquery()
        )
        mig_pools = holds.alias("pools")
        counted = sa.and_(
            instances.c.node == mig_pools.c.node, instances.c.parent == mig_pools.c.device
        )
        # Both ways: a pool without its instances, and instances without their pool.
        migs = sa.union_all(
            sa.select(mig_pools.c.node, mig_pools.c.device, mig_pools.c.instances, instances.c.held)
            .select_from(mig_pools.outerjoin(instances, counted))
            .where(
                mig_pools.c.kind == MIG_POOL,
                sa.or_(instances.c.held.is_(None), instances.c.held != mig_pools.c.instances),
            ),
            sa.select(instances.c.node, instances.c.parent, sa.null(), instances.c.held)
            .select_from(
                instances.outerjoin(mig_pools, sa.and_(counted, mig_pools.c.kind == MIG_POOL))
            )
            .where(mig_pools.c.node.is_(None)),
        )
        with self.engine.connect() as conn:
            for node, device, pool, total in conn.execute(query):
                log.error(
                    "GPU %s on %s: its share pool counts %s/1000 but its shares add up to %s/1000",
                    device,
                    node,
                    pool,
                    total or 0,
                )
            for node, device, pool, total in conn.execute(migs):
                log.error(
                    "GPU %s on %s: its MIG pool counts %s instance(s) but %s are held",
                    device,
                    node,
                    pool or 0,
                    total or 0,
                )

    def _warm(self) -> None:
        """Decide once for the common shapes before reporting ready.

        The engine keeps per-shape answers for every node; the first request
        of a shape builds them (about a second at 10,000 nodes). Building
        them here puts that second into start-up instead of into the first
        requests' latency. Deciding reserves nothing.
        """
        with self.lock:
            for gpus in WARM_GPU_COUNTS:
                self.cluster.place(PlacementRequest(gpus=gpus))

    def sync_nodes(self, names: list[str] | None) -> None:
        """Make memory match the database for these nodes (None: all of them).

        The state lock is held while reading, so a write of this process that
        commits after the read applies itself after the sync, never before
        it; one committing during the read is judged on one read of the holds
        and of its row (``_read_holds``). Snapshots are fetched only for nodes
        whose seq moved (a seq always names the same content), and nodes are
        added in name order so that every process breaks ties the same way.

        A moved snapshot is read, parsed and its design prepared without the lock
        (``ClusterState.prepare``): a new design's tables took 0.6 s to build for
        16 GPUs, and every /place and /score waited for them. A pass under the lock
        that finds a moved snapshot not prepared (it moved again meanwhile) changes
        nothing and prepares it; after ``PREPARE_TRIES`` passes the last one loads
        whatever it finds under the lock, as every pass did before.
        """
        prepared: dict[_RowKey, _Loaded] = {}
        for attempt in range(PREPARE_TRIES):
            unprepared = self._sync_pass(names, prepared, last=attempt == PREPARE_TRIES - 1)
            if not unprepared:
                return
            self._prepare(unprepared, prepared)

    def _sync_pass(
        self, names: list[str] | None, prepared: dict[_RowKey, _Loaded], last: bool
    ) -> list[str]:
        """One sync under the lock; unless this is the ``last`` pass, when a moved
        snapshot is not in ``prepared``, nothing is changed and the nodes of such
        snapshots are returned instead (none: the sync is done)."""
        nodes = schema.nodes
        node_query = sa.select(*_NODE_COLUMNS).order_by(nodes.c.name)
        if names is not None:
            node_query = node_query.where(nodes.c.name.in_(names))
        with self.lock, self.engine.connect() as conn:
            rows = conn.execute(node_query).mappings().all()
            moved = [r for r in rows if not self._has_snapshot(r)]
            for row in moved:
                if not self._ready(prepared.get(_row_key(row))):
                    prepared.pop(_row_key(row), None)  # or this state lost the design since
            unprepared = [str(r["name"]) for r in moved if _row_key(r) not in prepared]
            if unprepared and not last:
                return unprepared
            snapshots = (
                {
                    str(name): body
                    for name, body in conn.execute(
                        sa.select(nodes.c.name, nodes.c.snapshot).where(
                            nodes.c.name.in_(unprepared)
                        )
                    ).all()
                }
                if unprepared
                else {}
            )
            loads: dict[str, _Loaded] = {}
            for row in moved:
                name = str(row["name"])
                if _row_key(row) in prepared:
                    loads[name] = prepared[_row_key(row)]
                elif name in snapshots:  # the last pass: parsed here, its design built here
                    loads[name] = _parse(snapshots[name])
            # Host use first, then the holds: an allocation committed between the two
            # reads is counted committed yet missing from the host use, so the node's use
            # reads low until the next sync, never high (a low count never refuses a node
            # that fits; placement.analysis).
            host = host_use(conn, names)
            held, pools, committed = self._read_holds(conn, names)
            present = {str(row["name"]) for row in rows}
            for name in [n for n in (names or self.cluster.names()) if n not in present]:
                if name in self.cluster:
                    self.cluster.remove(name)
                self.heartbeats.pop(name, None)
                self.reported.pop(name, None)
                self.cordoned.discard(name)
                self.nvlink.forget(name)
            for row in rows:
                name = str(row["name"])
                if name in loads and not self._load_snapshot(name, row, loads[name]):
                    continue
                self.reported[name] = _aware(row["reported_at"])
                try:
                    self._sync_row(row, held.get(name, set()), pools.get(name, {}), committed)
                    unlisted = self._unlisted_mig_parents(conn, name, held.get(name, set()))
                    self.cluster.keep_unlisted_migs(name, unlisted)
                    # The other holds the snapshot does not list (a GPU off the bus): by
                    # UUID, as a process that saw it go keeps them; left out, every
                    # resync found the node changed and told watchers so.
                    kept, _ = self._wanted(
                        name, held.get(name, set()), pools.get(name, {}), committed
                    )
                    self.cluster.keep_unlisted_gpus(name, kept)
                    self._sync_host(name, host.get(name, (0, 0)), committed)
                except AllocationError:
                    # The rules above leave nothing to refuse; if memory still refused the
                    # database, say so and serve the other nodes: one node never stops a sync.
                    log.exception("node %s: memory refused the database's holds", name)
            self.refresh_availability(names)
        return []

    def _prepare(self, names: list[str], prepared: dict[_RowKey, _Loaded]) -> None:
        """Read, parse and prepare (``ClusterState.prepare``) these nodes' stored
        snapshots, without the lock; each kept under the (name, seq, reported_at) that
        names it (a snapshot stored again since the pass that named it gets its own)."""
        nodes = schema.nodes
        with self.engine.connect() as conn:
            bodies = (
                conn.execute(
                    sa.select(
                        nodes.c.name, nodes.c.seq, nodes.c.reported_at, nodes.c.snapshot
                    ).where(nodes.c.name.in_(names))
                )
                .mappings()
                .all()
            )
        cluster = self.cluster
        for row in bodies:
            prepared.setdefault(_row_key(row), _parse(row["snapshot"], cluster))

    def _read_holds(
        self, conn: sa.Connection, names: list[str] | None
    ) -> tuple[dict[str, set[str]], dict[str, dict[str, int]], set[str]]:
        """The holds and share pools of these nodes (``_by_node``), and of the allocations
        this process is committing on them, those whose row the database already has:
        committed, and perhaps ended already. What they hold is then what the database
        holds, not what this process chose.

        One statement, so one moment for both (Postgres reads each statement of a
        transaction as of its own start, SQLite each one outside a write): a commit
        of this process landing between a read of the holds and a later read of its
        row counted it committed yet left its holds out, and memory freed its devices.
        Its own notification never comes back to this process, so they stayed free
        here, under a live reservation, until the next full resync."""
        gpu_holds, rows = schema.gpu_holds, schema.allocations
        holds_read = _HOLD_COLUMNS.add_columns(_NO_ID)
        if names is not None:
            holds_read = holds_read.where(gpu_holds.c.node.in_(names))
        query: sa.Select[Any] | sa.CompoundSelect[Any] = holds_read
        ids = sorted(
            {
                allocation_id
                for marks in (self.inflight, self.inflight_shares)
                for node, taken in marks.items()
                if names is None or node in names
                for allocation_id in taken
            }
        )
        if ids:
            stored = sa.select(
                *(sa.cast(sa.null(), c.type) for c in _HOLD_COLUMNS.selected_columns), rows.c.id
            ).where(rows.c.id.in_(ids))
            query = sa.union_all(holds_read, stored)
        holds: list[tuple[Any, ...]] = []
        committed: set[str] = set()
        for node, device, kind, milli, allocation_id in conn.execute(query):
            if allocation_id is None:
                holds.append((node, device, kind, milli))
            else:
                committed.add(str(allocation_id))
        held, pools = _by_node(holds)
        return held, pools, committed

    def _ready(self, loaded: _Loaded | None) -> bool:
        """Whether a prepared snapshot loads without building a design (under the lock):
        parsed and prepared for this state; a failure is ready to be reported."""
        if loaded is None:
            return False
        if isinstance(loaded, Exception):
            return True
        design = loaded[1]
        return design is not None and self.cluster.has_design(design)

    def _load_snapshot(self, name: str, row: sa.RowMapping, loaded: _Loaded) -> bool:
        """Put a stored snapshot (parsed and perhaps prepared: ``_parse``) into the
        engine; False, logged and the node left out, when it cannot be loaded (a row
        stored before snapshots were checked as the engine loads them), so that one bad
        row never stops a replica."""
        try:
            if isinstance(loaded, Exception):
                raise loaded
            self.cluster.upsert(*loaded)
        except Exception as exc:  # whatever the row holds: this node is skipped, not the start
            log.error(
                "node %s is not served: its stored snapshot (seq %s) cannot be loaded: %s: %s",
                name,
                row["seq"],
                type(exc).__name__,
                exc,
            )
            if name in self.cluster:
                self.cluster.remove(name)
            self.heartbeats.pop(name, None)
            self.reported.pop(name, None)
            self.cordoned.discard(name)
            return False
        return True

    def _has_snapshot(self, row: sa.RowMapping) -> bool:
        """Whether memory holds the snapshot a node row stores (under the lock)."""
        name = str(row["name"])
        return (
            name in self.cluster
            and self.cluster.node(name).snapshot.seq == row["seq"]
            and self.reported.get(name) == _aware(row["reported_at"])
        )

    def resync(self, chunk: int = RESYNC_CHUNK) -> list[str]:
        """Compare every node with the database; sync the ones that differ, and name them
        (in name order: the listener tells watchers of them, service/notify.py).

        A resync is the safety net behind notifications and almost always
        finds nothing to fix, yet syncing everything 200 nodes at a time held
        the state lock about 11 ms per chunk at 10,000 nodes (its reads
        included), fifty times in a row: a stall of /place and /score each
        time. So the database is read without the lock; a node that looks the
        same in memory (snapshot seq, cordon, held devices) only takes its
        newer heartbeat, ``chunk`` nodes per hold of the lock, and the others,
        with nodes that came or went, go through ``sync_nodes``, which reads
        them again under the lock. A node that changes meanwhile looks
        different (and is synced) or is caught by its notification or the
        next resync.
        """
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(*_NODE_COLUMNS)).mappings().all()
            held, pools = _by_node(conn.execute(_HOLD_COLUMNS).all())
        with self.lock:
            gone = set(self.cluster.names()) - {str(row["name"]) for row in rows}
        differ = sorted(gone)
        for start in range(0, len(rows), chunk):
            with self.lock:
                moved = []
                for row in rows[start : start + chunk]:
                    name = str(row["name"])
                    if not self._looks_synced(row, held.get(name, set()), pools.get(name, {})):
                        differ.append(name)
                        continue
                    seen = _aware(row["heartbeat_at"])
                    if seen > self.heartbeats.get(name, _EPOCH):
                        self.heartbeats[name] = seen
                        moved.append(name)
                self.refresh_availability(moved)
        differ.sort()  # name order: every replica breaks ties the same way
        for start in range(0, len(differ), chunk):
            self.sync_nodes(differ[start : start + chunk])
        return differ

    def _looks_synced(self, row: sa.RowMapping, held: set[str], pools: dict[str, int]) -> bool:
        """Whether memory already has this node as the row, holds and share pools show it
        (under the lock): what ``_sync_row`` would leave unchanged, heartbeat aside."""
        name = str(row["name"])
        if not self._has_snapshot(row) or (name in self.cordoned) != bool(row["cordoned"]):
            return False
        entry = self.cluster.node(name)
        if name in self.inflight or name in self.inflight_shares:
            # Whether what this process is committing there is stored yet is a read of
            # its own, under the lock: sync_nodes makes it.
            return False
        devices, cpus = self._wanted(name, held, pools, set())
        return (
            devices == entry.held_gpus | entry.held_migs
            and cpus == entry.held_cpus
            and self._wanted_shares(name, held, pools, set()) == entry.shares
        )

    def _wanted(
        self, name: str, held: set[str], pools: dict[str, int], committed: set[str]
    ) -> tuple[set[str], set[int]]:
        """(GPU and MIG devices, CPUs) a node should hold: the database's holds plus the
        devices this process is committing and the database has no row of, but for a GPU
        the database has shares on (another replica's commit came first: this one will be
        refused)."""
        committing = self.inflight.get(name, {})
        wanted = held | {
            device
            for allocation_id, devices in committing.items()
            if allocation_id not in committed
            for device in devices
            if device not in pools
        }
        cpus = {cpu_of(d) for d in wanted if d.startswith(CPU_PREFIX)}
        return {d for d in wanted if not d.startswith(CPU_PREFIX)}, cpus

    def _wanted_shares(
        self, name: str, held: set[str], pools: dict[str, int], committed: set[str]
    ) -> dict[str, int]:
        """Thousandths per shared GPU a node should hold: the database's pools plus the
        shares this process is committing that they do not have yet. The database wins
        where the two disagree (another replica's commit came first, and this one will
        be refused): a share on a GPU it holds whole, or past a whole GPU, is left out."""
        wanted = dict(pools)
        for allocation_id, taken in self.inflight_shares.get(name, {}).items():
            if allocation_id in committed:
                continue  # the pool read has it, or has given it back already
            for device, milli in taken:
                if device not in held and wanted.get(device, 0) + milli <= FULL_SHARE:
                    wanted[device] = wanted.get(device, 0) + milli
        return {device: milli for device, milli in wanted.items() if milli > 0}

    def _sync_row(
        self, row: sa.RowMapping, held: set[str], pools: dict[str, int], committed: set[str]
    ) -> None:
        name = str(row["name"])
        self.heartbeats[name] = max(_aware(row["heartbeat_at"]), self.heartbeats.get(name, _EPOCH))
        if row["cordoned"]:
            self.cordoned.add(name)
        else:
            self.cordoned.discard(name)
        entry = self.cluster.node(name)
        migs = {m.uuid for m in entry.snapshot.mig_instances}
        wanted, cpus = self._wanted(name, held, pools, committed)
        gpus_now, migs_now, cpus_now = entry.held_gpus, entry.held_migs, entry.held_cpus
        shares, shares_now = self._wanted_shares(name, held, pools, committed), dict(entry.shares)
        # Given back first, then taken: a GPU may go from held whole to shared, or back.
        self.cluster.release(name, gpus_now - wanted, migs_now - wanted, cpus_now - cpus)
        for device in shares_now.keys() - shares.keys():
            self.cluster.set_share(name, device, 0)
        want_gpus = {d for d in wanted - gpus_now - migs_now if entry.has_gpu(d)}
        want_migs = {d for d in wanted - gpus_now - migs_now if d in migs}
        self.cluster.allocate(name, want_gpus, want_migs, cpus - cpus_now)
        # A shared GPU the snapshot no longer lists is set too, by UUID, as the process
        # that saw it go keeps it: left out, a process started meanwhile found the node
        # short of its pool at every resync, synced it again and told watchers so.
        for device, milli in shares.items():
            if shares_now.get(device) != milli:
                self.cluster.set_share(name, device, milli)

    def _unlisted_mig_parents(
        self, conn: sa.Connection, name: str, held: set[str]
    ) -> dict[str, str]:
        """Held MIG instances the node's snapshot no longer lists (MIG turned off under
        them) and memory does not hold yet -> the UUID of the GPU each was on, from its
        allocation's placement (under the lock). The GPU stays busy while the instance is
        held; a process started after the report knew neither (the database's MIG hold
        names the instance, and its parent column the GPU) and gave the GPU whole under
        the instance's job."""
        entry = self.cluster.node(name)
        listed = {m.uuid for m in entry.snapshot.mig_instances}
        unlisted = {
            d
            for d in held
            if not d.startswith(CPU_PREFIX)
            and not entry.has_gpu(d)
            and d not in listed
            and d not in entry.held_migs
        }
        if not unlisted:
            return {}
        holds = schema.gpu_holds
        query = sa.select(holds.c.device, holds.c.parent).where(
            holds.c.node == name,
            holds.c.kind == "mig",
            holds.c.device.in_(sorted(unlisted)),
            holds.c.parent.is_not(None),
        )
        return {str(device): str(parent) for device, parent in conn.execute(query)}

    def _sync_host(self, name: str, stored: tuple[int, int], committed: set[str]) -> None:
        """A node's host use: its live allocations' figures in the database, plus those
        this process is committing that the database has no row of yet."""
        cpu, memory = stored
        for allocation_id, (c, m) in self.inflight_host.get(name, {}).items():
            if allocation_id not in committed:
                cpu, memory = cpu + c, memory + m
        self.cluster.set_host_use(name, cpu, memory)

    def begin_inflight(
        self,
        devices: Sequence[tuple[str, str]],
        shares: Sequence[tuple[str, str, int]],
        allocation_id: str,
        key: str | None = None,
        host: Sequence[tuple[str, int, int]] = (),
    ) -> None:
        """Devices and shares this process is committing for ``allocation_id`` (under
        Idempotency-Key ``key``), and its tasks' host figures (node, milli-CPU, MiB)."""
        for node, cpu, memory in host:
            c, m = self.inflight_host[node].get(allocation_id, (0, 0))
            self.inflight_host[node][allocation_id] = (c + cpu, m + memory)
        for node, device in devices:
            self.inflight[node].setdefault(allocation_id, []).append(device)
        if key is not None:
            self.inflight_keys[key] += 1
        for node, device, milli in shares:
            self.inflight_shares[node].setdefault(allocation_id, []).append((device, milli))

    def end_inflight(
        self,
        devices: Sequence[tuple[str, str]],
        shares: Sequence[tuple[str, str, int]],
        allocation_id: str,
        key: str | None = None,
    ) -> None:
        for node, _device in devices:
            _forget_allocation(self.inflight, node, allocation_id)
        if key is not None:
            self.inflight_keys[key] -= 1
            if self.inflight_keys[key] <= 0:
                del self.inflight_keys[key]
        for node, _device, _milli in shares:
            _forget_allocation(self.inflight_shares, node, allocation_id)
        for node in [n for n, marks in self.inflight_host.items() if allocation_id in marks]:
            _forget_allocation(self.inflight_host, node, allocation_id)

    def is_stale(self, node: str) -> bool:
        seen = self.heartbeats.get(node)
        if seen is None:
            return True
        return (self.clock() - seen).total_seconds() > self.settings.heartbeat_ttl_s

    def refresh_if_due(self) -> None:
        """Staleness moves with the clock: re-evaluate it when the first usable node
        could have gone stale, so a node shown stale never gets a placement."""
        if self.clock() >= self._next_stale_at:
            self.refresh_availability()

    def refresh_availability(self, names: Iterable[str] | None = None) -> None:
        """Stale or cordoned nodes get no placements.

        ``names``: only these nodes changed (a heartbeat, a snapshot, a
        cordon). Thousands of agents heartbeat every few seconds; walking the
        whole cluster for each would cost more than all the decisions.
        """
        with self.lock:
            ttl = timedelta(seconds=self.settings.heartbeat_ttl_s)
            now = self.clock()
            whole = names is None
            next_stale = _FOREVER if whole else self._next_stale_at
            for name in self.cluster.names() if names is None else names:
                if name not in self.cluster:
                    continue
                seen = self.heartbeats.get(name)
                stale = seen is None or now - seen > ttl
                usable = name not in self.cordoned and not stale
                if usable and seen is not None:
                    # A heartbeat only moves this later, so this time stays conservative.
                    next_stale = min(next_stale, seen + ttl)
                if self.cluster.node(name).available != usable:
                    self.cluster.set_available(name, usable)
            self._next_stale_at = next_stale


# A stored snapshot read for loading: parsed with its design prepared (None: to be worked
# out by the upsert, under the lock), or what parsing or preparing it raised.
_Loaded = tuple[NodeSnapshot, Design | None] | Exception
_RowKey = tuple[str, int, datetime]


def _row_key(row: sa.RowMapping) -> _RowKey:
    """(name, seq, reported_at): what names one stored snapshot (see ``reported``)."""
    return str(row["name"]), int(row["seq"]), _aware(row["reported_at"])


def _parse(body: str, cluster: ClusterState | None = None) -> _Loaded:
    """A stored snapshot parsed, with its design prepared for ``cluster`` when given."""
    try:
        snapshot = NodeSnapshot.model_validate(json.loads(body))
        return snapshot, None if cluster is None else cluster.prepare(snapshot)
    except Exception as exc:  # whatever the row holds: _load_snapshot says so
        return exc


def host_use(conn: sa.Connection, names: list[str] | None) -> dict[str, tuple[int, int]]:
    """node -> (milli-CPU, MiB) held by its live allocations, from their host figure
    columns (``cpu_milli``, ``memory_mib`` per task) and placements (the tasks on each
    node).

    Only rows that carry a figure are read: rows without one (requests that leave them
    out, and rows written before the fields existed) count nothing."""
    rows, holds, shared = schema.allocations, schema.gpu_holds, schema.gpu_shares
    carries = sa.or_(rows.c.cpu_milli.is_not(None), rows.c.memory_mib.is_not(None))
    query = sa.select(rows.c.cpu_milli, rows.c.memory_mib, rows.c.placement).where(
        rows.c.live.is_(True), carries
    )
    if names is not None:
        on_nodes = sa.union(
            sa.select(holds.c.allocation_id).where(holds.c.node.in_(names)),
            sa.select(shared.c.allocation_id).where(shared.c.node.in_(names)),
        )
        query = query.where(rows.c.id.in_(on_nodes))
    use: dict[str, tuple[int, int]] = {}
    for cpu_milli, memory_mib, placement in conn.execute(query):
        cpu, memory = int(cpu_milli or 0), int(memory_mib or 0)
        for task in json.loads(placement).get("tasks", ()):
            node = str(task["node"])
            c, m = use.get(node, (0, 0))
            use[node] = (c + cpu, m + memory)
    return use


def _forget_allocation(marks: dict[str, dict[str, Any]], node: str, allocation_id: str) -> None:
    """Drop an allocation's in-flight marks on a node; a node left with none goes."""
    taken = marks.get(node)
    if taken is not None:
        taken.pop(allocation_id, None)
        if not taken:
            del marks[node]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FOREVER = datetime(9999, 1, 1, tzinfo=UTC)
CPU_PREFIX = CPU_DEVICE_PREFIX  # no snapshot's GPU or MIG UUID starts so (placement.snapshot)
SHARED = schema.SHARED
MIG_POOL = schema.MIG_POOL
_NODE_COLUMNS = (
    schema.nodes.c.name,
    schema.nodes.c.seq,
    schema.nodes.c.reported_at,
    schema.nodes.c.cordoned,
    schema.nodes.c.heartbeat_at,
)
_HOLD_COLUMNS = sa.select(
    schema.gpu_holds.c.node,
    schema.gpu_holds.c.device,
    schema.gpu_holds.c.kind,
    schema.gpu_holds.c.share_milli,
)


# The column that names a committed allocation in ``_read_holds``' rows; none on a hold.
_NO_ID = sa.cast(sa.null(), schema.allocations.c.id.type).label("committed")


def _by_node(
    rows: Iterable[Sequence[Any]],
) -> tuple[dict[str, set[str]], dict[str, dict[str, int]]]:
    """gpu_holds rows (node, device, kind, share_milli) as (node -> the devices held,
    node -> a shared GPU's thousandths held)."""
    held: dict[str, set[str]] = defaultdict(set)
    pools: dict[str, dict[str, int]] = defaultdict(dict)
    for node, device, kind, milli in rows:
        if kind == SHARED:
            pools[str(node)][str(device)] = int(milli or 0)
        elif kind != MIG_POOL:  # its instances' holds are what memory follows
            held[str(node)].add(str(device))
    return held, pools


def cpu_device(cpu: int) -> str:
    """The gpu_holds device name of a CPU reserved with cpus_per_task."""
    return f"{CPU_PREFIX}{cpu}"


def cpu_of(device: str) -> int:
    return int(device.removeprefix(CPU_PREFIX))


def _aware(value: datetime) -> datetime:
    # SQLite hands back naive datetimes for timezone-aware columns.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
