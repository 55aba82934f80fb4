"""`topoplace sim` on small traces: reports, what-if, modes, and the errors it names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topoplace.cli import main
from topoplace.sim.fleet import FleetError, apply_what_if, parse_cluster
from topoplace.sim.jobs import read_trace

TRACE = """name,gpus,gpu_fraction,gpu_models,submit,duration
a,8,,,0,100
b,4,,,1,50
c,1,0.5,,2,
d,1,0.5,,3,
e,2,,,4,10
f,8,,,5,20
g,1,,V100,6,5
"""


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text(TRACE)
    return path


def test_timed_replay_reports_every_policy(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    code = main(
        [
            "sim",
            "--trace",
            str(trace),
            "--cluster",
            "2xdgx1-v100",
            "--out",
            str(out),
            "--what-if",
            "+1 hgx-h100",
            "--no-progress",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "mode timed" in printed and "2 nodes, 16 GPUs" in printed
    for policy in ("topoplace", "first-fit", "best-fit", "best-effort", "slurm-greedy", "fgd"):
        assert any(line.split()[:1] == [policy] for line in printed.splitlines()), policy
    report = (out / "report.md").read_text()
    assert "## what if +1 hgx-h100: 3 nodes, 24 GPUs" in report
    assert (out / "allocation.png").exists() and (out / "fragmentation.svg").exists()


def test_fill_mode_finds_the_first_failure(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "sim",
            "--trace",
            str(trace),
            "--cluster",
            "1xdgx1-v100",
            "--mode",
            "fill",
            "--policies",
            "topoplace,first-fit",
            "--no-progress",
        ]
    )
    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "topoplace  " in line]
    assert lines, "no engine row"
    # 8 GPUs: job a takes all of them, job b (4 GPUs) is the first failure
    cells = lines[0].split()
    assert cells[3] == "1" and cells[4] == "0.0"


def test_gb200_racks_and_what_if_removal() -> None:
    nodes = parse_cluster("1xgb200-nvl72,3xpcie-8x-l40s")
    assert len(nodes) == 21
    assert len(apply_what_if(nodes, "-2 pcie-8x-l40s")) == 19
    assert len(apply_what_if(nodes, "-1 gb200-nvl72")) == 3
    with pytest.raises(FleetError, match="has 3 pcie-8x-l40s"):
        apply_what_if(nodes, "-4 pcie-8x-l40s")
    with pytest.raises(FleetError, match="unknown profile"):
        parse_cluster("2xnot-a-box")
    with pytest.raises(FleetError, match="COUNTxPROFILE"):
        parse_cluster("dgx1-v100")


def test_alibaba_rows_and_json_format(tmp_path: Path) -> None:
    ali = tmp_path / "pods.csv"
    ali.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
        "p0,1,1,1,460,,LS,Running,10,110,20\n"
        "p1,1,1,0,0,,LS,Running,5,50,5\n"
        "p2,1,1,2,1000,V100M16|T4,LS,Running,1,9,0\n"
    )
    trace = read_trace(ali)
    assert trace.timed and trace.cpu_only == 1 and trace.rows == 3
    p2, p1, p0 = trace.jobs  # the CPU-only pod is a job too: it takes CPU and memory
    assert (p1.gpus, p1.cpu_milli, p1.memory_mib) == (0, 1, 1)
    assert (p2.gpus, p2.models, p2.duration) == (2, ("V100M16", "T4"), 8.0)
    assert (p0.milli, p0.submit, p0.duration) == (460, 10.0, 90.0)
    ours = tmp_path / "jobs.json"
    ours.write_text(json.dumps({"jobs": [{"gpus": 1, "gpu_fraction": 0.25}]}))
    (job,) = read_trace(ours).jobs
    assert job.milli == 250 and job.duration is None and not read_trace(ours).timed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "2xdgx1-v100", "--policies", "magic"], "--policies: unknown magic"),
        (["--cluster", "2xdgx1-v100", "--max-seconds", "0"], "--max-seconds"),
        (["--cluster", "2xdgx1-v100", "--what-if", "*3 x"], "--what-if"),
        (["--snapshots", "/nonexistent.json"], "no such file"),
    ],
)
def test_cli_errors_exit_2(
    trace: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "--trace", str(trace), *args]) == 2
    assert message in capsys.readouterr().err


def test_missing_trace_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--trace", "/no/such.csv", "--cluster", "1xdgx1-v100"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_snapshots_export_round_trip(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from placement.profiles import build_profile

    path = tmp_path / "fleet.json"
    snaps = [build_profile("hgx-h100", f"h{i}").model_dump(mode="json") for i in range(2)]
    path.write_text(json.dumps({"nodes": snaps}))
    assert (
        main(
            [
                "sim",
                "--trace",
                str(trace),
                "--snapshots",
                str(path),
                "--no-progress",
                "--policies",
                "topoplace",
            ]
        )
        == 0
    )
    assert "2 nodes, 16 GPUs" in capsys.readouterr().out


def test_stranded_cliques_on_nvl72_racks() -> None:
    """A rack with free GPUs but no whole tray free is stranded; one whole tray is not."""
    from placement.workload_mix import WorkloadMix
    from topoplace.sim.jobs import Job
    from topoplace.sim.policies import EnginePolicy, SetTables
    from topoplace.sim.run import _Meter

    snaps = [n.snapshot for n in parse_cluster("1xgb200-nvl72")]
    jobs = [Job("j", 1, 1000, (), 0.0, None)]
    policy = EnginePolicy(snaps, WorkloadMix(size_mix={1: 1.0}), SetTables(snaps[:1]))
    for snap in snaps[1:]:
        policy.state.allocate(snap.name, [snap.gpus[0].uuid])
    assert _Meter(policy, snaps, jobs).stranded() == (0, 0)  # tray 0 is whole
    policy.state.allocate(snaps[0].name, [snaps[0].gpus[0].uuid])
    assert _Meter(policy, snaps, jobs).stranded() == (1, 54)


@pytest.mark.parametrize(("flag", "started"), [([], "0 of 0"), (["--cpu-only-jobs"], "1 of 1")])
def test_cpu_only_jobs_are_skipped_unless_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: list[str], started: str
) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("name,gpus,cpu_milli,memory_mib\ngpu,1,4000,1024\ncpu,0,2000,512\n")
    args = ["sim", "--trace", str(path), "--cluster", "1xdgx1-v100", "--mode", "timed"]
    assert main([*args, "--policies", "topoplace", "--no-progress", *flag]) == 0
    printed = capsys.readouterr().out
    assert "1 GPU jobs (0 GPU shares), 1 CPU-only jobs" in printed
    (row,) = [line for line in printed.splitlines() if line.split()[:1] == ["topoplace"]]
    assert started in row, row


@pytest.mark.parametrize(
    ("rows", "where", "named"),
    [
        ("a,1,,,0,\n", "missing/mix.json", "--write-mix: cannot write"),
        ("a,65,,,0,\n", "mix.json", "--write-mix: the trace's mix: size_mix['65']"),
    ],
)
def test_a_mix_that_cannot_be_written_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str, where: str, named: str
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(TRACE.splitlines()[0] + "\n" + rows)
    code = main(
        ["sim", "--trace", str(trace), "--cluster", "1xdgx1-v100", "--no-progress",
         "--write-mix", str(tmp_path / where)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and named in err and len(err.splitlines()) == 1
    assert not (tmp_path / where).exists()
