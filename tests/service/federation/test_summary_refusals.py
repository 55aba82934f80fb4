"""Refused summary pushes: each answered, counted and logged; their audit rows bounded."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agent.signing import NodeKey
from service.audit.refusals import RefusalGate
from service.schema import audit_log
from tests.service.audit.test_refusals import Ticks
from tests.service.federation.test_regions_api import bearer, register, signed, summary
from tests.service.metrics.scrape import parse, total

URL = "/v1/regions/{}/summary"


def _rows(client: TestClient) -> list[dict[str, Any]]:
    """The summary refusals' audit rows, oldest first."""
    engine: sa.Engine = client.app.state.service.engine  # type: ignore[attr-defined]
    query = (
        sa.select(audit_log.c.action, audit_log.c.detail)
        .where(audit_log.c.kind == "summary")
        .order_by(audit_log.c.id)
    )
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def _ticking_gate(client: TestClient) -> Ticks:
    ticks = Ticks()
    refusals = client.app.state.summary_refusals  # type: ignore[attr-defined]
    refusals.gate = RefusalGate(60.0, 600, clock=ticks)
    return ticks


def test_a_burst_of_refused_pushes_writes_one_row_per_region_and_cause_a_window(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    token = register(client)
    ticks = _ticking_gate(client)
    forged = signed(summary(), NodeKey.generate())
    with caplog.at_level(logging.WARNING, logger="topoplace.federation"):
        for _ in range(1000):
            answer = client.put(URL.format("aws-east"), json=forged, headers=bearer(token))
            assert answer.status_code == 403, answer.text
            assert answer.json()["error"]["code"] == "bad_signature"
    rows = _rows(client)
    assert [r["action"] for r in rows] == ["bad_signature"]
    logged = [r for r in caplog.records if "refused" in r.getMessage()]
    assert 1 <= len(logged) <= len(rows)  # visible, not a line per push
    # Another cause, and another region, have rows of their own.
    taken = signed(summary())
    assert client.put(URL.format("aws-east"), json=taken, headers=bearer(token)).status_code == 200
    for _ in range(5):
        replayed = client.put(URL.format("aws-east"), json=taken, headers=bearer(token))
        assert replayed.json()["error"]["code"] == "replayed_summary"
    other = register(client, "gcp-central")
    forged_there = signed(summary("gcp-central"), NodeKey.generate())
    for _ in range(5):
        client.put(URL.format("gcp-central"), json=forged_there, headers=bearer(other))
    rows = _rows(client)
    assert [(r["action"], _detail(r)["region"]) for r in rows] == [
        ("bad_signature", "aws-east"),
        ("replayed_summary", "aws-east"),
        ("bad_signature", "gcp-central"),
    ]
    # A window later the next refusal writes a row carrying the ones folded into none.
    ticks.now += 60
    client.put(URL.format("aws-east"), json=forged, headers=bearer(token))
    newest = _detail(_rows(client)[-1])
    assert (newest["code"], newest["region"], newest["coalesced"]) == (
        "bad_signature",
        "aws-east",
        999,
    )
    assert _detail(_rows(client)[0])["coalesced"] == 0
    _, samples = parse(client.get("/metrics").text)
    name = "topoplace_summary_refusals_total"
    assert total(samples, name, reason="bad_signature") == 1006
    assert total(samples, name, reason="replayed_summary") == 5


def test_the_rows_of_every_region_and_cause_together_are_capped(client: TestClient) -> None:
    refusals = client.app.state.summary_refusals  # type: ignore[attr-defined]
    refusals.gate = RefusalGate(60.0, 3, clock=Ticks())
    for n in range(6):  # an admin pushing for regions that do not exist: 404 each
        answer = client.put(URL.format(f"nowhere-{n}"), json=signed(summary(f"nowhere-{n}")))
        assert answer.status_code == 404
    assert len(_rows(client)) == 3


def _detail(row: dict[str, Any]) -> dict[str, Any]:
    detail: dict[str, Any] = json.loads(row["detail"])
    return detail
