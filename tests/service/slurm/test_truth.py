"""What Slurm really runs wins: the prolog's report and the reconcile backstop."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.slurm.fresh import FRESH
from service.slurm.reconcile import EARLY_GAP_S, Reconciler, reconcile
from service.slurm.settings import SlurmSettings
from service.slurm.truth import TruthError, from_show_job, gpu_indices
from tests.service.conftest import FakeClock
from tests.service.slurm.squeue import read_now

NO_VAL = 4294967294


def show_job(
    job: int,
    gres: str,
    nodes: str = "node1",
    comment: str = "",
    name: str = "train",
    user: str = "alice",
    workdir: str = "/home/alice",
    state: str = "RUNNING",
    restarts: int = 0,
    head: str = "",
    after_name: str = "",
) -> str:
    """A job as `scontrol -d show job -o` prints it (Slurm 22.05's order of fields).
    ``head``: what Slurm prints between the id and the name (an array task's
    ``ArrayJobId=N ArrayTaskId=K ``, a het job component's ``HetJobId=N HetJobOffset=K ``);
    ``after_name``: between the name and the user (a het job's ``HetJobIdSet=N-M ``)."""
    text = (
        f"JobId={job} {head}JobName={name} {after_name}UserId={user}(1000) GroupId={user}(1000)"
        f" MCS_label=N/A JobState={state} Reason=None Dependency=(null) Requeue=1"
        f" Restarts={restarts} BatchFlag=1 NodeList={nodes} JOB_GRES=gpu:2"
        f"   Nodes={nodes} CPU_IDs=0-1 Mem=0 GRES={gres} MinCPUsNode=1 Features=(null)"
        f" Command=(null) WorkDir={workdir}"
    )
    text += f" AdminComment={comment} " if comment else ""
    return f"{text} StdErr={workdir}/slurm-{job}.out StdIn=/dev/null Power="


def submit(client: TestClient, **fields: Any) -> dict[str, Any]:
    body = {"min_nodes": NO_VAL, "max_nodes": NO_VAL, "num_tasks": NO_VAL, "user_name": "alice"}
    decision: dict[str, Any] = client.post("/v1/slurm/job-submit", json={**body, **fields}).json()
    return decision


def started(client: TestClient, text: str, name: str = "train") -> dict[str, Any]:
    response = client.post("/v1/slurm/job-started", json={"show_job": text, "job_name": name})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def of_job(client: TestClient, job: int) -> list[dict[str, Any]]:
    rows = client.get("/v1/allocations", params={"job_id": str(job)}).json()["allocations"]
    return [a for a in rows if a["state"] in ("pending", "active", "degraded")]


def gpus(allocation: dict[str, Any]) -> dict[str, list[int]]:
    return {t["node"]: t["gpu_indices"] for t in allocation["tasks"]}


@pytest.mark.parametrize(
    ("gres", "indices"),
    [
        ("gpu:g1:1(IDX:1),gpu:g2:1(IDX:2)", [1, 2]),
        ("gpu:4(IDX:0-1,4-5)", [0, 1, 4, 5]),
        ("gpu:v100:2(IDX:6-7),shard:0(IDX:N/A)", [6, 7]),
        ("", []),
    ],
)
def test_gpu_indices_as_slurm_prints_them(gres: str, indices: list[int]) -> None:
    assert gpu_indices(gres) == indices


def test_a_job_on_several_nodes_is_read_per_node() -> None:
    text = show_job(3, "gpu:g0:1(IDX:0),gpu:g1:1(IDX:1)", "node[1-2]")
    truth, state = from_show_job(text, "train")
    assert truth.job_id == "3" and truth.user_name == "alice" and state == "RUNNING"
    assert truth.gpus == {"node1": [0, 1], "node2": [0, 1]}


def test_a_placed_job_that_runs_where_reserved_learns_its_job_id(dgx1: TestClient) -> None:
    decision = submit(dgx1, tres_per_node="gres:gpu:2")
    [allocation_id] = decision["allocation_ids"]
    gres = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in decision["gpu_indices"])
    text = show_job(7, gres, decision["nodes"][0], decision["set"]["admin_comment"])
    assert started(dgx1, text)["action"] == "attached"
    assert started(dgx1, text)["action"] == "matched"  # the prolog and the backstop agree
    [allocation] = of_job(dgx1, 7)
    assert allocation["id"] == allocation_id and allocation["job_id"] == "7"


def test_a_job_slurm_ran_elsewhere_moves_its_allocation(dgx1: TestClient) -> None:
    decision = submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    reserved = decision["gpu_indices"]
    elsewhere = [g for g in range(8) if g not in reserved][:2]
    gres = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in elsewhere)
    answer = started(dgx1, show_job(8, gres, "node1", decision["set"]["admin_comment"]))
    assert answer["action"] == "moved" and answer["allocation_id"] == decision["allocation_ids"][0]
    [allocation] = of_job(dgx1, 8)
    assert gpus(allocation) == {"node1": elsewhere}
    # The GPUs it left are free again; those it took are not.
    free = dgx1.post("/v1/score", json={"gpus": 8, "nodes": ["node1"]}).json()["nodes"][0]
    assert not free["fits"]
    again = submit(dgx1, tres_per_node=f"gres:gpu:{8 - 2}", req_nodes="node1")
    assert sorted(again["gpu_indices"]) == sorted(set(range(8)) - set(elsewhere))


def test_a_job_slurm_started_by_itself_supersedes_a_stale_reservation(dgx1: TestClient) -> None:
    """A job left to Slurm runs on GPUs the service still held for another (a pinned job
    still pending, or one whose epilog has not come): Slurm is running it, so it wins."""
    stale = submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    taken = stale["gpu_indices"]
    gres = f"gpu:2(IDX:{taken[0]},{taken[1]})"
    answer = started(dgx1, show_job(9, gres, "node1"))
    assert answer["action"] == "created" and answer["superseded"] == stale["allocation_ids"]
    [allocation] = of_job(dgx1, 9)
    assert gpus(allocation) == {"node1": sorted(taken)}
    assert allocation["owner"] == "slurm:alice" and allocation["state"] == "active"
    old = dgx1.get(f"/v1/allocations/{stale['allocation_ids'][0]}").json()
    assert old["state"] == "released"


def test_a_report_slurm_could_not_have_made_is_refused(dgx1: TestClient) -> None:
    response = dgx1.post(
        "/v1/slurm/job-started", json={"show_job": "nothing here", "job_name": "x"}
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_request"
    response = dgx1.post(
        "/v1/slurm/job-started", json={"show_job": show_job(4, "gpu:1(IDX:9)"), "job_name": "train"}
    )
    assert response.status_code == 400 and "no GPU [9]" in response.json()["error"]["message"]
    unknown = started(dgx1, show_job(5, "gpu:1(IDX:0)", "elsewhere1"))
    assert unknown["action"] == "none"


def test_reconcile_releases_a_job_cancelled_while_pending_at_once(dgx1: TestClient) -> None:
    """No epilog runs for it; the allocation is far younger than the grace period."""
    decision = submit(dgx1, tres_per_node="gres:gpu:1")
    squeue = {
        "jobs": [
            {
                "job_id": 11,
                "job_state": "CANCELLED",
                "admin_comment": decision["set"]["admin_comment"],
            }
        ]
    }
    settings = SlurmSettings(reconcile_grace_s=60)
    app: Any = dgx1.app
    from service.slurm.reconcile import reconcile

    result = reconcile(app.state.service, settings, squeue)
    assert result.released == decision["allocation_ids"]


def test_reconcile_records_running_jobs_and_releases_them_when_they_end(
    dgx1: TestClient, clock: FakeClock
) -> None:
    running = {
        "job_id": 12,
        "job_state": "RUNNING",
        "user_name": "bob",
        "nodes": "node2",
        "gres_detail": ["gpu:2(IDX:3-4)"],
        "admin_comment": "",
    }
    result = dgx1.post(
        "/v1/slurm/reconcile", params=read_now(clock), json={"jobs": [running]}
    ).json()
    [allocation] = of_job(dgx1, 12)
    assert result["observed"] == [allocation["id"]] and gpus(allocation) == {"node2": [3, 4]}
    assert (
        dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json={"jobs": [running]}).json()[
            "observed"
        ]
        == []
    )
    ended = {**running, "job_state": "COMPLETED"}
    result = dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json={"jobs": [ended]}).json()
    assert result["released"] == [allocation["id"]] and of_job(dgx1, 12) == []


def test_the_loop_runs_as_soon_as_a_fresh_reservation_passes_the_grace_period(
    dgx1: TestClient, tmp_path: Path
) -> None:
    """A reservation whose answer came too late for the filter: no job ever names it."""
    output = tmp_path / "squeue.json"
    output.write_text(json.dumps({"jobs": []}))
    app: Any = dgx1.app
    settings = SlurmSettings(
        squeue_command=f"cat {output}", reconcile_interval_s=3600, reconcile_grace_s=0
    )
    loop = Reconciler(app.state.service, settings)
    asyncio.run(loop.tick())  # the interval's first run; the next one is an hour away
    orphan = submit(dgx1, tres_per_node="gres:gpu:1")
    time.sleep(EARLY_GAP_S)  # early runs are this far apart on the loop's own monotonic clock
    asyncio.run(loop.tick())
    released = dgx1.get(f"/v1/allocations/{orphan['allocation_ids'][0]}").json()
    assert released["state"] == "released"
    assert not FRESH.due(0)


@pytest.mark.parametrize(
    ("nodes", "gres"),
    [
        ("node1", "gpu:1(IDX:9)"),  # a GPU the node's snapshot does not have
        ("node1", "gpu:2(IDX:-3)"),  # indices that cannot be read
        ("node[2-1]", "gpu:1(IDX:0)"),  # a host list that cannot be read
        ("node[1]" * 2000, "gpu:1(IDX:0)"),  # one past the recursion limit: was a 500
    ],
)
def test_one_running_job_that_cannot_be_recorded_does_not_stop_the_others(
    dgx1: TestClient, clock: FakeClock, nodes: str, gres: str
) -> None:
    """Such a job is skipped (and its allocations kept): the reconcile of every other
    job goes on, or one odd job would stop all releases for as long as it runs."""
    cancelled = submit(dgx1, tres_per_node="gres:gpu:1")
    odd = {"job_id": 30, "job_state": "RUNNING", "nodes": nodes, "gres_detail": [gres]}
    gone = {"job_id": 31, "job_state": "CANCELLED"}
    gone["admin_comment"] = cancelled["set"]["admin_comment"]
    running = {
        "job_id": 32,
        "job_state": "RUNNING",
        "user_name": "bob",
        "nodes": "node2",
        "gres_detail": ["gpu:2(IDX:6-7)"],
    }
    response = dgx1.post(
        "/v1/slurm/reconcile", params=read_now(clock), json={"jobs": [odd, gone, running]}
    )
    assert response.status_code == 200, response.text
    assert response.json()["released"] == cancelled["allocation_ids"]
    [recorded] = of_job(dgx1, 32)
    assert gpus(recorded) == {"node2": [6, 7]}
    assert of_job(dgx1, 30) == []


@pytest.mark.parametrize("details", [5, True, 1.5, "gpu:2(IDX:6-7)", {"node2": "gpu:2(IDX:6-7)"}])
def test_a_running_job_whose_gres_detail_is_no_list_does_not_stop_the_others(
    dgx1: TestClient, clock: FakeClock, details: object
) -> None:
    """squeue gives ``gres_detail`` as a list, one entry per node: anything else is that
    job's text the service cannot read, skipped like the others above. A number there
    failed the whole reconcile (500), every release with it, for as long as it ran."""
    cancelled = submit(dgx1, tres_per_node="gres:gpu:1")
    odd = {"job_id": 30, "job_state": "RUNNING", "nodes": "node2", "gres_detail": details}
    gone = {"job_id": 31, "job_state": "CANCELLED"}
    gone["admin_comment"] = cancelled["set"]["admin_comment"]
    response = dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json={"jobs": [odd, gone]})
    assert response.status_code == 200, response.text
    assert response.json()["released"] == cancelled["allocation_ids"]
    assert of_job(dgx1, 30) == []


@pytest.mark.parametrize(
    "gres",
    [
        "gpu:1(IDX:0-100000)",  # more GPUs than any node has
        "gpu:1(IDX:99999999999999999999)",
        "gpu:1(IDX:0-99999999999999999999)",  # refused before any index is made
        "gpu:2(IDX:5-2)",  # a range that goes backwards names no GPU: not a job on none
    ],
)
def test_gpu_indices_no_node_can_have_are_refused_unexpanded(gres: str) -> None:
    with pytest.raises(TruthError):
        gpu_indices(gres)


@pytest.mark.parametrize(
    ("nodes", "gres"),
    [
        ("node1", "gpu:1(IDX:0-99999999999999999999)"),
        ("node[1-99999999999999999999]", "gpu:1(IDX:0)"),
        ("node1", "gpu:g3:1(IDX:0-2,5),gpu:2(IDX:7-6)"),
        # int() refused 5,000 digits with a message of its own, quoting them all.
        (f"node[{'9' * 5000}]", "gpu:1(IDX:0)"),
    ],
)
def test_a_report_with_lists_no_cluster_has_is_refused_with_nothing_written(
    dgx1: TestClient, nodes: str, gres: str
) -> None:
    body = {"show_job": show_job(40, gres, nodes), "job_name": "train"}
    response = dgx1.post("/v1/slurm/job-started", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["detail"] == {"field": "show_job"}
    assert dgx1.get("/v1/allocations").json()["allocations"] == []


def test_a_report_naming_a_node_of_many_brackets_is_answered(dgx1: TestClient) -> None:
    """2,000 brackets in a node's name passed the recursion limit: a 500. It names one
    node, which topoplace does not know."""
    text = show_job(40, "gpu:1(IDX:0)", "node[1]" * 2000)
    answer = started(dgx1, text)
    assert answer["action"] == "none" and "no GPU of a node" in answer["message"]
    assert dgx1.get("/v1/allocations").json()["allocations"] == []


# A short host list naming as many nodes as a list may (slurm_formats/hostlist.py): ten
# bytes of a job's text that make 65,536 names, in 50-80 ms.
_WIDE = "a[1-65536]"


def test_host_lists_are_not_made_into_more_names_than_a_job_uses(dgx1: TestClient) -> None:
    """squeue pairs a job's nodes with its ``gres_detail``, one entry a node: the names
    past those entries were made all the same, so 300 jobs of 90 bytes (27 KB of a
    pushed answer) held the reconcile, and the GIL, for 18-24 s; a prolog's text of 300
    per-node lines (16 KB), each naming the most nodes a list may, for 39 s."""
    app: Any = dgx1.app
    state = app.state.service
    jobs = [
        {
            "job_id": 1000 + i,
            "job_state": "RUNNING",
            "nodes": _WIDE,
            "gres_detail": ["gpu:1(IDX:0)"],
        }
        for i in range(300)
    ]
    began = time.monotonic()
    reconcile(state, SlurmSettings(), {"jobs": jobs})
    assert time.monotonic() - began < 3
    line = f"   Nodes={_WIDE} CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)"
    text = show_job(41, "gpu:1(IDX:0)", "node1").replace("   Nodes=", line * 300 + "   Nodes=")
    began = time.monotonic()
    response = dgx1.post("/v1/slurm/job-started", json={"show_job": text, "job_name": "train"})
    assert time.monotonic() - began < 3
    assert response.status_code == 400 and "nodes" in response.text, response.text
    assert dgx1.get("/v1/allocations").json()["allocations"] == []


def test_text_a_user_writes_cannot_speak_for_the_job(dgx1: TestClient) -> None:
    """`scontrol show job` prints the job's name, work directory and comments as the user
    wrote them, among the fields the report is read for. A job naming another user's
    allocation, or GPUs it does not run on, takes nothing and ends nothing."""
    victim = submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    [held_id] = victim["allocation_ids"]
    gres = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in victim["gpu_indices"])
    assert started(dgx1, show_job(7, gres, "node1", victim["set"]["admin_comment"]))["action"]
    [before] = of_job(dgx1, 7)
    fake = f"topoplace alloc={held_id} ring=0GB/s"
    name = (
        f"x {fake} Nodes=node1 CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7) MinCPUsNode=1 JobState=RUNNING"
    )
    own = submit(dgx1, tres_per_node="gres:gpu:1", req_nodes="node2", user_name="mallory")
    real = f"gpu:g{own['gpu_indices'][0]}:1(IDX:{own['gpu_indices'][0]})"
    workdir = f"/home/mallory/x AdminComment={fake} "
    for job, comment in ((8, own["set"]["admin_comment"]), (9, "")):
        text = show_job(job, real, "node2", comment, name=name, user="mallory", workdir=workdir)
        answer = started(dgx1, text, name=name)
        assert answer["superseded"] == [] and answer["merged"] == [], answer
        [recorded] = of_job(dgx1, job)
        assert gpus(recorded) == {"node2": own["gpu_indices"]}
        assert of_job(dgx1, 7) == [before], "another user's allocation was taken or ended"
        if comment:
            assert answer == {
                **answer,
                "action": "attached",
                "allocation_id": own["allocation_ids"][0],
            }
        dgx1.post(f"/v1/jobs/{job}/release")


def test_a_report_whose_job_name_is_not_the_texts_is_refused(dgx1: TestClient) -> None:
    """The name is what tells the user's text from Slurm's fields: a report without it
    (an older prolog) or with another is refused, and the reconcile loop records the job."""
    text = show_job(10, "gpu:1(IDX:0)")
    for body in ({"show_job": text}, {"show_job": text, "job_name": "other"}):
        response = dgx1.post("/v1/slurm/job-started", json=body)
        assert response.status_code in (400, 422), response.text
    assert of_job(dgx1, 10) == []


def test_a_report_whose_job_id_is_in_other_digits_is_refused(dgx1: TestClient) -> None:
    """Slurm prints job ids in ASCII digits: "\u0661\u0662" (Arabic-Indic 12) is no job
    id, though int() reads it as 12, another job's. Taken so, the report recorded job 12
    on the GPUs named."""
    text = show_job(12, "gpu:1(IDX:0)").replace("JobId=12 ", "JobId=\u0661\u0662 ", 1)
    response = dgx1.post("/v1/slurm/job-started", json={"show_job": text, "job_name": "train"})
    assert response.status_code in (400, 422), response.text
    assert of_job(dgx1, 12) == []


@pytest.mark.parametrize("job_id", [None, "", "12; x", [12], True, -3, "\u0661\u0662", "\u00b2"])
def test_a_squeue_job_without_a_job_id_records_nothing(dgx1: TestClient, job_id: Any) -> None:
    running = {"job_state": "RUNNING", "nodes": "node2", "gres_detail": ["gpu:2(IDX:3-4)"]}
    if job_id is not None:
        running["job_id"] = job_id
    response = dgx1.post("/v1/slurm/reconcile", json={"jobs": [running]})
    assert response.status_code == 200, response.text
    assert dgx1.get("/v1/allocations").json()["allocations"] == []


def test_a_user_name_longer_than_an_owner_is_refused_cleanly(dgx1: TestClient) -> None:
    """An owner is at most 256 characters: a longer name is refused before any write,
    the same on SQLite and Postgres, and a squeue job with one is skipped."""
    user = "u" * 300
    text = show_job(50, "gpu:1(IDX:0)", user=user)
    response = dgx1.post("/v1/slurm/job-started", json={"show_job": text, "job_name": "train"})
    assert response.status_code == 400, response.text
    running = {"job_id": 51, "job_state": "RUNNING", "user_name": user, "nodes": "node2"}
    running["gres_detail"] = ["gpu:2(IDX:3-4)"]
    response = dgx1.post("/v1/slurm/reconcile", json={"jobs": [running]})
    assert response.status_code == 200, response.text
    assert dgx1.get("/v1/allocations").json()["allocations"] == []


@pytest.mark.parametrize("user", ["\x1b]52;c;cm0gLXJmIH4K\x07", "bob\x00", "eve\x1b[2K"])
def test_a_user_name_with_control_characters_is_refused_cleanly(
    dgx1: TestClient, user: str
) -> None:
    """A user name becomes the allocation's owner, which ``topoplace allocations`` prints
    in an operator's terminal (an escape there sets the clipboard or rewrites the screen)
    and Postgres cannot store with a NUL: no system user is called so, so the report is
    refused before any write, and a squeue job with one is skipped."""
    text = show_job(52, "gpu:1(IDX:0)", user=user)
    response = dgx1.post("/v1/slurm/job-started", json={"show_job": text, "job_name": "train"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "bad_request"
    running = {"job_id": 53, "job_state": "RUNNING", "user_name": user, "nodes": "node2"}
    running["gres_detail"] = ["gpu:2(IDX:3-4)"]
    response = dgx1.post("/v1/slurm/reconcile", json={"jobs": [running]})
    assert response.status_code == 200, response.text
    assert dgx1.get("/v1/allocations").json()["allocations"] == []


@pytest.mark.parametrize("state", ["COMPLETED", "CANCELLED", "NODE_FAIL"])
def test_a_report_of_a_job_that_has_ended_records_nothing(dgx1: TestClient, state: str) -> None:
    """A report read after the job ended (a prolog run again by hand, a late retry) says
    so: it must not bring the job back over the GPUs the next job holds."""
    successor = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    gres = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in range(8))
    answer = started(dgx1, show_job(60, gres, "node1", state=state))
    assert answer["action"] == "none" and answer["superseded"] == [], answer
    assert [a["id"] for a in of_job(dgx1, 60)] == []
    kept = dgx1.get(f"/v1/allocations/{successor['allocation_ids'][0]}").json()
    assert kept["state"] == "active"
