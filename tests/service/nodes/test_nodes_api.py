"""Nodes over real HTTP handling (TestClient) on a real database."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement.profiles import build_profile
from service import schema
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes, report


def test_report_list_get_and_topology(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"), ("hgx-h100", "h0"))
    listing = client.get("/v1/nodes").json()["nodes"]
    assert [n["name"] for n in listing] == ["dgx0", "h0"]
    node = client.get("/v1/nodes/dgx0").json()
    assert node["state"] == "ready" and node["gpu_count"] == 8
    assert node["free_gpus"] == list(range(8)) and node["islands"][0]["name"] == "nvl0"
    topo = client.get("/v1/nodes/dgx0/topology").json()
    assert topo["links"][0][3] == "NV2" and topo["bandwidth_gbps"][0][3] == 50.0
    assert topo["text"].splitlines()[0].split("\t")[1] == "GPU0"


def test_pcie_groups_are_named_as_such(client: TestClient) -> None:
    add_nodes(client, ("pcie-8x-l40s", "l0"), ("workstation-2x-a6000", "w0"))
    node = client.get("/v1/nodes/l0").json()
    assert [(i["name"], i["kind"], i["gpus"]) for i in node["islands"]] == [
        ("pcie0", "pcie", [0, 1, 2, 3]),
        ("pcie1", "pcie", [4, 5, 6, 7]),
    ]
    assert [g["island"] for g in node["gpus"]] == ["pcie0"] * 4 + ["pcie1"] * 4
    pair = client.get("/v1/nodes/w0").json()["islands"]
    assert pair == [{"name": "nvl0", "gpus": [0, 1], "free": [0, 1], "kind": "nvlink"}]


def test_mig_gpus_count_as_mig_and_a_refusal_says_how_many_whole_gpus(
    client: TestClient,
) -> None:
    add_nodes(client, ("dgx-a100-mig", "m0"))
    gpus = client.get("/v1/cluster").json()["gpus"]
    assert (gpus["total"], gpus["healthy"], gpus["unhealthy"]) == (8, 8, 0)
    assert gpus["mig_enabled"] == 4 and gpus["free"] == 4
    refused = client.post("/v1/place", json={"gpus": 8})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert "the largest has 4" in error["message"] and "MIG mode" in error["message"]
    assert "in total" not in refused.text
    scored = client.post("/v1/score", json={"gpus": 8}).json()["nodes"]
    assert [(n["node"], n["fits"]) for n in scored] == [("m0", False)]
    assert scored[0]["message"].startswith("4 whole GPUs, fewer than 8 GPUs: the others are in MIG")


def test_same_snapshot_again_is_idempotent_and_history_is_bounded(client: TestClient) -> None:
    snap = build_profile("hgx-h100", "h0")
    assert report(client, snap).json()["changed"] is True
    assert report(client, snap).json()["changed"] is False
    for seq in range(1, 30):
        assert (
            report(
                client, snap.model_copy(update={"seq": seq, "labels": {"v": str(seq)}})
            ).status_code
            == 200
        )
    history = client.get("/v1/nodes/h0/snapshots").json()
    assert len(history) == 20 and history[0]["seq"] == 29


def test_a_new_seq_with_the_same_content_is_a_heartbeat_not_a_change(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = client.app.state.service  # type: ignore[attr-defined]
    events: list[tuple[str, str]] = []
    publish = state.events.publish
    monkeypatch.setattr(
        state.events,
        "publish",
        lambda kind, type_, **kw: (events.append((kind, type_)), publish(kind, type_, **kw)),
    )
    snap = build_profile("hgx-h100", "h0", seq=1)
    assert report(client, snap).json()["changed"] is True
    later = snap.model_copy(update={"seq": 2, "timestamp": datetime(2030, 1, 1, tzinfo=UTC)})
    assert report(client, later).json() == {"node": "h0", "seq": 2, "changed": False}
    assert client.get("/v1/nodes/h0").json()["seq"] == 2  # the seq is stored all the same
    assert [row["seq"] for row in client.get("/v1/nodes/h0/snapshots").json()] == [1]
    assert events == [("node", "reported")]
    # An older seq is still refused, and a real change still is one.
    assert report(client, snap).status_code == 409
    changed = later.model_copy(update={"seq": 3, "labels": {"rack": "r2"}})
    assert report(client, changed).json()["changed"] is True
    assert [row["seq"] for row in client.get("/v1/nodes/h0/snapshots").json()] == [3, 1]
    assert events == [("node", "reported")] * 2


def test_replayed_or_mismatched_snapshots_are_refused(client: TestClient) -> None:
    snap = build_profile("hgx-h100", "h0", seq=5)
    report(client, snap)
    older = client.put(
        "/v1/nodes/h0/snapshot",
        json={"snapshot": snap.model_copy(update={"seq": 4}).model_dump(mode="json")},
    )
    assert older.status_code == 409 and older.json()["error"]["detail"]["field"] == "snapshot.seq"
    other = client.put("/v1/nodes/zz/snapshot", json={"snapshot": snap.model_dump(mode="json")})
    assert other.status_code == 400 and other.json()["error"]["code"] == "bad_request"


def test_invalid_snapshot_names_the_field_and_writes_nothing(client: TestClient) -> None:
    body = build_profile("workstation-2x-a6000", "ws").model_dump(mode="json")
    body["links"][0][1] = "NV9"
    response = client.put("/v1/nodes/ws/snapshot", json={"snapshot": body})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == "snapshot.links.0.1"
    assert client.get("/v1/nodes/ws").status_code == 404


def test_stale_nodes_get_no_placements_until_they_heartbeat(
    client: TestClient, clock: FakeClock
) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    clock.advance(61)
    assert client.get("/v1/nodes/h0").json()["state"] == "stale"
    response = client.post("/v1/place", json={"gpus": 1})
    assert response.status_code == 409
    assert response.json()["error"]["detail"]["reasons"][0]["cause"] == "unavailable"
    assert client.post("/v1/nodes/h0/heartbeat").status_code == 204
    assert client.post("/v1/place", json={"gpus": 1}).status_code == 201


def test_a_node_shown_stale_is_never_placed_on(client: TestClient, clock: FakeClock) -> None:
    add_nodes(client, ("hgx-h100", "h0"))  # TTL 60 s in these tests
    clock.advance(59.8)
    assert client.post("/v1/place", json={"gpus": 1}).status_code == 201
    clock.advance(0.4)  # a fraction of a second after the last decision
    assert client.get("/v1/nodes/h0").json()["state"] == "stale"
    assert client.post("/v1/place", json={"gpus": 1}).status_code == 409


def test_cordon_uncordon_and_remove(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    assert client.post("/v1/nodes/h0/cordon").json()["state"] == "cordoned"
    assert client.post("/v1/place", json={"gpus": 1}).status_code == 409
    assert client.post("/v1/nodes/h0/uncordon").json()["state"] == "ready"
    allocation = client.post("/v1/place", json={"gpus": 1}).json()
    assert client.delete("/v1/nodes/h0").status_code == 409  # still holds a GPU
    client.post(f"/v1/allocations/{allocation['id']}/release")
    assert client.delete("/v1/nodes/h0").status_code == 204
    assert client.get("/v1/nodes/h0").status_code == 404
    assert client.post("/v1/nodes/nope/heartbeat").status_code == 404


def test_a_reservation_committed_while_its_node_is_deleted_keeps_the_node(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holds' count and the delete are two statements: a reservation committed
    between them (another replica's) names the node's snapshot, so the delete fails
    at its commit and the node stays, with the reservation on it."""
    from service.allocations import api
    from service.allocations.schemas import PlaceRequest
    from service.nodes import repository

    add_nodes(client, ("hgx-h100", "h0"))
    state = client.app.state.service  # type: ignore[attr-defined]
    delete = repository.delete
    placed = []

    def racing_delete(conn: object, name: str) -> bool:
        placed.append(api.place(state, PlaceRequest(gpus=1), None).allocation.id)
        return delete(conn, name)  # type: ignore[arg-type]

    monkeypatch.setattr(repository, "delete", racing_delete)
    answer = client.delete("/v1/nodes/h0")
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "conflict"
    assert client.get("/v1/nodes/h0").json()["allocations"] == placed


def test_a_node_delete_refused_counts_what_allocations_hold(client: TestClient) -> None:
    """A MIG instance and a GPU share held: two devices, not the pool rows that count
    them besides (each a GPU's share or MIG pool)."""
    add_nodes(client, ("hgx-h100-mig", "m0"), ("hgx-h100", "h0"))
    mig = client.post("/v1/place", json={"gpus": 1, "mig_profile": "1g.10gb", "nodes": ["m0"]})
    share = client.post("/v1/place", json={"gpu_fraction": 0.5, "nodes": ["h0"]})
    assert mig.status_code == 201 and share.status_code == 201, (mig.text, share.text)
    for node in ("m0", "h0"):
        refused = client.delete(f"/v1/nodes/{node}")
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["detail"]["held"] == 1, refused.text


def test_a_deleted_node_leaves_no_device_report_order(client: TestClient) -> None:
    """The newest List its device reports were taken from goes with the node: a machine
    registered again under its name, its clock a little behind, is not deferred on it."""
    add_nodes(client, ("hgx-h100", "h0"), ("hgx-h100", "h1"))
    state = client.app.state.service  # type: ignore[attr-defined]
    order = schema.k8s_report_order
    at = datetime(2026, 6, 1, 12, tzinfo=UTC)
    with state.engine.begin() as conn:
        for node in ("h0", "h1"):
            conn.execute(
                sa.insert(order).values(node=node, resource="nvidia.com/gpu", listed_at=at)
            )
    assert client.delete("/v1/nodes/h0").status_code == 204
    with state.engine.connect() as conn:
        assert conn.execute(sa.select(order.c.node)).scalars().all() == ["h1"]
