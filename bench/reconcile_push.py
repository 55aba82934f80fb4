"""Other requests' latency while a whole queue's `squeue --json` is pushed to the service.

`topoplace serve` (SQLite) on loopback; one thread sends `GET /healthz` every
2 ms, and meanwhile a pushed squeue answer of `--mb` megabytes (the pending
job Slurm 22.05.8 printed on the loopback cluster, tests/service/slurm/
squeue-22.05.json, repeated with new job ids) goes to `POST
/v1/slurm/reconcile`. Printed per push: its time, and /healthz's median and
worst latency before it and while it was processed. The worst one is what
every other request of the process waited for the push (docs/slurm.md,
"Pushing squeue's answer"). Run it against an older checkout with
PYTHONPATH to compare; `TOPOPLACE_MAX_BODY_BYTES` is raised so that a
service without the route's own limit reads the push too.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.machine import describe
from tests.integrations.slurm.loopback import Service
from tests.service.slurm.captured import pending_queue

PING_EVERY_S = 0.002


def _pings(url: str, stop: threading.Event, seen: list[tuple[float, float]]) -> None:
    with httpx.Client(base_url=url, trust_env=False) as client:
        while not stop.is_set():
            sent = time.perf_counter()
            client.get("/healthz")
            seen.append((sent, time.perf_counter() - sent))
            time.sleep(PING_EVERY_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=20, help="the push's size, MiB")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    body, jobs = pending_queue(int(args.mb * 1024 * 1024))
    print(f"machine: {describe()}")
    print(f"push: {jobs} pending jobs, {len(body) / 1e6:.1f} MB")
    limit = str(max(len(body) + 1, 4 * 1024 * 1024))
    off = {"TOPOPLACE_SLURM_SQUEUE_COMMAND": "off", "TOPOPLACE_SLURM_SINFO_COMMAND": "off"}
    service = Service(Path(tempfile.mkdtemp()), {"TOPOPLACE_MAX_BODY_BYTES": limit, **off})
    service.start()
    try:
        for _ in range(args.rounds):
            seen: list[tuple[float, float]] = []
            stop = threading.Event()
            pinger = threading.Thread(target=_pings, args=(service.url, stop, seen))
            pinger.start()
            time.sleep(0.5)
            with httpx.Client(base_url=service.url, trust_env=False, timeout=120) as client:
                started = time.perf_counter()
                answer = client.post(
                    "/v1/slurm/reconcile",
                    content=body,
                    headers={"Content-Type": "application/json"},
                )
                ended = time.perf_counter()
            time.sleep(0.3)
            stop.set()
            pinger.join()
            before = [s for t, s in seen if t < started - 0.05]
            during = [s for t, s in seen if started <= t <= ended] or [0.0]
            print(
                f"push {answer.status_code} in {(ended - started) * 1e3:.0f} ms;"
                f" /healthz before: median {statistics.median(before) * 1e3:.1f} ms,"
                f" worst {max(before) * 1e3:.1f} ms; during: {len(during)} answered,"
                f" median {statistics.median(during) * 1e3:.1f} ms,"
                f" worst {max(during) * 1e3:.1f} ms"
            )
    finally:
        service.stop()


if __name__ == "__main__":
    main()
