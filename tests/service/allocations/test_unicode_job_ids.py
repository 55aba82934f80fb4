"""Job ids in any script: placed, listed and released by the id as written."""

from __future__ import annotations

from urllib.parse import quote

from fastapi.testclient import TestClient

from tests.service.helpers import add_nodes


def test_unicode_job_ids_round_trip(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    ids = ["\u00e9t\u00e9", "\u2603/\U0001f600", "a b+c", "\U0001f600" * 256, "caf\u0065\u0301"]
    for job in ids:
        placed = client.post("/v1/place", json={"gpus": 1, "job_id": job})
        assert placed.status_code == 201, (job, placed.text)
        listed = client.get("/v1/allocations", params={"job_id": job}).json()["allocations"]
        assert [a["id"] for a in listed] == [placed.json()["id"]], job
        released = client.post(f"/v1/jobs/{quote(job, safe='')}/release")
        assert released.json()["released"] == [placed.json()["id"]], (job, released.text)
    assert len(client.get("/v1/nodes/h0").json()["free_gpus"]) == 8
