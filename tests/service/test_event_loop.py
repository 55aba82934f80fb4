"""The one way off the event loop, and the watch that catches blocking work left on it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from service.app import create_app
from service.event_loop import off_loop, run_here
from service.flows import drive, drive_async
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi
from tests.service.loop_watch import LoopWatch, on_event_loop
from tests.service.slurm.test_job_submit_api import NO_VAL


def test_off_loop_runs_on_a_worker_thread_and_hands_back_its_answer_or_its_error() -> None:
    async def main() -> tuple[bool, bool, str]:
        here = on_event_loop()
        there, name = await off_loop(lambda: (on_event_loop(), threading.current_thread().name))
        return here, there, name

    here, there, name = asyncio.run(main())
    assert here and not there and name != threading.current_thread().name

    def refuse(message: str, *, code: int) -> None:
        raise ValueError(f"{message} {code}")

    with pytest.raises(ValueError, match="no 7"):
        asyncio.run(off_loop(refuse, "no", code=7))


def test_a_flows_blocking_steps_go_off_the_loop_driven_async_and_run_in_place_driven_blocking():
    def flow() -> Generator[Callable[[], object], object, tuple[object, object]]:
        first = yield on_event_loop
        second = yield lambda: threading.current_thread().name
        return first, second

    async def main() -> tuple[object, object]:
        return await drive_async(flow(), off_loop)

    on_loop, thread = asyncio.run(main())
    assert not on_loop and thread != threading.current_thread().name
    assert drive(flow(), run_here) == (False, threading.current_thread().name)


def test_the_watch_notes_a_database_connection_taken_on_the_loop_and_not_one_taken_off_it(
    tmp_path: Path,
) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'watch.sqlite3'}")

    def read() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    async def both() -> None:
        await off_loop(read)
        read()

    watch = LoopWatch()
    with watch.database(engine):
        read()  # no loop on this thread
        asyncio.run(both())
    assert len(watch.blocked) == 1 and "a database connection" in watch.blocked[0]
    assert "in both" in watch.blocked[0]  # where it came from
    with pytest.raises(AssertionError, match="on the event loop"):
        watch.check()
    engine.dispose()


def test_the_watch_notes_named_calls_made_on_the_loop() -> None:
    class Api:
        def list_pods(self, namespace: str) -> list[str]:
            return [namespace]

    api, watch = Api(), LoopWatch()
    watch.calls(api, "list_pods")

    async def main() -> list[str]:
        return api.list_pods("a") + await off_loop(api.list_pods, "b")

    assert asyncio.run(main()) == ["a", "b"]
    assert [b.splitlines()[0] for b in watch.blocked] == ["Api.list_pods on the event loop, from:"]


def test_every_adapter_leaves_the_database_and_the_kubernetes_api_to_worker_threads(
    settings: Settings, clock: FakeClock
) -> None:
    """Start-up, REST (/place with a replayed key, /score), the direct Slurm route, the
    extender's four verbs and shut-down, with every connection and API call watched."""
    app = create_app(settings, clock=clock, background=False)
    kube = FakeKubeApi()
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    app.state.k8s_api = kube
    watch = LoopWatch()
    watch.calls(kube, "bind", "get_pod", "list_pods")
    unset = {"min_nodes": NO_VAL, "max_nodes": NO_VAL, "num_tasks": NO_VAL}
    with watch.database(app.state.service.engine), TestClient(app) as client:
        add_nodes(client, ("hgx-h100", "h0"), ("hgx-h100", "h1"))
        key = {"Idempotency-Key": "once"}
        assert client.post("/v1/place", json={"gpus": 2}, headers=key).status_code == 201
        assert client.post("/v1/place", json={"gpus": 2}, headers=key).status_code == 200
        assert client.post("/v1/score", json={"gpus": 1, "nodes": ["h0"]}).status_code == 200
        job = {**unset, "tres_per_node": "gres:gpu:2"}
        assert client.post("/v1/slurm/job-submit", json=job).json()["action"] == "modify"
        trainer = kube.add(pod("trainer", 2))
        passed = client.post("/k8s/v1/filter", json=names_args(trainer, ["h0", "h1"])).json()
        assert passed["NodeNames"] == ["h0", "h1"]
        assert client.post("/k8s/v1/prioritize", json=names_args(trainer, ["h0", "h1"])).json()
        assert client.post("/k8s/v1/bind", json=binding_args(trainer, "h1")).json()["Error"] == ""
        # A second pod's bind, as the first: on the loop (the API's client was made at
        # start-up, for the pod watch), its Binding through the API's own bind on a
        # worker thread (the fake has no asynchronous one), its reservation written as
        # the Slurm filter's.
        second = kube.add(pod("second", 1))
        client.post("/k8s/v1/filter", json=names_args(second, ["h0", "h1"]))
        assert client.post("/k8s/v1/bind", json=binding_args(second, "h0")).json()["Error"] == ""
        victims = {"NodeNameToMetaVictims": {"h0": {"Pods": [], "NumPDBViolations": 0}}}
        preempt = client.post("/k8s/v1/preempt", json={"Pod": pod("other", 8), **victims})
        assert preempt.status_code == 200
    assert watch.seen["a database connection"] > 0 and watch.seen["FakeKubeApi.bind"] == 2
    # The one exception (service/event_loop.py): on SQLite the Slurm filter's and the pod
    # binds' reservations are written at once, on the loop, through a connection kept for
    # them that never waits; on Postgres they await the group committer (the watch above
    # saw no other database call on the loop).
    sqlite = app.state.service.engine.dialect.name == "sqlite"
    assert app.state.service.committer.at_once == (3 if sqlite else 0)
    watch.check(allowed="write_now")
