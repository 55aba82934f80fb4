"""Refused placement decisions in the audit log: what they record, and bounded in a storm."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import schema
from service.audit.refusals import RefusalGate
from service.state import ServiceState
from tests.service.audit.test_audit_api import _as, _audit, _state, _token
from tests.service.audit.test_refusals import Ticks
from tests.service.helpers import add_nodes


def _rows(state: ServiceState) -> int:
    with state.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(schema.audit_log)).scalar())


def test_a_refused_place_records_the_request_code_reasons_and_who_asked(
    client: TestClient,
) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    token_id, secret = _token(client, "scheduler", "slurmctld")
    before = _rows(_state(client))
    refused = client.post("/v1/place", json={"gpus": 64, "job_id": "big"}, headers=_as(secret))
    assert refused.status_code == 422, refused.text
    [entry] = _audit(client, kind="allocation", action="refused")
    assert entry["actor"] == {"token_id": token_id, "name": "slurmctld", "role": "scheduler"}
    assert (entry["route"], entry["job_id"], entry["allocation_id"]) == (
        "POST /v1/place",
        "big",
        None,
    )
    detail = entry["detail"]
    answer = refused.json()["error"]
    assert (detail["code"], detail["message"]) == ("unresolvable", answer["message"])
    assert detail["reasons"] == answer["detail"]["reasons"] and detail["reasons"]
    assert detail["request"]["gpus"] == 64 and detail["coalesced"] == 0
    assert _rows(_state(client)) == before + 1  # the refusal's row and nothing else


def test_nothing_fits_now_is_a_refused_unschedulable(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    assert client.post("/v1/place", json={"gpus": 8, "job_id": "all"}).status_code == 201
    busy = client.post("/v1/place", json={"gpus": 1, "job_id": "one"})
    assert busy.status_code == 409, busy.text
    [entry] = _audit(client, action="refused")
    assert entry["detail"]["code"] == "unschedulable"
    assert {r["cause"] for r in entry["detail"]["reasons"]} == {
        r["cause"] for r in busy.json()["error"]["detail"]["reasons"]
    }


def test_a_storm_of_one_impossible_request_writes_one_row_a_window(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    state = _state(client)
    ticks = Ticks()
    state.refusal_gate = RefusalGate(60.0, 600, clock=ticks)
    _, secret = _token(client, "scheduler", "hammer")
    for n in range(30):  # new job ids: still one shape
        answer = client.post("/v1/place", json={"gpus": 64, "job_id": f"j{n}"}, headers=_as(secret))
        assert answer.status_code == 422
    assert len(_audit(client, action="refused")) == 1
    other = client.post("/v1/place", json={"gpus": 48, "job_id": "x"}, headers=_as(secret))
    assert other.status_code == 422
    assert len(_audit(client, action="refused")) == 2  # another shape has its own row
    ticks.now += 60.0
    client.post("/v1/place", json={"gpus": 64, "job_id": "late"}, headers=_as(secret))
    newest = _audit(client, action="refused")[0]
    assert (newest["job_id"], newest["detail"]["coalesced"]) == ("late", 29)


def test_the_storm_cap_bounds_every_shape_together(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    _state(client).refusal_gate = RefusalGate(60.0, 5, clock=Ticks())
    for gpus in range(9, 29):
        assert client.post("/v1/place", json={"gpus": gpus}).status_code == 422
    assert len(_audit(client, action="refused")) == 5


def test_an_idempotent_replay_writes_no_second_decision(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    headers = {"Idempotency-Key": "k-1"}
    body: dict[str, Any] = {"gpus": 2, "job_id": "j"}
    first = client.post("/v1/place", json=body, headers=headers)
    again = client.post("/v1/place", json=body, headers=headers)
    assert first.json()["id"] == again.json()["id"]
    assert len(_audit(client, kind="allocation")) == 1  # the first decision's only
