"""`topoplace plan` as a user runs it: a real process, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from placement.profiles import build_profile
from topoplace_client.samples import sample_names, sample_text


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "topoplace", "plan", *args], capture_output=True, text=True
    )


@pytest.fixture
def dgx1_file(tmp_path: Path) -> Path:
    """The shipped DGX-1 sample, as a user's file."""
    path = tmp_path / "dgx1.txt"
    path.write_text(sample_text("dgx1-v100"), encoding="utf-8")
    return path


def test_plan_on_a_sample_by_name() -> None:
    proc = run("--topology", "pcie-8x-l40s", "--gpus", "4", "--cpus", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["gpus"] == [0, 1, 2, 3] and "NUMA 0" in out["reason"]
    assert "give --model MODEL" in proc.stderr
    given = run("--topology", "pcie-8x-l40s", "--gpus", "4", "--model", "NVIDIA L40S")
    assert given.returncode == 0 and given.stderr == ""
    proc = run("--topology", "no-such-sample", "--gpus", "1")
    assert proc.returncode == 2 and "sample name: dgx1-v100" in proc.stderr


def test_samples_lists_and_prints() -> None:
    samples = [sys.executable, "-m", "topoplace", "samples"]
    listed = subprocess.run(samples, capture_output=True, text=True, check=True).stdout
    assert [line.split()[0] for line in listed.splitlines()] == sample_names()
    shown = subprocess.run([*samples, "hgx-h100"], capture_output=True, text=True, check=True)
    assert shown.stdout == sample_text("hgx-h100")
    missing = subprocess.run([*samples, "nope"], capture_output=True, text=True)
    assert missing.returncode == 2 and "samples: dgx1-v100" in missing.stderr


def test_plan_json_on_real_topology(dgx1_file: Path) -> None:
    proc = run("--topology", str(dgx1_file), "--gpus", "4", "--busy", "1,4", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["gpus"] == [2, 3, 6, 7]
    assert out["ring_gbps"] == 25.0 and out["pair_sum_gbps"] == 166.0
    assert "NVLink-connected" in out["reason"]


def test_plan_on_snapshot_json(tmp_path: Path) -> None:
    path = tmp_path / "h100.json"
    path.write_text(build_profile("hgx-h100", "h").model_dump_json())
    proc = run("--topology", str(path), "--gpus", "4", "--cpus", "2")
    assert proc.returncode == 0, proc.stderr
    assert "ring:      450 GB/s" in proc.stdout and "cpuset:    0-1" in proc.stdout


def test_unschedulable_exits_nonzero_with_reason(dgx1_file: Path) -> None:
    proc = run("--topology", str(dgx1_file), "--gpus", "3", "--busy", "0,1,2,3,4,5")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "unschedulable: 1 node: fewer than 3 GPUs free"


def test_bad_input_names_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV9\t X \n")
    proc = run("--topology", str(bad), "--gpus", "2")
    assert proc.returncode == 2 and "line 3" in proc.stderr
    assert run("--profile", "nope", "--gpus", "1").returncode == 2
    proc = run("--profile", "hgx-h100", "--gpus", "1", "--busy", "9")
    assert proc.returncode == 2 and "--busy" in proc.stderr
    proc = run("--profile", "hgx-h100", "--gpus", "0")
    assert proc.returncode == 2 and "greater than or equal to 1" in proc.stderr


def test_profiles_command_lists_and_renders() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "topoplace", "profiles"], capture_output=True, text=True, check=True
    ).stdout
    assert "gb200-tray" in out and "riscv-nvlfusion-4" in out
    topo = subprocess.run(
        [sys.executable, "-m", "topoplace", "profiles", "workstation-2x-a6000"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "NV4" in topo
