"""`topoplace plan`: the engine offline, on one node described by a file or a profile."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from placement import ClusterState, NodeSnapshot, PlacementRequest
from placement.profiles import UnknownProfileError, build_profile
from topoplace_client.topology_file import TopologyFileError, load_topology

EXIT_PLACED = 0
EXIT_UNSCHEDULABLE = 1
EXIT_BAD_INPUT = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="choose GPUs on one node offline",
        description=(
            "Choose the best GPUs for a job on one node, from `nvidia-smi topo -m` text or a "
            "snapshot JSON. Exits 0 when placed, 1 when unschedulable (reason on stderr), "
            "2 on bad input."
        ),
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--topology",
        type=Path,
        metavar="FILE|SAMPLE",
        help="nvidia-smi topo -m output or snapshot JSON, or a sample (`topoplace samples`)",
    )
    src.add_argument("--profile", help="a built-in simulated profile (see `topoplace profiles`)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs for the task")
    p.add_argument("--busy", default="", help="comma-separated GPU indices already in use")
    p.add_argument("--model", default="unknown", help="GPU model for topo text (sets NVLink speed)")
    p.add_argument("--locality", choices=["nvlink", "prefer", "any"], default="prefer")
    p.add_argument("--objective", choices=["performance", "balanced"], default="performance")
    p.add_argument("--policy", choices=["pack", "spread"], default="pack")
    p.add_argument("--numa", choices=["required", "preferred", "ignore"], default="preferred")
    p.add_argument("--cpus", type=int, default=0, help="CPUs to reserve near the GPUs")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _busy(text: str, snapshot: NodeSnapshot) -> list[str]:
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        if not item.isdigit() or int(item) >= snapshot.gpu_count:
            raise ValueError(
                f"--busy: {item!r} is not a GPU index of this node (0..{snapshot.gpu_count - 1})"
            )
        out.append(snapshot.gpus[int(item)].uuid)
    return out


def run(args: argparse.Namespace) -> int:
    try:
        if args.topology is not None:
            snapshot = load_topology(args.topology, gpu_model=args.model)
        else:
            snapshot = build_profile(args.profile, "node")
        request = PlacementRequest(
            gpus=args.gpus,
            locality=args.locality,
            objective=args.objective,
            policy=args.policy,
            numa=args.numa,
            cpus_per_task=args.cpus,
        )
        busy = _busy(args.busy, snapshot)
    except (TopologyFileError, UnknownProfileError, ValueError) as exc:
        message = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        print(f"topoplace plan: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if any(gpu.model == "unknown" for gpu in snapshot.gpus):
        # The matrix names no model; say so once, where it does not mix with --json output.
        print(
            "topoplace plan: the topology names no GPU model, so the GPUs are model 'unknown'"
            " (NVLink speeds of no GPU family); give --model MODEL, e.g. --model"
            " 'Tesla V100-SXM2-32GB'",
            file=sys.stderr,
        )
    state = ClusterState()
    state.upsert(snapshot)
    state.allocate(snapshot.name, busy)
    outcome = state.place(request)
    if outcome.placement is None:
        print(f"unschedulable: {outcome.summary()}", file=sys.stderr)
        return EXIT_UNSCHEDULABLE
    task = outcome.placement.tasks[0]
    if args.json:
        print(
            json.dumps(
                {
                    "gpus": list(task.gpu_indices),
                    "ring_gbps": task.score.ring_gbps,
                    "pair_sum_gbps": task.score.pair_sum_gbps,
                    "reason": task.reason,
                }
            )
        )
    else:
        print(f"gpus:      {','.join(str(i) for i in task.gpu_indices)}")
        print(f"ring:      {task.score.ring_gbps:g} GB/s")
        print(f"pair sum:  {task.score.pair_sum_gbps:g} GB/s")
        if task.cpuset:
            print(f"cpuset:    {task.cpuset}")
        print(f"reason:    {task.reason}")
    return EXIT_PLACED
