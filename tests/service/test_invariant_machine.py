"""The one promise under any interleaving, as a stateful property test over real replicas.

Hypothesis drives real `topoplace serve` processes (three on one Postgres,
one on SQLite) with place (whole GPUs and GPU shares), replayed
Idempotency-Keys, one key sent to every replica at once, confirm, extend,
release, release by job id, expiry (reservations with a TTL of a fraction of
a second, swept by the services themselves), snapshots that turn GPUs
unhealthy and back or swap one for a new board, cordons and uncordons on
any replica, and calls that race each other across replicas. After every
step it checks, in the database and in every replica's view:

- a GPU is held by at most one live allocation, whole or in shares that sum
  to its pool and never pass a whole GPU, and every live allocation holds
  exactly the devices its placement names (ended ones hold nothing);
- every replica shows as busy exactly what the database holds, and the same
  thousandths on each shared GPU, within a bound (notifications are applied
  as they arrive);
- one Idempotency-Key makes at most one allocation, whichever replicas it
  reaches at once;
- no reservation made after a node's cordon answered holds its GPUs, on
  whichever replica it was made;
- no answer is a 5xx, and a confirmed allocation never ends `expired`.

Dropping a state guard in service/allocations/repository.py (confirm or
extend without its state condition, an expiry that ignores the state) makes
this test fail: the database refuses the write (a 500) or a confirmed
allocation expires.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from placement import Health, NodeSnapshot
from placement.profiles import build_profile
from service import schema
from tests.service import replica_processes
from tests.service.conftest import _truncate
from tests.service.invariant import database_shares_view, database_view, replica_shares_view

pytestmark = pytest.mark.slow

NODES = 4  # HGX H100 boxes of 8 GPUs
SHORT_TTL_S = 0.3
CONVERGE_S = 3.0
ENV = {
    "TOPOPLACE_HEARTBEAT_TTL_S": "3600",
    "TOPOPLACE_RESERVATION_TTL_S": "60",
    "TOPOPLACE_MIN_RESERVATION_TTL_S": "0.1",
}
LIVE = set(schema.LIVE_STATES)


@dataclass
class Cluster:
    urls: list[str]
    engine: sa.Engine
    clients: list[httpx.Client]
    snapshots: dict[str, NodeSnapshot] = field(default_factory=dict)

    def call(self, replica: int, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self.clients[replica % len(self.clients)].request(method, path, **kwargs)
        assert response.status_code < 500, f"{method} {path}: {response.text}"
        return response

    def report(self, replica: int, snap: NodeSnapshot) -> None:
        body = {"snapshot": snap.model_dump(mode="json")}
        response = self.call(replica, "PUT", f"/v1/nodes/{snap.name}/snapshot", json=body)
        assert response.status_code == 200, response.text
        self.snapshots[snap.name] = snap


def _cluster(database_url: str, count: int) -> Iterator[Cluster]:
    _truncate(database_url)
    with replica_processes.replicas(database_url, count, ENV) as running:
        urls = running.urls
        engine = sa.create_engine(database_url)
        clients = [httpx.Client(base_url=u, timeout=30.0, trust_env=False) for u in urls]
        cluster = Cluster(urls, engine, clients)
        for i in range(NODES):
            cluster.report(i, build_profile("hgx-h100", f"h100-{i}"))
        try:
            yield cluster
        finally:
            for client in clients:
                client.close()
            engine.dispose()


def _healthy_held(cluster: Cluster, held: set[tuple[str, str]]) -> set[tuple[str, str]]:
    healthy = {
        (name, g.uuid)
        for name, snap in cluster.snapshots.items()
        for g in snap.gpus
        if g.health is Health.HEALTHY
    }
    return held & healthy


class LifecycleMachine(RuleBasedStateMachine):
    cluster: Cluster  # set by each test before it runs the machine
    allocations = Bundle("allocations")

    def __init__(self) -> None:
        super().__init__()
        self.confirmed: set[str] = set()
        # Allocations that nothing may have ended yet: placed or extended with a long
        # TTL, never released. Confirming one of them must succeed.
        self.lasting: set[str] = set()
        self.keys: dict[str, tuple[dict[str, Any], str]] = {}
        self.jobs: set[str] = set()
        self.serial = 0
        self.seq = dict.fromkeys(self.cluster.snapshots, 0)
        # Nodes whose cordon has answered: no reservation made after it may hold their GPUs.
        self.cordoned: set[str] = set()
        self._reset()

    def _reset(self) -> None:
        """Each example starts from a healthy, empty cluster."""
        _, states = database_view(self.cluster.engine)
        for allocation_id, state in states.items():
            if state in LIVE:
                self.cluster.call(0, "POST", f"/v1/allocations/{allocation_id}/release")
        for name, snap in list(self.cluster.snapshots.items()):
            if any(g.health is not Health.HEALTHY for g in snap.gpus):
                self._report_health(0, name, None)
            self.cluster.call(0, "POST", f"/v1/nodes/{name}/uncordon")

    def _report_health(self, replica: int, name: str, sick: int | None) -> None:
        snap = self.cluster.snapshots[name]
        gpus = [
            g.model_copy(update={"health": Health.UNHEALTHY if g.index == sick else Health.HEALTHY})
            for g in snap.gpus
        ]
        self.cluster.report(replica, snap.model_copy(update={"gpus": gpus, "seq": snap.seq + 1}))

    def _place(self, replica: int, body: dict[str, Any], key: str | None) -> httpx.Response:
        headers = {"Idempotency-Key": key} if key else {}
        cordoned = set(self.cordoned)  # as of the call: a cordon racing it may go either way
        response = self.cluster.call(replica, "POST", "/v1/place", json=body, headers=headers)
        assert response.status_code in (200, 201, 409), response.text
        if response.status_code == 201:
            on = {task["node"] for task in response.json()["tasks"]} & cordoned
            assert not on, f"a reservation made after the cordon holds GPUs of {sorted(on)}"
        return response

    @rule(
        target=allocations,
        replica=st.integers(0, 2),
        gpus=st.sampled_from([1, 2, 4, 8]),
        short=st.booleans(),
        keyed=st.booleans(),
    )
    def place(self, replica: int, gpus: int, short: bool, keyed: bool) -> str:
        return self._placed(replica, {"gpus": gpus}, short, keyed)

    @rule(
        target=allocations,
        replica=st.integers(0, 2),
        fraction=st.sampled_from([0.25, 0.5, 0.75]),
        short=st.booleans(),
        keyed=st.booleans(),
    )
    def place_share(self, replica: int, fraction: float, short: bool, keyed: bool) -> str:
        return self._placed(replica, {"gpu_fraction": fraction}, short, keyed)

    def _placed(self, replica: int, asked: dict[str, Any], short: bool, keyed: bool) -> str:
        self.serial += 1
        body: dict[str, Any] = {**asked, "job_id": f"job-{self.serial}"}
        self.jobs.add(body["job_id"])
        if short:
            body["ttl_s"] = SHORT_TTL_S
        key = f"key-{time.monotonic_ns()}-{self.serial}" if keyed else None
        response = self._place(replica, body, key)
        if response.status_code == 409:
            return ""
        allocation_id = str(response.json()["id"])
        if not short:
            self.lasting.add(allocation_id)
        if key:
            self.keys[key] = (body, allocation_id)
        return allocation_id

    @rule(replica=st.integers(0, 2), data=st.data())
    def replay(self, replica: int, data: st.DataObject) -> None:
        if not self.keys:
            return
        key = data.draw(st.sampled_from(sorted(self.keys)))
        body, allocation_id = self.keys[key]
        response = self._place(replica, body, key)
        assert response.status_code == 200 and response.json()["id"] == allocation_id

    @rule(allocation=allocations, replica=st.integers(0, 2))
    def confirm(self, allocation: str, replica: int) -> None:
        if allocation:
            self._confirm(allocation, replica)

    def _confirm(self, allocation: str, replica: int) -> None:
        response = self.cluster.call(replica, "POST", f"/v1/allocations/{allocation}/confirm")
        assert response.status_code in (200, 409), response.text
        if allocation in self.lasting:
            assert response.status_code == 200, f"a live reservation was refused: {response.text}"
        if response.status_code == 200:
            assert response.json()["state"] in ("active", "degraded"), response.text
            self.confirmed.add(allocation)

    @rule(allocation=allocations, replica=st.integers(0, 2), short=st.booleans())
    def extend(self, allocation: str, replica: int, short: bool) -> None:
        if not allocation:
            return
        ttl = SHORT_TTL_S if short else 60
        path = f"/v1/allocations/{allocation}/extend"
        response = self.cluster.call(replica, "POST", path, json={"ttl_s": ttl})
        assert response.status_code in (200, 409), response.text
        if response.status_code == 200:
            assert response.json()["state"] in ("pending", "degraded")
            (self.lasting.discard if short else self.lasting.add)(allocation)
        elif allocation in self.lasting and allocation not in self.confirmed:
            raise AssertionError(f"a live reservation was refused: {response.text}")

    @rule(allocation=allocations, replica=st.integers(0, 2))
    def release(self, allocation: str, replica: int) -> None:
        if allocation:
            self.lasting.discard(allocation)
            path = f"/v1/allocations/{allocation}/release"
            assert self.cluster.call(replica, "POST", path).status_code == 200

    @rule(replica=st.integers(0, 2), data=st.data())
    def release_job(self, replica: int, data: st.DataObject) -> None:
        if not self.jobs:
            return
        job = data.draw(st.sampled_from(sorted(self.jobs)))
        response = self.cluster.call(replica, "POST", f"/v1/jobs/{job}/release")
        assert response.status_code == 200, response.text
        self.lasting -= set(response.json()["released"])

    @rule(
        target=allocations,
        asked=st.sampled_from([{"gpus": 2}, {"gpus": 8}, {"gpu_fraction": 0.5}]),
        count=st.integers(2, 3),
    )
    def keyed_places_race(self, asked: dict[str, Any], count: int) -> str:
        """One Idempotency-Key sent to several replicas at once (a client retrying on
        another replica before the first answered): one allocation at most."""
        self.serial += 1
        body = {**asked, "job_id": f"job-{self.serial}"}
        self.jobs.add(body["job_id"])
        key = f"race-key-{time.monotonic_ns()}-{self.serial}"
        start = threading.Barrier(count)

        def placing(replica: int) -> httpx.Response:
            start.wait()
            return self._place(replica, body, key)

        with ThreadPoolExecutor(count) as pool:
            answers = [done.result() for done in [pool.submit(placing, r) for r in range(count)]]
        placed = [a for a in answers if a.status_code in (200, 201)]
        ids = {str(a.json()["id"]) for a in placed}
        assert len(ids) <= 1, f"one Idempotency-Key made {sorted(ids)}"
        assert sum(a.status_code == 201 for a in answers) <= 1, [a.text for a in answers]
        if not ids:
            return ""
        allocation_id = ids.pop()
        self.keys[key] = (body, allocation_id)
        self.lasting.add(allocation_id)
        return allocation_id

    @rule(allocation=allocations, first=st.integers(0, 2), second=st.integers(0, 2))
    def confirm_races_release(self, allocation: str, first: int, second: int) -> None:
        if not allocation:
            return
        self.lasting.discard(allocation)  # either may win
        start = threading.Barrier(2)

        def confirming() -> None:
            start.wait()
            self._confirm(allocation, first)

        def releasing() -> None:
            start.wait()
            path = f"/v1/allocations/{allocation}/release"
            assert self.cluster.call(second, "POST", path).status_code == 200

        with ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(confirming), pool.submit(releasing)]:
                done.result()

    @rule(gpus=st.sampled_from([2, 4, 8]), count=st.integers(2, 4))
    def places_race(self, gpus: int, count: int) -> None:
        start = threading.Barrier(count)

        def placing(replica: int) -> None:
            start.wait()
            self._place(replica, {"gpus": gpus, "job_id": f"race-{replica}"}, None)

        with ThreadPoolExecutor(count) as pool:
            for done in [pool.submit(placing, r) for r in range(count)]:
                done.result()

    @rule()
    def ttl_passes(self) -> None:
        # Real processes sweep on their own wall clock, which no test can move: time
        # really passes here, kept short; nothing is asserted about when the sweep ran.
        time.sleep(SHORT_TTL_S + 0.25)  # past the short TTL and at least one sweep

    @rule(
        node=st.integers(0, NODES - 1),
        sick=st.none() | st.integers(0, 7),
        replica=st.integers(0, 2),
    )
    def health_changes(self, node: int, sick: int | None, replica: int) -> None:
        self._report_health(replica, f"h100-{node}", sick)

    @rule(node=st.integers(0, NODES - 1), replica=st.integers(0, 2), on=st.booleans())
    def cordon_flips(self, node: int, replica: int, on: bool) -> None:
        # Another replica may not have heard of it yet when the next place comes: the
        # reservation's holds name the node row it was chosen on, uncordoned.
        name = f"h100-{node}"
        action = "cordon" if on else "uncordon"
        response = self.cluster.call(replica, "POST", f"/v1/nodes/{name}/{action}")
        assert response.status_code == 200, response.text
        if on:
            self.cordoned.add(name)
        else:
            self.cordoned.discard(name)

    @rule(node=st.integers(0, NODES - 1), index=st.integers(0, 7), replica=st.integers(0, 2))
    def board_replaced(self, node: int, index: int, replica: int) -> None:
        # A GPU swapped for a new one: the old UUID's holder keeps its hold (degraded), the
        # new UUID is free, on every replica.
        snap = self.cluster.snapshots[f"h100-{node}"]
        new = f"GPU-swapped-{time.monotonic_ns()}"  # never one an earlier example reported
        gpus = [g.model_copy(update={"uuid": new}) if g.index == index else g for g in snap.gpus]
        self.cluster.report(replica, snap.model_copy(update={"gpus": gpus, "seq": snap.seq + 1}))

    @invariant()
    def one_gpu_one_live_allocation(self) -> None:
        deadline = time.monotonic() + CONVERGE_S
        while True:
            held, pools, states = database_shares_view(self.cluster.engine)
            views = [replica_shares_view(c) for c in self.cluster.clients]
            again, pools_again, _ = database_shares_view(self.cluster.engine)
            wanted = _healthy_held(self.cluster, held)
            shares = {gpu: milli for gpu, milli in pools.items() if gpu in wanted}
            steady = held == again and pools == pools_again
            if steady and all(v == (wanted, shares) for v in views):
                break
            if time.monotonic() > deadline:
                diffs = [
                    (sorted(busy - wanted), sorted(wanted - busy), shown, shares)
                    for busy, shown in views
                ]
                raise AssertionError(f"replicas disagree with the database: {diffs}")
            time.sleep(0.02)
        expired = {i for i in self.confirmed if states.get(i) == "expired"}
        assert not expired, f"confirmed allocations expired: {sorted(expired)}"


MACHINE_SETTINGS = settings(
    max_examples=6,
    stateful_step_count=20,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.fixture(scope="module")
def postgres_cluster(postgres_url: str) -> Iterator[Cluster]:
    yield from _cluster(postgres_url, 3)


@pytest.fixture(scope="module")
def sqlite_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    path = tmp_path_factory.mktemp("machine") / "topoplace.sqlite3"
    yield from _cluster(f"sqlite:///{path}", 1)


def _run(cluster: Cluster) -> None:
    LifecycleMachine.cluster = cluster
    LifecycleMachine.TestCase.settings = MACHINE_SETTINGS
    LifecycleMachine.TestCase().runTest()


def test_three_replicas_on_postgres_keep_the_promise(postgres_cluster: Cluster) -> None:
    _run(postgres_cluster)


def test_one_service_on_sqlite_keeps_the_promise(sqlite_cluster: Cluster) -> None:
    _run(sqlite_cluster)
