"""GET /metrics over real HTTP: every documented metric present, and moving with the work."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from bench.k8s_objects import names_args, pod
from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.metrics.scrape import Samples, documented, family_name, parse, total

NO_VAL = 4294967294
DGX1, H100 = "m-dgx1", "m-h100"
# Moved where what they measure happens: another replica's notification and a deadlock
# (test_replica_metrics.py), the Kubernetes API (k8s/test_timed_api.py), squeue
# (slurm/test_reconcile_loop.py), a region's refused summary
# (federation/test_summary_refusals.py).
NOT_MOVED_HERE = {
    "topoplace_replica_notification_lag_seconds",
    "topoplace_database_retries_total",
    "topoplace_kube_api_request_duration_seconds",
    "topoplace_squeue_duration_seconds",
    "topoplace_summary_refusals_total",
    "topoplace_clock_offset_seconds",  # 0 with one clock (tests/service/test_database_time.py)
}


@pytest.fixture
def service(settings: Settings, clock: FakeClock) -> Iterator[httpx.Client]:
    app = create_app(secured(settings), clock=clock, background=False)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with live_server(app) as url, httpx.Client(base_url=url, headers=headers) as client:
        yield client


def _scrape(client: httpx.Client) -> tuple[dict[str, str], Samples]:
    answer = client.get("/metrics", headers={"Authorization": ""})  # open: no token needed
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    return parse(answer.text)


def _report(client: httpx.Client, profile: str, name: str) -> httpx.Response:
    body = {"snapshot": build_profile(profile, name).model_dump(mode="json")}
    return client.put(f"/v1/nodes/{name}/snapshot", json=body)


ERRORS = ("crc_flit_errors", "crc_data_errors", "replay_errors", "recovery_errors")


def _links(gpu: int, tx: int, errors: int = 0) -> list[dict[str, int]]:
    counts = dict.fromkeys(ERRORS, errors)
    return [
        {"gpu": gpu, "link": link, "tx_bytes": tx, "rx_bytes": tx // 2, **counts}
        for link in range(6)
    ]


def _work(client: httpx.Client, clock: FakeClock) -> None:
    """A place, a refusal of each kind, a release, the schedulers' calls, node reports."""
    assert _report(client, "dgx1-v100", DGX1).status_code == 200
    assert _report(client, "dgx1-v100", DGX1).status_code == 200  # unchanged
    stray = build_profile("dgx1-v100", "m-other").model_dump(mode="json")
    assert client.put(f"/v1/nodes/{DGX1}/snapshot", json={"snapshot": stray}).status_code == 400
    heartbeat = client.post(f"/v1/nodes/{DGX1}/heartbeat", json={"nvlink": _links(0, 4096)})
    assert heartbeat.status_code == 204
    placed = client.post("/v1/place", json={"gpus": 4, "locality": "nvlink", "job_id": "j1"})
    assert placed.status_code == 201, placed.text
    assert client.post("/v1/place", json={"gpus": 8}).status_code == 409  # 4 left
    assert client.post("/v1/place", json={"gpus": 9}).status_code == 422  # never
    assert client.get("/v1/nodes/nope").status_code == 404
    assert client.get("/nothing/here").status_code == 404
    filtered = client.post("/k8s/v1/filter", json=names_args(pod("p", 1), [DGX1]))
    assert filtered.status_code == 200, filtered.text
    body = {"min_nodes": NO_VAL, "max_nodes": NO_VAL, "num_tasks": NO_VAL, "user_name": "u"}
    submitted = client.post("/v1/slurm/job-submit", json={**body, "tres_per_node": "gres/gpu:1"})
    assert submitted.status_code == 200, submitted.text
    clock.advance(15)  # past the NVLink readings' minimum interval
    heartbeat = client.post(f"/v1/nodes/{DGX1}/heartbeat", json={"nvlink": _links(0, 9000, 2)})
    assert heartbeat.status_code == 204
    assert _report(client, "hgx-h100", H100).status_code == 200
    clock.advance(50)  # the H100 node heartbeats again; the DGX-1 does not
    assert client.post(f"/v1/nodes/{H100}/heartbeat").status_code == 204
    clock.advance(20)  # 85 s without a heartbeat: the DGX-1 is stale (TTL 60 s)
    assert client.post("/v1/jobs/j1/release").status_code == 200


def test_every_documented_metric_is_exported_and_moves(
    service: httpx.Client, clock: FakeClock
) -> None:
    _, before = _scrape(service)
    _work(service, clock)
    types, after = _scrape(service)
    for name, kind in documented().items():
        assert types.get(family_name(name, kind)) == kind, f"{name}: not exported as a {kind}"
        if name in NOT_MOVED_HERE:
            continue
        moved = {key for key, value in after.items() if key[0].startswith(family_name(name, kind))}
        changed = [key for key in moved if before.get(key) != after[key]]
        assert changed, f"{name} did not move"


def test_what_moved_is_what_happened(service: httpx.Client, clock: FakeClock) -> None:
    _work(service, clock)
    _, s = _scrape(service)
    place = {"route": "/v1/place", "method": "POST"}
    requests = "topoplace_http_request_duration_seconds_count"
    assert total(s, requests, **place, status="2xx", code="none") == 1
    assert total(s, requests, **place, status="4xx", code="unschedulable") == 1
    assert total(s, requests, **place, status="4xx", code="unresolvable") == 1
    assert total(s, requests, route="/v1/nodes/{name}", code="not_found") == 1
    assert total(s, requests, route="unmatched", code="not_found") == 1
    assert total(s, requests, route="/v1/slurm/job-submit") == 1  # a route served directly
    assert total(s, "topoplace_extender_request_duration_seconds_count", verb="filter") == 1
    assert total(s, "topoplace_slurm_request_duration_seconds_count", call="job-submit") == 1
    assert total(s, "topoplace_unschedulable_total") >= 1
    assert total(s, "topoplace_unresolvable_total", cause="too_few_gpus") == 1
    assert total(s, "topoplace_events_total", kind="allocation", type="placed") == 2
    assert total(s, "topoplace_events_total", kind="allocation", type="released") == 1
    assert total(s, "topoplace_snapshots_ingested_total", changed="true") == 2
    assert total(s, "topoplace_snapshots_ingested_total", changed="false") == 1
    assert total(s, "topoplace_snapshot_refusals_total", reason="bad_request") == 1
    assert total(s, "topoplace_group_commit_batch_size_sum") == 2
    assert total(s, "topoplace_allocations", state="active") == 1  # the Slurm job's
    assert total(s, "topoplace_allocations", state="pending") == 0  # j1 released
    v100 = {"design": "8xTesla V100-SXM2-32GB", "region": "default"}
    h100 = {"design": "8xNVIDIA H100 80GB HBM3", "region": "default"}
    assert total(s, "topoplace_nodes", **v100, condition="stale") == 1
    assert total(s, "topoplace_nodes", **h100, condition="ready") == 1
    assert total(s, "topoplace_gpus", **v100, state="held") == 1  # the Slurm job's GPU
    assert total(s, "topoplace_gpus", **v100, state="unavailable") == 7  # stale
    assert total(s, "topoplace_gpus", **h100, state="free") == 8
    assert total(s, "topoplace_largest_free_nvlink_island_gpus", **h100) == 8
    assert total(s, "topoplace_largest_free_nvlink_island_gpus", **v100) == 0
    link = {"node": DGX1, "gpu": "0", "link": "3"}
    assert total(s, "topoplace_nvlink_tx_bytes_total", **link) == 9000
    assert total(s, "topoplace_nvlink_rx_bytes_total", **link) == 4500
    assert total(s, "topoplace_nvlink_telemetry_reports_total", outcome="stored") == 2


def test_an_unknown_method_does_not_add_series(service: httpx.Client) -> None:
    for method in ("BREW", "WHEN", "PROPFIND"):
        service.request(method, "/v1/place")
    _, s = _scrape(service)
    methods = {dict(lb)["method"] for (n, lb) in s if n.startswith("topoplace_http_request")}
    assert "other" in methods and not methods & {"BREW", "WHEN", "PROPFIND"}
