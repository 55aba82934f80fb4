"""What a Slurm filter call costs at least, measured the way slurmctld makes it.

slurmctld calls job_submit.lua once per submission, and between two
submissions (the rest of sbatch: about 5 ms here) the service sits idle, so
every call runs on caches that hold other processes' work. Each part is
timed back to back and after IDLE_S of idle:

1. lua -> bare server: the filter's own Lua client (topoplace_client.lua, one
   kept-alive HTTP/1.1 connection) against an asyncio server that answers
   every request with a fixed body: the round trip with no framework at all;
2. lua -> topoplace: the same client posting the benchmark's 1-GPU job to
   /v1/slurm/job-submit of a real `topoplace serve` (SQLite), the whole call
   as slurmctld makes it (each allocation released, untimed, after it);
3. engine: choosing and applying a 1-GPU placement on the same 3-node
   cluster, in process;
4. sqlite commit: the reservation's two inserts and commit as bare sqlite3
   calls on the service's schema.

Needs lua5.1 with lua-socket and lua-cjson (Debian). Run:
``python -m bench.filter_floor``.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench.fixed_answer import fixed_answer
from bench.machine import describe
from placement import ClusterState, PlacementRequest
from placement.profiles import build_profile
from service import migrate
from tests.integrations.slurm.loopback import LUA_DIR, Service

IDLE_S = 0.005
NODES = ("node1", "node2", "node3")
SUBMIT = '{tres_per_node="gres:gpu:1", partition_nodes="node[1-3]", user_name="bench", batch=true}'

BARE_BODY = '{"action":"unchanged","message":"bare"}'

# Times `count` posts of the job, after `idle` seconds each; prints one number per line.
LUA_LOOP = """
package.path = arg[1] .. "/?.lua;" .. package.path
local client = require("topoplace_client")
local socket = require("socket")
local count, idle, release = tonumber(arg[2]), tonumber(arg[3]), arg[4] == "release"
local body = @SUBMIT@
for _ = 1, count do
  if idle > 0 then socket.sleep(idle) end
  local started = socket.gettime()
  local status, answer = client.post("/v1/slurm/job-submit", body)
  print((socket.gettime() - started) * 1000)
  assert(status == 200, tostring(answer))
  if release then
    local id = answer.set.admin_comment:match("alloc=([%w-]+)")
    client.post("/v1/allocations/" .. id .. "/release", {})
  end
end
""".replace("@SUBMIT@", SUBMIT)


def lua_times(root: Path, url: str, count: int, idle_s: float, release: bool) -> list[float]:
    client = root / "lua"
    client.mkdir(exist_ok=True)
    shutil.copy(LUA_DIR / "topoplace_client.lua", client)
    (client / "topoplace.conf").write_text(f"server = {url}\ntimeout_ms = 1000\n")
    (client / "loop.lua").write_text(LUA_LOOP)
    done = subprocess.run(
        ["lua5.1", str(client / "loop.lua"), str(client), str(count), str(idle_s)]
        + (["release"] if release else []),
        capture_output=True,
        text=True,
        check=True,
    )
    return [float(line) for line in done.stdout.split()]


def in_process(step: Callable[[], None], count: int, idle_s: float) -> list[float]:
    times = []
    for _ in range(count):
        if idle_s:
            time.sleep(idle_s)
        started = time.perf_counter()
        step()
        times.append((time.perf_counter() - started) * 1000)
    return times


def engine_step() -> Callable[[], None]:
    state = ClusterState()
    for name in NODES:
        state.upsert(build_profile("dgx1-v100", name))
    request = PlacementRequest(gpus=1, nodes=NODES)

    def step() -> None:
        placement = state.place(request).placement
        assert placement is not None
        state.apply(placement)
        state.unapply(placement)  # the release is part of the step: it is cheap

    return step


def sqlite_step(path: Path) -> Callable[[], None]:
    """The statements a reservation writes, as bare sqlite3 calls on the service's schema:
    the allocation (live, named by its hold), the hold (naming the node snapshot it was
    chosen on) and the decision's audit row, in one transaction."""
    migrate.upgrade(f"sqlite:///{path}")
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA foreign_keys=ON")
    at = "2026-06-01 12:00:00.000000"
    db.execute(
        "INSERT INTO nodes (name, region, snapshot, seq, reported_at, heartbeat_at)"
        " VALUES ('node1', 'default', ?, 1, ?, ?)",
        ("{}" * 1400, at, at),
    )
    counter = iter(range(10**9))

    def step() -> None:
        allocation, device = str(uuid.uuid4()), f"GPU-{next(counter)}"
        db.execute("BEGIN")
        db.execute(
            "INSERT INTO allocations (id, state, owner, request, placement, created_at, live,"
            " anchor_node, anchor_device) VALUES (?, 'active', 'slurm:bench', ?, ?, ?, 1,"
            " 'node1', ?)",
            (allocation, "{}" * 160, "{}" * 420, at, device),
        )
        db.execute(
            "INSERT INTO gpu_holds (node, device, kind, allocation_id, live, node_seq)"
            " VALUES ('node1', ?, 'gpu', ?, 1, 1)",
            (device, allocation),
        )
        db.execute(
            "INSERT INTO audit_log (at, kind, action, actor_name, route, nodes, allocation_id,"
            " detail) VALUES (?, 'allocation', 'placed', 'bench', '/v1/slurm/job-submit',"
            " 'node1', ?, ?)",
            (at, allocation, "{}" * 610),
        )
        db.execute("COMMIT")

    return step


def measure_parts(
    root: Path, service: Service, bare_url: str, count: int
) -> list[tuple[str, float, float]]:
    """(part, p50 back to back, p50 after IDLE_S of idle) for each part, in ms."""
    engine, commit = engine_step(), sqlite_step(root / "floor.sqlite3")
    parts: list[tuple[str, Callable[[float], list[float]]]] = [
        ("lua -> bare server", lambda idle: lua_times(root, bare_url, count, idle, False)),
        (
            "lua -> topoplace job-submit",
            lambda idle: lua_times(root, service.url, count, idle, True),
        ),
        ("engine place + apply", lambda idle: in_process(engine, count, idle)),
        ("sqlite insert + commit", lambda idle: in_process(commit, count, idle)),
    ]
    rows = []
    for label, measure in parts:
        measure(0.0)  # warm-up
        hot, cold = (statistics.median(measure(idle)) for idle in (0.0, IDLE_S))
        rows.append((label, hot, cold))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300, help="calls per measurement")
    args = parser.parse_args()
    if shutil.which("lua5.1") is None:
        raise SystemExit("needs lua5.1 with lua-socket and lua-cjson (Debian packages)")
    print(f"machine: {describe()}")
    root = Path(tempfile.mkdtemp(prefix="topoplace-bench-floor-"))
    (root / "service").mkdir()
    service = Service(root / "service")
    with fixed_answer(BARE_BODY) as bare_url:
        try:
            service.start()
            service.report("dgx1-v100", list(NODES))
            time.sleep(0.5)
            rows = measure_parts(root, service, bare_url, args.count)
        finally:
            service.stop()
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n| part | p50 back to back ms | p50 after {IDLE_S * 1000:g} ms idle ms |")
    print("|---|---|---|")
    for label, hot, cold in rows:
        print(f"| {label} | {hot:.3f} | {cold:.3f} |")
    floor = [cold for label, _, cold in rows if label != "lua -> topoplace job-submit"]
    print(
        f"\nbare round trip + engine + commit after idle: {sum(floor):.2f} ms"
        f" (the whole topoplace call: {rows[1][2]:.2f} ms)"
    )


if __name__ == "__main__":
    main()
