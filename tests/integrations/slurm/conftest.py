"""Fixtures for the Slurm integration suite: the service and a loopback cluster.

The suite needs Debian's Slurm packages and root. Without them it is skipped
with a message saying what is missing, unless TOPOPLACE_REQUIRE_SLURM=1 (CI
sets it after installing them), when that is a failure instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integrations.slurm.loopback import LoopbackCluster, Service, missing_prerequisites

NODES = ("node1", "node2", "node3")
PROFILE = "dgx1-v100"  # the DGX-1 hybrid cube-mesh: two fully connected NVLink quads
INTERVAL_S = 10  # the default backstop; the prolog and fresh reservations do not wait for it
GRACE_S = 0.5  # the default: an orphan reservation goes soon after the timeout


@pytest.fixture(scope="session", autouse=True)
def _prerequisites() -> None:
    why = missing_prerequisites()
    if why is None:
        return
    message = f"Slurm integration tests need a loopback Slurm cluster: {why}"
    if os.environ.get("TOPOPLACE_REQUIRE_SLURM") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="package")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slurm")


@pytest.fixture(scope="package")
def service(root: Path) -> Iterator[Service]:
    svc = Service(
        root,
        {
            # The reconcile loop reads this cluster's squeue.
            "SLURM_CONF": str(root / "slurm.conf"),
            "TOPOPLACE_SLURM_SQUEUE_COMMAND": "squeue --json",
            "TOPOPLACE_SLURM_RECONCILE_INTERVAL_S": str(INTERVAL_S),
            "TOPOPLACE_SLURM_RECONCILE_GRACE_S": str(GRACE_S),
            # ... and its sinfo, for the nodes Slurm starts no job on (every second).
            "TOPOPLACE_SLURM_SINFO_COMMAND": "sinfo --json",
        },
    )
    try:
        svc.start()
        svc.report(PROFILE, [*NODES, "solo1"])
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="package")
def cluster(root: Path, service: Service) -> Iterator[LoopbackCluster]:
    """node1-3 with the filter, the epilog and cli_filter."""
    loop = LoopbackCluster(root, NODES, service, with_filter=True)
    try:
        loop.start()
        yield loop
    finally:
        loop.stop()


@pytest.fixture
def slurm_alone(tmp_path: Path, service: Service) -> Iterator[LoopbackCluster]:
    """One node, solo1, with no filter: Slurm's own choices."""
    loop = LoopbackCluster(tmp_path, ["solo1"], service, with_filter=False)
    try:
        loop.start()
        yield loop
    finally:
        loop.stop()


@pytest.fixture
def jobs(cluster: LoopbackCluster) -> Iterator[list[str]]:
    """Job ids a test started; cancelled at its end so every test starts on idle nodes."""
    started: list[str] = []
    yield started
    if started:
        cluster.run("scancel", *started)
        for job in started:
            cluster.wait_state(job, ("CANCELLED", "COMPLETED", "FAILED"), timeout_s=20)
