"""What /metrics reads from the service's state when scraped, rather than counting it.

Counters kept beside the state would drift from it (a replica's change, a
resync, a restart); these gauges are the state itself at scrape time:

- nodes by design, region and condition (ready, stale, cordoned);
- GPUs by design, region and state (free, held whole or in shares,
  unavailable: not held but on a stale or cordoned node, or unhealthy);
- the largest free NVLink island on any node of a design and region;
- live allocations by state (one query to the database);
- this host's clock offset from the database's (service/database_time.py);
- each node's latest NVLink counters (service/nodes/nvlink.py).

A node's *design* is its GPU count and model (``8x NVIDIA H100 80GB HBM3``):
nodes of one design answer placements alike, and there are few designs.
The state lock is taken for ``CHUNK`` nodes at a time, only to copy their
values, so a scrape of a large cluster never stalls /place for long.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import sqlalchemy as sa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from placement import NodeSnapshot, NodeView
from placement.islands import Island
from service import schema
from service.database_time import DatabaseTime
from service.nodes.nvlink import COUNTERS
from service.state import ServiceState

CHUNK = 200  # nodes copied per hold of the state lock (as in the resync, state.py)
CONDITIONS = ("ready", "stale", "cordoned")
GPU_STATES = ("free", "held", "unavailable")
NVLINK_HELP = {
    "tx_bytes": "NVLink data bytes sent, per node, GPU and link (NVML since driver load).",
    "rx_bytes": "NVLink data bytes received, per node, GPU and link.",
    "crc_flit_errors": "NVLink flow-control CRC errors, per node, GPU and link.",
    "crc_data_errors": "NVLink data CRC errors, per node, GPU and link.",
    "replay_errors": "NVLink replays, per node, GPU and link.",
    "recovery_errors": "NVLink recoveries, per node, GPU and link.",
}


def design_of(snapshot: NodeSnapshot) -> str:
    """``<count>x<model>`` of the node's most common GPU model; ``none`` without GPUs."""
    models = Counter(g.model for g in snapshot.gpus)
    if not models:
        return "none"
    return f"{snapshot.gpu_count}x{models.most_common(1)[0][0]}"


@dataclass
class _Group:
    nodes: Counter[str] = field(default_factory=Counter)
    gpus: Counter[str] = field(default_factory=Counter)
    largest_free_island: int = 0


@dataclass(frozen=True, slots=True)
class _Design:
    """What a scrape needs of a snapshot, worked out once per snapshot."""

    snapshot: NodeSnapshot  # held so that its id() names only it while cached
    group: tuple[str, str]  # (design, region)
    island_masks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Reading:
    """A node as one hold of the lock saw it: immutable values only."""

    snapshot: NodeSnapshot
    islands: tuple[Island, ...]
    free: int
    held: int
    condition: str


def _held_listed(entry: NodeView) -> int:
    """The GPUs held whole that the node's snapshot lists."""
    return sum(entry.has_gpu(uuid) for uuid in entry.held_gpus)


def _add(group: _Group, reading: _Reading, design: _Design) -> None:
    group.nodes[reading.condition] += 1
    free = reading.free if reading.condition == "ready" else 0
    free_count = free.bit_count()
    group.gpus["free"] += free_count
    group.gpus["held"] += reading.held
    group.gpus["unavailable"] += max(0, reading.snapshot.gpu_count - reading.held - free_count)
    island_free = max(((free & m).bit_count() for m in design.island_masks), default=0)
    group.largest_free_island = max(group.largest_free_island, island_free)


class ClusterCollector(Collector):
    """The lock is held only to copy each node's immutable values (a snapshot, a mask,
    a count); designs and island masks are worked out outside it, once per snapshot:
    at 10,000 nodes, working them out under the lock held it 10 ms per 500 nodes."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state
        self._designs: dict[int, _Design] = {}  # id(snapshot) -> its design
        self._designs_lock = threading.Lock()  # two scrapes at once share the cache

    def describe(self) -> list[Metric]:
        """Nothing: registering must not read the state (it may not be loaded yet)."""
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._nodes()
        yield self._allocations()
        yield self._clock_offset()
        if self.state.settings.metrics_nvlink:
            yield from self._nvlink()

    def _clock_offset(self) -> Metric:
        """How far this host's clock is from the database's, the one every decision is
        judged on (service/database_time.py): 0 where they are one clock (SQLite) and
        before the first reading."""
        clock = self.state.clock
        offset = clock.offset_s if isinstance(clock, DatabaseTime) else None
        return GaugeMetricFamily(
            "topoplace_clock_offset_seconds",
            "This host's clock minus the database's, at the last reading.",
            value=offset or 0.0,
        )

    def _readings(self) -> list[_Reading]:
        state = self.state
        with state.lock:
            names = state.cluster.names()
        readings: list[_Reading] = []
        for start in range(0, len(names), CHUNK):
            with state.lock:
                for name in names[start : start + CHUNK]:
                    if name not in state.cluster:
                        continue  # removed since the names were read
                    entry = state.cluster.node(name)
                    if name in state.cordoned:
                        condition = "cordoned"
                    elif state.is_stale(name):
                        condition = "stale"
                    else:
                        condition = "ready"
                    readings.append(
                        _Reading(
                            entry.snapshot,
                            entry.islands,
                            entry.free_mask,
                            # A GPU holding shares is in use too: left out, it read as
                            # unavailable and a cluster of shares as idle. Only the GPUs
                            # the snapshot lists, as for shares: one held by UUID while
                            # off the bus made the design's GPUs more than its nodes have.
                            _held_listed(entry) + len(entry.shares_by_index),
                            condition,
                        )
                    )
        return readings

    def _design(self, reading: _Reading) -> _Design:
        found = self._designs.get(id(reading.snapshot))
        if found is None or found.snapshot is not reading.snapshot:
            snap = reading.snapshot
            masks = tuple(sum(1 << g for g in i.gpus) for i in reading.islands)
            found = _Design(snap, (design_of(snap), snap.region), masks)
        return found

    def _groups(self) -> dict[tuple[str, str], _Group]:
        groups: dict[tuple[str, str], _Group] = defaultdict(_Group)
        with self._designs_lock:
            seen: dict[int, _Design] = {}
            for reading in self._readings():
                design = self._design(reading)
                seen[id(reading.snapshot)] = design
                _add(groups[design.group], reading, design)
            self._designs = seen  # the nodes gone or re-reported are dropped
        return groups

    def _nodes(self) -> Iterator[Metric]:
        labels = ["design", "region"]
        nodes = GaugeMetricFamily(
            "topoplace_nodes",
            "Nodes by design, region and condition.",
            labels=[*labels, "condition"],
        )
        gpus = GaugeMetricFamily(
            "topoplace_gpus",
            "Whole GPUs by design, region and state (free: placeable now; held: reserved or"
            " in use, whole or in GPU shares; unavailable: on a stale or cordoned node, or"
            " unhealthy).",
            labels=[*labels, "state"],
        )
        island = GaugeMetricFamily(
            "topoplace_largest_free_nvlink_island_gpus",
            "The most free GPUs joined by NVLink on any one ready node of a design and region.",
            labels=labels,
        )
        for (design, region), group in sorted(self._groups().items()):
            for condition in CONDITIONS:
                nodes.add_metric([design, region, condition], group.nodes[condition])
            for gpu_state in GPU_STATES:
                gpus.add_metric([design, region, gpu_state], group.gpus[gpu_state])
            island.add_metric([design, region], group.largest_free_island)
        yield from (nodes, gpus, island)

    def _allocations(self) -> Metric:
        allocations = schema.allocations
        query = (
            sa.select(allocations.c.state, sa.func.count())
            .where(allocations.c.state.in_(schema.LIVE_STATES))
            .group_by(allocations.c.state)
        )
        with self.state.engine.connect() as conn:
            counts = {str(s): int(n) for s, n in conn.execute(query).all()}
        family = GaugeMetricFamily(
            "topoplace_allocations", "Live allocations by state.", labels=["state"]
        )
        for live in schema.LIVE_STATES:
            family.add_metric([live], counts.get(live, 0))
        return family

    def _nvlink(self) -> Iterator[Metric]:
        labels = ["node", "gpu", "link"]
        families = {
            name: CounterMetricFamily(f"topoplace_nvlink_{name}", NVLINK_HELP[name], labels=labels)
            for name in COUNTERS
        }
        taken = GaugeMetricFamily(
            "topoplace_nvlink_telemetry_timestamp_seconds",
            "When the service took each node's latest NVLink counters (Unix time).",
            labels=["node"],
        )
        for reading in sorted(self.state.nvlink.readings(), key=lambda r: r.node):
            taken.add_metric([reading.node], reading.at.timestamp())
            for link in reading.links:
                values = [reading.node, str(link.gpu), str(link.link)]
                for name in COUNTERS:
                    value = getattr(link, name)
                    if value is not None:
                        families[name].add_metric(values, value)
        yield from families.values()
        yield taken
