"""A scheduler's truth (a Slurm job's GRES, the kubelet's devices of a pod) names whole
GPUs: a job said to run on a GPU it holds a share of holds that GPU whole from then on.

Matched as it was (its share and the GPU's other shares kept), the GPU the scheduler
gave the job alone kept taking new shares; a job with no allocation said to run there
already superseded those shares. Both truths now end the same way.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import schema
from service.allocations import api
from service.state import ServiceState
from tests.service.helpers import add_nodes


def _share(client: TestClient, fraction: float, job_id: str) -> dict[str, Any]:
    response = client.post("/v1/place", json={"gpu_fraction": fraction, "job_id": job_id})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def _pools(state: ServiceState) -> dict[str, int]:
    holds = schema.gpu_holds
    query = sa.select(holds.c.device, holds.c.share_milli).where(holds.c.kind == "shared")
    with state.engine.connect() as conn:
        return {str(d): int(m) for d, m in conn.execute(query)}


def test_a_job_said_to_run_on_its_shared_gpu_holds_it_whole(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    mine, other = _share(client, 0.25, "J"), _share(client, 0.25, "K")
    [index] = mine["tasks"][0]["gpu_indices"]
    [uuid] = mine["tasks"][0]["gpu_uuids"]
    assert other["tasks"][0]["gpu_uuids"] == [uuid]  # the tightest fit: the same GPU

    seen = api.observe(state, "J", "alice", {"dgx0": [index]}, [], "slurm prolog", started=True)

    assert seen.action == "moved" and seen.allocation_id == mine["id"], seen
    assert seen.superseded == (other["id"],)
    job = client.get(f"/v1/allocations/{mine['id']}").json()
    assert job["tasks"][0]["gpu_uuids"] == [uuid] and job["tasks"][0]["gpu_fraction"] is None
    assert client.get(f"/v1/allocations/{other['id']}").json()["state"] == "released"
    assert _pools(state) == {}
    gpus = client.get("/v1/cluster").json()["gpus"]
    assert gpus["shared"] == 0 and gpus["free"] == 7, gpus
    # The GPU is the job's alone: the next share opens another.
    assert _share(client, 0.5, "L")["tasks"][0]["gpu_uuids"] != [uuid]
    again = api.observe(state, "J", "alice", {"dgx0": [index]}, [], "slurm prolog", started=True)
    assert again.action == "matched"
