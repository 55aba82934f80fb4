"""The federation tests' regions whose answers each test chooses (fake_regions.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.service.federation.fake_regions import PRICES, Regions, add_region, answering


@pytest.fixture
def regions(client: TestClient) -> Iterator[Regions]:
    fake = Regions()
    for name, price in PRICES.items():
        add_region(client, name, price)
        fake.answers[name] = answering(name)
    app: Any = client.app
    app.state.federation_client = httpx.AsyncClient(transport=httpx.MockTransport(fake.handle))
    yield fake
