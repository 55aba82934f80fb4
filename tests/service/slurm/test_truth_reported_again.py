"""Slurm's truth taken by a replica behind a node deleted and reported again under its
old seq with other GPUs (a board replaced, an agent started afresh).

Slurm names GPUs by index. The replica behind has not heard of the delete or of the
new report (its notification is on the way), so its memory maps an index to a UUID
the node no longer has; the seq alone matches the stored one again. The truth must
still hold the GPU the stored snapshot gives that index, never the gone one: else
that GPU stays free and another replica hands it out a second time.
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


@pytest.mark.parametrize("cordon", [False, True], ids=["uncordoned", "cordoned"])
def test_a_job_started_on_a_replica_behind_holds_the_new_gpu_at_its_index(
    settings: Settings, clock: FakeClock, cordon: bool
) -> None:
    old = build_profile("hgx-h100", "h0")
    new = build_profile("hgx-h100", "other").model_copy(update={"name": "h0"})
    assert old.seq == new.seq and {g.uuid for g in old.gpus}.isdisjoint(g.uuid for g in new.gpus)
    with replica(settings, clock) as first:
        assert report(first, old).status_code == 200
        with replica(settings, clock) as behind:
            assert first.delete("/v1/nodes/h0").status_code == 204
            clock.advance(1)
            assert report(first, new).status_code == 200
            if cordon:
                # What Slurm runs on a cordoned node is held all the same.
                assert first.post("/v1/nodes/h0/cordon").status_code == 200
            state: ServiceState = behind.app.state.service  # type: ignore[attr-defined]
            assert state.cluster.node("h0").snapshot.gpus[0].uuid == old.gpus[0].uuid
            observed = started(behind, show_job(7, "gpu:1(IDX:0)", nodes="h0"))
            assert observed["action"] == "created", observed
            allocation = behind.get(f"/v1/allocations/{observed['allocation_id']}").json()
            assert [t["gpu_uuids"] for t in allocation["tasks"]] == [[new.gpus[0].uuid]]
            assert held(behind) == {("h0", new.gpus[0].uuid)}
            if cordon:
                assert first.post("/v1/nodes/h0/uncordon").status_code == 200
            # GPU 0 is the job's: the first replica finds one GPU of eight taken.
            rest = first.post("/v1/place", json={"gpus": 8, "nodes": ["h0"]})
            assert rest.status_code == 409, rest.text


@pytest.mark.parametrize("cordoned_first", [False, True], ids=["cordon", "uncordon"])
def test_a_job_started_on_a_replica_behind_a_cordon_or_an_uncordon_isheld(
    settings: Settings, clock: FakeClock, cordoned_first: bool
) -> None:
    """The truth's holds name the cordon as memory had it: the stored one differs, so the
    commit fails, and the truth is taken again on the node read anew, cordoned or not."""
    snap = build_profile("hgx-h100", "h0")
    with replica(settings, clock) as first:
        assert report(first, snap).status_code == 200
        if cordoned_first:
            assert first.post("/v1/nodes/h0/cordon").status_code == 200
        with replica(settings, clock) as behind:
            flip = "uncordon" if cordoned_first else "cordon"
            assert first.post(f"/v1/nodes/h0/{flip}").status_code == 200
            state: ServiceState = behind.app.state.service  # type: ignore[attr-defined]
            assert ("h0" in state.cordoned) == cordoned_first  # it has not heard of it
            observed = started(behind, show_job(7, "gpu:1(IDX:0)", nodes="h0"))
            assert observed["action"] == "created", observed
            assert held(behind) == {("h0", snap.gpus[0].uuid)}
            assert ("h0" in state.cordoned) != cordoned_first  # it read the node again
