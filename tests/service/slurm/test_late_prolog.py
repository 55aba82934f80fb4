"""A prolog's report processed after the job ended holds nothing.

The prolog (``POST /v1/slurm/job-started``) reads the job as it starts; its report
can be processed after the job's epilog, or after the reconcile loop released the
ended job (a retry, a slow network, a request queued behind others). Recorded
then, it would bring back an allocation for a dead job over the GPUs the next job
holds. The service remembers which jobs ended for ``TOPOPLACE_ENDED_JOB_MEMORY_S``
(docs/slurm.md, "A prolog report after the job ended").
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from service.slurm.reconcile import reconcile
from service.slurm.settings import SlurmSettings
from tests.service.conftest import FakeClock
from tests.service.slurm.test_truth import of_job, show_job, started, submit

EVERY_GPU = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in range(8))


def _epilog(client: TestClient, job: int, decision: dict[str, Any] | None = None) -> None:
    """What ``topoplace slurm epilog`` does: release the allocations the job's admin
    comment names, then every allocation carrying the job's id."""
    for allocation_id in (decision or {}).get("allocation_ids", []):
        assert client.post(f"/v1/allocations/{allocation_id}/release").status_code == 200
    assert client.post(f"/v1/jobs/{job}/release").status_code == 200


def _state_of(client: TestClient, allocation_id: str) -> str:
    state: str = client.get(f"/v1/allocations/{allocation_id}").json()["state"]
    return state


def _ignored(answer: dict[str, Any]) -> None:
    assert answer["action"] == "none", answer
    assert answer["superseded"] == [] and answer["allocation_id"] is None, answer
    assert "ended" in answer["message"], answer


def test_a_prolog_report_after_the_jobs_epilog_records_nothing(dgx1: TestClient) -> None:
    first = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    # Read as the job started; sent, but processed only after the job's epilog.
    text = show_job(70, EVERY_GPU, "node1", first["set"]["admin_comment"])
    _epilog(dgx1, 70, first)
    successor = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    assert successor["action"] == "modify", successor
    _ignored(started(dgx1, text))
    assert of_job(dgx1, 70) == []
    assert _state_of(dgx1, first["allocation_ids"][0]) == "released"
    assert _state_of(dgx1, successor["allocation_ids"][0]) == "active"


def test_a_late_prolog_report_of_a_job_left_to_slurm_records_nothing(dgx1: TestClient) -> None:
    """No reservation was made for it: only its epilog's release by job id knows it ended."""
    _epilog(dgx1, 71)
    successor = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    _ignored(started(dgx1, show_job(71, EVERY_GPU, "node1")))
    assert of_job(dgx1, 71) == []
    assert _state_of(dgx1, successor["allocation_ids"][0]) == "active"


def test_a_prolog_report_after_the_reconcile_ended_the_job_records_nothing(
    dgx1: TestClient,
) -> None:
    first = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    text = show_job(72, EVERY_GPU, "node1", first["set"]["admin_comment"])
    squeue = {
        "jobs": [
            {
                "job_id": 72,
                "job_state": "COMPLETED",
                "user_name": "alice",
                "admin_comment": first["set"]["admin_comment"],
            }
        ]
    }
    app: Any = dgx1.app
    released = reconcile(app.state.service, SlurmSettings(reconcile_grace_s=60), squeue)
    assert released.released == first["allocation_ids"]
    successor = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    _ignored(started(dgx1, text))
    assert _state_of(dgx1, successor["allocation_ids"][0]) == "active"


def test_a_job_id_used_again_after_the_memory_is_recorded(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """Slurm job ids wrap, and start again on a new cluster: past the memory's window a
    job id is a new job's."""
    _epilog(dgx1, 73)
    app: Any = dgx1.app
    clock.advance(app.state.service.settings.ended_job_memory_s + 1)
    answer = started(dgx1, show_job(73, "gpu:2(IDX:0-1)", "node1"))
    assert answer["action"] == "created", answer
    assert len(of_job(dgx1, 73)) == 1


def test_a_job_id_used_again_by_a_job_with_a_live_reservation_is_recorded(
    dgx1: TestClient,
) -> None:
    """Within the window, a job whose reservation is live (a reset cluster's job 74
    placed by the filter) is not the ended one: its report is taken."""
    _epilog(dgx1, 74)
    decision = submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    gres = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in decision["gpu_indices"])
    answer = started(dgx1, show_job(74, gres, "node1", decision["set"]["admin_comment"]))
    assert answer["action"] == "attached", answer
    [allocation] = of_job(dgx1, 74)
    assert allocation["id"] == decision["allocation_ids"][0]
