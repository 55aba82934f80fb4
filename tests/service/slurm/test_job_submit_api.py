"""POST /v1/slurm/job-submit and /v1/slurm/reconcile over the real app and databases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from service.slurm import service as slurm_service
from service.slurm.settings import SlurmSettings
from tests.service.conftest import FakeClock
from tests.service.loop_watch import LoopWatch
from tests.service.raw_asgi import raw_post
from tests.service.slurm.squeue import read_now

NO_VAL = 4294967294


def submit(client: TestClient, **fields: Any) -> dict[str, Any]:
    body = {"min_nodes": NO_VAL, "max_nodes": NO_VAL, "num_tasks": NO_VAL, "user_name": "alice"}
    response = client.post("/v1/slurm/job-submit", json={**body, **fields})
    assert response.status_code == 200, response.text
    decision: dict[str, Any] = response.json()
    return decision


def live(client: TestClient) -> list[dict[str, Any]]:
    allocations: list[dict[str, Any]] = client.get("/v1/allocations").json()["allocations"]
    return [a for a in allocations if a["state"] in ("pending", "active")]


def test_a_gpu_job_gets_exact_gpus_an_admin_comment_and_an_active_allocation(
    dgx1: TestClient,
) -> None:
    decision = submit(dgx1, tres_per_job="gres:gpu:4", partition_nodes="node[1-2]")
    assert decision["action"] == "modify"
    [allocation] = live(dgx1)
    [task] = allocation["tasks"]
    gpus = task["gpu_indices"]
    assert decision["set"] == {
        "req_nodes": task["node"],
        "tres_per_node": ",".join(f"gres:gpu:g{g}:1" for g in gpus),
        "tres_per_job": "",
        "admin_comment": f"topoplace alloc={allocation['id']} ring={allocation['ring_gbps']:g}GB/s"
        f" bandwidth={task['score']['bandwidth']:.2f} gpus={','.join(map(str, gpus))}",
    }
    assert decision["environment"]["TOPOPLACE_ALLOCATION_ID"] == allocation["id"]
    assert allocation["state"] == "active" and allocation["owner"] == "slurm:alice"
    assert task["nvlink_connected"] and allocation["ring_gbps"] == 25.0


def test_srun_jobs_get_no_environment_and_a_proposal_reserves_nothing(dgx1: TestClient) -> None:
    named = submit(dgx1, tres_per_node="gres:gpu:g0:1,gres:gpu:g1:1", batch=False)
    assert named["action"] == "modify" and named["environment"] == {}
    before = live(dgx1)
    proposal = submit(dgx1, tres_per_job="gres:gpu:2", reserve=False)
    assert proposal["action"] == "modify" and proposal["gres"].startswith("gpu:g")
    assert live(dgx1) == before


@pytest.mark.parametrize(
    ("fields", "action", "says"),
    [
        ({}, "unchanged", "asks for no GPU"),
        # srun/salloc that cli_filter.lua did not rewrite: a step's plain count would fail.
        ({"tres_per_node": "gres:gpu:2", "batch": False}, "unchanged", "without cli_filter"),
        ({"tres_per_job": "gres:gpu:2", "batch": False}, "unchanged", "without cli_filter"),
        ({"tres_per_task": "gres:gpu:1", "num_tasks": 4}, "unchanged", "per task"),
        ({"tres_per_job": "gres:gpu:1", "array_inx": "0-3"}, "unchanged", "arrays"),
        ({"tres_per_job": "gres:gpu:16"}, "unchanged", "no single node"),
        ({"tres_per_job": "gres:gpu:8", "min_nodes": 2}, "unchanged", "several nodes"),
        ({"tres_per_job": "gres:gpu:2", "req_nodes": "node[1-2]"}, "unchanged", "several nodes"),
        (
            {"tres_per_job": "gres:gpu:16", "comment": "topoplace:locality=nvlink"},
            "refuse",
            "the cluster can never hold this request",
        ),
        ({"tres_per_node": "gres:gpu:a100:1"}, "refuse", "model a100"),
        ({"tres_per_node": "gres:gpu:1", "comment": "topoplace:off"}, "unchanged", "off"),
        ({"tres_per_node": "gres:gpu:1", "comment": "topoplace:x=1"}, "refuse", "unknown"),
        ({"tres_per_node": "gres:gpu:1", "features": "a|b"}, "unchanged", "more than a list"),
        ({"tres_per_node": "gres:gpu:1", "features": "gpu_h100"}, "unchanged", "no node"),
        ({"tres_per_node": "gres:gpu:1", "partition_nodes": "other[1-4]"}, "unchanged", "no node"),
        ({"tres_per_node": "gres:gpu:1", "req_nodes": "node[1-"}, "unchanged", "unbalanced"),
        # Host lists longer than any cluster: refused unexpanded, on the event loop.
        (
            {"tres_per_node": "gres:gpu:1", "partition_nodes": "n[1-300]x[1-300]"},
            "unchanged",
            "more than",
        ),
        (
            {"tres_per_node": "gres:gpu:1", "req_nodes": "n[0-99999999999]"},
            "unchanged",
            "more than",
        ),
        (
            {"tres_per_node": "gres:gpu:1", "exc_nodes": "n[0-99999999999]"},
            "unchanged",
            "more than",
        ),
        # A host list int() or the recursion limit cannot read: were a 500.
        (
            {"tres_per_node": "gres:gpu:1", "req_nodes": f"n[{'9' * 5000}]"},
            "unchanged",
            "is not a number (of at most 20 digits)",
        ),
        ({"tres_per_node": "gres:gpu:1", "req_nodes": "a[1]" * 2000}, "unchanged", "no node"),
        (
            {"tres_per_node": "gres:gpu:1", "partition_nodes": "a[1]" * 2000},
            "unchanged",
            "no node",
        ),
        # More GPUs than a request may hold (a node has at most 64): was a 500.
        ({"tres_per_node": "gres:gpu:65"}, "refuse", "no node has 65 GPUs"),
        ({"tres_per_node": "gres:gpu:4294967295"}, "refuse", "never hold"),
        # A count of more digits than int() reads (4,300), or in other digits than ASCII
        # ones, which int() refuses ("\u00b2") or reads as another number ("\u0661" is 1):
        # the first two were a 500, the last was placed as one GPU.
        ({"tres_per_node": f"gres:gpu:{'9' * 5000}"}, "refuse", "GPU count"),
        ({"tres_per_node": "gres:gpu:\u00b2"}, "refuse", "GPU count"),
        ({"tres_per_job": "gres:gpu:\u0661"}, "refuse", "GPU count"),
        # An srun's per-GPU type of as many digits: was a 500; a type that names no GPU.
        (
            {"tres_per_node": f"gres:gpu:g{'1' * 5000}:1", "batch": False},
            "unchanged",
            "without cli_filter",
        ),
        ({"tres_per_job": "gres:gpu:65"}, "unchanged", "no single node"),
        (
            {"tres_per_node": "gres:gpu:65", "reserve": False, "batch": False},
            "refuse",
            "never hold",
        ),
        # What no reservation's request can say (a GPU type longer than a model name, more
        # nodes than a gang's tasks): was a 500, now left to Slurm saying why.
        ({"tres_per_node": f"gres:gpu:{'a' * 300}:1"}, "unchanged", "cannot be asked"),
        ({"tres_per_node": "gres:gpu:1", "min_nodes": 100000}, "unchanged", "cannot be asked"),
        # --exclusive: Slurm gives every GPU of an idle node; pinned beside another job it
        # waited for that job's end (tests/integrations/slurm/test_exclusive_jobs.py).
        ({"tres_per_job": "gres:gpu:2", "exclusive": True}, "unchanged", "--exclusive"),
        (
            {"tres_per_node": "gres:gpu:1", "exclusive": True, "reserve": False, "batch": False},
            "unchanged",
            "--exclusive",
        ),
        # --reservation: Slurm runs it on the reservation's nodes alone; pinned elsewhere
        # it was refused (tests/integrations/slurm/test_node_states.py).
        ({"tres_per_node": "gres:gpu:1", "reservation": "maint1"}, "unchanged", "maint1"),
        (
            {"tres_per_job": "gres:gpu:1", "reservation": "r", "reserve": False, "batch": False},
            "unchanged",
            "--reservation=r",
        ),
    ],
)
def test_jobs_left_to_slurm_or_refused_say_why_and_hold_nothing(
    dgx1: TestClient, fields: dict[str, Any], action: str, says: str
) -> None:
    decision = submit(dgx1, **fields)
    assert decision["action"] == action
    assert says in decision["message"]
    assert decision["set"] == {} and live(dgx1) == []


def test_candidates_follow_nodelist_exclude_features_and_models(dgx1: TestClient) -> None:
    assert submit(dgx1, tres_per_node="gres:gpu:1", req_nodes="node2")["nodes"] == ["node2"]
    assert submit(dgx1, tres_per_node="gres:gpu:1", exc_nodes="node1")["nodes"] == ["node2"]
    featured = submit(dgx1, tres_per_node="gres:gpu:v100:1", features="gpu_v100&nvisland8")
    assert featured["action"] == "modify"


def test_nothing_free_leaves_the_job_to_slurm_queue(dgx1: TestClient) -> None:
    for node in ("node1", "node2"):
        assert submit(dgx1, tres_per_node="gres:gpu:8", req_nodes=node)["action"] == "modify"
    decision = submit(dgx1, tres_per_node="gres:gpu:1")
    assert decision["action"] == "unchanged" and "nothing fits now" in decision["message"]
    # The refusal is a decision too: in the audit log with the Slurm route and the reasons.
    refused = dgx1.get("/v1/audit", params={"action": "refused"}).json()["entries"]
    assert refused and {e["route"] for e in refused} == {"POST /v1/slurm/job-submit"}
    assert refused[0]["detail"]["code"] == "unschedulable" and refused[0]["detail"]["reasons"]


def test_a_multi_node_job_gets_the_same_gpus_on_every_node(dgx1: TestClient) -> None:
    decision = submit(dgx1, tres_per_node="gres:gpu:4", min_nodes=2, max_nodes=2)
    assert decision["action"] == "modify"
    assert sorted(decision["set"]["req_nodes"].split(",")) == ["node1", "node2"]
    tasks = [t for a in live(dgx1) for t in a["tasks"]]
    assert {t["node"] for t in tasks} == {"node1", "node2"}
    assert len({tuple(t["gpu_indices"]) for t in tasks}) == 1
    assert decision["gpu_indices"] == tasks[0]["gpu_indices"]
    assert len(decision["allocation_ids"]) == len(live(dgx1))


def test_a_multi_node_job_whose_nodes_differ_is_left_to_slurm_holding_nothing(
    dgx1: TestClient,
) -> None:
    submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    before = live(dgx1)
    decision = submit(dgx1, tres_per_node="gres:gpu:6", min_nodes=2)
    assert decision["action"] == "unchanged" and "same GPUs" in decision["message"]
    assert live(dgx1) == before


def test_undoing_a_multi_node_gang_writes_the_database_off_the_event_loop(
    dgx1: TestClient,
) -> None:
    submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    before = live(dgx1)
    watch = LoopWatch()
    with watch.database(dgx1.app.state.service.engine):  # type: ignore[attr-defined]
        # Placed as one gang whose nodes get different GPUs: released, then left to Slurm.
        decision = submit(dgx1, tres_per_node="gres:gpu:6", min_nodes=2)
    assert decision["action"] == "unchanged" and live(dgx1) == before
    assert watch.seen["a database connection"] > 0  # the release happened, on a worker thread
    watch.check()


def test_undoing_the_nodes_placed_one_by_one_writes_the_database_off_the_event_loop(
    dgx1: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    before = live(dgx1)
    # Node by node, the first placement already gives other GPUs than the group was
    # chosen for (as when the node changed meanwhile): what was placed is undone.
    monkeypatch.setattr(
        slurm_service, "_same_gpu_group", lambda *_: ((0, 1, 2, 3, 4, 5), ["node2", "node1"])
    )
    watch = LoopWatch()
    with watch.database(dgx1.app.state.service.engine):  # type: ignore[attr-defined]
        decision = submit(dgx1, tres_per_node="gres:gpu:6", min_nodes=2)
    assert decision["action"] == "unchanged" and "changed while" in decision["message"]
    assert live(dgx1) == before
    everything = dgx1.get("/v1/allocations").json()["allocations"]
    assert [a["state"] for a in everything].count("released") >= 1  # placed, then undone
    watch.check()


def test_opt_out_can_be_forbidden(dgx1: TestClient) -> None:
    app: Any = dgx1.app
    app.state.slurm_settings = SlurmSettings(allow_opt_out=False)
    decision = submit(dgx1, tres_per_node="gres:gpu:1", comment="topoplace:off")
    assert decision["action"] == "refuse" and "does not allow" in decision["message"]


def test_a_malformed_body_gets_the_one_error_shape(dgx1: TestClient) -> None:
    response = dgx1.post("/v1/slurm/job-submit", json={"min_nodes": "two"})
    assert response.status_code == 422
    assert response.json()["error"]["detail"]["field"] == "min_nodes"


def test_a_body_that_is_not_json_gets_the_one_error_shape(dgx1: TestClient) -> None:
    response = dgx1.post(
        "/v1/slurm/job-submit", content=b"tres_per_node=gpu:1", headers={"Content-Type": "x"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"
    assert "JSON" in response.json()["error"]["message"]


def test_the_filter_route_keeps_the_token_check_and_body_limit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'slurm.sqlite3'}"
    settings = Settings(
        database_url=url,
        api_tokens="s3cret-0123456789abcdef",
        insecure_dev=False,
        max_body_bytes=2048,
    )
    with TestClient(create_app(settings, background=False)) as client:
        body = {"tres_per_node": "gres:gpu:1"}
        refused = client.post("/v1/slurm/job-submit", json=body)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        token = {"Authorization": "Bearer s3cret-0123456789abcdef"}
        large = client.post("/v1/slurm/job-submit", json={"comment": "x" * 4096}, headers=token)
        assert large.status_code == 413
        answer = client.post("/v1/slurm/job-submit", json=body, headers=token)
        assert answer.status_code == 200 and answer.json()["action"] == "unchanged"


def test_reconcile_releases_what_slurm_no_longer_has_after_the_grace_period(
    dgx1: TestClient, clock: FakeClock
) -> None:
    kept = submit(dgx1, tres_per_node="gres:gpu:1")
    done = submit(dgx1, tres_per_node="gres:gpu:1")
    lost = submit(dgx1, tres_per_node="gres:gpu:1")
    squeue = {
        "jobs": [
            {"job_id": 1, "job_state": "RUNNING", "admin_comment": kept["set"]["admin_comment"]},
            {"job_id": 2, "job_state": "COMPLETED", "admin_comment": done["set"]["admin_comment"]},
            {"job_id": 3, "job_state": "PENDING", "admin_comment": ""},
        ]
    }
    early = dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json=squeue).json()
    # A finished job's allocation goes at once; one no job names waits for the grace
    # period (its job may not exist yet); a live job's learns the job id.
    assert early == {
        "released": done["allocation_ids"],
        "live_jobs": 1,
        "observed": [],
        "attached": kept["allocation_ids"],
    }
    clock.advance(SlurmSettings().reconcile_grace_s + 1)
    result = dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json=squeue).json()
    assert result["released"] == lost["allocation_ids"]
    assert (
        dgx1.get("/v1/allocations", params={"job_id": "1"}).json()["allocations"][0]["id"]
        == (kept["allocation_ids"][0])
    )
    assert [a["id"] for a in live(dgx1)] == kept["allocation_ids"]


def test_reconcile_refuses_what_is_not_squeue_output(dgx1: TestClient) -> None:
    response = dgx1.post("/v1/slurm/reconcile", json={"nodes": []})
    assert response.status_code == 400
    assert "squeue --json" in response.json()["error"]["message"]


def test_a_user_name_is_refused_or_fits_in_its_owner(dgx1: TestClient) -> None:
    """The owner is slurm:<user>, at most 256 characters as any owner: a longer name is
    refused in the one error shape (the script lets the job through), never a 500."""
    too_long = dgx1.post(
        "/v1/slurm/job-submit", json={"tres_per_node": "gres:gpu:1", "user_name": "u" * 251}
    )
    assert too_long.status_code == 422, too_long.text
    assert too_long.json()["error"]["code"] == "invalid_request" and live(dgx1) == []
    decision = submit(dgx1, tres_per_node="gres:gpu:1", user_name="u" * 250)
    assert decision["action"] == "modify"
    [allocation] = live(dgx1)
    assert allocation["owner"] == "slurm:" + "u" * 250


def test_a_read_only_token_gets_proposals_and_reserves_nothing(dgx1: TestClient) -> None:
    """cli_filter.lua runs as the submitting user, so every user can read its token: a
    viewer token, good for `?propose=true` (what would be chosen, nothing held) and for
    nothing that writes. A scheduler token readable by users would let any of them
    release anyone's allocation."""
    created = dgx1.post("/v1/tokens", json={"role": "viewer", "name": "cli_filter"})
    assert created.status_code == 201, created.text
    viewer = {"Authorization": f"Bearer {created.json()['token']}"}
    body = {"tres_per_node": "gres:gpu:2", "batch": False, "min_nodes": NO_VAL}
    proposed = dgx1.post("/v1/slurm/job-submit?propose=true", json=body, headers=viewer)
    assert proposed.status_code == 200, proposed.text
    assert proposed.json()["action"] == "modify" and proposed.json()["gres"]
    # A proposal holds nothing, even for a body that asks to reserve.
    asked = {**body, "batch": True, "reserve": True}
    again = dgx1.post("/v1/slurm/job-submit?propose=true", json=asked, headers=viewer)
    assert again.status_code == 200 and again.json()["allocation_ids"] == []
    assert live(dgx1) == []
    for path in ("/v1/slurm/job-submit", "/v1/slurm/job-submit?propose=false"):
        refused = dgx1.post(path, json=asked, headers=viewer)
        assert refused.status_code == 403, refused.text
    assert live(dgx1) == []


@pytest.mark.parametrize("query", ["propose=%2CEr", "propose=maybe", "propose=1&propose=x"])
def test_a_propose_that_is_no_boolean_is_refused_and_holds_nothing(
    dgx1: TestClient, query: str
) -> None:
    body = {"tres_per_node": "gres:gpu:1", "min_nodes": NO_VAL, "user_name": "alice"}
    refused = dgx1.post(f"/v1/slurm/job-submit?{query}", json=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "invalid_request"
    assert live(dgx1) == []


def test_a_propose_repeated_is_a_proposal_if_any_says_so(dgx1: TestClient) -> None:
    """The access rule lets a read-only token through when any value is true: the handler
    reads it the same way, so such a call can never reserve."""
    body = {"tres_per_node": "gres:gpu:1", "min_nodes": NO_VAL, "user_name": "alice"}
    answer = dgx1.post("/v1/slurm/job-submit?propose=1&propose=0", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["allocation_ids"] == [] and live(dgx1) == []


def _raw_post(
    client: TestClient, path: str, query: bytes, body: Any, token: str
) -> tuple[int, Any]:
    """A POST as uvicorn's h11 protocol hands it over: the query string is the request
    target's bytes after its first '?', a '#' in them included (h11 does not split off a
    fragment, which no client sends). The test client's URL would drop it."""
    bearer = [(b"authorization", f"Bearer {token}".encode())]
    status, answer = raw_post(client, path, body, bearer, query)
    assert status is not None
    return status, json.loads(answer)


def test_a_proposal_is_read_from_the_query_the_access_rule_read(dgx1: TestClient) -> None:
    """The viewer token is let in because the query says propose=true; the handler must
    read that same query. Read from a URL rebuilt from the request, a '#' in the query
    cut the rest off as a fragment, and the viewer's call reserved."""
    created = dgx1.post("/v1/tokens", json={"role": "viewer", "name": "cli_filter"})
    assert created.status_code == 201, created.text
    body = {"tres_per_node": "gres:gpu:2", "batch": True, "reserve": True, "min_nodes": NO_VAL}
    status, answer = _raw_post(
        dgx1, "/v1/slurm/job-submit", b"x=1#&propose=true", body, created.json()["token"]
    )
    assert status == 200, answer
    assert answer["allocation_ids"] == [] and live(dgx1) == []
