"""The global service's view of its regions: parsed once per change, staleness per call.

Routing reads the regions on every request, so they are kept in memory as
the ranking's values (``ranking.Region``, whose per-design capacities and
prices are counted when it is made) and judged stale against the clock at
each call. A summary this process takes replaces its region's entry at
once; a registration, update or retirement here makes the next request read
the table again (an update on another replica is read before each forward:
routing._live_record); and every second a background task (``follow``) reads each
live region's summary seq alone and rereads only the regions whose seq
moved, for what other replicas took. Reading every summary each second held
the interpreter 3-6 ms at 50 regions, a stall on whichever request was
running; the seqs alone take about 0.5 ms. No request waits for a read but
the first one after a registration, update or retirement.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from service.event_loop import off_loop
from service.federation import ranking, store, summary_seq
from service.federation.store import RegionRecord
from service.state import Clock

REREAD_S = 1.0
log = logging.getLogger("topoplace.federation")


def summary_of(body: dict[str, Any]) -> ranking.Summary:
    return ranking.Summary(
        region=body["region"],
        seq=body["seq"],
        designs=tuple(
            ranking.DesignFree(
                design=d["design"],
                gpu_model=d["gpu_model"],
                gpus_per_node=d["gpus_per_node"],
                nodes=d["nodes"],
                free_gpus=d["free_gpus"],
                island_gbps=d["island_gbps"],
                by_island={int(k): v for k, v in d.get("by_island", {}).items()},
            )
            for d in body.get("designs", ())
        ),
        cliques=tuple(
            ranking.CliqueFree(c["domain"], c["design"], c["nodes"], c["free_nodes"])
            for c in body.get("cliques", ())
        ),
        stale_nodes=body.get("stale_nodes", 0),
        live_allocations=body.get("live_allocations", 0),
        network_gbps=body.get("network_gbps", 25.0),
    )


def _readable_summary(record: RegionRecord) -> tuple[ranking.Summary | None, str | None]:
    """The region's stored summary as the ranking takes it, or why it cannot be read. A
    summary stored before a check it now fails (island sizes were once checked by
    str.isdigit(), which takes "²") would otherwise raise out of every read of the table,
    a 500 for every federated call, on every replica, until the region pushed again."""
    if record.summary is None:
        return None, None
    try:
        return summary_of(record.summary), None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning(
            "region %s's stored summary (seq %s) cannot be read, so it is not routed to until"
            " its next push: %r",
            record.name,
            record.summary_seq,
            exc,
        )
        return None, f"its stored summary cannot be read ({exc!r}); waiting for its next push"


def region_of(record: RegionRecord) -> ranking.Region:
    summary, problem = _readable_summary(record)
    return ranking.Region(
        name=record.name,
        cloud=record.cloud,
        prices=tuple(
            ranking.Price(p["gpu_model"], p["on_demand"], p.get("spot")) for p in record.prices
        ),
        egress=ranking.Egress(record.egress["region_gb"], record.egress["internet_gb"]),
        summary=summary,
        labels=record.labels,
        summary_problem=problem,
    )


def _newer(kept: RegionRecord, read: RegionRecord) -> bool:
    """The summary kept here is newer than the one read: put here after the read began. A
    kept seq too far ahead to bind a push (service/federation/summary_seq.py) is not."""
    kept_seq, read_seq = kept.summary_seq or 0, read.summary_seq or 0
    binds = kept_seq <= summary_seq.binding_up_to(time.time_ns())
    return kept_seq > read_seq and binds and kept.retired_at == read.retired_at


@dataclass(frozen=True)
class Known:
    record: RegionRecord
    region: ranking.Region  # stale=False; judged per call


class Registry:
    def __init__(self, engine: sa.Engine, stale_s: float, clock: Clock) -> None:
        self.engine = engine
        self.stale_after = timedelta(seconds=stale_s)
        self.clock = clock
        self._known: dict[str, Known] = {}
        # A registration or retirement here moves the generation; a whole read that began
        # at the current one makes the registry fresh. Counted, not a flag, so a read that
        # began before a change does not hide it.
        self._generation = 0
        self._fresh_at = -1
        self._lock = threading.Lock()
        self._bad_urls_told: set[tuple[str, str]] = set()

    def invalidate(self) -> None:
        with self._lock:
            self._generation += 1

    @property
    def due(self) -> bool:
        """Never read, or changed here since: the next request reads before it routes."""
        return self._fresh_at != self._generation

    def put(self, record: RegionRecord) -> None:
        """This process stored a newer summary of ``record``'s region: route by it now.
        Two pushes stored side by side may come here in either order: the newer stays."""
        known = Known(record, region_of(record))
        with self._lock:
            kept = self._known.get(record.name)
            if kept is not None and _newer(kept.record, record):
                return
            self._known[record.name] = known

    async def follow(self) -> None:
        """Every REREAD_S, take what other replicas took: summaries, registrations and
        retirements."""
        while True:
            await asyncio.sleep(REREAD_S)
            try:
                await off_loop(self.refresh)
            except Exception:  # the database down a moment: the next round reads again
                log.exception("reading the regions failed; retrying")

    def reread(self) -> None:
        """Read every live region from the database (blocking); parse only what changed."""
        with self._lock:
            generation = self._generation
        records = store.listed(self.engine)
        self._take(records, {r.name for r in records}, generation)

    def refresh(self) -> None:
        """Read the live regions' seqs (blocking); reread only the regions that are new
        here or whose seq moved, and drop those no longer live."""
        with self._lock:
            generation = self._generation
            kept = {name: k.record.summary_seq for name, k in self._known.items()}
        seqs = store.live_seqs(self.engine)
        moved = [name for name, seq in seqs.items() if name not in kept or kept[name] != seq]
        records = store.named(self.engine, moved) if moved else []
        self._take(records, set(seqs), generation)

    def _take(self, records: list[RegionRecord], live: set[str], generation: int) -> None:
        with self._lock:
            known = {name: k for name, k in self._known.items() if name in live}
            for record in records:
                old = known.get(record.name)
                if old is not None and (old.record == record or _newer(old.record, record)):
                    continue  # the same, or a summary put here after this read began
                known[record.name] = Known(record, region_of(record))
            self._known = dict(sorted(known.items()))  # by name, as the table is listed
            if generation == self._generation:
                self._fresh_at = generation

    def is_stale(self, record: RegionRecord, now: datetime) -> bool:
        return record.summary_at is None or now - record.summary_at > self.stale_after

    def regions(self) -> list[ranking.Region]:
        """Every live region as the ranking takes it, stale ones marked."""
        now = self.clock()
        with self._lock:
            known = list(self._known.values())
        return [
            replace(k.region, stale=True) if self.is_stale(k.record, now) else k.region
            for k in known
        ]

    def tell_bad_url(self, record: RegionRecord, problem: str) -> None:
        """Warn, once per region and URL in this process, that the region's stored URL
        takes no forwards: each request that ranks it skips it, and says so in its
        attempts, but a warning a request would flood the log."""
        with self._lock:
            told = (record.name, record.url) in self._bad_urls_told
            self._bad_urls_told.add((record.name, record.url))
        if not told:
            log.warning(
                "region %s is skipped: its stored URL %r takes no forwards (%s); set a"
                " good one (PATCH /v1/regions/%s, topoplace region update %s --url URL)",
                record.name,
                record.url,
                problem,
                record.name,
                record.name,
            )

    def record(self, name: str) -> RegionRecord | None:
        with self._lock:
            found = self._known.get(name)
        return None if found is None else found.record
