"""A share finer than a thousandth: counted rounded up, and the answer says what is held.

Rounded to the nearest thousandth and answered as asked, three shares of 0.3334 were
counted 333 each and put on one GPU, each told it held 0.3334: 1.0002 GPUs promised
on one GPU, for the node's runtime to enforce.
"""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import schema
from tests.service.helpers import add_nodes


def _pools(client: TestClient) -> list[int]:
    holds = schema.gpu_holds
    query = sa.select(holds.c.share_milli).where(holds.c.kind == "shared")
    with client.app.state.service.engine.connect() as conn:  # type: ignore[attr-defined]
        return sorted(int(m) for (m,) in conn.execute(query))


def test_shares_finer_than_a_thousandth_never_sum_past_a_gpu(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    told: dict[str, float] = {}
    for _ in range(3):
        response = client.post("/v1/place", json={"gpu_fraction": 0.3334})
        assert response.status_code == 201, response.text
        [task] = response.json()["tasks"]
        told[task["gpu_uuids"][0]] = told.get(task["gpu_uuids"][0], 0.0) + task["gpu_fraction"]
        assert task["gpu_fraction"] == 0.334  # what is counted, and what to enforce
    assert all(total <= 1.0 for total in told.values()), told
    assert len(told) == 2 and _pools(client) == [334, 668]


def test_a_share_that_counts_as_a_whole_gpu_is_refused(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    response = client.post("/v1/place", json={"gpu_fraction": 0.9995})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == "gpu_fraction"
    assert "gpus=1" in error["message"]
    assert _pools(client) == [] and client.get("/v1/cluster").json()["gpus"]["free"] == 8
    most = client.post("/v1/place", json={"gpu_fraction": 0.999})
    assert most.status_code == 201 and most.json()["tasks"][0]["gpu_fraction"] == 0.999
