"""The console's "recent decisions" queries, as the script sends them, against the API.

console.js asks GET /v1/audit for the latest placed and refused decisions and
falls back to the allocations on a 403; these are those exact queries, so a
change to the audit API that would break the console fails here, without a browser.
"""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from service.console.endpoints import STATIC
from tests.service.audit.test_audit_api import _as, _token
from tests.service.helpers import add_nodes


def _queries() -> list[str]:
    script = (STATIC / "console.js").read_text()
    [template] = re.findall(r"api\(`(v1/audit\?[^`]*)`\)", script)
    limit = re.search(r"const DECISIONS = (\d+);", script)
    assert limit is not None
    return [
        template.replace("${action}", a).replace("${DECISIONS}", limit[1])
        for a in ("placed", "refused")
    ]


def test_an_admin_gets_placed_and_refused_decisions_with_their_reasons(
    client: TestClient,
) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    assert client.post("/v1/place", json={"gpus": 2, "job_id": "fits"}).status_code == 201
    assert client.post("/v1/place", json={"gpus": 48, "job_id": "never"}).status_code == 422
    placed, refused = (client.get(q).json()["entries"] for q in _queries())
    assert [e["job_id"] for e in placed] == ["fits"]
    assert placed[0]["detail"]["placement"]["reason"]
    assert placed[0]["detail"]["placement"]["tasks"][0]["gpu_indices"]
    assert [e["job_id"] for e in refused] == ["never"]
    reason = refused[0]["detail"]["reasons"][0]
    assert {"cause", "message", "nodes"} <= set(reason)


def test_a_viewer_is_refused_so_the_console_falls_back(client: TestClient) -> None:
    _, viewer = _token(client, "viewer", "wall")
    for query in _queries():
        answer = client.get(query, headers=_as(viewer))
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"
