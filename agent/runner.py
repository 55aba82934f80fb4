"""The agent's loop: register the key, send the snapshot when it changes, heartbeat between.

Each round reads the node, compares a hash of its content (everything but
``seq`` and ``timestamp``) with the last one the service acknowledged, and
sends a full signed snapshot when it differs, else a heartbeat. A snapshot
that was signed but not yet acknowledged is resent unchanged (same seq, same
signature) until the service takes it; a service that had taken it answers
``replayed_snapshot`` (a signed snapshot is taken once), and the agent signs
the next round's with a newer seq.

``seq`` is the larger of the last seq + 1 and the time in milliseconds, so
it keeps increasing across restarts without a state file; if the service
says a seq went back (its clock-independent check), the agent continues
from the service's stored seq + 1.

Nothing the service does stops the agent: an unreachable or failing
service, or a refusal, is logged and retried with exponential backoff and
jitter. A round whose discovery fails as a whole sends no heartbeat either,
so the node turns stale instead of looking healthy with outdated facts.

NVLink counters (``telemetry``, where the source reads NVML) ride on a
heartbeat at most once per ``telemetry_interval_s`` (30 s by default,
``--telemetry-interval``): a heartbeat round between carries nothing more,
so thousands of agents heartbeating every 15 s send counters half as often.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from agent.signing import NodeKey, canonical_json
from agent.sources import Source
from placement.snapshot import NodeSnapshot
from topoplace_client.api import ApiError, JSONObject, ServiceUnreachable

log = logging.getLogger("topoplace.agent")
TELEMETRY_INTERVAL_S = 30.0


class AgentClient(Protocol):
    """The calls the agent makes (``topoplace_client.api.TopoplaceClient`` has them)."""

    def put_snapshot(
        self, name: str, snapshot: dict[str, Any], signature: str | None = None
    ) -> JSONObject: ...
    def heartbeat(self, name: str, nvlink: list[dict[str, int]] | None = None) -> None: ...
    def put_node_key(self, name: str, public_key: str) -> JSONObject: ...


class Backoff:
    """Exponential backoff with jitter: the n-th failure waits 50-100% of initial * 2^n, capped."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.failures = 0
        self.rng = rng or random.Random()

    def next(self) -> float:
        ceiling = min(self.max_s, self.initial_s * 2 ** min(self.failures, 30))
        self.failures += 1
        # Jitter spreads the retries of thousands of agents after an outage.
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


def content_hash(snap: NodeSnapshot) -> str:
    """What changes when the node changes: everything but seq and timestamp."""
    body = snap.model_dump(mode="json", exclude={"seq", "timestamp"})
    return hashlib.sha256(canonical_json(body)).hexdigest()


@dataclass(frozen=True)
class SignedReport:
    digest: str
    seq: int
    snapshot: dict[str, Any]
    signature: str


class Agent:
    def __init__(
        self,
        source: Source,
        client: AgentClient,
        key: NodeKey,
        name: str,
        *,
        interval_s: float,
        backoff: Backoff,
        clock: Callable[[], float] = time.time,
        telemetry: Callable[[], list[dict[str, int]]] | None = None,
        telemetry_interval_s: float = TELEMETRY_INTERVAL_S,
    ) -> None:
        self.source = source
        self.client = client
        self.key = key
        self.name = name
        self.interval_s = interval_s
        self.backoff = backoff
        self.clock = clock
        self.seq = 0
        self.acked: str | None = None  # content hash the service last acknowledged
        self.pending: SignedReport | None = None
        self.key_registered = False
        self.telemetry = telemetry
        self.telemetry_interval_s = telemetry_interval_s
        self.telemetry_at: float | None = None  # when counters last went with a heartbeat

    # -- one round -------------------------------------------------------------

    def step(self) -> float:
        """One round; returns how long to wait before the next."""
        try:
            snap = self.source.read()
        except Exception as exc:  # whatever discovery raised, the agent stays up
            log.error("discovery failed, no heartbeat this round: %s", exc)
            return self.backoff.next()
        try:
            self._register_key()
            self._report(snap)
        except ServiceUnreachable as exc:
            log.warning("%s; retrying", exc)
            return self.backoff.next()
        except ApiError as exc:
            return self._refused(exc)
        except Exception:
            log.exception("unexpected error talking to the service; retrying")
            return self.backoff.next()
        self.backoff.reset()
        return self.interval_s

    def _register_key(self) -> None:
        if self.key_registered:
            return
        try:
            self.client.put_node_key(self.name, self.key.public_key)
        except ApiError as exc:
            if exc.code != "conflict":
                raise
            # Registration is trust on first use: another key owns this name.
            # Snapshots are still sent; verifying services will refuse them.
            log.error(
                "the service holds a different public key for node %s: %s", self.name, exc.message
            )
        self.key_registered = True

    def _report(self, snap: NodeSnapshot) -> None:
        digest = content_hash(snap)
        if digest == self.acked:
            try:
                nvlink = self._due_telemetry()
                if nvlink is None:
                    self.client.heartbeat(self.name)
                else:
                    self.client.heartbeat(self.name, nvlink)
                return
            except ApiError as exc:
                if exc.code != "not_found":
                    raise
                # The service forgot the node (deleted, or a new database): report it again.
                log.warning("the service does not know node %s; sending the snapshot", self.name)
                self.acked = None
        self._send(snap, digest)

    def _due_telemetry(self) -> list[dict[str, int]] | None:
        """The NVLink counters when they are due (and the source has any), else None."""
        if self.telemetry is None:
            return None
        now = self.clock()
        if self.telemetry_at is not None and now - self.telemetry_at < self.telemetry_interval_s:
            return None
        self.telemetry_at = now
        return self.telemetry() or None

    def _send(self, snap: NodeSnapshot, digest: str) -> JSONObject:
        report = self._signed(snap, digest)
        answer = self.client.put_snapshot(self.name, report.snapshot, report.signature)
        self.acked, self.pending = digest, None
        log.info("snapshot seq %d sent (changed: %s)", report.seq, answer.get("changed"))
        return answer

    def send_once(self) -> JSONObject:
        """Register the key and send the snapshot now; errors are raised, not retried."""
        snap = self.source.read()
        self._register_key()
        return self._send(snap, content_hash(snap))

    def _signed(self, snap: NodeSnapshot, digest: str) -> SignedReport:
        if self.pending is not None and self.pending.digest == digest:
            return self.pending
        now = self.clock()
        self.seq = max(self.seq + 1, int(now * 1000))
        body = snap.model_copy(
            update={"seq": self.seq, "timestamp": datetime.fromtimestamp(now, UTC)}
        ).model_dump(mode="json")
        self.pending = SignedReport(digest, self.seq, body, self.key.sign(body))
        return self.pending

    def _refused(self, exc: ApiError) -> float:
        seq_refused = exc.code in ("conflict", "replayed_snapshot")
        if seq_refused and exc.detail.get("field") == "snapshot.seq":
            # The service holds this seq or a later one (our clock went back,
            # another agent used this name, or it took a resent snapshot whose
            # answer was lost: a signed snapshot is taken once): continue after it.
            stored = exc.detail.get("stored_seq")
            self.seq = max(self.seq, stored if isinstance(stored, int) else self.seq)
            self.pending = None
            log.warning("%s; continuing from seq %d", exc.message, self.seq + 1)
            return 0.0
        if exc.status >= 500:
            log.warning("the service failed (%s): %s; retrying", exc.code, exc.message)
        else:
            log.error("the service refused (%s): %s; retrying", exc.code, exc.message)
        return self.backoff.next()

    # -- the loop ----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop`` is set."""
        log.info("agent for node %s started", self.name)
        while not stop.is_set():
            stop.wait(self.step())
        log.info("agent for node %s stopped", self.name)
