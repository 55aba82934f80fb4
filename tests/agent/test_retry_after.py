"""An overloaded service's Retry-After (429, 503) is honoured: the agent waits that long
(capped, never less than its own backoff) instead of coming back at its own pace."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path

import pytest

from agent.runner import Agent, Backoff
from agent.signing import NodeKey
from agent.sources import Identity, SimSource
from service.app import create_app
from service.settings import Settings
from tests.agent.scripted_front import ScriptedFront
from tests.live_server import live_server
from tests.topoplace.test_client_cmd import PROXY_VARIABLES
from topoplace_client.api import TopoplaceClient
from topoplace_client.retry_after import RETRY_AFTER_MAX_S, retry_after_s

NOW = 1_800_000_000.0


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _agent(client: TopoplaceClient) -> Agent:
    return Agent(
        SimSource("hgx-h100", Identity("n1")),
        client,
        NodeKey.generate(),
        "n1",
        interval_s=5.0,
        backoff=Backoff(1.0, 8.0, random.Random(7)),
        clock=lambda: NOW,
    )


def test_a_rate_limited_agent_waits_the_services_retry_after(tmp_path: Path) -> None:
    # The service's own limiter: two requests, then one back every 20 s (Retry-After: 20).
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'service.db'}",
        rate_limit_per_s=0.05,
        rate_limit_burst=2,
    )
    with live_server(create_app(settings)) as url, TopoplaceClient(url, timeout=5) as client:
        agent = _agent(client)
        assert agent.step() == 5.0  # the key and the snapshot: the burst
        delay = agent.step()  # the heartbeat is refused 429
        # Was: the backoff's 0.5-1 s, a retry 20 times sooner than the service asked.
        assert 19.0 <= delay <= 20.0 + 1.0, delay


@pytest.mark.parametrize(
    ("status", "retry_after", "expected"),
    [
        (503, "30", 30.0),
        (429, format_datetime(datetime.fromtimestamp(NOW + 45, UTC), usegmt=True), 45.0),
        (503, "86400", RETRY_AFTER_MAX_S),  # a day is capped: the agent comes back
    ],
)
def test_retry_after_seconds_or_date_is_waited_capped(
    front: tuple[str, ScriptedFront], status: int, retry_after: str, expected: float
) -> None:
    url, scripted = front
    with TopoplaceClient(url, timeout=5) as client:
        agent = _agent(client)
        scripted.answer(status, {"Retry-After": retry_after}, {"error": {"code": "busy"}})
        assert agent.step() == expected
        assert agent.step() == 5.0  # the service is back: the normal interval again


@pytest.mark.parametrize("retry_after", ["0", "soon", "-5", "Wed, 21 Oct 2015 07:28:00 GMT"])
def test_a_retry_after_shorter_than_the_backoff_or_unreadable_keeps_the_backoff(
    front: tuple[str, ScriptedFront], retry_after: str
) -> None:
    url, scripted = front
    with TopoplaceClient(url, timeout=5) as client:
        agent = _agent(client)
        for _ in range(4):
            scripted.answer(429, {"Retry-After": retry_after}, {"error": {"code": "busy"}})
        delays = [agent.step() for _ in range(4)]
    ceilings = [1, 2, 4, 8]  # the backoff as without the header: never less
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True)), delays


def test_other_refusals_ignore_a_retry_after(front: tuple[str, ScriptedFront]) -> None:
    # Only 429 and 503 mean "overloaded, come back later"; a 422 with the header is a refusal.
    url, scripted = front
    with TopoplaceClient(url, timeout=5) as client:
        agent = _agent(client)
        scripted.answer(422, {"Retry-After": "120"}, {"error": {"code": "invalid_request"}})
        assert agent.step() <= 1.0


def test_retry_after_values() -> None:
    assert retry_after_s("12", NOW) == 12.0
    assert retry_after_s(" 7 ", NOW) == 7.0
    assert retry_after_s("9" * 400, NOW) == RETRY_AFTER_MAX_S  # no overflow
    assert retry_after_s("Sun, 06 Nov 1994 08:49:37 GMT", NOW) == 0.0  # past: no wait
    later = format_datetime(datetime.fromtimestamp(NOW + 90, UTC), usegmt=True)
    assert retry_after_s(later, NOW) == 90.0
    for unreadable in (None, "", "1.5", "-1", "²", "tomorrow", "Mon, 99 Foo 2026 99:99:99 GMT"):
        assert retry_after_s(unreadable, NOW) is None, unreadable
