"""Nodes Slurm starts no job on (sinfo): read, and left out of the filter's choices."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.slurm import node_states
from service.slurm.node_states import (
    SinfoError,
    SlurmNodeStates,
    read_sinfo,
    unavailable_nodes,
)
from service.slurm.node_states_watcher import NodeStatesWatcher
from service.slurm.settings import SlurmSettings
from tests.service.slurm.test_truth import submit

RECORDED = Path(__file__).parent / "sinfo"
# Slurm 22.05.8, seven nodes: gpu1 drained, gpu2 draining (a job runs), gpu3's slurmd
# stopped (SIGSTOP) past SlurmdTimeout, gpu4 set down and back (ReturnToService=2),
# gpu5 failed, gpu6 in a maintenance reservation, gpu7 running a job.
FLAGS = RECORDED / "sinfo-22.05.8-flags.json"
# node1 down, node2 drained while idle, node3 running a job.
DOWN = RECORDED / "sinfo-22.05.8-down.json"


def test_the_states_slurm_starts_no_job_in_are_read_from_recorded_sinfo() -> None:
    assert unavailable_nodes(json.loads(FLAGS.read_text())) == {
        "gpu1": "idle+DRAIN: disk check",
        "gpu2": "mixed+DRAIN: draining for update",
        "gpu3": "idle+NOT_RESPONDING",
        "gpu5": "idle+FAIL: ecc errors",
        "gpu6": "idle+MAINTENANCE+RESERVED",
    }
    assert unavailable_nodes(json.loads(DOWN.read_text())) == {
        "node1": "down: y",
        "node2": "idle+DRAIN: x",
    }


def test_later_api_versions_give_the_state_as_a_list() -> None:
    sinfo = {
        "nodes": [
            {"name": "a", "state": ["IDLE", "DRAIN"], "reason": "r"},
            {"name": "b", "state": ["DOWN", "NOT_RESPONDING"]},
            {"name": "c", "state": ["MIXED"]},
            {"name": "d", "state": ["IDLE", "RESERVED", "POWERED_DOWN"]},
        ]
    }
    assert unavailable_nodes(sinfo) == {
        "a": "IDLE+DRAIN: r",
        "b": "DOWN+NOT_RESPONDING",
        # In an advance reservation: Slurm starts only the jobs that name it there.
        "d": "IDLE+RESERVED+POWERED_DOWN",
    }


@pytest.mark.parametrize(
    "sinfo",
    [
        [],
        {"nodes": "x"},
        # What 22.05.8 prints, exiting 0, when slurmctld does not answer: not "all up".
        {"errors": [{"error": "Unable to contact slurm controller"}], "nodes": []},
    ],
)
def test_what_is_not_a_sinfo_answer_is_refused(sinfo: Any) -> None:
    with pytest.raises(SinfoError):
        unavailable_nodes(sinfo)


def test_the_command_is_run_and_its_failures_said(tmp_path: Path) -> None:
    assert set(asyncio.run(read_sinfo(f"cat {DOWN}", 5))) == {"node1", "node2"}
    for command in ("false", "/nonexistent/sinfo --json", "echo not-json", "sleep 5"):
        with pytest.raises(RuntimeError, match=r"sinfo|false|echo|sleep 5.*timed out"):
            asyncio.run(read_sinfo(command, 0.5))


def test_the_setting_picks_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert SlurmSettings().sinfo() == "sinfo --json"
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert SlurmSettings().sinfo() == ""
    assert SlurmSettings(sinfo_command="off").sinfo() == ""
    assert SlurmSettings(sinfo_command="/opt/x/sinfo --json").sinfo() == "/opt/x/sinfo --json"
    monkeypatch.setenv("TOPOPLACE_SLURM_NODES_INTERVAL_S", "2.5")
    assert SlurmSettings().nodes_interval_s == 2.5


def test_a_failed_read_keeps_the_last_one_until_it_is_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(node_states.time, "monotonic", lambda: now[0])
    states = SlurmNodeStates()
    assert states.unavailable() == {}
    states.update({"node1": "down"})
    now[0] += node_states.STALE_AFTER_S
    assert states.unavailable() == {"node1": "down"}
    now[0] += 1  # slurmctld silent this long: it takes no submissions either
    assert states.unavailable() == {}


def _service(client: TestClient) -> Any:
    app: Any = client.app
    return app.state.service


def test_the_background_step_reads_sinfo_into_the_state(dgx1: TestClient) -> None:
    service = _service(dgx1)
    settings = SlurmSettings(sinfo_command=f"cat {DOWN}", nodes_interval_s=1)
    asyncio.run(NodeStatesWatcher(service, settings).tick())
    assert set(service.slurm_nodes.unavailable()) == {"node1", "node2"}
    failing = SlurmSettings(sinfo_command="false")
    asyncio.run(NodeStatesWatcher(service, failing).tick())
    assert set(service.slurm_nodes.unavailable()) == {"node1", "node2"}


def test_the_filter_places_jobs_only_on_nodes_slurm_has_up(dgx1: TestClient) -> None:
    service = _service(dgx1)
    first = submit(dgx1, tres_per_node="gres:gpu:8")
    assert first["nodes"] == ["node1"]  # node1 is chosen while Slurm has it up
    [allocation_id] = first["allocation_ids"]
    assert dgx1.post(f"/v1/allocations/{allocation_id}/release").status_code == 200
    service.slurm_nodes.update({"node1": "idle+DRAIN: disk check"})
    proposed = dgx1.post(
        "/v1/slurm/job-submit?propose=true", json={"tres_per_node": "gres:gpu:1"}
    ).json()
    assert proposed["nodes"] == ["node2"]  # cli_filter.lua's proposals too
    placed = submit(dgx1, tres_per_node="gres:gpu:8")
    assert placed["action"] == "modify" and placed["nodes"] == ["node2"], placed
    # node2 full, node1 drained: nothing fits now, not "never".
    assert submit(dgx1, tres_per_node="gres:gpu:1")["action"] == "unchanged"


def test_a_job_that_names_a_node_slurm_has_down_is_left_to_slurm(dgx1: TestClient) -> None:
    _service(dgx1).slurm_nodes.update({"node1": "down: bad psu"})
    named = submit(dgx1, tres_per_node="gres:gpu:1", req_nodes="node1")
    assert named["action"] == "unchanged" and "node1 (down: bad psu)" in named["message"]
    assert named["allocation_ids"] == []
    partition = submit(dgx1, tres_per_node="gres:gpu:1", partition_nodes="node1")
    assert partition["action"] == "unchanged" and "every node" in partition["message"]
    # Two nodes while one is down: not refused as more than the cluster has, it comes back.
    both = submit(dgx1, tres_per_node="gres:gpu:8", min_nodes=2)
    assert both["action"] == "unchanged" and "up now" in both["message"], both
    assert dgx1.get("/v1/allocations").json()["allocations"] == []


def test_place_is_not_bound_by_slurms_node_states(dgx1: TestClient) -> None:
    """/place serves callers other than Slurm: a Slurm drain says nothing to them."""
    _service(dgx1).slurm_nodes.update({"node1": "idle+DRAIN: x", "node2": "idle+DRAIN: x"})
    placed = dgx1.post("/v1/place", json={"gpus": 2})
    assert placed.status_code == 201, placed.text
