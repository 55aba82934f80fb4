"""Snapshots racing each other on a real server (uvicorn on loopback), SQLite and Postgres.

Each round releases its requests together from a barrier, one thread and
one connection per request, so they interleave inside the service as
agents' reports do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from placement import NodeSnapshot
from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from service.state import ServiceState
from tests.live_server import live_server

ROUNDS = 12


@pytest.fixture
def served(settings: Settings) -> Iterator[tuple[str, ServiceState]]:
    app = create_app(settings, background=False)
    with live_server(app) as url:
        yield url, app.state.service


def _together(url: str, snaps: list[NodeSnapshot]) -> list[httpx.Response]:
    barrier = threading.Barrier(len(snaps))
    answers: list[httpx.Response | None] = [None] * len(snaps)

    def send(i: int) -> None:
        with httpx.Client(base_url=url, trust_env=False, timeout=30) as client:
            body = {"snapshot": snaps[i].model_dump(mode="json")}
            barrier.wait()
            answers[i] = client.put(f"/v1/nodes/{snaps[i].name}/snapshot", json=body)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(snaps))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


def _statuses(answers: list[httpx.Response]) -> list[int]:
    fault = [a.text for a in answers if a.status_code >= 500]
    assert not fault, fault
    return [a.status_code for a in answers]


def _rounds(check: Callable[[int], None]) -> None:
    for round_ in range(ROUNDS):
        check(round_)


def test_two_first_snapshots_of_a_node_at_once(served: tuple[str, ServiceState]) -> None:
    url, state = served

    def check(round_: int) -> None:
        name = f"new{round_}"
        same = build_profile("hgx-h100", name, seq=5)
        newer = same.model_copy(update={"seq": 6, "labels": {"v": "6"}})
        statuses = _statuses(_together(url, [same, same, newer]))
        # The newest always wins; the older ones win only if they came first.
        assert statuses[2] == 200 and set(statuses) <= {200, 409}, statuses
        stored = httpx.get(f"{url}/v1/nodes/{name}", trust_env=False).json()
        assert stored["seq"] == 6 and stored["labels"] == {"v": "6"}
        assert state.cluster.node(name).snapshot.seq == 6

    _rounds(check)


def test_racing_snapshots_never_leave_an_older_seq_stored(
    served: tuple[str, ServiceState],
) -> None:
    url, state = served
    base = build_profile("hgx-h100", "h0", seq=1)
    assert _statuses(_together(url, [base])) == [200]

    def check(round_: int) -> None:
        first = 10 * (round_ + 1)
        snaps = [
            base.model_copy(update={"seq": first + i, "labels": {"v": str(first + i)}})
            for i in range(4)
        ]
        answers = _together(url, snaps)
        statuses = _statuses(answers)
        accepted = [s.seq for s, code in zip(snaps, statuses, strict=True) if code == 200]
        assert accepted and set(statuses) <= {200, 409}, statuses
        stored = httpx.get(f"{url}/v1/nodes/h0", trust_env=False).json()
        assert stored["seq"] == max(accepted), (stored["seq"], accepted)
        assert stored["labels"] == {"v": str(max(accepted))}
        assert state.cluster.node("h0").snapshot.seq == max(accepted)
        for answer, snap in zip(answers, snaps, strict=True):
            if answer.status_code == 409:
                assert answer.json()["error"]["detail"]["stored_seq"] > snap.seq

    _rounds(check)


def test_two_nodes_claiming_one_gpu_at_once_one_wins(served: tuple[str, ServiceState]) -> None:
    url, _ = served

    def check(round_: int) -> None:
        shared = build_profile("hgx-h100", f"a{round_}").gpus
        snaps = [
            build_profile("hgx-h100", f"{side}{round_}").model_copy(update={"gpus": shared})
            for side in ("a", "b")
        ]
        statuses = _statuses(_together(url, snaps))
        assert sorted(statuses) == [200, 409], statuses
        listing: list[dict[str, Any]] = httpx.get(f"{url}/v1/nodes", trust_env=False).json()[
            "nodes"
        ]
        owners = [n["name"] for n in listing if n["gpus"][0]["uuid"] == shared[0].uuid]
        assert len(owners) == 1

    _rounds(check)
