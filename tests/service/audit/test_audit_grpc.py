"""gRPC calls are audited as REST ones are: the token that called, and the method as the route."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from agent.signing import NodeKey
from placement.profiles import build_profile
from service.grpc.gen import topoplace_pb2 as pb
from service.settings import Settings
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.grpc.conftest import Running, snapshot_request, start


@pytest.fixture
def running(settings: Settings, clock: FakeClock) -> Iterator[Running]:
    yield from start(secured(settings), clock)


def _audit(running: Running, **params: Any) -> list[dict[str, Any]]:
    answer = running.rest.get("/v1/audit", params=params, headers=_admin())
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["entries"]
    return entries


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_grpc_place_confirm_release_name_the_token_and_method(running: Running) -> None:
    admin = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
    running.stub.ReportSnapshot(snapshot_request("dgx1-v100", "dgx0"), metadata=admin)
    made = running.rest.post(
        "/v1/tokens", json={"role": "scheduler", "name": "grpc-client"}, headers=_admin()
    ).json()
    scheduler = (("authorization", f"Bearer {made['token']}"),)
    placed = running.stub.Place(pb.PlaceRequest(gpus=2, job_id="g1"), metadata=scheduler)
    running.stub.ConfirmAllocation(pb.ConfirmAllocationRequest(id=placed.id), metadata=scheduler)
    running.stub.ReleaseJob(pb.ReleaseJobRequest(job_id="g1"), metadata=scheduler)
    entries = _audit(running, allocation_id=placed.id)[::-1]
    assert [(e["action"], e["route"]) for e in entries] == [
        ("placed", "gRPC Place"),
        ("confirmed", "gRPC ConfirmAllocation"),
        ("released", "gRPC ReleaseJob"),
    ]
    want = {"token_id": made["id"], "name": "grpc-client", "role": "scheduler"}
    assert all(e["actor"] == want for e in entries)
    assert entries[0]["detail"]["request"]["gpus"] == 2


def test_a_refused_grpc_snapshot_is_recorded(running: Running) -> None:
    key = NodeKey.generate()
    registered = running.rest.put(
        "/v1/nodes/h0/key", json={"public_key": key.public_key}, headers=_admin()
    )
    assert registered.status_code == 200
    snap = build_profile("hgx-h100", "h0").model_copy(update={"seq": 3})
    request = pb.ReportSnapshotRequest(node="h0", snapshot_json=snap.model_dump_json())
    admin = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
    with pytest.raises(grpc.RpcError):
        running.stub.ReportSnapshot(request, metadata=admin)  # unsigned
    [entry] = _audit(running, kind="snapshot")
    assert (entry["action"], entry["route"], entry["nodes"]) == (
        "bad_signature",
        "gRPC ReportSnapshot",
        ["h0"],
    )
    assert entry["actor"]["role"] == "admin"
