"""A replica frozen (SIGSTOP) inside a transaction does not stop the other's writes.

Real processes on one Postgres: replica A stores snapshots of a node in a loop and is
frozen while one of its transactions holds the node's device locks; replica B's report
of that node, which needs those locks, completes once Postgres ends A's idle session
(TOPOPLACE_DATABASE_IDLE_IN_TRANSACTION_S). Thawed, A answers its request 503
``database_unavailable``, as for any connection lost, not 500.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement.profiles import build_profile
from service.app import create_app
from service.nodes import repository
from service.settings import Settings
from tests.service import replica_processes
from tests.service.conftest import _truncate

IDLE_S = 1.0


def _named(url: str, name: str) -> str:
    return (
        sa.make_url(url)
        .update_query_dict({"application_name": name})
        .render_as_string(hide_password=False)
    )


@pytest.fixture
def two_replicas(postgres_url: str) -> Iterator[tuple[str, subprocess.Popen[bytes], str]]:
    _truncate(postgres_url)
    env = {"TOPOPLACE_DATABASE_IDLE_IN_TRANSACTION_S": str(IDLE_S)}
    a, a_proc = replica_processes.start(_named(postgres_url, "frozen-replica"), env)
    b, b_proc = replica_processes.start(_named(postgres_url, "other-replica"), env)
    try:
        replica_processes.wait_ready(a, a_proc)
        replica_processes.wait_ready(b, b_proc)
        yield a, a_proc, b
    finally:
        a_proc.send_signal(signal.SIGCONT)
        replica_processes.stop(a_proc)
        replica_processes.stop(b_proc)


def _body(seq: int) -> dict[str, object]:
    snap = build_profile("hgx-h100", "n0").model_copy(update={"seq": seq})
    return {"snapshot": snap.model_dump(mode="json")}


def test_a_frozen_replica_does_not_hold_the_others_writes(
    two_replicas: tuple[str, subprocess.Popen[bytes], str], postgres_url: str
) -> None:
    a, a_proc, b = two_replicas
    answers: list[httpx.Response] = []
    stop = threading.Event()

    def report_on_a() -> None:
        with httpx.Client(base_url=a, timeout=60, trust_env=False) as client:
            seq = 1
            while not stop.is_set():
                answers.append(client.put("/v1/nodes/n0/snapshot", json=_body(seq)))
                seq += 1

    reporter = threading.Thread(target=report_on_a, daemon=True)
    reporter.start()
    watcher = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        _freeze_holding_locks(a_proc, watcher)
        stop.set()
        answered = len(answers)
        started = time.monotonic()
        response = httpx.put(f"{b}/v1/nodes/n0/snapshot", json=_body(10**6), timeout=20)
        waited = time.monotonic() - started
        assert response.status_code == 200, response.text
        # B waited on A's locks until Postgres ended A's session, and no longer.
        assert IDLE_S * 0.5 < waited < IDLE_S + 5, waited
        a_proc.send_signal(signal.SIGCONT)
        reporter.join(timeout=30)
        assert not reporter.is_alive()
        frozen = answers[answered]  # the request A was inside when frozen
        assert frozen.status_code == 503, frozen.text
        assert frozen.json()["error"]["code"] == "database_unavailable"
        assert httpx.get(f"{a}/readyz", timeout=10).status_code == 200  # A recovers
    finally:
        stop.set()
        a_proc.send_signal(signal.SIGCONT)
        watcher.dispose()


def _freeze_holding_locks(proc: subprocess.Popen[bytes], watcher: sa.Engine) -> None:
    """SIGSTOP ``proc`` while one of its sessions is inside a transaction holding an
    advisory lock (a snapshot's device locks); found by polling pg_stat_activity, and
    tried again (SIGCONT first) when the freeze fell outside such a transaction."""
    inside = sa.text(
        "SELECT count(*) FROM pg_stat_activity AS activity JOIN pg_locks AS locks"
        " ON locks.pid = activity.pid AND locks.locktype = 'advisory' AND locks.granted"
        " WHERE activity.application_name = 'frozen-replica'"
        " AND activity.state = 'idle in transaction'"
    )
    deadline = time.monotonic() + 60
    with watcher.connect() as conn:
        while time.monotonic() < deadline:
            if conn.execute(inside).scalar_one():
                os.kill(proc.pid, signal.SIGSTOP)
                time.sleep(0.2)  # a statement running when frozen has ended since
                if conn.execute(inside).scalar_one():
                    return
                os.kill(proc.pid, signal.SIGCONT)
    raise AssertionError("never found the replica inside a transaction holding locks")


def test_a_session_ended_for_idling_answers_503(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The frozen process's side, in one process: a report that idles inside its
    transaction past the timeout (as a frozen process does) finds its session ended
    (SQLSTATE 25P03) and is answered as a connection lost."""
    _truncate(postgres_url)
    take_locks = repository.lock_device_uuids
    paused: list[str] = []

    def pause_holding_locks(conn: sa.Connection, uuids: Iterable[str]) -> None:
        take_locks(conn, uuids)
        if not paused:
            paused.append("once")
            time.sleep(0.5)

    settings = Settings(database_url=postgres_url, database_idle_in_transaction_s=0.2)
    with TestClient(create_app(settings, background=False)) as client:
        monkeypatch.setattr(repository, "lock_device_uuids", pause_holding_locks)
        response = client.put("/v1/nodes/n0/snapshot", json=_body(1))
        assert paused
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "database_unavailable"
        assert client.put("/v1/nodes/n0/snapshot", json=_body(1)).status_code == 200
