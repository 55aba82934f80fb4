"""Slurm submissions with and without the topoplace filter, on a loopback cluster.

The service runs as deployed, its reconcile loop reading the filtered
cluster's `squeue --json` (it releases the other clusters' reservations,
which no job there names, soon after they are made; that changes no timing).
Three clusters run side by side on this machine, configured alike from the
same service (DGX-1 nodes, 8 fake GPUs each, gres.conf and node lines from
`topoplace slurm`): one with job_submit.lua in front of slurmctld (the
filter), one with cli_filter.lua in sbatch as well, one without either.
Measured, one submission on each in turn so drift hits all three:

1. sbatch of a 1-GPU job that waits: a job without GPUs holds every CPU of
   each cluster's nodes, so nothing submitted runs and the filter reserves for
   every submission, as for a job waiting for Resources (a job submitted
   `--hold` is left to Slurm unreserved, docs/slurm.md, so timing one would
   time the filter's cheapest answer, not a reservation).
   Timed: the sbatch process's wall time, and the filter's own time, as
   job_submit.lua measures its call and logs it (`[1.3 ms]` in slurmctld's
   log; not the submit RPC's `usec=`, which slurmctld counts otherwise and
   which came out smaller than the filter's own time for the same job);
   submissions per second = 1 / mean sbatch time (one client, back to back).
   Every 20 submissions the jobs are cancelled and their allocations
   released, untimed, so the service always has GPUs to give. A fourth
   series on the cluster without the filter asks by hand for what the filter
   writes into a job (one node, one typed GPU, a comment, environment): its
   added time is Slurm's own, the part of the filter's cost no filter avoids.
   A fifth cluster runs the filter against a server that answers every call
   at once with a decision the service gave before the run: the filter's
   cost with no service behind it, the most any service could reach.
2. Throughput with several submitters: blocks of 20 waiting submissions from
   4 client threads at once, alternating between the clusters (cancelled and
   released between blocks, untimed): submissions per second over the blocks.
3. GPU choice: on a node where some jobs already hold GPUs, a `--gpus=4`
   job with the filter, and the same state without it (the same GPUs held
   by pinned jobs): the GPUs each gets and their all-reduce ring (GB/s).

Needs root and Debian's slurmctld, slurmd, slurm-client, munge, lua-socket,
lua-cjson. Run: ``python -m bench.slurm_submit [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import re
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from bench.fixed_answer import fixed_answer
from bench.machine import describe
from placement import bandwidth_matrix
from placement.profiles import build_profile
from tests.integrations.slurm.loopback import (
    Job,
    LoopbackCluster,
    Service,
    missing_prerequisites,
)

PROFILE = "dgx1-v100"
BANDWIDTH = bandwidth_matrix(build_profile(PROFILE, "any"))
ROUND = 20
CLIENTS = 4
PRESET = "without, fields set by hand as the filter sets them"
FIXED = "with filter, a server answering a fixed decision at once"
IDLE_S = 0.005  # about the time one sbatch takes, when the service waits
# Jobs already on the node before the 4-GPU job, as GPUs per job.
STATES = ((1,), (1, 2), (1, 1))
SUBMIT = {"tres_per_node": "gres:gpu:1", "partition_nodes": "node[1-3]", "user_name": "bench"}


def ring_gbps(gpus: list[int]) -> float:
    first, rest = gpus[0], gpus[1:]
    return max(
        min(float(BANDWIDTH[a][b]) for a, b in itertools.pairwise([first, *order, first]))
        for order in itertools.permutations(rest)
    )


def filter_ms(cluster: LoopbackCluster) -> list[float]:
    """The filter's own time per submission, as job_submit.lua logs it inside slurmctld."""
    text = (cluster.root / "log" / "slurmctld.log").read_text()
    return [float(m) for m in re.findall(r"lua: topoplace: .*\[([\d.]+) ms\]", text)]


def clear_allocations(service: Service) -> None:
    with service.client() as client:
        for state in ("pending", "active"):
            for allocation in client.allocations(state=state)["allocations"]:
                client.release(allocation["id"])


def fixed_decision(service: Service, node: str) -> str:
    """What the service answers a --gpus=1 batch job on ``node`` (released after)."""
    ask = {"tres_per_job": "gres/gpu:1", "partition_nodes": node, "batch": True}
    answer = httpx.post(f"{service.url}/v1/slurm/job-submit", json=ask, timeout=10)
    answer.raise_for_status()
    assert answer.json()["action"] == "modify", answer.text
    clear_allocations(service)
    return answer.text


def every_cpu(cluster: LoopbackCluster, nodes: list[str]) -> list[str]:
    """On each node a running job with every CPU and no GPU: jobs submitted after it
    wait for Resources, reserved for by the filter and never run. Their ids."""
    blockers = []
    for node in nodes:
        shown = cluster.run("scontrol", "show", "node", node).stdout
        cpus = re.search(r"CPUTot=(\d+)", shown)
        assert cpus is not None, shown
        job = cluster.sbatch(f"--cpus-per-task={cpus.group(1)}", "-w", node, script="sleep 3600")
        assert job.returncode == 0, job.stderr
        blockers.append(job.id)
    for job_id in blockers:
        cluster.wait_state(job_id, ("RUNNING",))
    return blockers


def clear(cluster: LoopbackCluster, service: Service, jobs: list[str]) -> None:
    if jobs:
        cluster.run("scancel", *jobs)
    clear_allocations(service)
    jobs.clear()


def as_the_filter_sets_it(node: str) -> list[str]:
    """A 1-GPU job asking, without the filter, for what the filter would write
    into it: one node, one typed GPU, a comment and environment variables."""
    return [
        "-w",
        node,
        "--gres=gpu:g3:1",
        "--comment=topoplace alloc=6f1c2a4e-0b7d-4c55-9a1e-3f2b8d7c6e10 ring=0GB/s"
        " bandwidth=1.00 gpus=3",
        "--export=ALL,TOPOPLACE_ALLOCATION_ID=6f1c2a4e,TOPOPLACE_GPUS=3,TOPOPLACE_RING_GBPS=0",
    ]


def submissions(
    clusters: dict[str, LoopbackCluster], service: Service, count: int, solo: str
) -> dict[str, list[float]]:
    """sbatch seconds per cluster, plus Slurm alone taking the fields the filter sets."""
    runs = {label: (cluster, ["--gpus=1"]) for label, cluster in clusters.items()}
    runs[PRESET] = (clusters["without"], as_the_filter_sets_it(solo))
    seconds: dict[str, list[float]] = {label: [] for label in runs}
    pending: dict[str, list[str]] = {label: [] for label in runs}
    for i in range(count):
        for label, (cluster, ask) in runs.items():
            job = cluster.sbatch(*ask, script="true")
            assert job.returncode == 0, job.stderr
            seconds[label].append(job.seconds)
            pending[label].append(job.id)
        if (i + 1) % ROUND == 0:
            for label, (cluster, _) in runs.items():
                clear(cluster, service, pending[label])
    for label, (cluster, _) in runs.items():
        clear(cluster, service, pending[label])
    return seconds


def concurrent_rates(
    clusters: dict[str, LoopbackCluster], service: Service, blocks: int
) -> dict[str, float]:
    """Submissions per second with CLIENTS submitting at once, over ``blocks`` blocks."""
    seconds = dict.fromkeys(clusters, 0.0)
    with ThreadPoolExecutor(CLIENTS) as pool:
        for _ in range(blocks):
            for label, cluster in clusters.items():

                def submit(_: int, cluster: LoopbackCluster = cluster) -> Job:
                    return cluster.sbatch("--gpus=1", script="true")

                started = time.perf_counter()
                jobs = list(pool.map(submit, range(ROUND)))
                seconds[label] += time.perf_counter() - started
                assert all(job.returncode == 0 for job in jobs), [j.stderr for j in jobs]
                clear(cluster, service, [job.id for job in jobs])
    return {label: blocks * ROUND / total for label, total in seconds.items()}


def service_calls(service: Service, count: int = 100) -> dict[str, float]:
    """p50 of the filter's call and of its parts, made straight to the service: back to
    back, and with the service idle for 5 ms before each call, as it is between two
    sbatch submissions (a call after idle time runs on cold CPU caches)."""
    out: dict[str, float] = {}
    with httpx.Client(base_url=service.url) as http:
        for label, method, path, body in (
            ("GET /healthz", "GET", "/healthz", None),
            ("POST /v1/place (1 GPU)", "POST", "/v1/place", {"gpus": 1}),
            ("POST /v1/slurm/job-submit", "POST", "/v1/slurm/job-submit", SUBMIT),
        ):
            for idle_s in (0.0, IDLE_S):
                times = []
                for i in range(count):
                    time.sleep(idle_s)
                    started = time.perf_counter()
                    response = http.request(method, path, json=body)
                    times.append((time.perf_counter() - started) * 1000)
                    assert response.status_code < 300, response.text
                    if i % ROUND == ROUND - 1:
                        clear_allocations(service)
                clear_allocations(service)
                out[label + (f" after {idle_s * 1000:g} ms idle" if idle_s else "")] = pct(
                    times, 50
                )
    return out


def held_gpus(cluster: LoopbackCluster, job: str) -> list[int]:
    shown = cluster.show_job(job)
    return sorted(int(i) for i in re.findall(r"\(IDX:(\d+)\)", shown))


def choice(
    filtered: LoopbackCluster, alone: LoopbackCluster, node: str, solo: str, state: tuple[int, ...]
) -> tuple[list[int], list[int], list[int]]:
    fillers = [filtered.sbatch(f"--gpus={g}", "-w", node, script="sleep 60") for g in state]
    busy: list[list[int]] = []
    for filler in fillers:
        filtered.wait_state(filler.id, ("RUNNING",))
        busy.append(held_gpus(filtered, filler.id))
    pinned = [
        alone.sbatch(
            "-w", solo, f"--gres={','.join(f'gpu:g{g}:1' for g in gpus)}", script="sleep 60"
        )
        for gpus in busy
    ]
    for job in pinned:
        alone.wait_state(job.id, ("RUNNING",))
    script = "echo CVD=$CUDA_VISIBLE_DEVICES; sleep 60"
    ours = filtered.sbatch("--gpus=4", "-w", node, script=script)
    theirs = alone.sbatch("--gpus=4", "-w", solo, script=script)
    picked = []
    for cluster, job in ((filtered, ours), (alone, theirs)):
        text = cluster.wait_output(job.id, "CVD=")
        picked.append(sorted(int(g) for g in text.split("CVD=")[1].split()[0].split(",")))
    return sorted(g for gpus in busy for g in gpus), picked[0], picked[1]


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 submissions each instead of 300")
    parser.add_argument("--count", type=int, help="submissions each (overrides --quick)")
    args = parser.parse_args()
    why = missing_prerequisites()
    if why is not None:
        raise SystemExit(f"cannot run a loopback Slurm cluster here: {why}")
    count = args.count or (60 if args.quick else 300)
    print(f"machine: {describe()}")
    root = Path(tempfile.mkdtemp(prefix="topoplace-bench-slurm-"))
    # The service as deployed: its reconcile loop reads the filtered cluster's squeue
    # (every interval, and soon after each reservation: service/slurm/fresh.py).
    service = Service(
        root / "service",
        {
            "SLURM_CONF": str(root / "filtered" / "slurm.conf"),
            "TOPOPLACE_SLURM_SQUEUE_COMMAND": "squeue --json",
        },
    )
    (root / "service").mkdir()
    nodes, solos, both = ["node1", "node2", "node3"], ["solo1", "solo2", "solo3"], ["cli1"]
    fixed_node = "fixed1"
    filtered = LoopbackCluster(
        root / "filtered", nodes, service, with_filter=True, cli_filter=False
    )
    alone = LoopbackCluster(root / "alone", solos, service, with_filter=False)
    with_cli = LoopbackCluster(root / "with-cli", both, service, with_filter=True)
    no_service = LoopbackCluster(
        root / "fixed", [fixed_node], service, with_filter=True, cli_filter=False
    )
    clusters = {
        "without": alone,
        "with filter": filtered,
        "with filter + cli_filter": with_cli,
        FIXED: no_service,
    }
    stack = contextlib.ExitStack()  # the fixed-answer server
    try:
        service.start()
        service.report(PROFILE, [*nodes, *solos, *both, fixed_node])
        for cluster in clusters.values():
            cluster.root.mkdir()
            cluster.start()
        fixed_server = fixed_answer(fixed_decision(service, fixed_node))
        no_service.write_filter_config(stack.enter_context(fixed_server))
        layout = {"without": solos, "with filter": nodes, "with filter + cli_filter": both}
        blockers = {
            label: every_cpu(cluster, layout.get(label, [fixed_node]))
            for label, cluster in clusters.items()
        }
        seconds = submissions(clusters, service, count, solos[1])
        inside = filter_ms(filtered)
        print(f"\n{count} waiting 1-GPU sbatch submissions per cluster, in turn, one client")
        print("| | sbatch p50 ms | sbatch p99 ms | submissions/s | added p50 ms | added p99 ms |")
        print("|---|---|---|---|---|---|")
        rate = {}
        for label, s in seconds.items():
            rate[label] = 1 / statistics.mean(s)
            # Pairwise: each submission against the one made just before it without.
            added = [(a - b) * 1000 for a, b in zip(s, seconds["without"], strict=True)]
            shown = "-" if label == "without" else None
            print(
                f"| {label} | {pct(s, 50) * 1000:.1f} | {pct(s, 99) * 1000:.1f}"
                f" | {rate[label]:.0f} | {shown or f'{pct(added, 50):.1f}'}"
                f" | {shown or f'{pct(added, 99):.1f}'} |"
            )
        for label, calls in (("the service", inside), ("a fixed answer", filter_ms(no_service))):
            print(
                f"filter inside slurmctld, calling {label} (job_submit.lua's HTTP call,"
                f" {len(calls)} calls): p50 {pct(calls, 50):.2f} ms, p99 {pct(calls, 99):.2f} ms"
            )
        for label in ("with filter", "with filter + cli_filter", FIXED):
            print(f"throughput {label} / without: {rate[label] / rate['without']:.2f}x")
        rates = concurrent_rates(clusters, service, 5 if args.quick else 15)
        print(
            f"{CLIENTS} clients at once, submissions/s: "
            + ", ".join(f"{label} {rate:.0f}" for label, rate in rates.items())
            + f"; with filter / without: {rates['with filter'] / rates['without']:.2f}x"
        )
        for label, cluster in clusters.items():
            clear(cluster, service, blockers[label])
        direct = service_calls(service)
        print(
            "the same service over HTTP from Python, p50 ms: "
            + ", ".join(f"{k} {v:.1f}" for k, v in direct.items())
        )
        print("\nGPU choice for a --gpus=4 job on a DGX-1 node with GPUs already held")
        print("| GPUs held | topoplace | ring GB/s | Slurm alone | ring GB/s |")
        print("|---|---|---|---|---|")
        for node, solo, state in zip(nodes, solos, STATES, strict=True):
            busy, ours, theirs = choice(filtered, alone, node, solo, state)
            print(f"| {busy} | {ours} | {ring_gbps(ours):g} | {theirs} | {ring_gbps(theirs):g} |")
    finally:
        stack.close()
        for cluster in clusters.values():
            cluster.stop()
        service.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
