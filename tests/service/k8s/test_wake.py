"""When the service becomes ready, it labels each GPU node once so parked pods are retried."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi.testclient import TestClient

from service.k8s.wake import WAKE_LABEL, WakeUp
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_api_server import FakeApiServer
from tests.service.k8s.fixtures import live_app
from tests.waiting import wait_until


def _k8s(client: TestClient) -> Any:
    return client.app.state.k8s  # type: ignore[attr-defined]


def _fleet(settings: Settings, clock: FakeClock, api: FakeApiServer) -> None:
    """The nodes, reported by their agents before the restart; one unknown to Kubernetes."""
    with live_app(settings, clock, api) as client:
        add_nodes(client, ("hgx-h100", "h100-a"), ("hgx-h100", "h100-b"), ("hgx-h100", "lab-1"))
    api.add_node("h100-a")
    api.add_node("h100-b")


def test_a_restarted_service_wakes_each_gpu_node_once(
    settings: Settings, clock: FakeClock, api: FakeApiServer
):
    _fleet(settings, clock, api)
    with live_app(settings, clock, api, wake_nodes=True) as client:
        wait_until(lambda: _k8s(client).wake.wake_ups == 1, "the wake-up")
        patched = sorted(name for name, _ in api.patches)
        assert patched == ["h100-a", "h100-b"]  # lab-1 is not a Kubernetes node: skipped
        labels = api.nodes["h100-a"]["metadata"]["labels"]
        assert labels[WAKE_LABEL].isdigit()
        assert api.patches[0][1] == {"metadata": {"labels": {WAKE_LABEL: labels[WAKE_LABEL]}}}
        # Still ready a while later: nothing more is sent.
        checks = _k8s(client).wake.checks
        wait_until(lambda: _k8s(client).wake.checks >= checks + 2, "two more readiness checks")
        assert len(api.patches) == 2
    with live_app(settings, clock, api, wake_nodes=True) as client:  # restarted again
        wait_until(lambda: _k8s(client).wake.wake_ups == 1, "the second wake-up")
    assert len(api.patches) == 4


def test_no_wake_up_when_switched_off(settings: Settings, clock: FakeClock, api: FakeApiServer):
    _fleet(settings, clock, api)
    with live_app(settings, clock, api, wake_nodes=False) as client:
        wait_until(lambda: _k8s(client).watcher.following, "the service follows pods")
        assert _k8s(client).wake is None
    assert api.patches == []


def test_a_wake_up_the_api_server_refused_is_finished_later(
    settings: Settings, clock: FakeClock, api: FakeApiServer
):
    _fleet(settings, clock, api)
    api.refuse = True
    with live_app(settings, clock, api, wake_nodes=True) as client:
        wait_until(lambda: _k8s(client).wake.checks >= 2, "a refused try")
        assert api.patches == []
        api.refuse = False
        wait_until(lambda: _k8s(client).wake.wake_ups == 1, "the wake-up")
    assert sorted(name for name, _ in api.patches) == ["h100-a", "h100-b"]


class _Done(Exception):
    pass


class _Stream:
    def __init__(self) -> None:
        self.labelled: list[str] = []

    async def label_node(self, name: str, key: str, value: str) -> bool:
        self.labelled.append(name)
        return True


def test_each_return_to_ready_wakes_once(settings: Settings, clock: FakeClock, api: FakeApiServer):
    # Ready, then the database gone for two checks, then back: two wake-ups, not one a check.
    _fleet(settings, clock, api)
    with live_app(settings, clock, api) as client:
        state = client.app.state.service  # type: ignore[attr-defined]
    answers = [True, True, False, False, True, True, True]

    def ready(_: object) -> bool:
        if not answers:
            raise _Done
        return answers.pop(0)

    stream = _Stream()
    wake = WakeUp(state, stream, rate_per_s=1000, ready=ready, check_s=0)  # type: ignore[arg-type]

    async def until_done() -> None:
        with contextlib.suppress(_Done):
            await wake.run()

    asyncio.run(until_done())
    assert wake.wake_ups == 2
    assert sorted(stream.labelled) == sorted(["h100-a", "h100-b", "lab-1"] * 2)
