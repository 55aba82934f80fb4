"""Slurm's truth (a GPU index, IDX) reported to a replica whose memory of the node is
behind the database's: the index is the GPU the stored snapshot gives it."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.helpers import add_nodes, report
from tests.service.slurm.test_truth import show_job, started

NEW = "GPU-00000000-0000-0000-0000-0000000000aa"


def test_a_job_started_on_a_replica_behind_holds_the_gpu_the_stored_snapshot_names(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    (snap,) = add_nodes(client, ("dgx1-v100", "node1"))
    app = create_app(secured(settings), clock=clock, background=False)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as behind:
        state: ServiceState = app.state.service
        # GPU 0 is replaced by another card, reported through the first replica.
        gpus = [g.model_copy(update={"uuid": NEW}) if g.index == 0 else g for g in snap.gpus]
        answer = report(client, snap.model_copy(update={"seq": snap.seq + 1, "gpus": gpus}))
        assert answer.status_code == 200, answer.text
        assert state.cluster.node("node1").snapshot.gpus[0].uuid == snap.gpus[0].uuid
        observed = started(behind, show_job(7, "gpu:1(IDX:0)"))
        allocation = behind.get(f"/v1/allocations/{observed['allocation_id']}").json()
        assert [t["gpu_uuids"] for t in allocation["tasks"]] == [[NEW]]
