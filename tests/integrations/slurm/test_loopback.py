"""The harness itself: stopping a cluster leaves no daemon and no job process behind."""

from __future__ import annotations

from pathlib import Path

from tests.integrations.slurm.loopback import LoopbackCluster, Service


def test_stop_ends_every_daemon_and_every_running_job(tmp_path: Path, service: Service) -> None:
    cluster = LoopbackCluster(tmp_path, ["solo1"], service, with_filter=False)
    try:
        cluster.start()
        job = cluster.sbatch("--gpus=1", script="echo started; sleep 60")
        # slurmctld may call a job RUNNING before slurmd has started its slurmstepd;
        # the job's own first line means the step and the job process both exist.
        cluster.wait_output(job.id, "started", timeout_s=60)
        assert cluster._strays(), "a running job has a slurmstepd carrying the cluster's conf"
    finally:
        cluster.stop()
    assert {d.name for d in cluster.daemons} == {"munged", "slurmctld", "slurmd-solo1"}
    assert all(d.process.poll() is not None for d in cluster.daemons)
    assert cluster._strays() == []
