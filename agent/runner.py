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

The key is registered before the first report and again whenever the
service has forgotten the node or its key (a heartbeat answered 404, a
snapshot refused with ``node_key_required``). A key the service refuses (a
different one holds the name, or only an admin may register a first key)
stops reporting until it is fixed, with an error naming the fixing command,
logged at most every ``KEY_ERROR_EVERY_S``.

Nothing the service does stops the agent: an unreachable or failing
service, or a refusal, is logged and retried with exponential backoff and
jitter (a 429 or 503 waits its Retry-After instead where that is longer, up
to ``RETRY_AFTER_MAX_S``); a refused token (401) has the token file read again, so a rotated
token is picked up without a restart. A round whose discovery fails as a
whole sends no heartbeat either, so the node turns stale instead of looking
healthy with outdated facts.

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
from topoplace_client.retry_after import retry_after_s

log = logging.getLogger("topoplace.agent")
TELEMETRY_INTERVAL_S = 30.0

# Answers that say "overloaded, come back later": their Retry-After is honoured.
BUSY_STATUSES = frozenset({429, 503})
# A key the service refuses is logged as an error at most this often (seconds).
KEY_ERROR_EVERY_S = 300.0


class KeyRefused(Exception):
    """The service refuses the node's key (another key holds the name, or only an admin may
    register a first key); the message says what fixes it."""


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


def _due(last: float | None, now: float, every_s: float) -> bool:
    """Whether something done at ``last`` is due again at ``now``. A clock stepped back
    (``now`` before ``last``) makes it due: else it would wait as long as the step."""
    return last is None or not 0 <= now - last < every_s


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
        key_hint: str | None = None,
        reload_token: Callable[[], bool] | None = None,
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
        # How the fixing command names the key (``@PATH.pub``); else the key itself.
        self.key_hint = key_hint
        self.key_problem_logged_at: float | None = None
        # Re-reads the token file after a 401; whether the token changed (a rotation).
        self.reload_token = reload_token
        # Whether a refusal was retried without a pause since a round last went through.
        self.retried_at_once = False

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
        except KeyRefused as exc:
            return self._key_not_accepted(exc)
        except ApiError as exc:
            return self._refused(exc)
        except Exception:
            log.exception("unexpected error talking to the service; retrying")
            return self.backoff.next()
        self.backoff.reset()
        self.retried_at_once = False
        return self.interval_s

    def _register_key(self) -> None:
        if self.key_registered:
            return
        try:
            self.client.put_node_key(self.name, self.key.public_key)
        except ApiError as exc:
            raise self._key_refusal(exc) from None
        if self.key_problem_logged_at is not None:
            log.info("public key of node %s registered", self.name)
            self.key_problem_logged_at = None
        self.key_registered = True

    def _key_refusal(self, exc: ApiError) -> Exception:
        """The refusal of a key registration as a KeyRefused naming the command that fixes it."""
        key = self.key_hint or self.key.public_key
        if exc.code == "conflict" and exc.detail.get("field") == "public_key":
            return KeyRefused(
                f"the service holds a different public key for node {self.name}, so it refuses"
                " this agent's snapshots (was the node reinstalled, or does another machine"
                " use this name?); if this agent's key is the node's now, an admin replaces the"
                f" old one: topoplace node-key {self.name} --register {key} --replace"
            )
        if exc.status == 403 and exc.code == "forbidden":
            return KeyRefused(
                f"node {self.name} has no registered public key and this service lets only an"
                f" admin register a node's first key: an admin runs topoplace node-key"
                f" {self.name} --register {key} (or the service trusts on first use:"
                f" TOPOPLACE_TRUST_ON_FIRST_USE=true); the service said: {exc.message}"
            )
        return exc

    def _key_not_accepted(self, exc: KeyRefused) -> float:
        """Loud, but once per KEY_ERROR_EVERY_S: the agent retries every round until it is fixed."""
        now = self.clock()
        if _due(self.key_problem_logged_at, now, KEY_ERROR_EVERY_S):
            log.error("%s; nothing is reported until then (retrying)", exc)
            self.key_problem_logged_at = now
        else:
            log.debug("%s", exc)
        return self.backoff.next()

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
                # The service forgot the node (deleted, or a new database): register the
                # key again (a new database has none) and report the node again.
                log.warning("the service does not know node %s; sending the snapshot", self.name)
                self.acked = None
                self.key_registered = False
                self._register_key()
        self._send(snap, digest)

    def _due_telemetry(self) -> list[dict[str, int]] | None:
        """The NVLink counters when they are due (and the source has any), else None."""
        if self.telemetry is None:
            return None
        now = self.clock()
        if not _due(self.telemetry_at, now, self.telemetry_interval_s):
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
        """Register the key and send the snapshot now; errors (``KeyRefused`` among them)
        are raised, not retried, but for a seq the service holds a newer one of (the clock
        went back): that is sent once more after the stored seq, as the daemon would."""
        snap = self.source.read()
        self._register_key()
        digest = content_hash(snap)
        try:
            return self._send(snap, digest)
        except ApiError as exc:
            if not self._continue_after_stored_seq(exc):
                raise
        return self._send(snap, digest)

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
        if exc.code == "node_key_required":
            # The service has no key for the node (e.g. its database was reset): register again.
            log.warning("the service has no public key for node %s; registering it", self.name)
            self.key_registered = False
            return self._at_once()
        if self._continue_after_stored_seq(exc):
            return self._at_once()
        if exc.status == 401 and self.reload_token is not None and self.reload_token():
            # A rotated token: the old one is revoked once the new one is deployed, and
            # an agent that kept the old one would never be heard again until restarted.
            log.warning("the service refused the token; the token file changed, retrying")
            return self.backoff.next()
        if exc.status in BUSY_STATUSES:
            return self._busy(exc)
        if exc.status >= 500:
            log.warning("the service failed (%s): %s; retrying", exc.code, exc.message)
        else:
            log.error("the service refused (%s): %s; retrying", exc.code, exc.message)
        return self.backoff.next()

    def _busy(self, exc: ApiError) -> float:
        """The backoff, or the answer's Retry-After where longer (capped): an overloaded
        service that thousands of agents retried at their own pace would stay overloaded."""
        delay = self.backoff.next()
        asked = retry_after_s(exc.retry_after, self.clock())
        if asked is not None and asked > delay:
            delay = asked
        log.warning(
            "the service is busy (%d %s): %s; retrying in %.0f s",
            exc.status,
            exc.code,
            exc.message,
            delay,
        )
        return delay

    def _at_once(self) -> float:
        """No pause for the first refusal that the next try mends (a key to register again,
        a seq to continue after), the backoff for any more before a round goes through: a
        service that keeps answering so must not get a loop of requests without a pause."""
        if self.retried_at_once:
            return self.backoff.next()
        self.retried_at_once = True
        return 0.0

    def _continue_after_stored_seq(self, exc: ApiError) -> bool:
        """Whether ``exc`` says the service holds this seq or a later one (our clock went
        back, another agent used this name, or it took a resent snapshot whose answer was
        lost: a signed snapshot is taken once); if so the next one is signed after it."""
        seq_refused = exc.code in ("conflict", "replayed_snapshot")
        if not seq_refused or exc.detail.get("field") != "snapshot.seq":
            return False
        stored = exc.detail.get("stored_seq")
        self.seq = max(self.seq, stored if isinstance(stored, int) else self.seq)
        self.pending = None
        log.warning("%s; continuing from seq %d", exc.message, self.seq + 1)
        return True

    # -- the loop ----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop`` is set."""
        log.info("agent for node %s started", self.name)
        while not stop.is_set():
            stop.wait(self.step())
        log.info("agent for node %s stopped", self.name)
