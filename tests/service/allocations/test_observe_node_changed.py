"""A scheduler's truth is recorded on the node snapshot the database holds.

The truth names GPUs by index (Slurm's IDX), mapped to UUIDs on the replica's
memory of the node. Another replica may have stored a newer snapshot meanwhile
(a GPU replaced, the indices renumbered): a mapping made on the old one must not
be recorded; the truth is mapped again on the stored snapshot.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement import NodeSnapshot
from service import schema
from service.allocations import api
from service.allocations.results import Observation
from service.allocations.schemas import PlaceRequest
from service.app import create_app
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock, secured
from tests.service.helpers import add_nodes, report


def _replaced(snap: NodeSnapshot, index: int, uuid: str) -> NodeSnapshot:
    """``snap`` one seq on, GPU ``index`` a new card (another UUID)."""
    gpus = [g.model_copy(update={"uuid": uuid}) if g.index == index else g for g in snap.gpus]
    return snap.model_copy(update={"seq": snap.seq + 1, "gpus": gpus})


def _held(state: ServiceState) -> set[str]:
    with state.engine.connect() as conn:
        rows = conn.execute(sa.select(schema.gpu_holds.c.device)).all()
    return {str(device) for (device,) in rows}


def test_a_replica_behind_a_snapshot_records_a_truth_on_the_stored_gpus(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    (snap,) = add_nodes(client, ("hgx-h100", "h0"))
    app = create_app(secured(settings), clock=clock, background=False)
    with TestClient(app):
        behind: ServiceState = app.state.service
        old = snap.gpus[0].uuid
        new = "GPU-00000000-0000-0000-0000-0000000000aa"
        answer = report(client, _replaced(snap, 0, new))  # through the first replica
        assert answer.status_code == 200, answer.text
        assert behind.cluster.node("h0").snapshot.gpus[0].uuid == old  # not heard of yet
        observation = api.observe(behind, "42", "slurm", {"h0": [0]}, [], "observed: Slurm")
        assert observation.action == "created"
        assert _held(behind) == {new}, "GPU 0 is the new card, as the database says"
        allocation = api.get(behind, observation.allocation_id)
        assert [list(t.gpu_uuids) for t in allocation.tasks] == [[new]]
        assert behind.cluster.node("h0").snapshot.seq == snap.seq + 1


def test_a_task_truth_mapped_on_a_replaced_snapshot_is_not_recorded(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    (snap,) = add_nodes(client, ("hgx-h100", "h0"))
    first: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    body = PlaceRequest.model_validate({"gpus": 1, "tasks": 2, "job_id": "gang"})
    placed = api.place(first, body, "k-gang")
    app = create_app(secured(settings), clock=clock, background=False)
    with TestClient(app):
        behind: ServiceState = app.state.service
        held = _held(behind)
        free = next(g.index for g in snap.gpus if g.uuid not in held)
        new = "GPU-00000000-0000-0000-0000-0000000000bb"
        answer = report(client, _replaced(snap, free, new))  # through the first replica
        assert answer.status_code == 200, answer.text
        reason = "observed: the kubelet"
        stale = api.task_truth(behind, placed.allocation.id, 0, "h0", [free], reason, job_id="gang")
        with pytest.raises(api.NodeChanged):
            api.observe_all(behind, [stale])
        assert _held(behind) == held, "nothing recorded on the replaced snapshot"
        # Named again on the snapshot now in memory: the GPU is the new card.
        again = api.task_truth(behind, placed.allocation.id, 0, "h0", [free], reason, job_id="gang")
        (answer_again,) = api.observe_all(behind, [again])
        assert isinstance(answer_again, Observation) and answer_again.action == "moved"
        assert new in _held(behind)
