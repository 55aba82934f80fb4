"""What each allocator leaves free: sequential fills and random busy masks of real topologies.

Run ``python -m bench.fill_quality`` (about a minute) or ``--quick``. For
every design (the real ``nvidia-smi topo -m`` files in
``/work/shared/data/topologies`` and every built-in whole-GPU profile of at
most 16 GPUs) and every allocator (the engine's single-node choice, first-fit,
go-gpuallocator best effort and Slurm-like greedy, as ``bench.baselines``
writes their rules; best-fit packing picks GPUs inside a node as first-fit):

- **fills**: a random sequence of 1-, 2- and 4-GPU jobs placed one after the
  other on an empty node until the next one does not fit, nothing released;
  each allocator follows its own trajectory;
- **masks**: random busy masks (each GPU busy with probability 0.3-0.7) and
  one job of 1, 2 or 4 GPUs; the same cases for every allocator.

Counted per decision, each against what was possible at that moment:

- ``ring4``: a best-ring 4-set (ring = the node's best 4-GPU ring) was free
  before, and some choice for the job keeps one free: did this one?
- ``ring4+pair``: the same for a best-ring-and-pair 4-set (ring and pair
  sum both the node's best);
- ``pair-break``: a 1-GPU job took a GPU with a free NVLink partner while a
  free GPU without one existed (an avoidable broken pair or island);
- ``degraded``: a job of 2+ GPUs got a ring below the best feasible one.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import numpy as np

from bench.baselines import (
    first_fit,
    partition_best_effort,
    slurm_greedy_gpus,
)
from bench.machine import describe
from placement.bandwidth import DEFAULT_BANDWIDTH
from placement.node_choice import SetQuery, best_set, indices_to_mask, mask_to_indices
from placement.profiles import build_profile, profile_names
from placement.snapshot import NodeSnapshot
from placement.topo_text import parse_topo_matrix
from placement.topology_class import TopologyClass, build_class, wiring_of

TOPOLOGY_DIR = Path("/work/shared/data/topologies")
# The GPU model of each real file (the text carries none; the lane rate needs it).
TOPOLOGY_MODELS = {
    "dgx1-v100.txt": "Tesla V100-SXM2-32GB",
    "hgx-h100.txt": "NVIDIA H100 80GB HBM3",
    "pcie-8x-l40s.txt": "NVIDIA L40S",
    "workstation-3x-a6000.txt": "NVIDIA RTX A6000",
}
# Best-fit packing is a node-level rule; inside a node it picks as first-fit does.
ALLOCATORS = ("engine", "first-fit", "best-effort", "slurm-greedy")
JOB_SIZES = (1, 2, 4)
COUNTERS = ("ring4", "ring4+pair")

Chooser = Callable[[TopologyClass, int, int], int]  # (class, free mask, k) -> set mask


def designs(topology_dir: Path = TOPOLOGY_DIR) -> dict[str, TopologyClass]:
    """Real topologies first, then the built-in profiles; one class per distinct wiring."""
    snaps: dict[str, NodeSnapshot] = {}
    if topology_dir.is_dir():
        for path in sorted(topology_dir.glob("*.txt")):
            model = TOPOLOGY_MODELS.get(path.name, "unknown")
            snaps[path.stem + " (real)"] = parse_topo_matrix(
                path.read_text(), node_name=path.stem, gpu_model=model
            )
    for name in profile_names():
        snap = build_profile(name, "bench")
        if "mig" not in name and 2 <= snap.gpu_count <= 16:
            snaps[name] = snap
    out: dict[str, TopologyClass] = {}
    seen: set[str] = set()
    for name, snap in snaps.items():
        wiring = wiring_of(snap, DEFAULT_BANDWIDTH)
        if wiring.key() in seen:
            continue
        seen.add(wiring.key())
        out[name] = build_class(wiring)
    return out


def _wrap(pick: Callable[[np.ndarray, list[int], int, tuple[int, ...]], object]) -> Chooser:
    def choose(tc: TopologyClass, free: int, k: int) -> int:
        got = pick(tc.wiring.bw, list(mask_to_indices(free)), k, tc.wiring.sockets)
        return -1 if got is None else indices_to_mask(got)  # type: ignore[arg-type]

    return choose


CHOOSERS: dict[str, Chooser] = {
    "engine": lambda tc, free, k: best_set(tc, free, SetQuery(k=k)),
    "first-fit": _wrap(lambda bw, free, k, sockets: first_fit(free, k)),
    "best-effort": _wrap(lambda bw, free, k, sockets: partition_best_effort(bw, free, k)),
    "slurm-greedy": _wrap(lambda bw, free, k, sockets: slurm_greedy_gpus(free, k, sockets, bw)),
}


@dataclass
class Tally:
    kept: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    chances: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    pair_break: int = 0
    pair_chances: int = 0
    degraded: int = 0
    decisions: int = 0


class Judge:
    """Per design: which free sets hold a best 4-set, and what was possible per decision."""

    def __init__(self, tc: TopologyClass) -> None:
        self.tc = tc
        n = tc.n
        self.best4: dict[str, list[int]] = {c: [] for c in COUNTERS}
        if n >= 4:
            fours = tc.by_k[4]
            ring, pair = tc.ring[fours[0]], tc.pair[fours[0]]
            self.best4["ring4"] = [int(m) for m in fours if tc.ring[m] == ring]
            self.best4["ring4+pair"] = [
                int(m) for m in fours if tc.ring[m] == ring and tc.pair[m] == pair
            ]
        self.partners = [
            indices_to_mask([j for j in range(n) if tc.wiring.nvlink[i, j] and j != i])
            for i in range(n)
        ]

    def holds(self, counter: str, free: int) -> bool:
        return any(m & free == m for m in self.best4[counter])

    def judge(self, tally: Tally, free: int, k: int, chosen: int) -> None:
        tc = self.tc
        tally.decisions += 1
        if k >= 2:
            best_ring = float(tc.ring[best_set(tc, free, SetQuery(k=k))])
            tally.degraded += int(float(tc.ring[chosen]) < best_ring - 1e-9)
        options = [indices_to_mask(c) for c in combinations(mask_to_indices(free), k)]
        for counter in COUNTERS:
            if not self.holds(counter, free):
                continue
            if any(self.holds(counter, free & ~o) for o in options):
                tally.chances[counter] += 1
                tally.kept[counter] += int(self.holds(counter, free & ~chosen))
        if k == 1:
            lonely = [g for g in mask_to_indices(free) if not self.partners[g] & free]
            paired = [g for g in mask_to_indices(free) if self.partners[g] & free]
            if lonely and paired:
                tally.pair_chances += 1
                tally.pair_break += int(mask_to_indices(chosen)[0] in paired)


def run(
    classes: dict[str, TopologyClass], fills: int, masks: int, seed: int
) -> dict[str, dict[str, dict[str, Tally]]]:
    """mode -> design -> allocator -> tally."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, dict[str, Tally]]] = {"fills": {}, "masks": {}}
    for design, tc in classes.items():
        judge = Judge(tc)
        fill_t = {a: Tally() for a in ALLOCATORS}
        mask_t = {a: Tally() for a in ALLOCATORS}
        full = (1 << tc.n) - 1
        for _ in range(fills):
            jobs = rng.choice(JOB_SIZES, size=4 * tc.n).tolist()
            for name in ALLOCATORS:
                free = full
                for k in jobs:
                    if free.bit_count() < k:
                        break
                    chosen = CHOOSERS[name](tc, free, k)
                    judge.judge(fill_t[name], free, k, chosen)
                    free &= ~chosen
        for _ in range(masks):
            busy = rng.random(tc.n) < rng.uniform(0.3, 0.7)
            free = indices_to_mask([i for i in range(tc.n) if not busy[i]])
            k = int(rng.choice(JOB_SIZES))
            if free.bit_count() < k:
                continue
            for name in ALLOCATORS:
                judge.judge(mask_t[name], free, k, CHOOSERS[name](tc, free, k))
        out["fills"][design] = fill_t
        out["masks"][design] = mask_t
    return out


def totals(per_design: dict[str, dict[str, Tally]]) -> dict[str, Tally]:
    sums = {a: Tally() for a in ALLOCATORS}
    for tallies in per_design.values():
        for a, t in tallies.items():
            s = sums[a]
            for c in COUNTERS:
                s.kept[c] += t.kept[c]
                s.chances[c] += t.chances[c]
            s.pair_break += t.pair_break
            s.pair_chances += t.pair_chances
            s.degraded += t.degraded
            s.decisions += t.decisions
    return sums


def markdown(results: dict[str, dict[str, dict[str, Tally]]]) -> list[str]:
    lines = [
        "| mode | allocator | decisions | best-ring 4-set kept | best-ring-and-pair 4-set kept"
        " | pair-breaking 1-GPU picks | degraded placements |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for mode, per_design in results.items():
        for a, t in totals(per_design).items():
            lines.append(
                f"| {mode} | {a} | {t.decisions}"
                + "".join(f" | {t.kept[c]} of {t.chances[c]}" for c in COUNTERS)
                + f" | {t.pair_break} of {t.pair_chances} | {t.degraded} |"
            )
    return lines


def by_design(results: dict[str, dict[str, dict[str, Tally]]]) -> list[str]:
    lines = ["| mode | design | " + " | ".join(ALLOCATORS) + " |"]
    lines.append("|---|---|" + "---:|" * len(ALLOCATORS))
    for mode, per_design in results.items():
        for design, tallies in per_design.items():
            cells = [
                f"{t.kept['ring4']}/{t.kept['ring4+pair']} of "
                f"{t.chances['ring4']}/{t.chances['ring4+pair']}"
                for t in tallies.values()
            ]
            lines.append(f"| {mode} | {design} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fill_quality", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer fills and masks")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--topologies", type=Path, default=TOPOLOGY_DIR)
    args = parser.parse_args(argv)
    fills, masks = (10, 60) if args.quick else (60, 400)
    started = time.perf_counter()
    classes = designs(args.topologies)
    print(f"machine : {describe()}")
    print(f"designs : {', '.join(classes)}")
    print(f"per design: {fills} fills, {masks} random busy masks; seed {args.seed}")
    results = run(classes, fills, masks, args.seed)
    print()
    for line in markdown(results):
        print(line)
    print()
    print("Per design, best-ring / best-ring-and-pair 4-sets kept of the chances:")
    for line in by_design(results):
        print(line)
    print(f"\n({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
