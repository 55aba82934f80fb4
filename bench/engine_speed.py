"""Engine speed: decisions per second and latency per decision.

Workloads (printed with the machine they ran on):

1. Clusters of 1,000 and 10,000 mixed-profile nodes at 10/50/90% fill, for
   1/2/4/8-GPU requests. Each decision is ``place`` followed by ``apply``
   (the in-memory commit), and the oldest allocation of the run is released
   so the fill stays put. Latency is per ``place``; throughput counts the
   whole loop.
2. Any k on a 16-GPU node (DGX-2 design) with random free masks, cold
   (answer never computed before) and warm.
3. ``evaluate`` (what /score asks) on one 63-GPU node (NVLink islands of 8,
   above the exact tables), for random free sets: the first ask of a free
   set searches (what every ask cost before large-node answers were kept),
   asking again finds the kept answer.
4. ``place`` of 1 or 8 GPUs across 20 HGX H100 nodes beside one 63-GPU node
   (NVLink islands of 8) whose free GPUs change before every ask, so that
   its answer is never kept: with the seed-by-seed search the large node had
   (every seed grown one GPU at a time in Python, every grown set's ring
   computed) and with the engine's, same states, same run.

The baseline, measured in the same run on the same states: a per-node loop
that asks every node for its best set directly (no cross-node arrays, no
answer cache), which is how a straightforward allocator would do it. Ratios
are engine / baseline throughput.

Run: ``python -m bench.engine_speed [--quick]``.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque
from functools import lru_cache, partial

import numpy as np

from bench.machine import describe
from placement import ClusterState, Placement, PlacementRequest
from placement.large_node import LARGE_ANSWERS, LargeClass
from placement.node_choice import NO_SET, SetQuery, best_set, indices_to_mask
from placement.profiles import build_profile, gb200_nvl72_rack
from placement.snapshot import NodeSnapshot
from placement.topo_text import parse_topo_matrix
from placement.topology_class import TopologyClass

# Mixed fleet: (profile, share). GB200 trays come in racks of 18.
FLEET = (
    ("dgx1-v100", 0.15),
    ("dgx-a100", 0.15),
    ("hgx-h100", 0.25),
    ("hgx-b200", 0.10),
    ("pcie-8x-l40s", 0.15),
    ("riscv-nvlfusion-4", 0.05),
    ("dgx2-v100", 0.05),
    ("gb200", 0.10),
)


def build_cluster(nodes: int, seed: int) -> ClusterState:
    state = ClusterState()
    made = 0
    rack = 0
    for profile, share in FLEET:
        count = round(nodes * share)
        if profile == "gb200":
            while count > 0:
                for snap in gb200_nvl72_rack(f"rack{rack}", clique_id=rack)[:count]:
                    state.upsert(snap)
                    made += 1
                count -= 18
                rack += 1
            continue
        for _ in range(count):
            state.upsert(build_profile(profile, f"{profile}-{made:05d}"))
            made += 1
    return state


def fill(state: ClusterState, fraction: float, seed: int) -> None:
    """Top every node up to a random `fraction` of its GPUs held (random fragmentation)."""
    rng = random.Random(seed)
    for entry in state.nodes():
        held = entry.held_gpus
        free = sorted(g.uuid for g in entry.snapshot.gpus if g.uuid not in held)
        more = round(len(entry.snapshot.gpus) * fraction) - len(held)
        if more > 0:
            state.allocate(entry.name, rng.sample(free, k=more))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def run_engine(state: ClusterState, k: int, decisions: int) -> tuple[list[float], float, int]:
    request = PlacementRequest(gpus=k)
    held: deque[Placement] = deque()
    latencies: list[float] = []
    placed = 0
    start = time.perf_counter()
    for _ in range(decisions):
        t0 = time.perf_counter()
        outcome = state.place(request)
        latencies.append(time.perf_counter() - t0)
        if outcome.placement is not None:
            state.apply(outcome.placement)
            held.append(outcome.placement)
            placed += 1
            if len(held) > 1:
                state.unapply(held.popleft())
    wall = time.perf_counter() - start
    for placement in held:
        state.unapply(placement)
    return latencies, decisions / wall, placed


def run_baseline(state: ClusterState, k: int, decisions: int) -> float:
    """Per-node loop: every node's best set computed directly, best node kept."""
    query = SetQuery(k=k)
    nodes = [(node, state.topology_class(node.name)) for node in state.nodes()]
    start = time.perf_counter()
    for _ in range(decisions):
        best: tuple[float, float, str] | None = None
        for entry, tc in nodes:
            if not isinstance(tc, TopologyClass) or not entry.available:
                continue
            mask = best_set(tc, entry.free_mask, query)
            if mask == NO_SET:
                continue
            key = (float(tc.ring[mask]), float(tc.pair[mask]), entry.name)
            if best is None or key[:2] > best[:2]:
                best = key
    return decisions / (time.perf_counter() - start)


def cluster_section(
    sizes: tuple[int, ...], fills: tuple[float, ...], decisions: int, quick: bool
) -> list[str]:
    rows = []
    for size in sizes:
        t0 = time.perf_counter()
        state = build_cluster(size, seed=size)
        build_s = time.perf_counter() - t0
        print(f"\n{size} nodes built in {build_s:.1f}s ({state.class_count} topology classes)")
        for fraction in fills:
            fresh = state
            fill(fresh, fraction, seed=int(fraction * 100))
            for k in (1, 2, 4, 8):
                run_engine(fresh, k, min(200, decisions))  # warm the answer caches
                lat, rate, placed = run_engine(fresh, k, decisions)
                base_n = 3 if size >= 10_000 or quick else 10
                base = run_baseline(fresh, k, base_n)
                p50, p99 = percentile(lat, 50) * 1e3, percentile(lat, 99) * 1e3
                place_rate = len(lat) / sum(lat)
                row = (
                    f"| {size:,} | {fraction:.0%} | {k} | {place_rate:,.0f} | {rate:,.0f} "
                    f"| {p50:.3f} | {p99:.3f} | {base:,.1f} | {place_rate / base:,.0f}x |"
                )
                print(row + f"  placed {placed}/{decisions}")
                rows.append(row)
    return rows


def sixteen_gpu_section(samples: int) -> list[str]:
    rows = []
    rng = random.Random(16)
    snap = build_profile("dgx2-v100", "dgx2")
    state = ClusterState()
    t0 = time.perf_counter()
    state.upsert(snap)
    print(
        f"\n16-GPU class tables built in {(time.perf_counter() - t0) * 1e3:.0f} ms"
        " (once per design)"
    )
    uuids = [g.uuid for g in snap.gpus]
    for k in range(1, 17):
        cold: list[float] = []
        warm: list[float] = []
        base: list[float] = []
        tc = state.topology_class("dgx2")
        assert isinstance(tc, TopologyClass)
        for _ in range(samples):
            busy_n = rng.randint(0, 16 - k)
            busy = rng.sample(range(16), busy_n)
            state.allocate("dgx2", [uuids[i] for i in busy])
            request = PlacementRequest(gpus=k)
            t0 = time.perf_counter()
            outcome = state.place(request)
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            again = state.place(request)
            warm.append(time.perf_counter() - t0)
            assert outcome == again and outcome.placement is not None
            free = ((1 << 16) - 1) & ~indices_to_mask(busy)
            t0 = time.perf_counter()
            _brute_force_best(tc, free, k)
            base.append(time.perf_counter() - t0)
            state.release("dgx2", [uuids[i] for i in busy])
        row = (
            f"| {k} | {percentile(cold, 50) * 1e3:.3f} | {percentile(cold, 99) * 1e3:.3f} "
            f"| {percentile(warm, 99) * 1e3:.3f} | {percentile(base, 50) * 1e3:.1f} "
            f"| {percentile(base, 50) / percentile(cold, 50):.0f}x |"
        )
        print(row)
        rows.append(row)
    return rows


def _brute_force_best(tc: TopologyClass, free: int, k: int) -> int:
    """Baseline: enumerate every k-subset of the free GPUs, each scored from the tables.

    A generous baseline (it gets every subset's ring for free from the
    tables); without them each subset's ring would need its own search.
    """
    from itertools import combinations

    members = [i for i in range(16) if free >> i & 1]
    best = (-1.0, -1.0, 0)
    for subset in combinations(members, k):
        mask = indices_to_mask(subset)
        key = (float(tc.ring[mask]), float(tc.pair[mask]), mask)
        if key[:2] > best[:2]:
            best = key
    return best[2]


SIXTEEN_HEADER = (
    "\n| k | cold p50 ms | cold p99 ms | warm p99 ms | enumerate subsets p50 ms | ratio |\n"
    "|---|---|---|---|---|---|"
)


LARGE_HEADER = (
    "\n| 63-GPU node, k | first ask p50 ms | first ask p99 ms | asked again p50 ms"
    " | asked again p99 ms |\n|---|---|---|---|---|"
)


def large_node(n: int, name: str) -> NodeSnapshot:
    """n GPUs in NVLink islands of 8 (NODE within a half, SYS across), two NUMA nodes."""

    def link(i: int, j: int) -> str:
        if i == j:
            return "X"
        if i // 8 == j // 8:
            return "NV12"
        return "NODE" if (i < n // 2) == (j < n // 2) else "SYS"

    rows = [
        "\t".join(
            [f"GPU{i}", *(link(i, j) for j in range(n)), *(("0", "0"), ("1", "1"))[i >= n // 2]]
        )
        for i in range(n)
    ]
    header = "\t".join(["", *(f"GPU{i}" for i in range(n)), "CPU Affinity", "NUMA Affinity"])
    return parse_topo_matrix("\n".join([header, *rows]) + "\n", node_name=name)


def large_node_section(samples: int) -> list[str]:
    rows = []
    rng = random.Random(63)
    snap = large_node(63, "big")
    state = ClusterState()
    state.upsert(snap)
    uuids = [g.uuid for g in snap.gpus]
    for k in (1, 4, 8):
        first: list[float] = []
        again: list[float] = []
        for _ in range(samples):
            busy = [uuids[i] for i in rng.sample(range(63), rng.randint(0, 63 - k))]
            state.allocate("big", busy)
            request = PlacementRequest(gpus=k)
            t0 = time.perf_counter()
            answer = state.evaluate(request)
            first.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert state.evaluate(request) == answer
            again.append(time.perf_counter() - t0)
            state.release("big", busy)
        row = (
            f"| {k} | {percentile(first, 50) * 1e3:.1f} | {percentile(first, 99) * 1e3:.1f} "
            f"| {percentile(again, 50) * 1e3:.2f} | {percentile(again, 99) * 1e3:.2f} |"
        )
        print(row)
        rows.append(row)
    return rows


BESIDE_HEADER = (
    "\n| place beside a churning 63-GPU node, k | seed-by-seed search p50 / p99 ms"
    " | engine p50 / p99 ms | ratio p50 / p99 |\n|---|---|---|---|"
)


def beside_large_node_section(asks: int) -> list[str]:
    from tests.placement.reference import large_best_set

    rows = []
    for k in (1, 8):
        timings = {}
        for name, search in (
            ("seed-by-seed", large_best_set),
            ("engine", LargeClass._best_set_uncached),
        ):
            state = ClusterState()
            for i in range(20):
                state.upsert(build_profile("hgx-h100", f"hgx{i}"))
            snap = large_node(63, "big")
            state.upsert(snap)
            tc = state.topology_class("big")
            assert isinstance(tc, LargeClass)
            # An instance attribute: only this state's node searches the other way.
            tc._best = lru_cache(maxsize=LARGE_ANSWERS)(partial(search, tc))
            rng = random.Random(k)
            request = PlacementRequest(gpus=k)
            state.place(request)
            latencies = []
            for _ in range(asks):
                gpu = rng.choice(snap.gpus).uuid
                if gpu in state.node("big").held_gpus:
                    state.release("big", [gpu])
                else:
                    state.allocate("big", [gpu])
                t0 = time.perf_counter()
                state.place(request)
                latencies.append(time.perf_counter() - t0)
            timings[name] = (percentile(latencies, 50) * 1e3, percentile(latencies, 99) * 1e3)
        (b50, b99), (e50, e99) = timings["seed-by-seed"], timings["engine"]
        row = (
            f"| {k} | {b50:.1f} / {b99:.1f} | {e50:.2f} / {e99:.2f} "
            f"| {b50 / e50:,.0f}x / {b99 / e99:,.0f}x |"
        )
        print(row)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run for a smoke test")
    args = parser.parse_args()
    print(f"machine: {describe()}")
    sizes = (1_000,) if args.quick else (1_000, 10_000)
    fills = (0.1, 0.5, 0.9)
    decisions = 300 if args.quick else 2_000
    header = (
        "| nodes | fill | GPUs | place/s | loop/s (place+commit+release) | p50 ms | p99 ms "
        "| per-node loop/s | ratio |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    print("\n" + header)
    rows = cluster_section(sizes, fills, decisions, args.quick)
    print(SIXTEEN_HEADER)
    rows16 = sixteen_gpu_section(40 if args.quick else 200)
    print(LARGE_HEADER)
    rows_large = large_node_section(20 if args.quick else 100)
    print(BESIDE_HEADER)
    rows_beside = beside_large_node_section(40 if args.quick else 200)
    print("\n--- markdown ---")
    print(header)
    print("\n".join(rows))
    print(SIXTEEN_HEADER)
    print("\n".join(rows16))
    print(LARGE_HEADER)
    print("\n".join(rows_large))
    print(BESIDE_HEADER)
    print("\n".join(rows_beside))


if __name__ == "__main__":
    main()
