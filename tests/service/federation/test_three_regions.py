"""Three regions on loopback, each its own `topoplace serve` and database, and a global one.

One federation for the module (four processes take seconds to start); the
tests run in order and each leaves the regions as it found them: every
allocation it makes is released, every node it cordons uncordoned.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agent.signing import NodeKey
from tests.service.federation.fake_regions import free_h100_node
from tests.service.federation.loopback import (
    STALE_S,
    Federation,
    Region,
    federation,
    summary_body,
)
from tests.service.replica_processes import wait_ready
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("federation")) as running:
        wait_until(lambda: all(_fresh(running, name) for name in running.regions), "summaries")
        # A region's first push may come before all its nodes have reported.
        _all_free(running)
        yield running


def _region(fed: Federation, name: str) -> dict[str, Any]:
    answer = fed.get(f"/v1/regions/{name}")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _fresh(fed: Federation, name: str) -> bool:
    summary = _region(fed, name)["summary"]
    return summary is not None and not summary["stale"]


def _free(fed: Federation, name: str) -> int:
    summary = _region(fed, name)["summary"]
    return -1 if summary is None else int(summary["free_gpus"])


def _all_free(fed: Federation) -> None:
    """Wait for every region's releases to reach the global service (16 GPUs each)."""
    names = ("aws-east", "gcp-central", "onprem-dgx")
    wait_until(lambda: all(_free(fed, n) == 16 for n in names), "every region wholly free")


def _release(region: Region, allocation_id: str) -> None:
    answer = httpx.post(
        f"{region.url}/v1/allocations/{allocation_id}/release",
        headers=region.headers,
        trust_env=False,
    )
    assert answer.status_code == 200, answer.text


def _place(fed: Federation, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return fed.post("/v1/federation/place", body, headers=headers)


H100_FLOOR: dict[str, Any] = {"gpus": 4, "federation": {"floor": {"gbps": 400}}}


def test_regions_are_listed_with_their_summaries(fed: Federation) -> None:
    listed = fed.get("/v1/regions").json()["regions"]
    assert [r["name"] for r in listed] == ["aws-east", "gcp-central", "onprem-dgx"]
    assert _free(fed, "aws-east") == 16
    assert _free(fed, "gcp-central") == 16
    shown = _region(fed, "gcp-central")
    assert shown["prices"][0] == {"gpu_model": "H100", "on_demand": 3.0, "spot": None}
    assert "forward_token" not in shown and "token" not in shown
    # A bad registration changes nothing; a summary not signed by the region is refused.
    bad = fed.post("/v1/regions", {"name": "azure-west", "cloud": "azure", "url": "nowhere"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
    assert len(fed.get("/v1/regions").json()["regions"]) == 3
    aws = fed.regions["aws-east"]
    forged = fed.push("aws-east", summary_body("aws-east", []), NodeKey.generate(), aws.token)
    assert forged.status_code == 403 and forged.json()["error"]["code"] == "bad_signature"
    assert _free(fed, "aws-east") == 16


def test_the_cheapest_region_meeting_the_floor_gets_the_job(fed: Federation) -> None:
    # Without a floor the on-prem A100s are cheapest (1.0 per GPU-hour)...
    cheapest = _place(fed, {"gpus": 4})
    assert cheapest.status_code == 201, cheapest.text
    assert cheapest.json()["region"] == "onprem-dgx"
    _release(fed.regions["onprem-dgx"], cheapest.json()["allocation"]["id"])
    # ...with 400 GB/s asked, only H100s qualify, and GCP's are cheaper than AWS's.
    placed = _place(fed, H100_FLOOR)
    assert placed.status_code == 201, placed.text
    body = placed.json()
    assert body["region"] == "gcp-central"
    assert body["node"] == "a3-1" and len(body["gpus"]) == 4
    assert body["cost"]["compute"] == pytest.approx(12.0) and body["cost"]["egress"] == 0
    assert body["predicted_gbps"] >= 400
    others = {a["region"]: a for a in body["alternatives"]}
    assert others["aws-east"]["fits"] and others["aws-east"]["cost"]["total"] == 16.0
    assert not others["onprem-dgx"]["fits"] and "floor" in others["onprem-dgx"]["reason"]
    # The allocation lives in the region's own service, not in the global one.
    gcp = fed.regions["gcp-central"]
    held = httpx.get(
        f"{gcp.url}/v1/allocations/{body['allocation']['id']}",
        headers=gcp.headers,
        trust_env=False,
    )
    assert held.status_code == 200 and held.json()["state"] == "pending"
    wait_until(lambda: _free(fed, "gcp-central") == 12, "the region pushes its change")
    _release(gcp, body["allocation"]["id"])
    wait_until(lambda: _free(fed, "gcp-central") == 16, "the release pushed")


def test_a_large_dataset_keeps_the_job_near_its_data(fed: Federation) -> None:
    _all_free(fed)
    near = {**H100_FLOOR, "federation": {**H100_FLOOR["federation"]}}
    near["federation"]["data"] = {"region": "aws-east", "size_gb": 2000}
    placed = _place(fed, near)
    assert placed.status_code == 201, placed.text
    body = placed.json()
    # GCP: 12 compute + 2000 GB x 0.09 out of AWS = 192; AWS: 16 and no egress.
    assert body["region"] == "aws-east"
    assert body["cost"] == pytest.approx(
        {
            "price_per_gpu_hour": 4.0,
            "spot": False,
            "gpu_hours": 4.0,
            "compute": 16.0,
            "egress": 0.0,
            "total": 16.0,
            "per_hour": 16.0,
        }
    )
    gcp = next(a for a in body["alternatives"] if a["region"] == "gcp-central")
    assert gcp["cost"]["egress"] == pytest.approx(180.0)
    _release(fed.regions["aws-east"], body["allocation"]["id"])
    # A small one moves to the cheaper region: 12 + 10 x 0.09 < 16.
    near["federation"]["data"]["size_gb"] = 10
    small = _place(fed, near).json()
    assert small["region"] == "gcp-central"
    assert small["cost"]["egress"] == pytest.approx(0.9)
    _release(fed.regions["gcp-central"], small["allocation"]["id"])


def test_score_explains_without_reserving(fed: Federation) -> None:
    _all_free(fed)
    body = {"gpus": 4, "federation": {"floor": {"gbps": 400}, "spot": True}}
    answer = fed.post("/v1/federation/score", body)
    assert answer.status_code == 200, answer.text
    candidates = answer.json()["candidates"]
    assert [c["region"] for c in candidates][:2] == ["aws-east", "gcp-central"]  # spot 1.5
    assert candidates[0]["cost"]["spot"] is True
    assert candidates[0]["cost"]["price_per_gpu_hour"] == 1.5
    assert _free(fed, "aws-east") == 16


def test_a_refusal_fails_over_to_the_next_region(fed: Federation) -> None:
    _all_free(fed)
    gcp = fed.regions["gcp-central"]
    cordon = httpx.post(f"{gcp.url}/v1/nodes/a3-1/cordon", headers=gcp.headers, trust_env=False)
    assert cordon.status_code == 200, cordon.text
    wait_until(lambda: _free(fed, "gcp-central") == 8, "the cordon pushed")
    # A summary that says the H100s are free (signed by the region's key, a few seconds
    # ahead of the region's own): the global service believes it, the region refuses.
    old = summary_body(
        "gcp-central",
        [free_h100_node("NVIDIA H100 80GB HBM3 x8 nvl[8]")],
        ahead_ns=3_000_000_000,
    )
    assert fed.push("gcp-central", old, gcp.key, gcp.token).status_code == 200
    placed = _place(fed, H100_FLOOR)
    assert placed.status_code == 201, placed.text
    body = placed.json()
    assert body["region"] == "aws-east"
    first, second = body["attempts"]
    assert first["region"] == "gcp-central" and first["outcome"] == "refused"
    assert first["status"] == 409 and "unschedulable" in first["detail"]
    assert second == {**second, "region": "aws-east", "outcome": "placed"}
    _release(fed.regions["aws-east"], body["allocation"]["id"])
    uncordon = httpx.post(f"{gcp.url}/v1/nodes/a3-1/uncordon", headers=gcp.headers, trust_env=False)
    assert uncordon.status_code == 200
    wait_until(lambda: _free(fed, "gcp-central") == 16, "the region's own summary again")


def test_the_same_key_forwarded_twice_is_one_allocation(fed: Federation) -> None:
    _all_free(fed)
    first = _place(fed, H100_FLOOR, key="job-42")
    assert first.status_code == 201, first.text
    region = first.json()["region"]
    # The region fills up meanwhile, so the ranking would now send a new job elsewhere.
    wait_until(lambda: _free(fed, region) == 12, "the placement pushed")
    again = _place(fed, H100_FLOOR, key="job-42")
    assert again.status_code == 200, again.text
    assert again.json()["region"] == region
    assert again.json()["allocation"]["id"] == first.json()["allocation"]["id"]
    assert again.json()["replayed"] is True
    owner = fed.regions[region]
    live = httpx.get(f"{owner.url}/v1/allocations", headers=owner.headers, trust_env=False).json()[
        "allocations"
    ]
    assert [a["id"] for a in live if a["state"] == "pending"] == [first.json()["allocation"]["id"]]
    _release(owner, first.json()["allocation"]["id"])


def test_a_key_past_ascii_reaches_the_region_as_sent(fed: Federation) -> None:
    """The region reads the forwarded key as the global service read the caller's: its
    retry is replayed there (test_key_bytes.py)."""
    _all_free(fed)
    headers = {"Idempotency-Key": b"job-\xe9t\xe9"}
    first = fed.post("/v1/federation/place", H100_FLOOR, headers=headers)
    assert first.status_code == 201, first.text
    again = fed.post("/v1/federation/place", H100_FLOOR, headers=headers)
    assert again.status_code == 200, again.text
    assert again.json()["replayed"] is True
    assert again.json()["allocation"]["id"] == first.json()["allocation"]["id"]
    _release(fed.regions[first.json()["region"]], first.json()["allocation"]["id"])


def test_a_stopped_region_is_skipped_then_stale_then_back(fed: Federation) -> None:
    _all_free(fed)
    aws = fed.regions["aws-east"]
    near = {
        "gpus": 4,
        "federation": {"floor": {"gbps": 400}, "data": {"region": "aws-east", "size_gb": 2000}},
    }
    kept = _place(fed, near)
    assert kept.json()["region"] == "aws-east"
    aws.stop()
    # Unreachable before its summary is stale: tried, skipped within the deadline.
    moved = _place(fed, near)
    assert moved.status_code == 201, moved.text
    assert moved.json()["region"] == "gcp-central"
    assert moved.json()["attempts"][0]["outcome"] == "unreachable"
    _release(fed.regions["gcp-central"], moved.json()["allocation"]["id"])
    # Then stale: shown, not deleted, and no longer tried.
    wait_until(
        lambda: _region(fed, "aws-east")["summary"]["stale"],
        "aws goes stale",
        timeout_s=STALE_S * 10,
    )
    scored = fed.post("/v1/federation/score", near).json()["candidates"]
    aws_row = next(c for c in scored if c["region"] == "aws-east")
    assert aws_row["stale"] and not aws_row["fits"] and "stale" in aws_row["reason"]
    skipped = _place(fed, near).json()
    assert [a["region"] for a in skipped["attempts"]] == ["gcp-central"]
    _release(fed.regions["gcp-central"], skipped["allocation"]["id"])
    # Back on its next push, its allocation still there.
    aws.start()
    assert aws.proc is not None
    wait_ready(aws.url, aws.proc, 90)
    wait_until(lambda: _fresh(fed, "aws-east"), "aws pushes again")
    assert _region(fed, "aws-east")["summary"]["live_allocations"] == 1
    back = _place(fed, near).json()
    assert back["region"] == "aws-east"
    _release(aws, back["allocation"]["id"])
    _release(aws, kept.json()["allocation"]["id"])


def test_a_gang_never_spans_regions(fed: Federation) -> None:
    _all_free(fed)
    # Three 8-GPU tasks: five free 8-GPU boxes in all, but no region has three.
    spread = _place(fed, {"gpus": 8, "tasks": 3})
    assert spread.status_code == 409, spread.text
    assert spread.json()["error"]["code"] == "no_region"
    _all_free(fed)
    # Two H100 boxes: only AWS has them, though GCP's one is cheaper per GPU-hour. Between
    # them the gang talks over the network (no multi-node NVLink here): 25 GB/s predicted.
    gang = _place(fed, {"gpus": 8, "tasks": 2, "gpu_models": ["H100"]})
    assert gang.status_code == 201, gang.text
    body = gang.json()
    assert body["region"] == "aws-east" and sorted(body["nodes"]) == ["p5-1", "p5-2"]
    assert body["cost"]["gpu_hours"] == 16.0 and body["predicted_gbps"] == 25.0
    _release(fed.regions["aws-east"], body["allocation"]["id"])
