"""Gangs on multi-node NVLink racks: distance from the optimum, and time per decision.

Workload: GB200 NVL72 racks (18 trays x 4 GPUs, one NVLink clique per
rack, one network block per rack) with random GPUs busy, and gang requests
of 2..24 tasks x 1, 2 or 4 GPUs. For each request the optimum is computed
independently by exhaustive reasoning that the tray structure allows: a tray
with f free GPUs holds floor(f / k) tasks of k GPUs (all GPUs of a tray are
equivalent on its NVSwitch), so a gang has an all-NVLink placement exactly
when one rack's trays hold all its tasks, and otherwise the fewest racks it
can span is found by trying every number of racks from the largest down.
The engine is correct when it finds an all-NVLink placement whenever one
exists (same predicted ring as the optimum) and otherwise spans no more
racks than necessary.

Run: ``python -m bench.gang_quality [--quick]``.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from bench.machine import describe
from placement import ClusterState, PlacementRequest
from placement.profiles import gb200_nvl72_rack


def build(racks: int) -> ClusterState:
    state = ClusterState()
    for r in range(racks):
        for snap in gb200_nvl72_rack(f"rack{r:02d}", clique_id=r):
            state.upsert(snap)
    return state


def fragment(state: ClusterState, rng: random.Random, fill: float) -> None:
    for entry in state.nodes():
        state.release(entry.name, entry.held_gpus)
        busy = [g.uuid for g in entry.snapshot.gpus if rng.random() < fill]
        state.allocate(entry.name, busy)


def rack_capacity(state: ClusterState, k: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for entry in state.nodes():
        rack = entry.snapshot.labels["topoplace.io/rack"]
        out[rack] = out.get(rack, 0) + entry.free_mask.bit_count() // k
    return out


def optimum(state: ClusterState, tasks: int, k: int) -> tuple[bool, int] | None:
    """(fits in one NVLink rack, fewest racks) or None when the gang cannot fit at all."""
    capacity = sorted(rack_capacity(state, k).values(), reverse=True)
    if sum(capacity) < tasks:
        return None
    if capacity[0] >= tasks:
        return True, 1
    total = 0
    for used, cap in enumerate(capacity, start=1):
        total += cap
        if total >= tasks:
            return False, used
    return None


def run(racks: int, requests: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    state = build(racks)
    nvlink_hits = nvlink_cases = block_ok = placed_cases = infeasible_agree = 0
    times: list[float] = []
    for _ in range(requests):
        fragment(state, rng, rng.choice([0.3, 0.5, 0.7, 0.85]))
        k = rng.choice([1, 2, 4])
        tasks = rng.randint(2, 24)
        best = optimum(state, tasks, k)
        t0 = time.perf_counter()
        outcome = state.place(PlacementRequest(gpus=k, tasks=tasks))
        times.append(time.perf_counter() - t0)
        if best is None:
            infeasible_agree += outcome.placement is None
            continue
        placed_cases += 1
        assert outcome.placement is not None, outcome.summary()
        if best[0]:
            nvlink_cases += 1
            nvlink_hits += outcome.placement.fabric_domain is not None
        labels = (state.node(t.node).snapshot.labels for t in outcome.placement.tasks)
        racks_used = len({lab["topoplace.io/rack"] for lab in labels})
        block_ok += racks_used <= best[1]
    p50 = float(np.percentile(times, 50)) * 1e3
    p99 = float(np.percentile(times, 99)) * 1e3
    infeasible = requests - placed_cases
    return [
        f"| {racks} racks ({racks * 18} trays, {racks * 72} GPUs) | {requests} "
        f"| {nvlink_hits}/{nvlink_cases} | {block_ok}/{placed_cases} "
        f"| {infeasible_agree}/{infeasible} | {p50:.2f} | {p99:.2f} |"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(f"machine: {describe()}\n")
    print(
        "| cluster | gangs | all-NVLink when possible | racks <= optimum "
        "| refused when impossible | p50 ms | p99 ms |"
    )
    print("|---|---|---|---|---|---|---|")
    sizes = ((4, 100),) if args.quick else ((4, 400), (16, 200))
    for racks, requests in sizes:
        for row in run(racks, requests, seed=racks):
            print(row)


if __name__ == "__main__":
    main()
