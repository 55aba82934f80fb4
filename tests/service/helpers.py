from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from placement import NodeSnapshot
from placement.profiles import build_profile


def report(client: TestClient, snap: NodeSnapshot) -> Any:
    return client.put(
        f"/v1/nodes/{snap.name}/snapshot", json={"snapshot": snap.model_dump(mode="json")}
    )


def add_nodes(client: TestClient, *specs: tuple[str, str]) -> list[NodeSnapshot]:
    snaps = [build_profile(profile, name) for profile, name in specs]
    for snap in snaps:
        response = report(client, snap)
        assert response.status_code == 200, response.text
    return snaps
