"""POST /v1/jobs/{job_id}/release takes every job id /place stores, "/" included."""

from __future__ import annotations

from urllib.parse import quote

from fastapi.testclient import TestClient

from tests.service.helpers import add_nodes

# The job id the Kubernetes gang reservations carry (service/k8s/pod_request.py).
GANG_JOB = "k8s-gang:team-a/trainer"


def test_a_job_id_with_a_slash_is_released_by_its_job(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    placed = client.post("/v1/place", json={"gpus": 2, "job_id": GANG_JOB})
    assert placed.status_code == 201, placed.text
    scheduler = client.post("/v1/tokens", json={"role": "scheduler", "name": "epilog"}).json()[
        "token"
    ]

    # Was 404 "no such route" (and admin-only by the access table), though gRPC
    # ReleaseJob released it: "/" ended the path parameter.
    for path in (f"/v1/jobs/{quote(GANG_JOB, safe='')}/release", f"/v1/jobs/{GANG_JOB}/release"):
        released = client.post(path, headers={"Authorization": f"Bearer {scheduler}"})
        assert released.status_code == 200, released.text
        expected = [placed.json()["id"]] if path.endswith("%2Ftrainer/release") else []
        assert released.json() == {"released": expected}
    listed = client.get("/v1/allocations", params={"job_id": GANG_JOB}).json()["allocations"]
    assert [a["state"] for a in listed] == ["released"]


def test_the_route_keeps_its_template_in_the_metrics(client: TestClient) -> None:
    assert client.post("/v1/jobs/j1/release").status_code == 200
    metrics = client.get("/metrics").text
    assert 'route="/v1/jobs/{job_id}/release"' in metrics
    assert "{job_id:path}" not in metrics
