"""The harness itself: stopping a cluster leaves no daemon and no job process behind."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integrations.slurm.loopback import LoopbackCluster, Service


def test_stop_ends_every_daemon_and_every_running_job(tmp_path: Path, service: Service) -> None:
    cluster = LoopbackCluster(tmp_path, ["solo1"], service, with_filter=False)
    try:
        cluster.start()
        job = cluster.sbatch("--gpus=1", script="sleep 60")
        cluster.wait_state(job.id, ("RUNNING",))
        # slurmctld may call a job RUNNING a moment before slurmd has started its
        # slurmstepd: wait for the process itself, not for a fixed time.
        deadline = time.monotonic() + 15
        while not cluster._strays() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cluster._strays(), "a running job has a slurmstepd carrying the cluster's conf"
    finally:
        cluster.stop()
    assert {d.name for d in cluster.daemons} == {"munged", "slurmctld", "slurmd-solo1"}
    assert all(d.process.poll() is not None for d in cluster.daemons)
    assert cluster._strays() == []
