"""Slurm's truth about a node the replica it reaches has not heard of yet (another
replica stored the node's first report a moment before; its notification is on the way).

The node is in the database: its GPUs are held all the same, or the replica that stored
it sees them free and hands them to another job while Slurm runs this one there.
"""

from __future__ import annotations

import pytest

from placement.profiles import build_profile
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.deaf_replicas import deaf_listener, held, replica  # noqa: F401
from tests.service.helpers import report
from tests.service.slurm.test_truth import show_job, started

pytestmark = pytest.mark.usefixtures("deaf_listener")


def test_a_job_started_on_a_node_a_replica_has_not_heard_of_holds_its_gpus(
    settings: Settings, clock: FakeClock
) -> None:
    snap = build_profile("hgx-h100", "h0")
    with replica(settings, clock) as first, replica(settings, clock) as behind:
        assert report(first, snap).status_code == 200
        state: ServiceState = behind.app.state.service  # type: ignore[attr-defined]
        assert "h0" not in state.cluster  # it has not heard of the node
        observed = started(behind, show_job(7, "gpu:2(IDX:0-1)", nodes="h0"))
        assert observed["action"] == "created", observed
        assert held(behind) == {("h0", snap.gpus[0].uuid), ("h0", snap.gpus[1].uuid)}
        # GPUs 0 and 1 are the job's: the first replica finds two GPUs of eight taken.
        rest = first.post("/v1/place", json={"gpus": 8, "nodes": ["h0"]})
        assert rest.status_code == 409, rest.text


def test_the_reconcile_loop_records_a_job_on_a_node_its_replica_has_not_heard_of(
    settings: Settings, clock: FakeClock
) -> None:
    snap = build_profile("hgx-h100", "h0")
    with replica(settings, clock) as first, replica(settings, clock) as behind:
        assert report(first, snap).status_code == 200
        job = {
            "job_id": 8,
            "job_state": "RUNNING",
            "user_name": "bob",
            "nodes": "h0",
            "gres_detail": ["gpu:2(IDX:2-3)"],
        }
        answer = behind.post("/v1/slurm/reconcile", json={"jobs": [job]})
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["observed"]) == 1, answer.text
        assert held(behind) == {("h0", snap.gpus[2].uuid), ("h0", snap.gpus[3].uuid)}
