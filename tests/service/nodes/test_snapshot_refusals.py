"""Snapshots the service refuses, and that nothing of them is stored (SQLite and Postgres)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement import NodeSnapshot
from placement.profiles import build_profile
from service import schema
from service.app import create_app
from service.grpc.gen import topoplace_pb2 as pb
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.grpc.conftest import Running, details, reason, start
from tests.service.helpers import report

MAX_SEQ = 2**63 - 1  # the largest BIGINT


def _put(client: TestClient, name: str, body: dict[str, Any]) -> Any:
    return client.put(f"/v1/nodes/{name}/snapshot", json={"snapshot": body})


def _stored_rows(settings: Settings) -> int:
    engine = sa.create_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            count = conn.execute(sa.select(sa.func.count()).select_from(schema.nodes))
            return int(count.scalar_one())
    finally:
        engine.dispose()


def _invalid(response: Any, field: str) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == field
    return str(error["message"])


def test_a_node_without_gpus_is_refused_and_the_service_starts_again(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    body = {"name": "cpu0", "gpus": [], "links": []}
    message = _invalid(_put(client, "cpu0", body), "snapshot.gpus")
    assert "at least one GPU" in message
    assert client.get("/v1/nodes/cpu0").status_code == 404
    assert _stored_rows(settings) == 0
    # Nothing was kept that could stop a start.
    with TestClient(create_app(settings, clock=clock, background=False)) as again:
        assert again.get("/readyz").status_code == 200


def test_more_gpus_than_the_engine_masks_hold_is_refused(client: TestClient) -> None:
    count = 64
    body = {
        "name": "big",
        "gpus": [
            {"index": i, "uuid": f"GPU-big-{i}", "model": "NVIDIA H100"} for i in range(count)
        ],
        "links": [["X" if i == j else "SYS" for j in range(count)] for i in range(count)],
    }
    _invalid(_put(client, "big", body), "snapshot.gpus")
    assert client.get("/v1/nodes/big").status_code == 404


def test_seq_past_bigint_is_refused_and_the_largest_one_locks_out_with_409(
    client: TestClient,
) -> None:
    snap = build_profile("hgx-h100", "h0")
    body = snap.model_dump(mode="json")
    _invalid(_put(client, "h0", {**body, "seq": MAX_SEQ + 1}), "snapshot.seq")
    assert client.get("/v1/nodes/h0").status_code == 404

    # A report of a node without a key, by an admin, with the largest seq: accepted ...
    assert _put(client, "h0", {**body, "seq": MAX_SEQ}).status_code == 200
    assert _put(client, "h0", {**body, "seq": MAX_SEQ}).json()["changed"] is False
    # ... and the real agent then gets a 409 that says why, never a 500.
    real = _put(client, "h0", {**body, "seq": 1_780_000_000_000, "labels": {"v": "2"}})
    assert real.status_code == 409, real.text
    error = real.json()["error"]
    assert error["detail"] == {"field": "snapshot.seq", "stored_seq": MAX_SEQ}
    assert "largest seq" in error["message"] and "DELETE /v1/nodes/h0" in error["message"]
    same_seq = _put(client, "h0", {**body, "seq": MAX_SEQ, "labels": {"v": "2"}})
    assert same_seq.status_code == 409
    # What the agent sends next (the stored seq + 1) is a 422, not a 500.
    _invalid(_put(client, "h0", {**body, "seq": MAX_SEQ + 1}), "snapshot.seq")
    # Deleting the node lets the agent start again.
    assert client.delete("/v1/nodes/h0").status_code == 204
    assert _put(client, "h0", {**body, "seq": 1_780_000_000_000}).status_code == 200


def test_a_cpuset_of_billions_of_cpus_is_refused_at_once(client: TestClient) -> None:
    body = build_profile("hgx-h100", "h0").model_dump(mode="json")
    body["numa_nodes"][0]["cpus"] = "0-2000000000"
    started = time.monotonic()
    message = _invalid(_put(client, "h0", body), "snapshot.numa_nodes.0.cpus")
    assert time.monotonic() - started < 2 and "highest CPU id" in message
    body["numa_nodes"][0]["cpus"] = "0-9_9999_9999"
    assert "not a CPU number" in _invalid(_put(client, "h0", body), "snapshot.numa_nodes.0.cpus")


def test_numa_nodes_naming_more_cpus_than_a_machine_are_refused(
    client: TestClient, settings: Settings
) -> None:
    """Each cpuset was bounded alone: 1,024 NUMA nodes of "0-16383", a 32 KB report, made
    16.7 million CPUs (1.2 s in the state lock, 680 MB)."""
    body = build_profile("hgx-h100", "h0").model_dump(mode="json")
    body["numa_nodes"] = [{"id": i, "cpus": "0-16383"} for i in range(1024)]
    message = _invalid(_put(client, "h0", body), "snapshot.numa_nodes.1.cpus")
    assert "more than 16384 CPUs" in message
    # One CPU in two NUMA nodes could be given to two tasks (the place step then failed
    # with 409 after 4 tries): refused, naming both.
    body["numa_nodes"] = [{"id": 0, "cpus": "0-63"}, {"id": 1, "cpus": "60-127"}]
    message = _invalid(_put(client, "h0", body), "snapshot.numa_nodes.0.cpus")
    assert "NUMA node 0 shares CPU 60 with NUMA node 1" in message
    assert _stored_rows(settings) == 0


def test_more_nics_than_a_machine_carries_are_refused(client: TestClient) -> None:
    """GET /topology prints a NIC x NIC matrix: 3,000 NICs made 35 MB of text."""
    body = build_profile("hgx-h100", "h0").model_dump(mode="json")
    nic = {"name": "nic", "links": ["SYS"] * len(body["gpus"])}
    body["nics"] = [{**nic, "name": f"nic{i}"} for i in range(1025)]
    assert "at most 1024 items" in _invalid(_put(client, "h0", body), "snapshot.nics")
    body["nics"] = body["nics"][:1024]
    assert _put(client, "h0", body).status_code == 200
    # The matrix at the bound: 1,024 x 1,024 cells, 5.4 MB.
    assert len(client.get("/v1/nodes/h0/topology").text) < 6_000_000


def test_a_gpu_of_another_node_is_refused_naming_that_node(
    client: TestClient, settings: Settings
) -> None:
    first = build_profile("hgx-h100", "h0")
    assert report(client, first).status_code == 200
    second = build_profile("hgx-h100", "h1")
    gpus = [*second.gpus]
    gpus[3] = gpus[3].model_copy(update={"uuid": first.gpus[5].uuid})
    response = report(client, second.model_copy(update={"gpus": gpus}))
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "conflict" and error["detail"]["node"] == "h0"
    assert error["detail"]["uuid"] == first.gpus[5].uuid and "'h0'" in error["message"]
    assert client.get("/v1/nodes/h1").status_code == 404 and _stored_rows(settings) == 1
    # The node itself may report its own GPUs again, changed or not.
    relabeled = first.model_copy(update={"seq": 1, "labels": {"rack": "r2"}})
    assert report(client, relabeled).status_code == 200
    # A GPU that moved: once its old node is gone, the new one may report it.
    assert client.delete("/v1/nodes/h0").status_code == 204
    assert report(client, second.model_copy(update={"gpus": gpus})).status_code == 200


def test_a_mig_instance_named_like_a_gpu_of_another_node_is_refused(client: TestClient) -> None:
    mig = build_profile("hgx-h100-mig", "m0")
    assert report(client, mig).status_code == 200
    other = build_profile("hgx-h100", "h0")
    gpus = [*other.gpus]
    gpus[0] = gpus[0].model_copy(update={"uuid": mig.mig_instances[0].uuid})
    response = report(client, other.model_copy(update={"gpus": gpus}))
    assert response.status_code == 409 and response.json()["error"]["detail"]["node"] == "m0"


def test_a_gpu_of_another_node_stored_by_another_replica_is_refused(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    """The check reads the database, not only this replica's memory."""
    with TestClient(create_app(settings, clock=clock, background=False)) as other_replica:
        assert report(other_replica, build_profile("hgx-h100", "h0")).status_code == 200
    assert "h0" not in client.app.state.service.cluster  # type: ignore[attr-defined]
    clash = build_profile("hgx-h100", "h1").model_copy(
        update={"gpus": build_profile("hgx-h100", "h0").gpus}
    )
    response = report(client, clash)
    assert response.status_code == 409 and response.json()["error"]["detail"]["node"] == "h0"


def test_a_gpu_uuid_spelled_like_a_held_cpu_is_refused_and_the_service_starts_again(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    """Held CPUs are stored as "cpu:<id>" beside held GPUs: a GPU so named, once placed,
    read back as a CPU and stopped every replica's start and sync."""
    snap = build_profile("hgx-h100", "h0")
    gpus = [g.model_copy(update={"uuid": f"cpu:x{g.index}"}) for g in snap.gpus]
    response = report(client, snap.model_copy(update={"gpus": gpus}))
    message = _invalid(response, "snapshot.gpus.0.uuid")
    assert "names a CPU" in message
    assert client.get("/v1/nodes/h0").status_code == 404 and _stored_rows(settings) == 0
    assert client.post("/v1/place", json={"gpus": 8}).status_code == 409
    with TestClient(create_app(settings, clock=clock, background=False)) as again:
        assert again.get("/readyz").status_code == 200


def test_a_mig_instance_past_the_last_slice_is_refused(client: TestClient) -> None:
    """Stored, one instance at slice 20,000,000 made every MIG placement, on any node,
    list twenty million slices of that GPU under the state lock (48 s each)."""
    assert report(client, build_profile("hgx-h100-mig", "m0")).status_code == 200
    far = build_profile("hgx-h100-mig", "m1")
    migs = [*far.mig_instances]
    migs[-1] = migs[-1].model_copy(update={"placement_start": 20_000_000})
    response = report(client, far.model_copy(update={"mig_instances": migs}))
    _invalid(response, f"snapshot.mig_instances.{len(migs) - 1}.placement_start")
    assert client.get("/v1/nodes/m1").status_code == 404
    placed = client.post("/v1/place", json={"gpus": 1, "mig_profile": migs[0].profile})
    assert placed.status_code == 201 and placed.json()["tasks"][0]["node"] == "m0"


def _without_last_gpu(snap: NodeSnapshot) -> NodeSnapshot:
    n = snap.gpu_count - 1
    return snap.model_copy(
        update={
            "seq": snap.seq + 1,
            "gpus": snap.gpus[:n],
            "links": [row[:n] for row in snap.links[:n]],
            "nics": [nic.model_copy(update={"links": nic.links[:n]}) for nic in snap.nics],
            "cpu_links": [link for link in snap.cpu_links if link.gpu < n],
        }
    )


def test_a_gpu_still_held_on_the_node_that_dropped_it_is_refused_elsewhere(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    """A node that stops reporting a held GPU degrades its allocation, which keeps the
    GPU: the job may still run on it, so no other node may report it and have it placed
    again until that allocation ends (checked on another replica too)."""
    first = build_profile("hgx-h100", "h0")
    assert report(client, first).status_code == 200
    placed = client.post("/v1/place", json={"gpus": 8})
    assert placed.status_code == 201, placed.text
    allocation = placed.json()["id"]
    dropped = first.gpus[7].uuid
    assert report(client, _without_last_gpu(first)).status_code == 200
    assert client.get(f"/v1/allocations/{allocation}").json()["state"] == "degraded"

    second = build_profile("hgx-h100", "h1")
    gpus = [second.gpus[0].model_copy(update={"uuid": dropped}), *second.gpus[1:]]
    claim = second.model_copy(update={"gpus": gpus})
    with TestClient(create_app(settings, clock=clock, background=False)) as other_replica:
        for replica in (client, other_replica):
            response = report(replica, claim)
            assert response.status_code == 409, response.text
            error = response.json()["error"]
            assert error["code"] == "conflict" and error["detail"]["node"] == "h0"
            assert error["detail"]["uuid"] == dropped and "held" in error["message"]
            assert replica.get("/v1/nodes/h1").status_code == 404
    assert _stored_rows(settings) == 1
    # Once the allocation ends, the GPU may be reported by the node it moved to.
    assert client.post(f"/v1/allocations/{allocation}/release").status_code == 200
    assert report(client, claim).status_code == 200


@pytest.fixture
def grpc_running(settings: Settings, clock: FakeClock) -> Iterator[Running]:
    yield from start(settings, clock)


def test_grpc_refuses_the_same_snapshots(grpc_running: Running) -> None:
    stub = grpc_running.stub
    first = build_profile("hgx-h100", "h0")
    stub.ReportSnapshot(pb.ReportSnapshotRequest(node="h0", snapshot_json=first.model_dump_json()))
    clash = build_profile("hgx-h100", "h1").model_copy(update={"gpus": first.gpus})
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReportSnapshot(
            pb.ReportSnapshotRequest(node="h1", snapshot_json=clash.model_dump_json())
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason(caught.value) == "conflict" and "'h0'" in (caught.value.details() or "")

    empty = '{"name": "cpu0", "gpus": [], "links": []}'
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReportSnapshot(pb.ReportSnapshotRequest(node="cpu0", snapshot_json=empty))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details(caught.value)["BadRequest"].field_violations[0].field == "snapshot.gpus"
    assert "cpu0" not in grpc_running.state.cluster
