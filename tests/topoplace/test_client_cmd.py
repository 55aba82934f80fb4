"""The client commands against a real service: uvicorn on loopback, the demo cluster, SQLite.

One server serves the whole module (starting it, migrations included, is
most of the cost); each test works on its own job ids so that the tests
do not depend on each other's order.
"""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.demo import demo_snapshots
from service.schema import LIVE_STATES
from topoplace import client_cmd
from topoplace.cli import main
from topoplace_client import api as client_module
from topoplace_client.api import TopoplaceClient

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")
DEMO = demo_snapshots()


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy from the environment must not sit between the client and loopback,
    # and the default server must come from each test, not from the shell.
    for name in (*PROXY_VARIABLES, client_cmd.SERVER_ENV):
        monkeypatch.delenv(name, raising=False)


class Cli:
    """`topoplace ...` in-process against one server; returns (exit code, stdout, stderr)."""

    def __init__(self, server: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.server = server
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        code = main([*args, "--server", self.server])
        captured = self.capsys.readouterr()
        return code, captured.out, captured.err

    def json(self, *args: str) -> Any:
        code, out, err = self(*args, "--json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def cli(server: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(server, capsys)


def _place(cli: Cli, *args: str) -> dict[str, Any]:
    allocation: dict[str, Any] = cli.json("place", *args)
    return allocation


def test_nodes_lists_the_demo_cluster(cli: Cli) -> None:
    code, out, err = cli("nodes")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "STATE", "FREE/GPUS"]
    names = [line.split()[0] for line in lines[1:]]
    assert sorted(names) == sorted(s.name for s in DEMO)
    row = next(line for line in lines if line.startswith("v100-a "))
    assert row.split()[1] == "ready" and row.split()[-1] == "default"
    assert "/8" in row.split()[2] and "nvl0:" in row
    # GPUs without NVLink are PCIe groups, one per socket, not islands of one GPU each.
    pcie = next(line for line in lines if line.startswith("l40s-a "))
    assert "pcie0:4/4,pcie1:4/4" in pcie and "nvl" not in pcie

    listed = cli.json("nodes")["nodes"]
    assert {n["name"] for n in listed} == {s.name for s in DEMO}


def test_node_detail_shows_gpus_islands_and_allocations(cli: Cli) -> None:
    placed = _place(cli, "--gpus", "2", "--job-id", "detail-job")
    node = placed["tasks"][0]["node"]
    code, out, _ = cli("node", node)
    assert code == 0
    assert f"node       {node}" in out and "ISLAND" in out and "HEALTH" in out
    row = next(line for line in out.splitlines() if line.startswith(placed["id"]))
    gpus = ",".join(str(i) for i in placed["tasks"][0]["gpu_indices"])
    assert "detail-job" in row and row.endswith(f"{node}[{gpus}]")

    detail = cli.json("node", node)
    assert placed["id"] in detail["allocations"]

    code, out, err = cli("node", "no-such-node")
    assert code == 1 and out == ""
    assert err.startswith("error: not_found: ") and "no-such-node" in err


def test_topo_prints_the_matrix_and_bandwidths(cli: Cli) -> None:
    code, out, _ = cli("topo", "v100-a")
    assert code == 0
    assert out.splitlines()[0].split()[:2] == ["GPU0", "GPU1"] and "NV1" in out
    assert "Bandwidth" not in out

    code, out, _ = cli("topo", "v100-a", "--bandwidth")
    assert code == 0 and "Bandwidth (GB/s)" in out
    matrix = out.split("rates it:\n\n", 1)[1].splitlines()
    assert matrix[0].split() == [f"GPU{i}" for i in range(8)]
    assert matrix[1].split() == ["GPU0", "X", "25", "25", "50", "50", "8", "8", "8"]

    topo = cli.json("topo", "v100-a")
    assert topo["gpus"][0] == "GPU0" and topo["bandwidth_gbps"][0][3] == 50.0


def test_place_returns_gpus_and_honours_the_idempotency_key(cli: Cli) -> None:
    args = ("--gpus", "4", "--locality", "nvlink", "--job-id", "idem-job")
    first = _place(cli, *args, "--idempotency-key", "idem-key-1")
    assert first["state"] == "pending" and first["job_id"] == "idem-job"
    assert len(first["tasks"]) == 1 and len(first["tasks"][0]["gpu_indices"]) == 4
    again = _place(cli, *args, "--idempotency-key", "idem-key-1")
    assert again["id"] == first["id"]
    assert len(cli.json("allocations", "--job", "idem-job")["allocations"]) == 1

    code, _, err = cli("place", "--gpus", "2", "--idempotency-key", "idem-key-1")
    assert code == 1 and err.startswith("error: conflict: ")


def test_a_replayed_key_whose_allocation_ended_names_no_gpus_as_placed(cli: Cli) -> None:
    # A wrapper retrying `place` on exit 3 with the same key, after the reservation was
    # released (or expired): the replay is the ended allocation, whose GPUs another job
    # may hold now. It was printed as placed (exit 0, CUDA_VISIBLE_DEVICES of those GPUs).
    args = ("--gpus", "8", "--locality", "nvlink", "--model", "H100", "--job-id", "ended-job")
    first = _place(cli, *args, "--idempotency-key", "ended-key")
    assert cli.json("release", first["id"]) == {"released": [first["id"]]}
    other = _place(cli, *args[:-1], "ended-other")
    assert other["tasks"][0]["gpu_uuids"] == first["tasks"][0]["gpu_uuids"]

    code, out, err = cli("place", *args, "--idempotency-key", "ended-key")
    assert code == 1 and out == ""
    assert err.startswith(f"error: allocation_ended: allocation {first['id']} ")
    assert "released" in err and "new Idempotency-Key" in err
    code, out, err = cli("place", *args, "--idempotency-key", "ended-key", "--json")
    assert code == 1 and json.loads(out)["id"] == first["id"]
    assert json.loads(out)["state"] == "released" and "allocation_ended" in err
    assert set(LIVE_STATES) == client_cmd.LIVE_STATES  # the service's, copied


def test_place_prints_what_a_launcher_needs(cli: Cli) -> None:
    code, out, _ = cli(
        "place", "--gpus", "2", "--tasks", "2", "--cpus", "1", "--job-id", "text-job",
        "--owner", "alice", "--ttl", "60", "--policy", "spread", "--model", "H100", "B200",
    )  # fmt: skip
    assert code == 0
    listed = cli.json("allocations", "--job", "text-job")["allocations"]
    assert len(listed) == 1
    allocation = listed[0]
    assert allocation["owner"] == "alice"
    fields = dict(line.split(None, 1) for line in out.splitlines()[:8] if not line[0].isspace())
    assert fields["allocation"] == allocation["id"] and fields["state"] == "pending"
    assert fields["owner"] == "alice" and fields["ring"].endswith("GB/s")
    assert fields["expires"].endswith(" UTC")
    for task in allocation["tasks"]:
        gpus = ",".join(str(i) for i in task["gpu_indices"])
        assert f"task {task['task']}: node {task['node']}, GPUs {gpus}, ring" in out
        assert f"  CUDA_VISIBLE_DEVICES={task['env']['CUDA_VISIBLE_DEVICES']}" in out
        assert task["env"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
        assert len(task["cpus"]) == 1
        node = cli.json("node", task["node"])
        assert all(
            "H100" in node["gpus"][i]["model"] or "B200" in node["gpus"][i]["model"]
            for i in task["gpu_indices"]
        )


def test_an_impossible_request_is_unresolvable(cli: Cli) -> None:
    code, out, err = cli("place", "--gpus", "64", "--locality", "nvlink")
    assert code == 1 and out == ""
    assert err.startswith("error: unresolvable: ") and "64 GPUs" in err

    code, out, err = cli("place", "--gpus", "64", "--locality", "nvlink", "--json")
    assert code == 1 and "unresolvable" in err
    assert json.loads(out)["error"]["detail"]["reasons"][0]["resolvable"] is False


def test_usage_errors_exit_2(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    # The service's own validation is a usage error too.
    code, _, err = cli("place", "--mig-profile", "1g.10gb", "--gpus", "2")
    assert code == 2 and err.startswith("error: invalid_request: ")
    for argv in (["release"], ["release", "x", "--job", "y"], ["place", "--gpus", "0"]):
        with pytest.raises(SystemExit) as exited:
            main([*argv, "--server", cli.server])
        assert exited.value.code == 2
    assert "--gpus: must be at least 1" in capsys.readouterr().err
    assert main(["cluster", "--server", "ftp://example.org"]) == 2
    assert capsys.readouterr().err.startswith("error: --server: ")


def test_release_by_id_and_by_job(cli: Cli) -> None:
    one = _place(cli, "--gpus", "1", "--job-id", "rel-job")
    two = _place(cli, "--gpus", "1", "--job-id", "rel-job")
    other = _place(cli, "--gpus", "1", "--job-id", "rel-other")

    code, out, _ = cli("release", one["id"])
    assert code == 0 and out == f"released {one['id']}\n"
    code, out, _ = cli("release", one["id"])
    assert code == 0 and "already ended; nothing released" in out

    assert cli.json("release", "--job", "rel-job") == {"released": [two["id"]]}
    code, out, _ = cli("release", "--job", "rel-job")
    assert code == 0 and "no live allocations" in out
    released = cli.json("allocations", "--job", "rel-job", "--state", "released")
    assert {a["id"] for a in released["allocations"]} == {one["id"], two["id"]}
    assert cli.json("allocations", "--job", "rel-other")["allocations"][0]["state"] == "pending"
    assert cli.json("release", other["id"]) == {"released": [other["id"]]}

    code, _, err = cli("release", "no-such-allocation")
    assert code == 1 and err.startswith("error: not_found: ")


def test_allocations_listing_filters(cli: Cli) -> None:
    placed = _place(cli, "--gpus", "2", "--job-id", "list-job", "--owner", "bob")
    node = placed["tasks"][0]["node"]

    code, out, _ = cli("allocations", "--job", "list-job")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["ID", "STATE", "JOB", "OWNER", "RING", "EXPIRES", "PLACEMENT"]
    assert row.split()[:4] == [placed["id"], "pending", "list-job", "bob"]

    on_node = cli.json("allocations", "--node", node)["allocations"]
    assert placed["id"] in {a["id"] for a in on_node}
    assert all(any(t["node"] == node for t in a["tasks"]) for a in on_node)
    assert cli.json("allocations", "--job", "list-job", "--state", "active")["allocations"] == []
    assert len(cli.json("allocations", "--limit", "1")["allocations"]) == 1

    code, out, _ = cli("allocations", "--job", "no-such-job")
    assert code == 0 and out == "no allocations match\n"


def test_cluster_summary(cli: Cli) -> None:
    total_gpus = sum(s.gpu_count for s in DEMO)
    code, out, _ = cli("cluster")
    assert code == 0
    lines = dict(line.split(None, 1) for line in out.splitlines())
    assert lines["nodes"].startswith(f"{len(DEMO)}: ") and "ready" in lines["nodes"]
    assert lines["GPUs"].startswith(f"{total_gpus}: ") and "free" in lines["GPUs"]
    assert lines["fragmentation"].split()[0].endswith("%")

    summary = cli.json("cluster")
    assert summary["nodes"]["total"] == len(DEMO) and summary["gpus"]["total"] == total_gpus
    # The MIG node's GPUs in MIG mode are counted as such, not as unhealthy.
    gpus = summary["gpus"]
    assert gpus["mig_enabled"] == 4 and gpus["unhealthy"] == 0
    assert gpus["healthy"] == total_gpus


def test_server_from_the_environment(
    server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(client_cmd.SERVER_ENV, server.removeprefix("http://"))
    assert main(["cluster", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"]["total"] == len(DEMO)
    monkeypatch.setenv(client_cmd.SERVER_ENV, "ftp://example.org")
    assert main(["cluster"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {client_cmd.SERVER_ENV}: ")


def test_unreachable_server_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    # Bound but not listening: the kernel refuses connections, and holding the
    # socket keeps anyone else from taking the port meanwhile.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        assert main(["nodes", "--server", url]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"error: cannot reach topoplace at {url}: ")

    # Listening but never answering: the timeout applies and says so.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        assert main(["cluster", "--server", url, "--timeout", "0.2"]) == 3
        assert time.monotonic() - started < 5
    assert "no answer within 0.2 s" in capsys.readouterr().err


def _mock_cli(monkeypatch: pytest.MonkeyPatch, handler: Any) -> functools.partial[TopoplaceClient]:
    factory = functools.partial(TopoplaceClient, transport=httpx.MockTransport(handler))
    monkeypatch.setattr(client_module, "TopoplaceClient", factory)
    return factory


def test_answers_that_are_not_the_service_s(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/cluster":
            body = {"error": {"code": "database_unavailable", "message": "down", "detail": {}}}
            return httpx.Response(503, json=body, headers={"Retry-After": "5"})
        if request.url.path == "/v1/nodes":
            return httpx.Response(200, text="<html>a login page</html>")
        return httpx.Response(502, text="<h1>Bad Gateway</h1>")

    _mock_cli(monkeypatch, handler)
    # The service up but unable to serve exits like an unreachable one: retry later.
    assert main(["cluster", "--server", "http://svc"]) == 3
    assert capsys.readouterr().err == (
        "error: database_unavailable: down; try again later (Retry-After: 5)\n"
    )
    assert main(["nodes", "--server", "http://svc"]) == 1
    assert "error: invalid_response: " in capsys.readouterr().err
    assert main(["node", "x", "--server", "http://svc"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: http_502: http://svc/v1/nodes/x answered 502 Bad Gateway")


def test_a_rate_limited_answer_exits_3_with_its_retry_after(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """429 is "try later", as for `topoplace agent --once`: a wrapper that retries on 3
    and gives up on 1 must not give up on a service that asked it to slow down."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = {"error": {"code": "rate_limited", "message": "too many requests", "detail": {}}}
        return httpx.Response(429, json=body, headers={"Retry-After": "7"})

    _mock_cli(monkeypatch, handler)
    assert main(["place", "--gpus", "2", "--server", "http://svc"]) == 3
    err = capsys.readouterr().err
    assert err == "error: rate_limited: too many requests; try again later (Retry-After: 7)\n"
    assert main(["release", "a1", "--server", "http://svc", "--json"]) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"]["code"] == "rate_limited"
    assert "Retry-After: 7" in captured.err


def test_other_commands_do_not_import_httpx() -> None:
    code = "import sys, topoplace.cli; topoplace.cli.build_parser(); print('httpx' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert result.stdout.strip() == "False"


def test_place_a_gpu_share_and_see_it_listed(cli: Cli) -> None:
    share = _place(cli, "--gpu-fraction", "0.25", "--job-id", "share-job")
    task = share["tasks"][0]
    assert task["gpu_fraction"] == 0.25 and len(task["gpu_indices"]) == 1
    code, out, _ = cli("allocations", "--job", "share-job")
    assert code == 0 and f"0.25@{task['gpu_indices'][0]}" in out
    code, _, err = cli("place", "--gpu-fraction", "0.5", "--gpus", "2")
    assert code == 2 and err.startswith("error: invalid_request: ")
