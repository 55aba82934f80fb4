"""`topoplace sim` given hostile or clumsy input: one clear line and exit 2, or a bounded run."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from topoplace.cli import main
from topoplace.sim.fleet import parse_cluster
from topoplace.sim.jobs import Job
from topoplace.sim.policies import build_policies
from topoplace.sim.run import SAMPLES, SimResult, simulate

HEADER = "name,gpus,gpu_fraction,gpu_models,submit,duration\n"
ALIBABA = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,"
    "creation_time,scheduled_time,deletion_time\n"
)


def sim(trace: Path, *extra: str) -> int:
    return main(["sim", "--trace", str(trace), "--cluster", "1xdgx1-v100", "--no-progress", *extra])


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (HEADER + "a,1,,,inf,10\n", "submit"),
        (HEADER + "a,1,,,nan,10\n", "submit"),
        (HEADER + "a,1,,,-inf,10\n", "submit"),
        (HEADER + "a,1,,,0,nan\n", "duration"),
        (HEADER + "a,1,,,0,inf\n", "duration"),
        (ALIBABA + "a,1000,100,1,1000,,nan,1,5\n", "creation_time"),
        (ALIBABA + "a,1000,100,1,1000,,0,1,inf\n", "deletion_time"),
        (ALIBABA + "a,1000,100,1,1000,,0,nan,5\n", "scheduled_time"),
    ],
    ids=[
        "inf-submit",
        "nan-submit",
        "-inf-submit",
        "nan-duration",
        "inf-duration",
        "nan-creation",
        "inf-deletion",
        "nan-scheduled",
    ],
)
def test_a_time_that_is_not_a_finite_number_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, named: str
) -> None:
    # An infinite submit time made the timed replay spin forever past --max-seconds, and a
    # NaN one or a NaN duration was replayed with figures that meant nothing.
    trace = tmp_path / "jobs.csv"
    trace.write_text(text)
    assert sim(trace, "--max-seconds", "5") == 2
    err = capsys.readouterr().err
    assert f"{trace}: job 1 (a): {named} must be a finite number" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("seconds", ["nan", "inf"])
def test_max_seconds_must_be_a_finite_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seconds: str
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(HEADER + "a,1,,,0,10\n")
    assert sim(trace, "--max-seconds", seconds) == 2
    assert "--max-seconds must be" in capsys.readouterr().err


def test_a_tiny_positive_horizon_does_not_spin() -> None:
    # The last submit time 5e-324 made the sampling step 0: the sampling loop never ended.
    jobs = [Job("a", 1, 1000, (), 0.0, None), Job("b", 1, 1000, (), 5e-324, None)]
    nodes = parse_cluster("1xdgx1-v100")
    snaps = [n.snapshot for n in nodes]
    (policy,) = build_policies(["first-fit"], snaps, jobs)
    done: list[SimResult] = []
    worker = threading.Thread(
        target=lambda: done.append(simulate(policy, snaps, jobs, "timed", float("inf"))),
        daemon=True,
    )
    worker.start()
    worker.join(60)
    assert done, "the replay of two jobs did not end"
    assert done[0].started == 2 and len(done[0].timeline) <= SAMPLES + 2
