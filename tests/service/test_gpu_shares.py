"""The service refuses GPU shares (gpu_fraction) with 422 unsupported: no share holds yet."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.service.helpers import add_nodes


def test_place_and_score_refuse_shares_and_hold_nothing(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    for path in ("/v1/place", "/v1/score"):
        response = client.post(path, json={"gpu_fraction": 0.25})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "unsupported"
        assert "does not reserve them yet" in error["message"]
        assert error["detail"] == {"field": "gpu_fraction"}
    view = client.get("/v1/cluster").json()
    assert view["gpus"]["free"] == 8 and view["gpus"]["shared"] == 0
    assert view["allocations"] == {}
    bad = client.post("/v1/place", json={"gpu_fraction": 0.5, "gpus": 2})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
