"""Every method of the gRPC API, against a running server, on SQLite and Postgres."""

from __future__ import annotations

import orjson

from service.allocations import api
from service.allocations.encoding import allocation_json
from service.allocations.schemas import AllocationView
from service.grpc import convert
from service.grpc.gen import topoplace_pb2 as pb
from tests.service.conftest import FakeClock
from tests.service.grpc.conftest import Running, snapshot_request


def test_nodes_report_heartbeat_list_and_get(running: Running, clock: FakeClock) -> None:
    accepted = running.stub.ReportSnapshot(snapshot_request("dgx1-v100", "dgx0"))
    assert (accepted.node, accepted.seq, accepted.changed) == ("dgx0", 1, True)
    again = running.stub.ReportSnapshot(snapshot_request("dgx1-v100", "dgx0"))
    assert not again.changed
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))

    clock.advance(30)
    running.stub.Heartbeat(pb.HeartbeatRequest(node="h0"))
    node = running.stub.GetNode(pb.GetNodeRequest(name="h0"))
    assert node.heartbeat_at.ToDatetime().replace(tzinfo=clock.now.tzinfo) == clock.now
    assert node.state == "ready" and node.gpu_count == 8 and list(node.free_gpus) == list(range(8))
    assert [g.index for g in node.gpus] == list(range(8)) and node.gpus[0].uuid

    listed = running.stub.ListNodes(pb.ListNodesRequest())
    assert sorted(n.name for n in listed.nodes) == ["dgx0", "h0"]
    # The same views as REST, field by field.
    rest = running.rest.get("/v1/nodes/dgx0").json()
    grpc_node = running.stub.GetNode(pb.GetNodeRequest(name="dgx0"))
    assert list(grpc_node.free_gpus) == rest["free_gpus"]
    assert [i.name for i in grpc_node.islands] == [i["name"] for i in rest["islands"]]
    assert grpc_node.seq == rest["seq"] and grpc_node.state == rest["state"]


def test_pcie_groups_have_their_kind_as_in_rest(running: Running) -> None:
    running.stub.ReportSnapshot(snapshot_request("pcie-8x-l40s", "l0"))
    grpc_node = running.stub.GetNode(pb.GetNodeRequest(name="l0"))
    rest = running.rest.get("/v1/nodes/l0").json()
    assert [(i.name, i.kind, list(i.gpus)) for i in grpc_node.islands] == [
        (i["name"], i["kind"], i["gpus"]) for i in rest["islands"]
    ]
    assert [i.kind for i in grpc_node.islands] == ["pcie", "pcie"]


def test_place_score_and_the_allocation_lifecycle(running: Running, clock: FakeClock) -> None:
    running.stub.ReportSnapshot(snapshot_request("dgx1-v100", "dgx0"))
    placed = running.stub.Place(pb.PlaceRequest(gpus=4, job_id="j1", owner="ana"))
    assert placed.state == "pending" and placed.job_id == "j1" and placed.owner == "ana"
    task = placed.tasks[0]
    assert list(task.gpu_indices) in ([0, 1, 2, 3], [4, 5, 6, 7])
    assert task.env["CUDA_VISIBLE_DEVICES"] == ",".join(task.gpu_uuids)
    assert task.score.ring_gbps == 25.0
    # The message carries what REST shows for the same allocation.
    rest = running.rest.get(f"/v1/allocations/{placed.id}").json()
    assert AllocationView.model_validate(rest).tasks[0].gpu_uuids == list(task.gpu_uuids)
    # Both encode one typed allocation, each at its own edge.
    typed = api.get(running.state, placed.id)
    assert convert.allocation(typed) == placed and orjson.loads(allocation_json(typed)) == rest

    scored = running.stub.Score(pb.ScoreRequest(gpus=4, nodes=pb.NodeNames(names=["dgx0"])))
    assert [(n.node, n.fits, n.rank) for n in scored.nodes] == [("dgx0", True, 1)]
    assert list(scored.nodes[0].task.gpu_indices) != list(task.gpu_indices)
    assert not running.stub.Score(pb.ScoreRequest(gpus=4, nodes=pb.NodeNames())).nodes

    got = running.stub.GetAllocation(pb.GetAllocationRequest(id=placed.id))
    assert got == placed
    second = running.stub.Place(pb.PlaceRequest(gpus=2, job_id="j2", ttl_s=30))
    listed = running.stub.ListAllocations(pb.ListAllocationsRequest(job_id="j1"))
    assert [a.id for a in listed.allocations] == [placed.id]
    everything = running.stub.ListAllocations(pb.ListAllocationsRequest(state="pending", limit=5))
    assert {a.id for a in everything.allocations} == {placed.id, second.id}

    confirmed = running.stub.ConfirmAllocation(pb.ConfirmAllocationRequest(id=placed.id))
    assert confirmed.state == "active" and not confirmed.HasField("expires_at")
    extended = running.stub.ExtendAllocation(pb.ExtendAllocationRequest(id=second.id, ttl_s=600))
    assert extended.expires_at.ToDatetime() > second.expires_at.ToDatetime()

    released = running.stub.ReleaseAllocation(pb.ReleaseAllocationRequest(id=second.id))
    assert list(released.released) == [second.id]
    by_job = running.stub.ReleaseJob(pb.ReleaseJobRequest(job_id="j1"))
    assert list(by_job.released) == [placed.id]
    node = running.stub.GetNode(pb.GetNodeRequest(name="dgx0"))
    assert len(node.free_gpus) == 8 and not node.allocations
    gone = running.stub.GetAllocation(pb.GetAllocationRequest(id=placed.id))
    assert gone.state == "released" and gone.HasField("ended_at")


def test_every_request_field_reaches_the_engine(running: Running) -> None:
    running.stub.ReportSnapshot(snapshot_request("dgx1-v100", "dgx0"))
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    request = pb.PlaceRequest(
        gpus=2,
        tasks=2,
        locality="nvlink",
        policy="spread",
        objective="balanced",
        max_ring_loss=0.25,
        numa="ignore",
        cpus_per_task=0,
        gpu_models=["H100"],
        min_gpu_memory_mib=1024,
        regions=[],
        exclude_nodes=["dgx0"],
        job_id="gang",
        owner="ops",
        ttl_s=60,
    )
    placed = running.stub.Place(request)
    assert {t.node for t in placed.tasks} == {"h0"} and len(placed.tasks) == 2
    stored = running.rest.get(f"/v1/allocations/{placed.id}").json()
    assert stored["owner"] == "ops"
    refused = running.stub.Score(pb.ScoreRequest(gpus=1, node_labels={"zone": "nowhere"}))
    assert not any(n.fits for n in refused.nodes)
    assert {n.cause for n in refused.nodes} == {"labels"}


def test_a_heartbeat_carries_nvlink_counters_as_rest_does(
    running: Running, clock: FakeClock
) -> None:
    running.stub.ReportSnapshot(snapshot_request("dgx1-v100", "dgx0"))
    report = '{"nvlink": [{"gpu": 1, "link": 2, "tx_bytes": 5, "replay_errors": 3}]}'
    clock.advance(30)
    running.stub.Heartbeat(pb.HeartbeatRequest(node="dgx0", report_json=report))
    view = running.rest.get("/v1/nodes/dgx0/nvlink").json()
    assert [(e["gpu"], e["link"], e["tx_bytes"], e["replay_errors"]) for e in view["links"]] == [
        (1, 2, 5, 3)
    ]
    node = running.stub.GetNode(pb.GetNodeRequest(name="dgx0"))
    assert node.heartbeat_at.ToDatetime().replace(tzinfo=clock.now.tzinfo) == clock.now


def test_a_job_released_by_job_id_is_remembered_as_ended(running: Running) -> None:
    """ReleaseJob says the job ended, as REST's release by job id does (a Slurm epilog):
    a prolog report of its start processed after it records nothing (docs/slurm.md)."""
    from tests.service.slurm.test_truth import show_job

    running.stub.ReportSnapshot(snapshot_request("dgx1-v100", "dgx0"))
    assert list(running.stub.ReleaseJob(pb.ReleaseJobRequest(job_id="80")).released) == []
    text = show_job(80, "gpu:2(IDX:0-1)", "dgx0")
    answer = running.rest.post(
        "/v1/slurm/job-started", json={"show_job": text, "job_name": "train"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["action"] == "none" and "ended" in answer.json()["message"]
    assert running.rest.get("/v1/allocations").json()["allocations"] == []
