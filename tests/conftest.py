"""Suite-wide defaults.

The service refuses to start without a token source (service/app.py); most
of the suite is about placement, nodes and schedulers, not about who may
call, so it runs the service with --insecure-dev unless a test says
otherwise. The API tests go through a real admin token instead
(tests/service/conftest.py ``client``), and the access tests
(tests/service/test_access_*.py, tests/service/grpc/test_auth.py) turn
insecure mode off explicitly.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOPOPLACE_INSECURE_DEV", "1")
# Starlette's TestClient names its host "testserver": a tokenless call for a host that
# is not loopback is refused in insecure mode (service/edge/dev_hosts.py).
os.environ.setdefault("TOPOPLACE_INSECURE_DEV_HOSTS", "testserver")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """The service runs on asyncio (uvicorn); anyio's tests would also run on trio
    wherever trio is installed, and selenium (the browser tests) brings it along."""
    return "asyncio"
