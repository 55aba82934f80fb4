"""The agent's rounds against a scripted service: changes, heartbeats, retries, refusals."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from agent.nvml_fake import FakeNvml, fake_host
from agent.runner import KEY_ERROR_EVERY_S, Agent, Backoff, KeyRefused
from agent.signing import NodeKey, verify
from agent.sources import Identity, NvmlSource, SimSource
from placement import Health
from placement.profiles import build_profile
from tests.waiting import wait_until
from topoplace_client.api import ApiError, ServiceUnreachable


class ScriptedService:
    """Records the agent's calls; ``fail_next`` makes the next calls raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.failures: list[Exception] = []
        self.keys: dict[str, str] = {}
        self.stored_seq: dict[str, int] = {}

    def _maybe_fail(self) -> None:
        if self.failures:
            raise self.failures.pop(0)

    def put_node_key(self, name: str, public_key: str) -> dict[str, Any]:
        self._maybe_fail()
        self.calls.append(("key", public_key))
        if self.keys.setdefault(name, public_key) != public_key:
            raise ApiError("conflict", "different key", 409, {"field": "public_key"})
        return {"node": name, "public_key": public_key}

    def put_snapshot(
        self, name: str, snapshot: dict[str, Any], signature: str | None = None
    ) -> dict[str, Any]:
        self._maybe_fail()
        self.calls.append(("snapshot", (snapshot, signature)))
        self.stored_seq[name] = snapshot["seq"]
        return {"node": name, "seq": snapshot["seq"], "changed": True}

    def heartbeat(self, name: str) -> None:
        self._maybe_fail()
        self.calls.append(("heartbeat", name))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]

    def snapshots(self) -> list[tuple[dict[str, Any], str]]:
        return [value for kind, value in self.calls if kind == "snapshot"]


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _agent(service: ScriptedService, source: Any = None, clock: Clock | None = None) -> Agent:
    return Agent(
        source or SimSource("hgx-h100", Identity("n1")),
        service,
        NodeKey.generate(),
        "n1",
        interval_s=5.0,
        backoff=Backoff(1.0, 8.0, random.Random(7)),
        clock=clock or Clock(),
    )


def test_first_round_registers_the_key_and_sends_a_signed_snapshot() -> None:
    service = ScriptedService()
    agent = _agent(service)
    assert agent.step() == 5.0
    assert service.kinds() == ["key", "snapshot"]
    snapshot, signature = service.snapshots()[0]
    assert verify(agent.key.public_key, snapshot, signature)
    assert snapshot["name"] == "n1" and snapshot["seq"] == 1_800_000_000_000
    assert snapshot["timestamp"].startswith("2027-01-15T")


def test_unchanged_node_heartbeats_and_a_change_sends_a_new_seq() -> None:
    fake = FakeNvml.from_snapshot(build_profile("hgx-h100", "n1"))
    fake.nvmlInit()
    source = NvmlSource(fake, fake_host(build_profile("hgx-h100", "n1")), Identity("n1"))
    service, clock = ScriptedService(), Clock()
    agent = _agent(service, source, clock)
    agent.step()
    agent.step()
    agent.step()
    assert service.kinds() == ["key", "snapshot", "heartbeat", "heartbeat"]
    fake.lose_gpu(6)  # a GPU falls off the bus while the agent runs
    assert agent.step() == 5.0
    first, second = service.snapshots()
    assert second[0]["seq"] > first[0]["seq"]
    assert second[0]["gpus"][6]["health"] == Health.UNHEALTHY
    assert verify(agent.key.public_key, second[0], second[1])


def test_service_down_backs_off_with_jitter_and_resends_the_same_signed_snapshot() -> None:
    service = ScriptedService()
    service.failures = [ServiceUnreachable("http://x", "refused") for _ in range(5)]
    clock = Clock()
    agent = _agent(service, clock=clock)
    delays = []
    for _ in range(5):
        delays.append(agent.step())
        clock.now += 1
    ceilings = [1, 2, 4, 8, 8]  # doubling, capped at backoff_max_s
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == 5  # jittered
    assert agent.step() == 5.0  # back: the normal interval again
    assert service.kinds() == ["key", "snapshot"]


def test_a_snapshot_that_failed_is_retried_with_the_same_seq_and_signature() -> None:
    service = ScriptedService()
    clock = Clock()
    agent = _agent(service, clock=clock)
    agent._register_key()
    service.failures = [ApiError("database_unavailable", "db down", 503)]
    agent.step()  # the PUT fails after signing
    clock.now += 10
    agent.step()
    ((snapshot, signature),) = service.snapshots()
    assert snapshot["seq"] == 1_800_000_000_000  # signed at the first try, not the second
    assert verify(agent.key.public_key, snapshot, signature)


def test_heartbeat_for_a_forgotten_node_sends_the_snapshot_again() -> None:
    service = ScriptedService()
    agent = _agent(service)
    agent.step()
    service.failures = [ApiError("not_found", "no node named 'n1'", 404)]
    assert agent.step() == 5.0
    assert service.kinds() == ["key", "snapshot", "key", "snapshot"]


def test_seq_conflict_continues_after_the_stored_seq() -> None:
    service = ScriptedService()
    clock = Clock()
    agent = _agent(service, clock=clock)
    stored = 1_900_000_000_000
    agent._register_key()
    service.failures = [
        ApiError("conflict", "seq is older", 409, {"field": "snapshot.seq", "stored_seq": stored})
    ]
    assert agent.step() == 0.0  # retry at once
    agent.step()
    assert service.snapshots()[0][0]["seq"] == stored + 1


def test_a_different_registered_key_stops_reporting_with_a_rate_limited_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", "topoplace.agent")
    service = ScriptedService()
    service.keys["n1"] = NodeKey.generate().public_key
    clock = Clock()
    agent = _agent(service, clock=clock)
    agent.key_hint = "@/etc/topoplace/node.key.pub"
    assert agent.step() > 0  # backs off, then tries to register again
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1
    assert "different public key" in errors[0].getMessage()
    fix = "topoplace node-key n1 --register @/etc/topoplace/node.key.pub --replace"
    assert fix in errors[0].getMessage()
    # Nothing signed with a key the service does not hold is sent.
    assert service.kinds() == ["key"]
    clock.now += KEY_ERROR_EVERY_S / 2
    agent.step()
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1  # rate-limited
    clock.now += KEY_ERROR_EVERY_S
    agent.step()
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 2
    assert service.kinds() == ["key", "key", "key"]
    # An admin replaces the old key: the next round registers and reports.
    service.keys["n1"] = agent.key.public_key
    assert agent.step() == 5.0
    assert service.kinds() == ["key", "key", "key", "key", "snapshot"]
    assert "public key of node n1 registered" in caplog.text


def test_send_once_raises_a_key_conflict() -> None:
    service = ScriptedService()
    service.keys["n1"] = NodeKey.generate().public_key
    agent = _agent(service)
    with pytest.raises(KeyRefused, match="--replace"):
        agent.send_once()
    assert service.kinds() == ["key"]


def test_a_first_key_only_an_admin_may_register_says_so(caplog: pytest.LogCaptureFixture) -> None:
    service = ScriptedService()
    refusal = ApiError("forbidden", "registering a node's first key is an admin action", 403)
    service.failures = [refusal]
    agent = _agent(service)
    assert agent.step() > 0
    assert "topoplace node-key n1 --register" in caplog.text
    assert "TOPOPLACE_TRUST_ON_FIRST_USE" in caplog.text
    assert service.kinds() == []  # the refused registration, then nothing was sent
    service.failures = [refusal]
    with pytest.raises(KeyRefused, match="only an admin"):
        agent.send_once()


def test_a_forgotten_node_registers_its_key_again() -> None:
    service = ScriptedService()
    agent = _agent(service)
    agent.step()
    service.keys.clear()  # a new database: no node, no key
    service.failures = [ApiError("not_found", "no node named 'n1'", 404)]
    assert agent.step() == 5.0
    assert service.kinds() == ["key", "snapshot", "key", "snapshot"]
    assert service.keys["n1"] == agent.key.public_key


def test_a_snapshot_refused_for_want_of_a_key_registers_it_again() -> None:
    service = ScriptedService()
    agent = _agent(service)
    agent.step()
    service.keys.clear()
    agent.step()  # heartbeat
    agent.source = SimSource("dgx1-v100", Identity("n1"))  # a change: a snapshot is sent
    service.failures = [ApiError("node_key_required", "node 'n1' has no registered key", 403)]
    assert agent.step() == 0.0  # at once
    assert agent.step() == 5.0
    assert service.kinds() == ["key", "snapshot", "heartbeat", "key", "snapshot"]


def test_refusals_and_unexpected_errors_never_stop_the_agent() -> None:
    service = ScriptedService()
    service.failures = [
        ApiError("invalid_request", "bad", 422),
        ApiError("unauthorized", "token", 401),
        RuntimeError("bug"),
    ]
    agent = _agent(service)
    assert [agent.step() > 0 for _ in range(3)] == [True] * 3
    assert agent.backoff.failures == 3
    assert agent.step() == 5.0 and agent.backoff.failures == 0


def test_discovery_failure_sends_no_heartbeat() -> None:
    fake = FakeNvml.from_snapshot(build_profile("pcie-8x-l40s", "n1"))
    fake.nvmlInit()
    source = NvmlSource(fake, fake_host(build_profile("pcie-8x-l40s", "n1")), Identity("n1"))
    service = ScriptedService()
    agent = _agent(service, source)
    agent.step()
    fake.nvmlShutdown()  # NVML stops answering altogether
    assert agent.step() >= 0.5
    assert service.kinds() == ["key", "snapshot"]
    fake.nvmlInit()
    agent.step()
    assert service.kinds() == ["key", "snapshot", "heartbeat"]


def test_run_stops_when_asked() -> None:
    service = ScriptedService()
    agent = _agent(service)
    agent.interval_s = 0.01
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    wait_until(lambda: len(service.calls) >= 4, "four calls to the service", interval_s=0.005)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert service.kinds()[:3] == ["key", "snapshot", "heartbeat"]


def test_send_once_after_the_clock_went_back_continues_after_the_stored_seq() -> None:
    # A restarted --once (a timer's, say) whose clock stepped back behind the stored seq.
    service = ScriptedService()
    agent = _agent(service)
    stored = 1_900_000_000_000
    agent._register_key()
    service.failures = [
        ApiError(
            "replayed_snapshot",
            "not newer",
            409,
            {"field": "snapshot.seq", "stored_seq": stored},
        )
    ]
    answer = agent.send_once()
    assert answer["seq"] == stored + 1
    snapshot, signature = service.snapshots()[-1]
    assert snapshot["seq"] == stored + 1 and verify(agent.key.public_key, snapshot, signature)


@pytest.mark.parametrize(
    "refusal",
    [
        ApiError("node_key_required", "node 'n1' has no registered key", 403),
        ApiError("replayed_snapshot", "not newer", 409, {"field": "snapshot.seq", "stored_seq": 5}),
    ],
)
def test_a_refusal_retried_at_once_that_comes_back_backs_off_instead_of_spinning(
    refusal: ApiError,
) -> None:
    # A service that keeps answering so (its key or seq store behind a balancer that
    # alternates between databases, or an admin racing the agent) gets one immediate retry,
    # then the usual backoff: never a loop of requests without a pause.
    service = ScriptedService()
    agent = _agent(service)
    agent._register_key()
    delays = []
    for _ in range(4):
        service.failures = [refusal]
        delays.append(agent.step())
    assert delays[0] == 0.0
    assert all(d > 0 for d in delays[1:]), delays
    assert agent.step() == 5.0  # taken: the next refusal is retried at once again
    service.failures = [refusal]
    assert agent.step() == 0.0


def test_a_refused_key_is_logged_again_after_the_clock_stepped_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = ScriptedService()
    service.keys["n1"] = NodeKey.generate().public_key
    clock = Clock()
    agent = _agent(service, clock=clock)
    agent.step()
    clock.now -= 3600.0  # NTP steps the clock back an hour: the error is not muted that long
    agent.step()
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 2
