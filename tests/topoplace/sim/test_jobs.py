"""Trace reading: CPU and memory per job, CPU-only jobs kept, bad amounts named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topoplace.cli import main
from topoplace.sim.jobs import TraceError, read_trace


def test_our_csv_reads_cpu_and_memory(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("name,gpus,cpu_milli,memory_mib\na,1,8000,16384\nb,2,,\nc,0,4000,1024\n")
    trace = read_trace(path)
    a, b, c = trace.jobs
    assert (a.cpu_milli, a.memory_mib) == (8000, 16384)
    assert (b.cpu_milli, b.memory_mib) == (0, 0)  # empty: not counted
    assert (c.gpus, c.cpu_milli, c.memory_mib) == (0, 4000, 1024)  # CPU-only: kept
    assert trace.cpu_only == 1 and trace.size_mix() == {1: 1, 2: 1}


def test_our_json_reads_cpu_milli(tmp_path: Path) -> None:
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps([{"name": "j", "gpus": 1, "cpu_milli": 2500}]))
    (job,) = read_trace(path).jobs
    assert (job.cpu_milli, job.memory_mib) == (2500, 0)


def test_alibaba_rows_keep_cpu_only_pods(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
        "p0,12000,16384,1,1000,,LS,Running,0,10,0\n"
        "p1,32000,49152,0,0,,LS,Running,1,5,1\n"
    )
    p0, p1 = read_trace(path).jobs
    assert (p0.gpus, p0.cpu_milli, p0.memory_mib) == (1, 12000, 16384)
    assert (p1.gpus, p1.cpu_milli, p1.memory_mib, p1.duration) == (0, 32000, 49152, 4.0)


AMOUNTS = "name,gpus,cpu_milli,memory_mib\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("name,gpus\nx,two\n", "job 1"),
        ("name,gpus,gpu_fraction\nx,2,0.5\n", "gpus must be 1"),
        ("name,gpus,gpu_fraction\nx,1,1.5\n", "between 0 and 1"),
        (AMOUNTS + "big,1,lots,\n", "job 1 \\(big\\): cpu_milli must be a whole .* not 'lots'"),
        (AMOUNTS + "neg,1,-5,\n", "job 1 \\(neg\\): cpu_milli must be a whole number >= 0"),
        (AMOUNTS + "half,1,1.5,\n", "job 1 \\(half\\): cpu_milli"),
        (AMOUNTS + "mem,1,1000,x\n", "job 1 \\(mem\\): memory_mib must be a whole number"),
    ],
)
def test_a_bad_trace_names_the_job(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_a_bad_cpu_milli_exits_2_naming_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("name,gpus,cpu_milli\nok,1,1000\ntrain-7,1,eight\n")
    assert main(["sim", "--trace", str(path), "--cluster", "1xdgx1-v100", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "job 2 (train-7)" in err and "cpu_milli" in err and "'eight'" in err
