"""`topoplace sim` given hostile or clumsy input: one clear line and exit 2, or a bounded run."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from placement.model_demand import MAX_LISTS
from placement.task_mix import MAX_TYPES
from placement.workload_mix import parse
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


NODE_LIST = "sn,cpu_milli,memory_mib,gpu,model\n"


@pytest.mark.parametrize(
    ("fleet", "content", "named"),
    [
        ("--nodes", NODE_LIST, "no GPU nodes"),
        ("--snapshots", "[]", "no GPU nodes"),
        ("--snapshots", '{"nodes": []}', "no GPU nodes"),
        ("--nodes", NODE_LIST + "n1,1000,1000,8,V100M16\n" * 2, "node 'n1' is listed twice"),
    ],
    ids=["header-only-node-list", "empty-list", "empty-export", "duplicate-node"],
)
def test_a_fleet_of_no_nodes_or_a_name_twice_is_bad_input(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fleet: str,
    content: str,
    named: str,
) -> None:
    # No node failed inside the replay with a numpy TypeError traceback; a node listed
    # twice was one node to the engine and two to the baselines, compared as one fleet.
    trace = tmp_path / "jobs.csv"
    trace.write_text(HEADER + "a,1,,,0,10\n")
    path = tmp_path / "fleet"
    path.write_text(content)
    code = main(["sim", "--trace", str(trace), fleet, str(path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and f"{fleet}: {path}: {named}" in err and len(err.splitlines()) == 1


def test_a_what_if_that_removes_every_node_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(HEADER + "a,1,,,0,10\n")
    assert sim(trace, "--what-if", "-1 dgx1-v100") == 2
    err = capsys.readouterr().err
    assert "--what-if: '-1 dgx1-v100': no GPU nodes" in err and len(err.splitlines()) == 1


def test_two_what_ifs_adding_one_design_add_two_sets_of_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Both changes named their node whatif-dgx1-v100-0000: the engine got 2 nodes of the
    # 3 the report named, and started 2 of 3 8-GPU jobs where first-fit started 3.
    trace = tmp_path / "jobs.csv"
    trace.write_text(HEADER + "".join(f"j{i},8,,,{i},\n" for i in range(3)))
    code = sim(
        trace, "--what-if", "+1 dgx1-v100", "--what-if", "+1 dgx1-v100",
        "--mode", "fill", "--policies", "topoplace,first-fit",
    )  # fmt: skip
    assert code == 0
    what_if = capsys.readouterr().out.split("\nwhat if")[-1]
    assert "3 nodes, 24 GPUs" in what_if
    started = {
        cells[0]: cells[2]
        for cells in (line.split() for line in what_if.splitlines())
        if cells and cells[0] in ("topoplace", "first-fit")
    }
    assert started == {"topoplace": "3", "first-fit": "3"}


def test_a_trace_of_more_task_types_and_model_lists_than_the_engine_keeps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 300 CPU figures (task types) and 100 model lists: the engine's policy failed to build
    # with a ValueError traceback (at most 256 types, 64 model lists); --write-mix refused
    # the trace's mix. The engine keeps the most frequent, as when it observes requests.
    rows = "".join(f"j{i},1,,M{i % 100}|v100,{i},,{i + 1}\n" for i in range(300))
    trace = tmp_path / "jobs.csv"
    trace.write_text("name,gpus,gpu_fraction,gpu_models,submit,duration,cpu_milli\n" + rows)
    mix = tmp_path / "mix.json"
    code = sim(trace, "--policies", "topoplace", "--write-mix", str(mix))
    assert code == 0, capsys.readouterr().err
    written = parse(mix.read_text())
    assert written.task_mix is not None and len(written.task_mix) == MAX_TYPES
    assert written.model_demand is not None
    assert sum(written.model_demand.values()) == 300  # every GPU asked, in some list
    assert len([m for m in written.model_demand if m]) == MAX_LISTS


@pytest.mark.parametrize("option", ["--trace", "--nodes", "--snapshots"])
@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda p: p.mkdir(), "a directory, not a file"),
        (lambda p: p.write_bytes(b"gpus\n\xff\xfe1\n"), "not UTF-8 text (byte 5 is 0xff)"),
    ],
    ids=["directory", "not-utf8"],
)
def test_an_unreadable_input_file_is_one_line_naming_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    option: str,
    make: Callable[[Path], object],
    named: str,
) -> None:
    # A directory ended in an IsADirectoryError traceback (exit 1); bytes that are not
    # UTF-8 printed "error: 'utf-8' codec can't decode byte 0xff..." naming no file.
    trace = tmp_path / "jobs.csv"
    trace.write_text(HEADER + "a,1,,,0,10\n")
    bad = tmp_path / "bad"
    make(bad)
    args = {"--trace": str(trace), "--cluster": "1xdgx1-v100"}
    if option == "--trace":
        args["--trace"] = str(bad)
    else:
        del args["--cluster"]
        args[option] = str(bad)
    code = main(["sim", "--no-progress", *(x for kv in args.items() for x in kv)])
    err = capsys.readouterr().err
    assert code == 2 and f"{bad}: {named}" in err and len(err.splitlines()) == 1
    if option != "--trace":
        assert err.startswith(f"error: {option}: ")


def test_a_spreadsheet_csv_with_a_byte_order_mark_reads_its_first_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_bytes(b"\xef\xbb\xbfgpus,submit,duration\n2,0,10\n")
    assert sim(trace) == 0
    assert "1 GPU jobs" in capsys.readouterr().out


def test_an_out_that_is_a_file_is_refused_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Was: the whole replay, its tables printed, then a FileExistsError traceback, exit 1.
    trace = tmp_path / "jobs.csv"
    trace.write_text(HEADER + "a,1,,,0,10\n")
    out = tmp_path / "report"
    out.write_text("")
    assert sim(trace, "--out", str(out)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: --out: cannot make the directory {out}: File exists\n"


def _small_file_limit() -> None:
    # Writes past 1 KiB fail with EFBIG, as on a full disk (SIGXFSZ ignored: an error).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))


@pytest.mark.parametrize("written", ["allocation.png", "mix.json"])
def test_a_plot_or_mix_that_cannot_be_written_whole_leaves_the_old_one(
    tmp_path: Path, written: str
) -> None:
    # Was: the plot or the mix truncated to its first 1024 bytes and an OSError
    # traceback ([Errno 27] File too large), exit 1.
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "name,gpus,submit,duration,cpu_milli\n"
        + "".join(f"j{i},1,{i},5,{1000 + i}\n" for i in range(200))
    )
    out = tmp_path / "out"
    out.mkdir()
    target = out / written
    target.write_text("old\n")
    option = ["--out", str(out)] if written.endswith(".png") else ["--write-mix", str(target)]
    result = subprocess.run(
        [sys.executable, "-m", "topoplace", "sim", "--trace", str(trace), "--cluster",
         "1xdgx1-v100", "--no-progress", "--policies", "first-fit", *option],
        capture_output=True, text=True, preexec_fn=_small_file_limit, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.endswith(f"cannot write {target}: File too large\n")
    assert target.read_text() == "old\n"
    assert {p.name for p in out.iterdir()} <= {written, "report.md"}


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("--cluster", "100000000xdgx1-v100", "--cluster: '100000000xdgx1-v100': 100000000 nodes"),
        ("--what-if", "+6000 gb200-nvl72", "--what-if: '+6000 gb200-nvl72': 108001 nodes"),
    ],
    ids=["cluster", "what-if"],
)
def test_a_fleet_too_large_to_build_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, named: str
) -> None:
    # Was: building 100,000,000 DGX-1 snapshots, days past --max-seconds and out of memory.
    trace = tmp_path / "jobs.csv"
    trace.write_text(HEADER + "a,1,,,0,10\n")
    args = ["--cluster", "1xdgx1-v100"] if option == "--what-if" else []
    code = main(["sim", "--trace", str(trace), "--no-progress", *args, option, value])
    err = capsys.readouterr().err
    assert code == 2 and named in err and "at most 100000" in err
