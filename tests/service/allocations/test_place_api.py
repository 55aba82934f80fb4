"""/place, /score and allocations: reservations that never double-book."""

from __future__ import annotations

import orjson
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement import Health
from service import schema
from service.allocations import api
from service.allocations.schemas import AllocationView, ScoreRequest, ScoreResult
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes, report


def test_place_reserves_and_returns_the_environment(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    response = client.post("/v1/place", json={"gpus": 4, "job_id": "j1", "owner": "ana"})
    assert response.status_code == 201, response.text
    allocation = response.json()
    task = allocation["tasks"][0]
    assert allocation["state"] == "pending" and allocation["expires_at"] is not None
    assert task["gpu_indices"] in ([0, 1, 2, 3], [4, 5, 6, 7])
    assert task["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(task["gpu_uuids"])
    assert task["score"]["ring_gbps"] == 25.0
    # Responses are built as plain data: they must still match the documented schema.
    assert AllocationView.model_validate(allocation).tasks[0].env == task["env"]
    node = client.get("/v1/nodes/dgx0").json()
    assert len(node["free_gpus"]) == 4 and node["allocations"] == [allocation["id"]]
    assert client.get(f"/v1/allocations/{allocation['id']}").json()["id"] == allocation["id"]


def test_idempotency_key_returns_the_same_allocation(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    headers = {"Idempotency-Key": "pod-uid-123"}
    first = client.post("/v1/place", json={"gpus": 2}, headers=headers)
    again = client.post("/v1/place", json={"gpus": 2}, headers=headers)
    assert first.status_code == 201 and again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert len(client.get("/v1/allocations").json()["allocations"]) == 1
    assert len(client.get("/v1/nodes/h0").json()["free_gpus"]) == 6
    reused = client.post("/v1/place", json={"gpus": 3}, headers=headers)
    assert reused.status_code == 409 and reused.json()["error"]["code"] == "conflict"


def test_priority_is_refused_saying_it_was_removed(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    for path in ("/v1/place", "/v1/score"):
        for value in (0, 5, None):
            response = client.post(path, json={"gpus": 1, "priority": value})
            assert response.status_code == 422, (path, value)
            error = response.json()["error"]
            assert error["code"] == "invalid_request" and error["detail"]["field"] == "priority"
            assert error["message"].startswith("priority: removed from the API")
            assert "never had an effect" in error["message"]
    assert client.get("/v1/allocations").json()["allocations"] == []


def test_a_key_stored_with_priority_still_replays(client: TestClient, settings: Settings) -> None:
    # Rows written before priority was removed store it in their request JSON; a
    # retry of the same request (without priority now) is still the same request.
    add_nodes(client, ("hgx-h100", "h0"))
    headers = {"Idempotency-Key": "from-the-earlier-version"}
    first = client.post("/v1/place", json={"gpus": 2, "job_id": "old"}, headers=headers)
    assert first.status_code == 201
    engine = sa.create_engine(settings.database_url)
    table = schema.allocations
    with engine.begin() as conn:
        stored = conn.execute(sa.select(table.c.request)).scalar_one()
        assert "priority" not in orjson.loads(stored)
        legacy = orjson.dumps({**orjson.loads(stored), "priority": 0}).decode()
        conn.execute(table.update().values(request=legacy))
    engine.dispose()
    again = client.post("/v1/place", json={"gpus": 2, "job_id": "old"}, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = client.post("/v1/place", json={"gpus": 3, "job_id": "old"}, headers=headers)
    assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"


def test_unschedulable_and_unresolvable_are_told_apart(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    never = client.post("/v1/place", json={"gpus": 16, "locality": "nvlink"})
    assert never.status_code == 422 and never.json()["error"]["code"] == "unresolvable"
    client.post("/v1/place", json={"gpus": 8})
    busy = client.post("/v1/place", json={"gpus": 2})
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "unschedulable"
    assert busy.headers["Retry-After"] == "5"
    assert busy.json()["error"]["detail"]["reasons"][0]["cause"] == "busy"


def test_bad_requests_name_the_field(client: TestClient) -> None:
    response = client.post("/v1/place", json={"gpus": 0})
    assert response.status_code == 422 and response.json()["error"]["detail"]["field"] == "gpus"
    response = client.post("/v1/place", json={"gpus": 1, "colour": "red"})
    assert response.json()["error"]["detail"]["field"] == "colour"
    assert client.get("/v1/allocations/nope").status_code == 404
    huge = client.post(
        "/v1/place",
        content=b"{" + b" " * (5 * 1024 * 1024) + b"}",
        headers={"content-type": "application/json"},
    )
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "payload_too_large"


def test_confirm_extend_release_and_expiry(client: TestClient, clock: FakeClock) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    keep = client.post("/v1/place", json={"gpus": 2, "job_id": "keep"}).json()
    lapse = client.post("/v1/place", json={"gpus": 2, "job_id": "lapse", "ttl_s": 30}).json()
    assert client.post(f"/v1/allocations/{keep['id']}/confirm").json()["state"] == "active"
    extended = client.post(f"/v1/allocations/{lapse['id']}/extend", json={"ttl_s": 60}).json()
    assert extended["state"] == "pending"
    clock.advance(61)
    client.post("/v1/nodes/h0/heartbeat")
    state = client.app.state.service  # type: ignore[attr-defined]
    assert api.sweep(state).ids == (lapse["id"],)
    assert client.get(f"/v1/allocations/{lapse['id']}").json()["state"] == "expired"
    assert client.get(f"/v1/allocations/{keep['id']}").json()["state"] == "active"
    assert len(client.get("/v1/nodes/h0").json()["free_gpus"]) == 6
    released = client.post("/v1/jobs/keep/release").json()["released"]
    assert (
        released == [keep["id"]] and client.post("/v1/jobs/keep/release").json()["released"] == []
    )
    assert len(client.get("/v1/nodes/h0").json()["free_gpus"]) == 8
    listed = client.get("/v1/allocations", params={"state": "released"}).json()["allocations"]
    assert [a["id"] for a in listed] == [keep["id"]]


def test_unhealthy_gpu_degrades_its_allocation(client: TestClient) -> None:
    snap = add_nodes(client, ("workstation-2x-a6000", "ws"))[0]
    allocation = client.post("/v1/place", json={"gpus": 2}).json()
    sick = snap.model_copy(
        update={
            "seq": 1,
            "gpus": [snap.gpus[0].model_copy(update={"health": Health.UNHEALTHY}), snap.gpus[1]],
        }
    )
    assert report(client, sick).status_code == 200
    assert client.get(f"/v1/allocations/{allocation['id']}").json()["state"] == "degraded"


def test_two_replicas_never_hand_out_a_gpu_twice(settings: Settings, clock: FakeClock) -> None:
    # Replica B loads its state before replica A reserves: B's memory is stale
    # and it picks the same GPUs; the database refuses, B catches up and retries.
    a_app = create_app(settings, clock=clock, background=False)
    with TestClient(a_app) as a:
        add_nodes(a, ("workstation-2x-a6000", "ws"), ("hgx-h100", "h0"))
        b_app = create_app(settings, clock=clock, background=False)
        with TestClient(b_app) as b:
            first = a.post("/v1/place", json={"gpus": 8}).json()
            second = b.post("/v1/place", json={"gpus": 8})
            assert second.status_code == 409  # h0 is taken; ws has only 2 GPUs
            third = b.post("/v1/place", json={"gpus": 2})
            assert third.status_code == 201
            assert third.json()["tasks"][0]["node"] == "ws"
            assert first["tasks"][0]["node"] == "h0"
    engine = sa.create_engine(settings.database_url)
    with engine.connect() as conn:
        holds = conn.execute(sa.select(schema.gpu_holds.c.device)).scalars().all()
    engine.dispose()
    assert len(holds) == len(set(holds)) == 10


def test_score_ranks_without_reserving(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"), ("pcie-8x-l40s", "pcie0"))
    body = client.post("/v1/score", json={"gpus": 4, "locality": "nvlink"}).json()
    ScoreResult.model_validate(body)
    result = body["nodes"]
    by_node = {n["node"]: n for n in result}
    assert by_node["dgx0"]["fits"] and by_node["dgx0"]["rank"] == 1
    assert by_node["pcie0"]["cause"] == "no_nvlink_set_ever" and not by_node["pcie0"]["resolvable"]
    assert client.get("/v1/allocations").json()["allocations"] == []


@pytest.mark.parametrize(
    "request_body",
    [
        {"gpus": 4, "locality": "nvlink", "nodes": ["dgx0", "pcie0", "h987654321", "mig0", "x"]},
        {"gpus": 2, "policy": "spread"},
        {"mig_profile": "1g.10gb"},
    ],
)
def test_score_answer_over_http_is_the_plain_data_answer(
    client: TestClient, request_body: dict[str, object]
) -> None:
    """REST sends rows encoded once per unchanged node with only the rank written per call:
    they read exactly as the plain rows gRPC converts, while ranks move between calls."""
    add_nodes(
        client,
        ("dgx1-v100", "dgx0"),
        ("pcie-8x-l40s", "pcie0"),
        ("hgx-h100", "h987654321"),  # the number the rows are encoded around
        ("dgx-a100-mig", "mig0"),
    )
    state = client.app.state.service
    for _ in range(3):
        answer = client.post("/v1/score", json=request_body)
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/json"
        ScoreResult.model_validate(answer.json())
        plain = api.score(state, ScoreRequest.model_validate(request_body))
        assert answer.json() == orjson.loads(orjson.dumps({"nodes": plain}))
        # The best node changes between calls, so ranks move and rows are reused.
        assert client.post("/v1/place", json={"gpus": 2}).status_code in (201, 409)


def test_cluster_summary_and_health(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"), ("dgx1-v100", "d0"))
    client.post("/v1/place", json={"gpus": 3})
    summary = client.get("/v1/cluster").json()
    assert summary["nodes"]["ready"] == 2 and summary["gpus"]["total"] == 16
    assert summary["gpus"]["free"] == 13 and summary["allocations"] == {"pending": 1}
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["status"] == "ready"


def test_cpus_reserved_with_a_task_are_held_and_freed(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    add_nodes(client, ("workstation-2x-a6000", "ws0"))  # 2 GPUs, CPUs 0-63
    first = client.post("/v1/place", json={"gpus": 1, "cpus_per_task": 40})
    assert first.status_code == 201, first.text
    cpus = first.json()["tasks"][0]["cpus"]
    assert len(cpus) == 40
    # A GPU is free but not 40 CPUs: refused, and the reason says CPUs.
    second = client.post("/v1/place", json={"gpus": 1, "cpus_per_task": 40})
    assert second.status_code == 409, second.text
    # Another process on the same database learns of the held CPUs from the holds.
    with TestClient(create_app(settings, clock=clock, background=False)) as replica:
        again = replica.post("/v1/place", json={"gpus": 1, "cpus_per_task": 40})
        assert again.status_code == 409, again.text
        fits = replica.post("/v1/place", json={"gpus": 1, "cpus_per_task": 24})
        assert fits.status_code == 201, fits.text
        assert not set(fits.json()["tasks"][0]["cpus"]) & set(cpus)
        assert replica.post(f"/v1/allocations/{fits.json()['id']}/release").status_code == 200
    released = client.post(f"/v1/allocations/{first.json()['id']}/release")
    assert released.status_code == 200
    client.app.state.service.sync_nodes(["ws0"])  # what a notification or resync does
    third = client.post("/v1/place", json={"gpus": 1, "cpus_per_task": 40})
    assert third.status_code == 201, third.text


def test_a_held_uuid_reported_as_the_other_kind_degrades_and_stays_held(
    client: TestClient,
) -> None:
    """A MIG instance's UUID reported next as a GPU's (or a GPU's as a MIG instance's):
    the holding allocation lost what it held, and the device, still held under its
    UUID, is not offered as the other kind, which the store, keyed by UUID, would
    refuse at every commit: every placement that chose it failed, on any node."""
    mig, whole = add_nodes(client, ("hgx-h100-mig", "m0"), ("hgx-h100", "z9"))
    profile = mig.mig_instances[0].profile
    on_mig = client.post("/v1/place", json={"gpus": 1, "mig_profile": profile}).json()
    on_gpu = client.post("/v1/place", json={"gpus": 1, "nodes": ["z9"]}).json()
    mig_uuid, gpu_uuid = on_mig["tasks"][0]["mig_uuids"][0], on_gpu["tasks"][0]["gpu_uuids"][0]
    parent = next(m.parent_gpu for m in mig.mig_instances if m.uuid == mig_uuid)
    as_gpu = [
        g.model_copy(
            update={"mig_enabled": False, "uuid": mig_uuid if g.index == parent else g.uuid}
        )
        for g in mig.gpus
    ]
    swapped = mig.model_copy(update={"seq": 1, "gpus": as_gpu, "mig_instances": []})
    assert report(client, swapped).status_code == 200
    index = next(g.index for g in whole.gpus if g.uuid == gpu_uuid)
    as_mig = [
        g.model_copy(update={"mig_enabled": True, "uuid": "GPU-z9-new"}) if g.index == index else g
        for g in whole.gpus
    ]
    instance = mig.mig_instances[0].model_copy(update={"uuid": gpu_uuid, "parent_gpu": index})
    turned = whole.model_copy(update={"seq": 1, "gpus": as_mig, "mig_instances": [instance]})
    assert report(client, turned).status_code == 200
    for allocation in (on_mig, on_gpu):
        assert client.get(f"/v1/allocations/{allocation['id']}").json()["state"] == "degraded"
    for _ in range(3):
        placed = client.post("/v1/place", json={"gpus": 1})
        assert placed.status_code == 201, placed.text
        assert mig_uuid not in placed.json()["tasks"][0]["gpu_uuids"]
    refused = client.post("/v1/place", json={"gpus": 1, "mig_profile": profile})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "unschedulable"


def test_a_gpu_turning_mig_degrades_its_whole_and_shared_holds(client: TestClient) -> None:
    snap = add_nodes(client, ("hgx-h100", "h0"))[0]
    whole = client.post("/v1/place", json={"gpus": 1}).json()
    share = client.post("/v1/place", json={"gpu_fraction": 0.25}).json()
    bystander = client.post("/v1/place", json={"gpus": 1}).json()
    turned = {whole["tasks"][0]["gpu_uuids"][0], share["tasks"][0]["gpu_uuids"][0]}
    gpus = [g.model_copy(update={"mig_enabled": g.uuid in turned}) for g in snap.gpus]
    assert report(client, snap.model_copy(update={"seq": 1, "gpus": gpus})).status_code == 200
    for allocation in (whole, share):
        assert client.get(f"/v1/allocations/{allocation['id']}").json()["state"] == "degraded"
    assert client.get(f"/v1/allocations/{bystander['id']}").json()["state"] == "pending"


def test_host_use_is_counted_and_rebuilt_from_the_stored_requests(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    add_nodes(client, ("workstation-2x-a6000", "ws0"), ("workstation-2x-a6000", "ws1"))
    service = client.app.state.service  # type: ignore[attr-defined]
    cpu, _ = service.cluster.host_room("ws0")
    assert cpu is not None  # the profile reports its CPUs
    body = {"gpus": 1, "cpu_milli": cpu - 1000, "memory_mib": 1024}
    first = client.post("/v1/place", json=body)
    assert first.status_code == 201, first.text
    node = first.json()["tasks"][0]["node"]
    assert service.cluster.host_used(node) == (cpu - 1000, 1024)
    # The node's last GPU is free, but not its CPU: the next such task goes elsewhere.
    second = client.post("/v1/place", json=body)
    assert second.status_code == 201 and second.json()["tasks"][0]["node"] != node
    third = client.post("/v1/place", json=body)
    assert third.status_code == 409, third.text
    assert any(r["cause"] == "host" for r in third.json()["error"]["detail"]["reasons"])
    # A new process (a restart) counts the same use from the allocations' stored requests.
    with TestClient(create_app(settings, clock=clock, background=False)) as restarted:
        state = restarted.app.state.service  # type: ignore[attr-defined]
        assert state.cluster.host_used(node) == (cpu - 1000, 1024)
        assert restarted.post("/v1/place", json=body).status_code == 409
    assert client.post(f"/v1/allocations/{first.json()['id']}/release").status_code == 200
    service.sync_nodes([node])  # what a notification or resync does
    assert service.cluster.host_used(node) == (0, 0)
    assert client.post("/v1/place", json=body).json()["tasks"][0]["node"] == node


def test_a_gpu_turning_mig_off_under_a_held_instance_is_not_given_whole(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    """A GPU one of whose MIG instances is held, reported next with MIG off: not given
    whole by this process, nor by one started after the report (a restart); free again
    once the instance is released."""
    snap = add_nodes(client, ("dgx-a100-mig", "mig0"))[0]
    held = client.post("/v1/place", json={"mig_profile": "3g.40gb"})
    assert held.status_code == 201, held.text
    parent = held.json()["tasks"][0]["gpu_uuids"][0]
    gpus = [g.model_copy(update={"mig_enabled": False}) for g in snap.gpus]
    flat = snap.model_copy(update={"seq": 1, "gpus": gpus, "mig_instances": []})
    assert report(client, flat).status_code == 200
    with TestClient(create_app(settings, clock=clock, background=False)) as restarted:
        for replica in (client, restarted):
            given = replica.post("/v1/place", json={"gpus": len(gpus), "nodes": ["mig0"]})
            assert given.status_code == 409, given.text
            one = replica.post("/v1/score", json={"gpus": 1, "nodes": ["mig0"]})
            assert one.status_code == 200 and parent not in one.text, one.text
        released = restarted.post(f"/v1/allocations/{held.json()['id']}/release")
        assert released.status_code == 200, released.text
        whole = restarted.post("/v1/place", json={"gpus": len(gpus), "nodes": ["mig0"]})
        assert whole.status_code == 201, whole.text
