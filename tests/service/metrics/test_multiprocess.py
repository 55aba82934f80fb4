"""Several worker processes behind one port: /metrics adds up every worker's counts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.service.metrics.scrape import parse, total

WORKER = """
from service.metrics.registry import Metrics
metrics = Metrics()
metrics.published("allocation", "placed", {placed})
metrics.requests.labels("/v1/place", "POST", "2xx", "none").observe(0.002)
"""
SCRAPER = """
import sys
from fastapi.testclient import TestClient
from service.app import create_app
from service.settings import Settings
settings = Settings(database_url="sqlite:///{db}", insecure_dev=True)
with TestClient(create_app(settings, background=False)) as client:
    sys.stdout.write(client.get("/metrics").text)
"""


def _python(code: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_counts_of_every_worker_are_added_up(tmp_path: Path) -> None:
    shared = tmp_path / "prometheus"
    shared.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(shared)}
    _python(WORKER.format(placed=2), env)
    _python(WORKER.format(placed=3), env)
    types, samples = parse(_python(SCRAPER.format(db=tmp_path / "db.sqlite3"), env))
    assert total(samples, "topoplace_events_total", kind="allocation", type="placed") == 5
    place = {"route": "/v1/place", "method": "POST", "status": "2xx", "code": "none"}
    assert total(samples, "topoplace_http_request_duration_seconds_count", **place) == 2
    # The state's gauges come from the worker that answers.
    assert types["topoplace_allocations"] == "gauge" and types["topoplace_nodes"] == "gauge"
    assert total(samples, "topoplace_allocations", state="pending") == 0
