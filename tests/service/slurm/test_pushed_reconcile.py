"""POST /v1/slurm/reconcile: a pushed squeue answer counts as taken when its read started."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.allocations import api as allocations
from service.app import create_app
from service.settings import Settings
from service.slurm.settings import SlurmSettings
from tests.live_server import live_server
from tests.service.conftest import ADMIN_TOKEN, FakeClock
from tests.service.slurm.squeue import live, read_now, running
from tests.service.slurm.test_truth import show_job
from tests.slurm_cron import documented_cron_command


def _reserve(client: TestClient) -> list[str]:
    body = {"tres_per_node": "gres:gpu:2", "user_name": "alice"}
    ids: list[str] = client.post("/v1/slurm/job-submit", json=body).json()["allocation_ids"]
    assert ids
    return ids


def test_a_reservation_made_while_a_pushed_squeue_ran_is_kept(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """cron ran squeue, the filter reserved for a job squeue had not seen, and the answer
    was posted 2 s later (squeue | curl posts once squeue has finished): the answer
    says nothing of that job, so its reservation is no orphan."""
    read_at = clock.now.timestamp()
    clock.advance(0.1)
    made = _reserve(dgx1)
    clock.advance(2)
    pushed = dgx1.post("/v1/slurm/reconcile", params={"read_at": read_at}, json={"jobs": []})
    assert pushed.status_code == 200, pushed.text
    assert pushed.json()["released"] == []
    assert live(dgx1) == made, "a reservation newer than squeue's read was released"


def test_without_read_at_an_answer_counts_as_taken_the_squeue_timeout_before_it_came(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """A pusher that does not say when its read started (a cron line written before
    read_at): its answer is taken as old as the slowest squeue the service would wait
    for itself (squeue_timeout_s, 20 s). A reservation made 2 s before the answer came
    is kept; orphans are still released, 20 s later than with read_at."""
    orphan = _reserve(dgx1)
    clock.advance(1)
    made = _reserve(dgx1)
    clock.advance(2)
    early = dgx1.post("/v1/slurm/reconcile", json={"jobs": []})
    assert early.status_code == 200, early.text
    assert early.json()["released"] == [] and sorted(live(dgx1)) == sorted(orphan + made)
    timeout_s = SlurmSettings().squeue_timeout_s
    clock.advance(timeout_s + SlurmSettings().reconcile_grace_s - 2.5)
    late = dgx1.post("/v1/slurm/reconcile", json={"jobs": []}).json()
    assert late["released"] == orphan and live(dgx1) == made
    clock.advance(1)
    assert dgx1.post("/v1/slurm/reconcile", json={"jobs": []}).json()["released"] == made


def test_a_read_at_ahead_of_the_service_clock_counts_as_none(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """The cron host's clock runs 30 s ahead: its read_at is no moment its squeue could
    have started, so it says nothing of how long that squeue ran. Counted from the
    arrival, a reservation made while a squeue slower than the grace period ran (its job
    missing from the answer) was released as an orphan; the answer counts as taken as
    without read_at, the squeue timeout (20 s) before it came."""
    made = _reserve(dgx1)
    clock.advance(3)  # squeue ran 3 s on a busy controller; the job came during it
    ahead = clock.now.timestamp() + 30
    kept = dgx1.post("/v1/slurm/reconcile", params={"read_at": ahead}, json={"jobs": []})
    assert kept.status_code == 200, kept.text
    assert kept.json()["released"] == [] and live(dgx1) == made
    clock.advance(SlurmSettings().squeue_timeout_s)
    ahead = clock.now.timestamp() + 30
    gone = dgx1.post("/v1/slurm/reconcile", params={"read_at": ahead}, json={"jobs": []})
    assert gone.json()["released"] == made


def test_a_read_at_older_than_the_answer_keeps_what_came_since(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """read_at only moves the moment earlier than the arrival: an allocation older than
    it by the grace is still an orphan, one made after it is kept."""
    orphan = _reserve(dgx1)
    clock.advance(1)
    read_at = clock.now.timestamp()
    clock.advance(0.1)
    made = _reserve(dgx1)
    clock.advance(10)
    pushed = dgx1.post("/v1/slurm/reconcile", params={"read_at": read_at}, json={"jobs": []})
    assert pushed.json()["released"] == orphan and live(dgx1) == made


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("nan", "finite"),
        ("inf", "finite"),
        ("-inf", "finite"),
        ("-1", "greater than or equal to 0"),
        ("yesterday", "valid number"),
        ("1764979200.N", "valid number"),  # BSD date prints %N as N
        ("", "valid number"),
        ("+61", "after the service's clock"),
        ("+1e300", "after the service's clock"),
        ("*1000", "after the service's clock"),  # milliseconds
        ("-3601", "before the service's clock"),
        ("0", "before the service's clock"),
    ],
)
def test_a_read_at_that_cannot_be_when_squeue_started_is_refused(
    dgx1: TestClient, clock: FakeClock, value: str, says: str
) -> None:
    orphan = _reserve(dgx1)
    clock.advance(60)
    now = clock.now.timestamp()
    if value.startswith("+") or value.startswith("-3"):
        value = repr(now + float(value))
    elif value.startswith("*"):
        value = repr(now * float(value[1:]))
    refused = dgx1.post("/v1/slurm/reconcile", params={"read_at": value}, json={"jobs": []})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == "query.read_at"
    assert error["message"].startswith("query.read_at: ") and says in error["message"]
    assert live(dgx1) == orphan, "a refused answer released something"


def test_read_at_needs_the_scheduler_role_as_before(dgx1: TestClient, clock: FakeClock) -> None:
    """The parameter opens nothing: a viewer token (cli_filter.lua's, readable by users)
    is refused with or without it; a scheduler token is served."""
    orphan = _reserve(dgx1)
    clock.advance(60)
    tokens: dict[str, dict[str, str]] = {}
    for role, scope in (("viewer", {}), ("scheduler", {}), ("agent", {"nodes": ["node1"]})):
        body = {"role": role, "name": f"cron-{role}", **scope}
        created = dgx1.post("/v1/tokens", json=body)
        assert created.status_code == 201, created.text
        tokens[role] = {"Authorization": f"Bearer {created.json()['token']}"}
    params = {"read_at": clock.now.timestamp()}
    for role in ("viewer", "agent"):
        for query in (params, {}):
            refused = dgx1.post(
                "/v1/slurm/reconcile", params=query, json={"jobs": []}, headers=tokens[role]
            )
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "forbidden"
    assert live(dgx1) == orphan
    served = dgx1.post(
        "/v1/slurm/reconcile", params=params, json={"jobs": []}, headers=tokens["scheduler"]
    )
    assert served.status_code == 200 and served.json()["released"] == orphan


@pytest.mark.parametrize("says_when", [True, False], ids=["read_at", "without"])
def test_a_job_that_ended_while_a_pushed_squeue_ran_is_not_recorded_again(
    dgx1: TestClient, clock: FakeClock, says_when: bool
) -> None:
    """squeue saw job 5 running; while it printed, the job's epilog released it and the
    next job was given its GPUs. Counted from its arrival, the answer was newer than
    that end: it recorded job 5 again and released the next job's reservation."""
    body = {"tres_per_node": "gres:gpu:8", "user_name": "alice", "req_nodes": "node1"}
    first = dgx1.post("/v1/slurm/job-submit", json=body).json()
    gres = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in range(8))
    comment = first["set"]["admin_comment"]
    report = {"show_job": show_job(5, gres, "node1", comment), "job_name": "train"}
    assert dgx1.post("/v1/slurm/job-started", json=report).json()["action"] == "attached"
    clock.advance(5)
    read_at = clock.now.timestamp()
    clock.advance(1)
    assert dgx1.post("/v1/jobs/5/release").json()["released"]  # the epilog
    made = dgx1.post("/v1/slurm/job-submit", json=body).json()["allocation_ids"]
    assert made
    clock.advance(1)
    params = {"read_at": read_at} if says_when else {}
    answer = {"jobs": [running(5, comment, [gres])]}
    pushed = dgx1.post("/v1/slurm/reconcile", params=params, json=answer)
    assert pushed.status_code == 200, pushed.text
    assert pushed.json()["observed"] == [] and live(dgx1) == made, (
        "an ended job was recorded over the next job's GPUs"
    )


# The fake squeue: says it started, waits for the test's go (the job submitted while
# it ran), then prints an answer without that job, as a slurmctld read before it would,
# a second later (a busy controller: longer than the grace period).
FAKE_SQUEUE = """#!/bin/sh
: > "$PUSH_DIR/started"
i=0
while [ ! -e "$PUSH_DIR/go" ] && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
sleep 1
echo '{"jobs": []}'
"""


@pytest.mark.skipif(shutil.which("curl") is None, reason="the documented line runs curl")
def test_the_documented_cron_line_keeps_a_reservation_made_while_squeue_ran(
    tmp_path: Path,
) -> None:
    """The line from docs/slurm.md, run by /bin/sh against a running service (its wall
    clock, SQLite): a reservation older than its squeue's start by more than the grace is
    released; one made while that squeue ran, missing from its answer, is kept."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'push.sqlite3'}",
        insecure_dev=False,
        bootstrap_admin_token=ADMIN_TOKEN,
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(FAKE_SQUEUE)
    (bin_dir / "squeue").chmod(0o755)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    body = {"tres_per_node": "gres:gpu:1", "user_name": "alice"}
    with (
        live_server(create_app(settings, demo=True, background=False)) as url,
        httpx.Client(base_url=url, headers=admin, trust_env=False, timeout=30) as http,
    ):
        token = http.post("/v1/tokens", json={"role": "scheduler", "name": "cron"})
        assert token.status_code == 201, token.text
        headers = tmp_path / "topoplace-reconcile.headers"
        headers.write_text(f"Authorization: Bearer {token.json()['token']}\n")

        def reserve() -> list[str]:
            ids: list[str] = http.post("/v1/slurm/job-submit", json=body).json()["allocation_ids"]
            assert ids
            return ids

        orphan = reserve()
        time.sleep(SlurmSettings().reconcile_grace_s + 0.5)  # older than the grace at the read
        environment = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        environment["PUSH_DIR"] = str(tmp_path)
        cron = subprocess.Popen(
            ["/bin/sh", "-c", documented_cron_command(url, headers)],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 20
            while not (tmp_path / "started").exists():
                assert cron.poll() is None and time.monotonic() < deadline, "squeue never ran"
                time.sleep(0.05)
            made = reserve()  # a job submitted while squeue ran
            (tmp_path / "go").touch()
            _, stderr = cron.communicate(timeout=30)
        finally:
            if cron.poll() is None:
                cron.kill()
                cron.wait()
        assert cron.returncode == 0, stderr
        rows = http.get("/v1/allocations").json()["allocations"]
        states = {row["id"]: row["state"] for row in rows}
        assert states[orphan[0]] == "released", "the orphan older than squeue's read was kept"
        assert states[made[0]] == "active", "a reservation made while squeue ran was released"


def test_a_node_deleted_while_a_job_of_it_is_recorded_skips_that_job_alone(
    dgx1: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node2 is deleted between the answer's read of what runs on it and the record of
    its job: that job is left, as one whose GPUs cannot be named is; the other job's
    GPUs are recorded and the orphan released. The node's NotFound ended the whole
    answer, which then recorded and released nothing."""
    orphan = _reserve(dgx1)
    [task] = dgx1.get(f"/v1/allocations/{orphan[0]}").json()["tasks"]
    free = next(i for i in range(8) if task["node"] != "node1" or i not in task["gpu_indices"])
    clock.advance(60)
    real_observe = allocations.observe

    def deleted_first(state: Any, job_id: str, *args: Any, **kwargs: Any) -> Any:
        if job_id == "7":
            assert dgx1.delete("/v1/nodes/node2").status_code == 204
        return real_observe(state, job_id, *args, **kwargs)

    monkeypatch.setattr(allocations, "observe", deleted_first)
    gone = {**running(7, "", ["gpu:g0:1(IDX:0)"]), "nodes": "node2"}
    runs = running(8, "", [f"gpu:g{free}:1(IDX:{free})"])
    answer = {"jobs": [gone, runs]}
    pushed = dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json=answer)

    assert pushed.status_code == 200, pushed.text
    assert pushed.json()["released"] == orphan, pushed.json()
    [recorded] = live(dgx1)
    assert dgx1.get(f"/v1/allocations/{recorded}").json()["job_id"] == "8"
