"""What the Slurm service tests share: two DGX-1 nodes, node1 and node2, reported."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.service.helpers import add_nodes


@pytest.fixture
def dgx1(client: TestClient) -> TestClient:
    add_nodes(client, ("dgx1-v100", "node1"), ("dgx1-v100", "node2"))
    return client
