"""The request middleware: templates not paths, outcomes from the one error shape, faults."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.responses import PlainTextResponse

from service.app import create_app
from service.edge.faults import FaultBarrier
from service.metrics.http import RequestMetrics, error_code
from service.metrics.registry import Metrics
from service.settings import Settings
from tests.service.metrics.scrape import parse, total
from tests.waiting import wait_until

COUNT = "topoplace_http_request_duration_seconds_count"


def _settings(tmp_path: Path, **more: object) -> Settings:
    return Settings(database_url=f"sqlite:///{tmp_path / 'db.sqlite3'}", insecure_dev=True, **more)


def test_a_fault_counts_as_the_500_the_client_got() -> None:
    app = FastAPI()

    @app.get("/boom/{part}")
    def boom(part: str) -> None:
        raise RuntimeError("a bug")

    @app.get("/text")
    def text() -> PlainTextResponse:
        return PlainTextResponse("not json", status_code=418)

    metrics = Metrics()
    app.add_middleware(FaultBarrier)
    app.add_middleware(RequestMetrics, metrics=metrics)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/boom/a").status_code == 500
        assert client.get("/boom/b").status_code == 500
        assert client.get("/text").status_code == 418
    labels = {"route": "/boom/{part}", "method": "GET", "status": "5xx", "code": "internal_error"}
    assert metrics.registry.get_sample_value(COUNT, labels) == 2
    teapot = {"route": "/text", "method": "GET", "status": "4xx", "code": "unknown"}
    assert metrics.registry.get_sample_value(COUNT, teapot) == 1


def test_routes_behind_a_path_prefix_keep_their_template(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path), background=False)
    with TestClient(app, root_path="/topoplace") as client:
        assert client.get("/topoplace/v1/nodes/some-node").status_code == 404
        assert client.get("/topoplace/v1/cluster").status_code == 200
        _, samples = parse(client.get("/topoplace/metrics").text)
    assert total(samples, COUNT, route="/v1/nodes/{name}", code="not_found") == 1
    assert total(samples, COUNT, route="/v1/cluster", status="2xx") == 1
    assert not [
        lb for (n, lb) in samples if n == COUNT and ("route", "/topoplace/v1/cluster") in lb
    ]


def test_a_throttled_caller_is_counted_as_rate_limited(tmp_path: Path) -> None:
    """Throttled before routing: its route is not known, and counts as ``unmatched``."""
    app = create_app(_settings(tmp_path, rate_limit_per_s=1, rate_limit_burst=2), background=False)
    with TestClient(app) as client:
        answers = [client.get("/v1/cluster").status_code for _ in range(5)]
        assert 429 in answers

        def scraped() -> str | None:
            answer = client.get("/metrics")  # throttled too, until a token is back
            return answer.text if answer.status_code == 200 else None

        _, samples = parse(wait_until(scraped, "the scrape to get a token"))
    assert total(samples, COUNT, route="unmatched", code="rate_limited") >= answers.count(429)
    assert total(samples, COUNT, route="/v1/cluster", code="none") == answers.count(200)


def test_error_codes_are_read_only_from_the_error_shape() -> None:
    assert error_code(b'{"error": {"code": "unschedulable", "message": "m"}}') == "unschedulable"
    assert error_code(b'{"detail": "Not Found"}') == "unknown"
    assert error_code(b"<html>") == "unknown"
    assert error_code(b'{"error": {"code": ' + b'"' + b"x" * 100 + b'"}}') == "unknown"
    assert error_code(b'{"error": ["code"]}') == "unknown"
