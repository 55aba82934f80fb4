"""A token revoked while its request is in flight writes nothing (revoked_meanwhile.py).

Against a real uvicorn over loopback: the client sends its headers and half
its body, the token is revoked (through this replica, or through another one
on the same database), then the rest of the body arrives. Before, the token
checked at the headers let the write land after the revocation had
committed. Also a request whose body arrived in full but which waits on the
state lock while its token is revoked.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from service.tokens import store
from tests.live_server import live_server
from tests.service.conftest import ADMIN_TOKEN, secured

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
NODE = "n1"


@dataclass
class Replica:
    url: str
    app: FastAPI

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").split(":")
        return host, int(port)


def _replica(settings: Settings) -> Iterator[Replica]:
    app = create_app(secured(settings), background=False)
    with live_server(app) as url:
        yield Replica(url, app)


@pytest.fixture
def replica(settings: Settings) -> Iterator[Replica]:
    yield from _replica(settings)


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=10) as client:
        yield client


def _token(http: httpx.Client, url: str, role: str) -> tuple[str, dict[str, str]]:
    made = http.post(f"{url}/v1/tokens", json={"role": role, "name": role}, headers=ADMIN)
    assert made.status_code == 201, made.text
    presented = {"Authorization": f"Bearer {made.json()['token']}"}
    # Verified once (and cached), so the slow requests' headers are let in at once.
    assert http.get(f"{url}/v1/nodes", headers=presented).status_code == 200
    return made.json()["id"], presented


def _report(http: httpx.Client, url: str) -> None:
    snap = build_profile("dgx-a100", NODE).model_dump(mode="json")
    answer = http.put(f"{url}/v1/nodes/{NODE}/snapshot", json={"snapshot": snap}, headers=ADMIN)
    assert answer.status_code == 200, answer.text


def _allocations(http: httpx.Client, url: str) -> list[dict[str, Any]]:
    answer = http.get(f"{url}/v1/allocations", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    listed: list[dict[str, Any]] = answer.json()["allocations"]
    return listed


class SlowRequest:
    """A request whose headers and first half of body are sent at once; the rest on
    :meth:`finish`, which reads the answer."""

    def __init__(
        self,
        address: tuple[str, int],
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
    ) -> None:
        self.rest = body[len(body) // 2 :]
        head = [f"{method} {path} HTTP/1.1", f"Host: {address[0]}:{address[1]}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        self.sock = socket.create_connection(address, timeout=10)
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body[: len(body) // 2])
        time.sleep(0.2)  # its headers are checked meanwhile: the token is good then

    def finish(self) -> tuple[int, dict[str, str], dict[str, Any]]:
        with self.sock:
            self.sock.sendall(self.rest)
            received = b""
            while b"\r\n\r\n" not in received:
                received += self.sock.recv(65536)
            head, _, body = received.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
            while len(body) < int(headers.get("content-length", "0")):
                body += self.sock.recv(65536)
        return int(lines[0].split(" ", 2)[1]), headers, json.loads(body) if body else {}


def _assert_refused(answer: tuple[int, dict[str, str], dict[str, Any]]) -> None:
    status, headers, body = answer
    assert status == 401, body
    assert body["error"]["code"] == "unauthorized"
    assert "revoked while this request was in flight" in body["error"]["message"]
    assert headers["www-authenticate"] == "Bearer"


def _revoke_through(http: httpx.Client, url: str, token_id: str) -> None:
    assert http.delete(f"{url}/v1/tokens/{token_id}", headers=ADMIN).status_code == 204


PLACE = json.dumps({"gpus": 2, "job_id": "slow-job", "owner": "mallory"}).encode()


def test_a_place_whose_token_is_revoked_mid_body_reserves_nothing(
    replica: Replica, http: httpx.Client
) -> None:
    _report(http, replica.url)
    token_id, scheduler = _token(http, replica.url, "scheduler")
    slow = SlowRequest(replica.address, "POST", "/v1/place", scheduler, PLACE)
    _revoke_through(http, replica.url, token_id)
    _assert_refused(slow.finish())
    assert _allocations(http, replica.url) == []


def test_a_place_finished_before_the_revocation_is_made(
    replica: Replica, http: httpx.Client
) -> None:
    """The control: the same slow request with its token live reserves."""
    _report(http, replica.url)
    _, scheduler = _token(http, replica.url, "scheduler")
    status, _, body = SlowRequest(replica.address, "POST", "/v1/place", scheduler, PLACE).finish()
    assert status == 201, body
    assert [a["job_id"] for a in _allocations(http, replica.url)] == ["slow-job"]


@pytest.mark.parametrize(
    ("action", "body"), [("release", b"{}"), ("extend", b'{"ttl_s": 3600.0}'), ("confirm", b"{}")]
)
def test_a_change_to_an_allocation_whose_token_is_revoked_mid_body_changes_nothing(
    replica: Replica, http: httpx.Client, action: str, body: bytes
) -> None:
    _report(http, replica.url)
    placed = http.post(f"{replica.url}/v1/place", json={"gpus": 2}, headers=ADMIN)
    assert placed.status_code == 201, placed.text
    [before] = _allocations(http, replica.url)
    token_id, scheduler = _token(http, replica.url, "scheduler")
    path = f"/v1/allocations/{before['id']}/{action}"
    slow = SlowRequest(replica.address, "POST", path, scheduler, body)
    _revoke_through(http, replica.url, token_id)
    _assert_refused(slow.finish())
    assert _allocations(http, replica.url) == [before]


def test_an_admin_token_revoked_mid_body_makes_no_token_and_reports_no_node(
    replica: Replica, http: httpx.Client
) -> None:
    """An admin's writes are held to it too: a token, a node's snapshot."""
    token_id, admin = _token(http, replica.url, "admin")
    making = SlowRequest(
        replica.address, "POST", "/v1/tokens", admin, b'{"role": "admin", "name": "kept"}'
    )
    snap = json.dumps({"snapshot": build_profile("dgx-a100", NODE).model_dump(mode="json")})
    reporting = SlowRequest(
        replica.address, "PUT", f"/v1/nodes/{NODE}/snapshot", admin, snap.encode()
    )
    _revoke_through(http, replica.url, token_id)
    _assert_refused(making.finish())
    _assert_refused(reporting.finish())
    listed = http.get(f"{replica.url}/v1/tokens", headers=ADMIN).json()["tokens"]
    assert "kept" not in [t["name"] for t in listed]
    assert http.get(f"{replica.url}/v1/nodes/{NODE}", headers=ADMIN).status_code == 404


def test_a_revocation_through_another_replica_counts(
    settings: Settings, http: httpx.Client
) -> None:
    """Revoked through the second replica, which this one hears of by its poll
    (service/auth.py REVOCATION_POLL_S): the body finished after that writes nothing."""
    first_replica = _replica(settings)
    second_replica = _replica(settings)
    first, second = next(first_replica), next(second_replica)
    try:
        _report(http, first.url)
        token_id, scheduler = _token(http, first.url, "scheduler")
        slow = SlowRequest(first.address, "POST", "/v1/place", scheduler, PLACE)
        _revoke_through(http, second.url, token_id)
        started = time.monotonic()
        while http.get(f"{first.url}/v1/nodes", headers=scheduler).status_code == 200:
            assert time.monotonic() - started < 2.0, "the first replica never heard of it"
            time.sleep(0.02)
        _assert_refused(slow.finish())
        assert _allocations(http, first.url) == []
    finally:
        for running in (first_replica, second_replica):
            running.close()


def _waiting_on_the_lock(replica: Replica, http: httpx.Client) -> bool:
    """Whether the service's event loop is stuck (on the state lock the test holds)."""
    try:
        http.get(f"{replica.url}/healthz", timeout=0.3)
    except httpx.ReadTimeout:
        return True
    return False


def test_a_place_that_waits_on_the_state_lock_while_its_token_is_revoked_reserves_nothing(
    replica: Replica, http: httpx.Client
) -> None:
    _report(http, replica.url)
    token_id, scheduler = _token(http, replica.url, "scheduler")
    state = replica.app.state.service
    answer: list[httpx.Response] = []
    placing = threading.Thread(
        target=lambda: answer.append(
            http.post(f"{replica.url}/v1/place", json=json.loads(PLACE), headers=scheduler)
        )
    )
    with state.lock:  # /place decides on the event loop: it waits here, with the loop
        placing.start()
        with httpx.Client(trust_env=False) as probe:
            assert _wait_for(lambda: _waiting_on_the_lock(replica, probe))
        # The loop is stuck, so the revocation is made as the endpoint makes it.
        store.revoke(state.engine, token_id)
        replica.app.state.token_check.drop(token_id)
    placing.join(timeout=10)
    [refused] = answer
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]["code"] == "unauthorized"
    assert _allocations(http, replica.url) == []


def _wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
    return False


def test_a_place_that_waits_on_the_group_commit_while_its_token_is_revoked_reserves_nothing(
    replica: Replica, http: httpx.Client
) -> None:
    """Its choice made, the reservation waits in the group committer's queue behind a
    batch being written (held here); the token revoked meanwhile, it is refused just
    before its rows are written, and its GPUs are free again."""
    _report(http, replica.url)
    token_id, scheduler = _token(http, replica.url, "scheduler")
    committer = replica.app.state.service.committer
    writing, release = threading.Event(), threading.Event()
    write = committer.writer.write

    def held_write(*rows: Any) -> None:
        writing.set()
        assert release.wait(10)
        write(*rows)

    committer.writer.write = held_write
    answers: dict[str, httpx.Response] = {}

    def place(name: str, headers: dict[str, str], job_id: str) -> threading.Thread:
        body = {"gpus": 4, "job_id": job_id, "owner": name}
        thread = threading.Thread(
            target=lambda: answers.__setitem__(
                name, http.post(f"{replica.url}/v1/place", json=body, headers=headers)
            )
        )
        thread.start()
        return thread

    first = place("admin", ADMIN, "first-job")
    assert writing.wait(5), "the first reservation never reached its write"
    waiting = place("scheduler", scheduler, "slow-job")
    # Chosen and queued: the GPUs it chose are held in memory, waiting for the commit.
    state = replica.app.state.service
    assert _wait_for(lambda: len(state.inflight.get(NODE, {})) == 2)
    _revoke_through(http, replica.url, token_id)
    release.set()
    first.join(timeout=10)
    waiting.join(timeout=10)
    assert answers["admin"].status_code == 201, answers["admin"].text
    refused = answers["scheduler"]
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]["code"] == "unauthorized"
    assert "revoked while this request was in flight" in refused.json()["error"]["message"]
    assert [a["job_id"] for a in _allocations(http, replica.url)] == ["first-job"]
    # Its tentative choice was undone: the other four GPUs can be reserved.
    again = http.post(f"{replica.url}/v1/place", json={"gpus": 4}, headers=ADMIN)
    assert again.status_code == 201, again.text
