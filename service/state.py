"""The service's in-memory view: the engine's ClusterState plus what it needs to stay true.

Reads (/score, node listings) are served from here; writes go to the
database first or, for placements, tentatively here and then to the
database, undone if the commit fails. One lock serializes changes to the
engine state, which is the engine's contract (placement/cluster.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from placement import ClusterState, NodeSnapshot
from service import schema
from service.settings import Settings

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class ServiceState:
    def __init__(self, settings: Settings, engine: Engine, clock: Clock = utc_now) -> None:
        self.settings = settings
        self.engine = engine
        self.clock = clock
        self.cluster = ClusterState()
        self.lock = threading.RLock()
        self.heartbeats: dict[str, datetime] = {}
        self.cordoned: set[str] = set()
        self.loaded = False

    def load(self) -> None:
        """Build the in-memory state from the database (start-up, or after losing track)."""
        with self.engine.connect() as conn:
            node_rows = conn.execute(sa.select(schema.nodes)).mappings().all()
            holds = conn.execute(sa.select(schema.gpu_holds)).mappings().all()
        with self.lock:
            self.cluster = ClusterState()
            self.heartbeats.clear()
            self.cordoned.clear()
            for row in node_rows:
                self.cluster.upsert(NodeSnapshot.model_validate(json.loads(row["snapshot"])))
                self.heartbeats[row["name"]] = _aware(row["heartbeat_at"])
                if row["cordoned"]:
                    self.cordoned.add(row["name"])
            self.add_holds(holds)
            self.refresh_availability()
            self.loaded = True

    def add_holds(self, holds: Iterable[sa.RowMapping]) -> None:
        """Mark held in memory what the database says is held (idempotent)."""
        with self.lock:
            for hold in holds:
                node = str(hold["node"])
                if node not in self.cluster:
                    continue
                entry = self.cluster.node(node)
                device = str(hold["device"])
                if hold["kind"] == "mig" and device not in entry.busy_mig:
                    self.cluster.allocate(node, mig_uuids=[device])
                elif hold["kind"] == "gpu" and device not in entry.busy:
                    self.cluster.allocate(node, gpu_uuids=[device])

    def is_stale(self, node: str) -> bool:
        seen = self.heartbeats.get(node)
        if seen is None:
            return True
        return (self.clock() - seen).total_seconds() > self.settings.heartbeat_ttl_s

    def refresh_availability(self) -> None:
        """Stale or cordoned nodes get no placements; called before each decision."""
        with self.lock:
            for name in self.cluster.names():
                usable = name not in self.cordoned and not self.is_stale(name)
                if self.cluster.node(name).available != usable:
                    self.cluster.set_available(name, usable)


def _aware(value: datetime) -> datetime:
    # SQLite hands back naive datetimes for timezone-aware columns.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
