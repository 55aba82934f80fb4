"""Placement quality: the engine against first-fit and go-gpuallocator best effort.

Run ``python -m bench.quality`` (a few minutes on two cores) or
``python -m bench.quality --quick`` (a smoke run, well under a minute). It
prints; it asserts nothing about timings. Two measurements:

1. Fragmented nodes. Random free sets on single nodes of several designs;
   for every feasible k >= 2, the predicted ring bandwidth (the class's
   ``ring[mask]``, the same number the engine reports) of the engine's set,
   the first-fit set and the best-effort set. The engine's set maximises
   ring by construction, so "engine >= baseline" must hold in 100% of cases;
   the report prints that share rather than assuming it.
2. Trace replay. The Alibaba 2023 GPU trace (see ``bench.trace``) replayed on
   the trace's cluster, pods in file order, nothing ever released: the
   standard "fill until the first failure" measure. The whole-GPU pods of a
   pod list ask for fewer GPUs than the cluster has (the default list: 4,355
   of 6,212), so the list is replayed again from its start until a pod
   cannot be placed, as the FGD paper inflates the workload until the
   cluster is full. After the first failure the replay goes on to the end of
   that pass, skipping pods that do not fit, for a secondary number: GPUs
   allocated at the end.

Every set's ring bandwidth and NVLink connectivity are read from the node
class's tables for all three allocators, so the numbers are comparable; the
engine's own reported values are checked against them.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.baselines import (
    EXACT_PARTITION_LIMIT,
    BaselineCluster,
    first_fit,
    partition_best_effort,
    place_best_effort,
    place_first_fit,
)
from bench.machine import describe
from bench.trace import DEFAULT_TRACE_DIR, NODE_FILE, Pod, build_cluster, read_nodes, read_pods
from placement import ClusterState, NodeSnapshot, PlacementRequest
from placement.bandwidth import DEFAULT_BANDWIDTH
from placement.node_choice import NO_SET, SetQuery, best_set, indices_to_mask
from placement.profiles import build_profile
from placement.topology_class import TopologyClass, Wiring, build_class, wiring_of

FILLS = (0.5, 0.7, 0.9)
FRAGMENT_PROFILES = ("dgx1-v100", "hgx-h100", "pcie-8x-l40s", "two-island-16", "dgx-a100")
ALLOCATORS = ("engine", "first-fit", "best-effort")
TRACES = ("default", "multigpu50")
QUICK_SAMPLES, FULL_SAMPLES = 60, 2000
QUICK_POD_ROWS = 2000


# Designs ----------------------------------------------------------------------


def two_island_wiring() -> Wiring:
    """A 16-GPU node of two 8-GPU NVSwitch islands joined only over PCIe.

    Inside an island every pair is NVS12 (12 lanes x 25 GB/s = 300 GB/s,
    A100-class), across islands SYS (8 GB/s); island i sits on NUMA node i.
    This is the shape where a topology-blind choice hurts most: a set that
    straddles the islands rings at PCIe speed.
    """
    n = 16
    island = np.arange(n) // 8
    same = island[:, None] == island[None, :]
    off_diagonal = ~np.eye(n, dtype=np.bool_)
    bw = np.where(same, 300.0, 8.0) * off_diagonal
    return Wiring(bw=bw, nvlink=same & off_diagonal, gpu_numa=tuple(int(i) for i in island))


def design_classes(names: Sequence[str] = FRAGMENT_PROFILES) -> dict[str, TopologyClass]:
    out: dict[str, TopologyClass] = {}
    for name in names:
        if name == "two-island-16":
            wiring = two_island_wiring()
        else:
            wiring = wiring_of(build_profile(name, "bench-node"), DEFAULT_BANDWIDTH)
        out[name] = build_class(wiring)
    return out


# 1. Fragmented nodes ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RingCase:
    design: str
    fill: float
    k: int
    free: int  # GPUs free on the node
    engine: float
    first_fit: float
    best_effort: float


def fragmented_cases(
    classes: dict[str, TopologyClass],
    fills: Sequence[float] = FILLS,
    samples: int = FULL_SAMPLES,
    seed: int = 7,
) -> list[RingCase]:
    """Ring bandwidth of each allocator's choice on random fragmented nodes.

    Each GPU is busy independently with probability ``fill``, so a fill
    level gives a spread of free counts around its mean (with an exact busy
    count, 90% of an 8-GPU node would always leave one GPU: no case at all).
    Every k from 2 to the number of free GPUs is one case.
    """
    rng = np.random.default_rng(seed)
    cases: list[RingCase] = []
    for design, tc in classes.items():
        n = tc.n
        best_effort_memo: dict[tuple[int, int], tuple[int, ...] | None] = {}
        for fill in fills:
            busy = rng.random((samples, n)) < fill
            for row in busy:
                free_idx = [i for i in range(n) if not row[i]]
                free = indices_to_mask(free_idx)
                for k in range(2, len(free_idx) + 1):
                    engine = best_set(tc, free, SetQuery(k=k))
                    ff = first_fit(free_idx, k)
                    key = (free, k)
                    if key not in best_effort_memo:
                        best_effort_memo[key] = partition_best_effort(tc.wiring.bw, free_idx, k)
                    be = best_effort_memo[key]
                    if engine == NO_SET or ff is None or be is None:
                        continue  # k <= free GPUs and no hard constraint: cannot happen
                    cases.append(
                        RingCase(
                            design=design,
                            fill=fill,
                            k=k,
                            free=len(free_idx),
                            engine=float(tc.ring[engine]),
                            first_fit=float(tc.ring[indices_to_mask(ff)]),
                            best_effort=float(tc.ring[indices_to_mask(be)]),
                        )
                    )
    return cases


@dataclass(frozen=True, slots=True)
class RingSummary:
    label: str
    cases: int
    engine: float  # mean ring, GB/s
    first_fit: float
    best_effort: float
    ge_first_fit: float  # share of cases with engine >= first-fit
    ge_best_effort: float
    gt_first_fit: float  # share with engine strictly better
    gt_best_effort: float
    greedy: int  # cases where best effort used its greedy fallback

    @property
    def ratio_first_fit(self) -> float:
        return _ratio(self.engine, self.first_fit)

    @property
    def ratio_best_effort(self) -> float:
        return _ratio(self.engine, self.best_effort)


def summarize(label: str, cases: Sequence[RingCase]) -> RingSummary:
    if not cases:
        return RingSummary(label, 0, *(float("nan"),) * 7, 0)
    e = np.array([c.engine for c in cases])
    f = np.array([c.first_fit for c in cases])
    b = np.array([c.best_effort for c in cases])
    # Table values are rounded to 1e-6; compare with the same tolerance.
    tol = 1e-9
    return RingSummary(
        label=label,
        cases=len(cases),
        engine=float(e.mean()),
        first_fit=float(f.mean()),
        best_effort=float(b.mean()),
        ge_first_fit=float(np.mean(e >= f - tol)),
        ge_best_effort=float(np.mean(e >= b - tol)),
        gt_first_fit=float(np.mean(e > f + tol)),
        gt_best_effort=float(np.mean(e > b + tol)),
        greedy=sum(1 for c in cases if c.free > EXACT_PARTITION_LIMIT and c.k < c.free),
    )


# 2. Trace replay --------------------------------------------------------------


@dataclass
class ReplayResult:
    allocator: str
    total_gpus: int
    pods_per_pass: int
    failed_at: int | None = None  # position in the replayed stream
    failed_pod: Pod | None = None
    failed_pass: int = 0  # 1-based
    unallocated_at_failure: int = 0
    placed_before: int = 0
    multi_before: int = 0
    nvlink_before: int = 0
    ring_before: dict[int, list[float]] = field(default_factory=dict)  # k -> rings
    placed_end: int = 0
    skipped_end: int = 0
    allocated_end: int = 0
    mismatches: int = 0  # engine's own ring/NVLink flag vs the class tables
    seconds: float = 0.0

    @property
    def nvlink_share(self) -> float:
        return self.nvlink_before / self.multi_before if self.multi_before else float("nan")

    @property
    def mean_ring(self) -> float:
        rings = [r for rs in self.ring_before.values() for r in rs]
        return float(np.mean(rings)) if rings else float("nan")


class _Classes:
    """Topology classes by wiring, built once per design."""

    def __init__(self) -> None:
        self._by_key: dict[str, TopologyClass] = {}
        self._of_node: dict[str, TopologyClass] = {}

    def add(self, snapshot: NodeSnapshot) -> None:
        wiring = wiring_of(snapshot, DEFAULT_BANDWIDTH)
        key = wiring.key()
        if key not in self._by_key:
            self._by_key[key] = build_class(wiring)
        self._of_node[snapshot.name] = self._by_key[key]

    def __getitem__(self, node: str) -> TopologyClass:
        return self._of_node[node]


Placer = Callable[[Pod], tuple[str, tuple[int, ...]] | None]


def replay(
    snapshots: Sequence[NodeSnapshot],
    pods: Sequence[Pod],
    allocator: str,
    max_passes: int = 50,
) -> ReplayResult:
    """Place ``pods`` in order (cycling) with one allocator until the first failure.

    ``allocator`` is "engine", "first-fit" or "best-effort". See the module
    docstring for the protocol.
    """
    started = time.perf_counter()
    classes = _Classes()
    for snap in snapshots:
        classes.add(snap)
    total = sum(s.gpu_count for s in snapshots)
    result = ReplayResult(allocator=allocator, total_gpus=total, pods_per_pass=len(pods))
    if not pods:
        return result
    placer, engine_check = _placer(snapshots, allocator)
    allocated = 0
    placed = 0
    position = 0
    for pass_no in range(1, max_passes + 1):
        for pod in pods:
            got = placer(pod)
            if got is None:
                if result.failed_pod is None:
                    result.failed_at = position
                    result.failed_pod = pod
                    result.failed_pass = pass_no
                    result.unallocated_at_failure = total - allocated
                    result.placed_before = placed
                else:
                    result.skipped_end += 1
                position += 1
                continue
            node, gpus = got
            allocated += len(gpus)
            placed += 1
            position += 1
            if result.failed_pod is None and len(gpus) > 1:
                tc = classes[node]
                mask = indices_to_mask(gpus)
                result.multi_before += 1
                result.nvlink_before += int(bool(tc.nvlink_connected[mask]))
                result.ring_before.setdefault(len(gpus), []).append(float(tc.ring[mask]))
        if result.failed_pod is not None:
            break
    result.placed_end = placed
    result.allocated_end = allocated
    if engine_check is not None:
        result.mismatches = engine_check(classes)
    result.seconds = time.perf_counter() - started
    return result


def _placer(
    snapshots: Sequence[NodeSnapshot], allocator: str
) -> tuple[Placer, Callable[[_Classes], int] | None]:
    if allocator == "engine":
        return _engine_placer(snapshots)
    cluster = BaselineCluster.from_snapshots(snapshots)
    place = {"first-fit": place_first_fit, "best-effort": place_best_effort}[allocator]

    def baseline(pod: Pod) -> tuple[str, tuple[int, ...]] | None:
        got = place(cluster, pod.gpus, pod.gpu_models)
        if got is not None:
            cluster.allocate(*got)
        return got

    return baseline, None


def _engine_placer(
    snapshots: Sequence[NodeSnapshot],
) -> tuple[Placer, Callable[[_Classes], int]]:
    state = ClusterState()
    for snap in snapshots:
        state.upsert(snap)
    requests: dict[tuple[int, tuple[str, ...]], PlacementRequest] = {}
    reported: list[tuple[str, tuple[int, ...], float, bool]] = []

    def engine(pod: Pod) -> tuple[str, tuple[int, ...]] | None:
        key = (pod.gpus, pod.gpu_models)
        request = requests.get(key)
        if request is None:
            # Defaults: locality "prefer", policy "pack", objective "performance".
            request = PlacementRequest(gpus=pod.gpus, gpu_models=pod.gpu_models)
            requests[key] = request
        outcome = state.place(request)
        if outcome.placement is None:
            return None
        state.apply(outcome.placement)
        task = outcome.placement.tasks[0]
        reported.append(
            (task.node, task.gpu_indices, outcome.placement.ring_gbps, task.nvlink_connected)
        )
        return task.node, task.gpu_indices

    def check(classes: _Classes) -> int:
        bad = 0
        for node, gpus, ring, connected in reported:
            tc = classes[node]
            mask = indices_to_mask(gpus)
            if abs(float(tc.ring[mask]) - ring) > 1e-6 or (
                len(gpus) > 1 and bool(tc.nvlink_connected[mask]) != connected
            ):
                bad += 1
        return bad

    return engine, check


# Report -----------------------------------------------------------------------


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def _num(x: float, digits: int = 1) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def machine_lines() -> list[str]:
    return [f"machine : {describe()}", f"numpy   : {np.__version__}"]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return out


_RING_HEADER = (
    "design / fill",
    "cases",
    "engine",
    "first-fit",
    "best-eff",
    "E/FF",
    "E/BE",
    "E>=FF",
    "E>=BE",
    "E>FF",
    "E>BE",
    "BE greedy",
)


def _ring_row(s: RingSummary) -> list[str]:
    return [
        s.label,
        str(s.cases),
        _num(s.engine),
        _num(s.first_fit),
        _num(s.best_effort),
        _num(s.ratio_first_fit, 3),
        _num(s.ratio_best_effort, 3),
        _pct(s.ge_first_fit),
        _pct(s.ge_best_effort),
        _pct(s.gt_first_fit),
        _pct(s.gt_best_effort),
        str(s.greedy),
    ]


def ring_summaries(
    cases: Sequence[RingCase], designs: Sequence[str], fills: Sequence[float]
) -> tuple[list[RingSummary], list[RingSummary], RingSummary]:
    """(per design and fill, per design, overall)."""
    by_fill = [
        summarize(f"{d} @{int(f * 100)}%", [c for c in cases if c.design == d and c.fill == f])
        for d in designs
        for f in fills
    ]
    by_design = [summarize(d, [c for c in cases if c.design == d]) for d in designs]
    return by_fill, by_design, summarize("all", cases)


def report_fragmented(
    cases: Sequence[RingCase], designs: Sequence[str], fills: Sequence[float]
) -> list[str]:
    by_fill, by_design, overall = ring_summaries(cases, designs, fills)
    lines = ["Mean predicted ring bandwidth (GB/s) of the set each allocator picks;"]
    lines.append("E/FF, E/BE: ratio of the means; E>=X: share of cases the engine is at least")
    lines.append("as good (must be 100%); E>X: share where it is strictly better.")
    lines.append("")
    lines += _table(_RING_HEADER, [_ring_row(s) for s in by_fill])
    lines.append("")
    lines += _table(_RING_HEADER, [*(_ring_row(s) for s in by_design), _ring_row(overall)])
    lines.append("")
    ks = sorted({c.k for c in cases})
    by_k = [summarize(f"k={k}", [c for c in cases if c.k == k]) for k in ks]
    lines.append("All designs, by k:")
    lines += _table(("k", *_RING_HEADER[1:]), [_ring_row(s) for s in by_k])
    return lines


def _k_ring(r: ReplayResult, k: int) -> str:
    rings = r.ring_before.get(k)
    return _num(float(np.mean(rings))) if rings else "n/a"


def report_replay(results: Sequence[ReplayResult]) -> list[str]:
    ks = sorted({k for r in results for k in r.ring_before})
    header = [
        "allocator",
        "fail pass",
        "fail pod",
        "unalloc GPUs",
        "placed",
        "multi",
        "NVLink",
        "ring",
        *(f"ring k={k}" for k in ks),
        "end alloc",
        "end placed",
        "end skipped",
        "sec",
    ]
    rows = []
    for r in results:
        pod = r.failed_pod
        rows.append(
            [
                r.allocator,
                str(r.failed_pass) if pod else "-",
                f"{pod.gpus} GPU" if pod else "none",
                str(r.unallocated_at_failure) if pod else "-",
                str(r.placed_before),
                str(r.multi_before),
                _pct(r.nvlink_share),
                _num(r.mean_ring),
                *(_k_ring(r, k) for k in ks),
                f"{r.allocated_end}/{r.total_gpus}",
                str(r.placed_end),
                str(r.skipped_end),
                _num(r.seconds),
            ]
        )
    lines = _table(header, rows)
    engine = next((r for r in results if r.allocator == "engine"), None)
    if engine is not None:
        lines.append("")
        lines.append("engine / baseline (unallocated: lower is better; the rest: higher is better)")
        ratio_rows = []
        for r in results:
            if r is engine:
                continue
            ratio_rows.append(
                [
                    r.allocator,
                    _num(_ratio(engine.unallocated_at_failure, r.unallocated_at_failure), 3),
                    _num(_ratio(engine.placed_before, r.placed_before), 3),
                    _num(_ratio(engine.nvlink_share, r.nvlink_share), 3),
                    _num(_ratio(engine.mean_ring, r.mean_ring), 3),
                    _num(_ratio(engine.allocated_end, r.allocated_end), 3),
                ]
            )
        lines += _table(
            ["vs", "unalloc", "placed", "NVLink", "ring", "end alloc"],
            ratio_rows,
        )
        if engine.mismatches:
            lines.append(
                f"WARNING: {engine.mismatches} engine placements reported a ring or NVLink flag"
                " that differs from the class tables"
            )
        else:
            lines.append("engine-reported ring and NVLink flags match the class tables: yes")
    return lines


def markdown(
    overall: Sequence[RingSummary], replays: Mapping[str, Sequence[ReplayResult]]
) -> list[str]:
    out = [
        "| design | cases | ring engine | ring first-fit | ring best-effort | E/FF | E/BE"
        " | engine >= both |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in overall:
        both = min(s.ge_first_fit, s.ge_best_effort)
        out.append(
            f"| {s.label} | {s.cases} | {_num(s.engine)} | {_num(s.first_fit)}"
            f" | {_num(s.best_effort)} | {_num(s.ratio_first_fit, 3)}"
            f" | {_num(s.ratio_best_effort, 3)} | {_pct(both)} |"
        )
    out.append("")
    out.append(
        "| trace | allocator | unallocated GPUs at 1st failure | pods placed | multi-GPU on"
        " NVLink | mean ring multi-GPU (GB/s) | GPUs allocated at end |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for trace, results in replays.items():
        for r in results:
            unalloc = str(r.unallocated_at_failure) if r.failed_pod else "-"
            out.append(
                f"| {trace} | {r.allocator} | {unalloc} | {r.placed_before}"
                f" | {_pct(r.nvlink_share)} | {_num(r.mean_ring)}"
                f" | {r.allocated_end}/{r.total_gpus} |"
            )
    return out


def _cluster_lines(snapshots: Sequence[NodeSnapshot]) -> list[str]:
    designs = Counter((s.gpu_count, s.gpus[0].model, _wiring_word(s)) for s in snapshots)
    parts = [f"{n}x {g}-GPU {m} ({w})" for (g, m, w), n in sorted(designs.items())]
    total = sum(s.gpu_count for s in snapshots)
    return [f"cluster : {len(snapshots)} nodes, {total} GPUs: " + ", ".join(parts)]


def _wiring_word(snap: NodeSnapshot) -> str:
    n = snap.gpu_count
    if n == 1:
        return "single GPU"
    nvlink = any(snap.link(i, j).is_nvlink for i in range(n) for j in range(i + 1, n))
    return "NVLink" if nvlink else "PCIe"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.quality",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer samples and pods")
    parser.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE_DIR)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    quick: bool = args.quick
    samples = QUICK_SAMPLES if quick else FULL_SAMPLES
    pod_rows = QUICK_POD_ROWS if quick else None
    started = time.perf_counter()

    print("topoplace placement quality benchmark" + (" (--quick)" if quick else ""))
    print("=" * 72)
    for line in machine_lines():
        print(line)
    print()

    print(f"1. Fragmented nodes ({samples} random nodes per design and fill level)")
    print("-" * 72)
    print("Each GPU is busy independently with probability = fill level; every k from 2 to")
    print("the number of free GPUs is one case. two-island-16: two 8-GPU NVSwitch islands")
    print("(300 GB/s) joined over PCIe SYS (8 GB/s).")
    print()
    t0 = time.perf_counter()
    classes = design_classes()
    cases = fragmented_cases(classes, FILLS, samples, args.seed)
    for line in report_fragmented(cases, FRAGMENT_PROFILES, FILLS):
        print(line)
    print(f"({time.perf_counter() - t0:.1f} s)")
    print()

    replays: dict[str, list[ReplayResult]] = {}
    if (args.trace_dir / NODE_FILE).exists():
        t0 = time.perf_counter()
        snapshots = build_cluster(read_nodes(args.trace_dir))
        print("2. Trace replay: Alibaba GPU trace 2023 (openb), fill until the first failure")
        print("-" * 72)
        print("Whole-GPU pods in file order, nothing released; the list is replayed from its")
        print("start until a pod cannot be placed. Engine: ClusterState.place + apply with the")
        print("default request (locality prefer, policy pack); baselines: first node in name")
        print("order where the allocator places. 8-GPU nodes: dgx1-v100 wiring (bench.trace).")
        for line in _cluster_lines(snapshots):
            print(line)
        print(f"(cluster built in {time.perf_counter() - t0:.1f} s)")
        for trace in TRACES:
            pods = read_pods(trace, args.trace_dir, limit=pod_rows)
            sizes = Counter(p.gpus for p in pods.pods)
            constrained = sum(1 for p in pods.pods if p.gpu_models)
            print()
            print(
                f"[{trace}] {pods.total} pods read"
                + (f" (first {pod_rows} rows)" if pod_rows else "")
                + f": {len(pods.pods)} whole-GPU pods"
                f" ({', '.join(f'{n}x {k}-GPU' for k, n in sorted(sizes.items()))};"
                f" {constrained} with gpu_spec), skipped {pods.sharing} GPU-sharing pods"
                f" (gpu_milli < 1000) and {pods.cpu_only} CPU-only pods;"
                f" {sum(p.gpus for p in pods.pods)} GPUs asked per pass"
            )
            results = [replay(snapshots, pods.pods, a) for a in ALLOCATORS]
            replays[trace] = results
            for line in report_replay(results):
                print(line)
        print()
        print("Columns: fail pass/pod: pass of the pod list and size of the first pod that")
        print("could not be placed; unalloc GPUs: GPUs free in the cluster at that moment;")
        print("placed, multi, NVLink, ring: pods placed before it, how many of them asked for")
        print("2+ GPUs, the share of those on an NVLink-connected set, their mean ring (GB/s);")
        print("end: after skipping unplaceable pods to the end of that pass.")
    else:
        print(f"2. Trace replay skipped: {args.trace_dir / NODE_FILE} not found")
    print()

    _, by_design, overall = ring_summaries(cases, FRAGMENT_PROFILES, FILLS)
    print("Markdown for docs/benchmarks.md")
    print("-" * 72)
    for line in markdown([*by_design, overall], replays):
        print(line)
    print()
    print(f"total time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
