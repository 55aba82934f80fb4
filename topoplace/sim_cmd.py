"""`topoplace sim`: replay a job trace over a fleet, the engine against baselines.

The logic lives in ``topoplace.sim`` (jobs, fleet, policies, run, report);
this module is the command line: arguments, the progress bar, the time
bound and where the report goes. Exit status: 0 done (also when
``--max-seconds`` cut a run short: the report says so), 2 bad input.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from placement.workload_mix import WorkloadMixError, to_text
from topoplace.output_file import write_whole
from topoplace.sim.fleet import (
    FleetError,
    FleetNode,
    apply_what_if,
    describe,
    parse_cluster,
    snapshot_nodes,
    trace_nodes,
)
from topoplace.sim.jobs import TraceError, read_trace
from topoplace.sim.policies import ALL_POLICIES, build_policies, trace_mix
from topoplace.sim.report import causes, markdown, plot, text_table
from topoplace.sim.run import SimResult, simulate

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sim",
        help="replay a job trace over a fleet: the engine against baseline schedulers",
        description=(
            "Replay a job trace (Alibaba v2023 pod list, or our CSV/JSON format: see"
            " docs/sim.md) over a fleet through the real engine and baseline schedulers in"
            " simulated time; print tables, write a markdown report and plots."
        ),
    )
    p.add_argument("--trace", type=Path, required=True, help="job trace (.csv or .json)")
    fleet = p.add_mutually_exclusive_group(required=True)
    fleet.add_argument("--cluster", help="built-in profiles x counts: 100xdgx1-v100,8xgb200-nvl72")
    fleet.add_argument("--nodes", type=Path, help="an openb node list CSV (Alibaba trace nodes)")
    fleet.add_argument("--snapshots", type=Path, help="a `topoplace export` file")
    p.add_argument(
        "--what-if",
        action="append",
        default=[],
        metavar="CHANGE",
        help='a changed fleet to compare: "+8 gb200-nvl72", "-16 pcie-8x-l40s" (repeatable;'
        " all changes together make the second fleet)",
    )
    p.add_argument(
        "--mode",
        choices=["auto", "timed", "fill"],
        default="auto",
        help="timed: submit times and durations with a queue; fill: FGD's fill-until-full"
        " protocol; auto: timed when the trace has times (default)",
    )
    p.add_argument(
        "--policies",
        default=",".join(ALL_POLICIES),
        help=f"comma-separated, from {', '.join(ALL_POLICIES)} (default: all)",
    )
    p.add_argument(
        "--cpu-only-jobs",
        action="store_true",
        help="place the trace's jobs without GPUs too, on CPU and memory (default: counted and"
        " skipped; see docs/sim.md)",
    )
    p.add_argument("--max-seconds", type=float, default=300.0, help="bound on the whole run")
    p.add_argument("--limit", type=int, help="only the first N jobs of the trace")
    p.add_argument("--out", type=Path, help="directory for report.md and the plots")
    p.add_argument(
        "--write-mix",
        type=Path,
        metavar="FILE",
        help="write the workload mix the engine is given (the trace's sizes, CPU and memory"
        " per GPU, task types and model demand; after --limit) to FILE, for `topoplace serve"
        " --workload-mix FILE` (docs/sim.md)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


class Bar:
    """A one-line progress bar on a terminal; silent elsewhere."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self._last = -1

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        tenth = int(1000 * done / total)
        if tenth == self._last:
            return
        self._last = tenth
        width = 30
        filled = int(width * done / total)
        sys.stderr.write(
            f"\r{self.label:>24} [{'#' * filled}{'.' * (width - filled)}] {done / total:6.1%}"
        )
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _fleet(args: argparse.Namespace) -> list[FleetNode]:
    if args.cluster:
        return parse_cluster(args.cluster)
    if args.nodes:
        return trace_nodes(args.nodes)
    return snapshot_nodes(args.snapshots)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        if not 0 < args.max_seconds < math.inf:  # NaN too: it would bound nothing
            raise ValueError("--max-seconds must be a finite number of seconds, more than 0")
        if args.limit is not None and args.limit < 1:
            raise ValueError("--limit must be at least 1")
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        unknown = [p for p in policies if p not in ALL_POLICIES]
        if unknown or not policies:
            raise ValueError(
                f"--policies: unknown {', '.join(unknown) or '(none)'}; known: "
                + ", ".join(ALL_POLICIES)
            )
        if args.out is not None:
            # Before the replay, which may take --max-seconds: not after it.
            try:
                args.out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ValueError(
                    f"--out: cannot make the directory {args.out}: {exc.strerror}"
                ) from None
        trace = read_trace(args.trace)
        base = _fleet(args)
        fleets: list[tuple[str, list[FleetNode]]] = [("present fleet", base)]
        if args.what_if:
            changed = base
            for change in args.what_if:
                changed = apply_what_if(changed, change)
            fleets.append(("what if " + ", ".join(args.what_if), changed))
    except (TraceError, FleetError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    jobs = list(trace.jobs[: args.limit] if args.limit else trace.jobs)
    mode = args.mode if args.mode != "auto" else ("timed" if trace.timed else "fill")
    shares = sum(1 for j in jobs if j.gpus and j.milli < 1000)
    cpu_only = sum(1 for j in jobs if not j.gpus)
    gpu_jobs = len(jobs) - cpu_only
    if not args.cpu_only_jobs:
        jobs = [j for j in jobs if j.gpus]
    if args.write_mix is not None:
        # Before the replay, so that a run cut short still leaves the file; the mix is the
        # trace's alone (every fleet's engine gets the same one).
        try:
            write_whole(args.write_mix, to_text(trace_mix(jobs)))
        except WorkloadMixError as exc:
            print(f"error: --write-mix: the trace's mix: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except OSError as exc:
            print(
                f"error: --write-mix: cannot write {args.write_mix}: {exc.strerror}",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
    header = [
        f"trace: {args.trace.name}: {trace.rows} rows, {gpu_jobs} GPU jobs"
        f" ({shares} GPU shares), {cpu_only} CPU-only jobs"
        f" ({'placed' if args.cpu_only_jobs else 'skipped: --cpu-only-jobs places them'});"
        f" mode {mode}",
    ]
    deadline = started + args.max_seconds
    runs: list[tuple[str, list[SimResult]]] = []
    for label, nodes in fleets:
        header.append(f"{label}: {describe(nodes)}")
        snapshots = [n.snapshot for n in nodes]
        hosts = {n.snapshot.name: (n.cpu_milli, n.memory_mib) for n in nodes}
        cpu_capacity = sum(n.cpu_milli for n in nodes if n.cpu_milli is not None)
        results = []
        for policy in build_policies(policies, snapshots, jobs, hosts):
            bar = Bar(f"{label[:12]} {policy.name}", not args.no_progress)
            results.append(
                simulate(policy, snapshots, jobs, mode, deadline, bar, cpu_capacity or None)
            )
        runs.append((f"{label}: {describe(nodes)}", results))
    for line in header:
        print(line)
    for fleet, results in runs:
        print()
        print(fleet)
        for line in text_table(results):
            print(line)
        for line in causes(results):
            print(line)
    if any(r.truncated for _, results in runs for r in results):
        print(
            f"\n(cut short by --max-seconds {args.max_seconds:g}: figures cover the jobs"
            " replayed so far)"
        )
    if args.out is not None:
        report = args.out / "report.md"
        try:
            write_whole(report, markdown("topoplace sim", header, runs))
            written = plot(runs, args.out)
        except OSError as exc:
            print(
                f"error: --out: cannot write {exc.filename or report}: {exc.strerror}",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        if not written:
            print("(matplotlib not installed: no plots; `pip install topoplace[sim]`)")
        print(f"report: {args.out / 'report.md'}" + "".join(f", {p}" for p in written))
    print(f"({time.perf_counter() - started:.1f} s)")
    return EXIT_OK
