"""`topoplace nodes|node|topo|place|release|allocations|cluster`: the running service over HTTP.

Each command makes its request(s) through ``topoplace_client.api`` and prints a
short human-readable view, or with ``--json`` the service's JSON unchanged.

Exit status, for scripts:

- 0: done;
- 1: the service refused (unschedulable, unresolvable, conflict, not found), or
  ``place`` replayed an Idempotency-Key whose allocation has ended;
- 2: a usage error, whether argparse or the service's own validation saw it;
- 3: try later: no answer from the service, or it answered that it cannot serve
  (5xx, e.g. its database is down) or is rate limiting this caller (429 rate_limited;
  its Retry-After is in the message): ``ApiError.try_later``, the rule
  `topoplace agent --once` exits 3 by too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from topoplace_client.arguments import finite_number, int_at_least, positive_seconds

if TYPE_CHECKING:
    # Imported where a command runs instead: httpx takes a noticeable share of
    # the start-up time of every other command (`plan`, `serve`, ...).
    from topoplace_client.api import ApiError, JSONObject, TopoplaceClient

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

SERVER_ENV = "TOPOPLACE_SERVER"
TOKEN_ENV = "TOPOPLACE_TOKEN"
CA_BUNDLE_ENV = "TOPOPLACE_CA_BUNDLE"
DEFAULT_SERVER = "http://127.0.0.1:8080"  # where `topoplace serve` listens by default
DEFAULT_TIMEOUT_S = 10.0
# The service's codes for a request it could not make sense of: the caller's
# mistake, so they exit like a bad flag rather than like a refusal.
USAGE_CODES = frozenset({"bad_request", "invalid_request", "payload_too_large"})
ALLOCATION_STATES = ("pending", "active", "degraded", "released", "expired")
# Gangs can span thousands of tasks; a listing row names only the first few.
TASKS_SHOWN = 3

EXIT_HELP = (
    "exit status: 0 done; 1 the service refused (unschedulable, unresolvable, conflict,"
    " not found, an Idempotency-Key's allocation ended); 2 usage error; 3 try later:"
    " the service could not be reached, cannot serve (5xx) or is rate limiting (429)"
)

Action = Callable[["TopoplaceClient", argparse.Namespace], None]


class UsageError(Exception):
    """A command's own argument found wrong while it ran (an output file that cannot be
    written): exit 2, one line."""


# -- argument parsing ---------------------------------------------------------


_positive_int = int_at_least(1)
_non_negative_int = int_at_least(0)


def _service_options() -> argparse.ArgumentParser:
    """Options every client command takes, after the command name."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("service options")
    group.add_argument(
        "--server",
        metavar="URL",
        help=f"the topoplace service (default: ${SERVER_ENV}, else {DEFAULT_SERVER})",
    )
    group.add_argument(
        "--token-file",
        metavar="PATH",
        help=f"a file holding the API token (default: ${TOKEN_ENV}, else none)",
    )
    group.add_argument(
        "--ca-bundle",
        metavar="PEM",
        help=f"CA certificates an https service's certificate must chain to (default:"
        f" ${CA_BUNDLE_ENV}, else the system's)",
    )
    group.add_argument(
        "--json", action="store_true", help="print the service's JSON answer, errors included"
    )
    group.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up on an answer after this long (default {DEFAULT_TIMEOUT_S:g})",
    )
    return common


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = _service_options()

    def command(name: str, action: Action, help_text: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(
            name, parents=[common], help=help_text, description=help_text, epilog=EXIT_HELP
        )
        parser.set_defaults(func=lambda args: run(action, args))
        return parser

    command(
        "nodes",
        show_nodes,
        "list the service's nodes: state, free GPUs, free NVLink islands and PCIe groups",
    )

    p = command("node", show_node, "one node in detail: GPUs, islands, live allocations")
    p.add_argument("name", help="node name")

    p = command(
        "node-key",
        do_node_key,
        "show, register, replace or delete a node's signing key (registering a first key,"
        " replacing and deleting are admin actions)",
    )
    p.add_argument("name", help="node name")
    change = p.add_mutually_exclusive_group()
    change.add_argument(
        "--register",
        metavar="KEY",
        help="register this public key: base64, or @PATH of the agent's .pub file",
    )
    change.add_argument("--delete", action="store_true", help="forget the node's key")
    p.add_argument(
        "--replace", action="store_true", help="with --register: replace a different key"
    )

    p = command("topo", show_topology, "a node's GPU topology as `nvidia-smi topo -m` prints it")
    p.add_argument("node", help="node name")
    p.add_argument(
        "--bandwidth", action="store_true", help="also print the GB/s the engine assumes per pair"
    )

    p = command("place", do_place, "choose GPUs for a job and reserve them")
    _add_place_options(p)

    p = command("release", do_release, "release one allocation, or every live one of a job")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("allocation_id", nargs="?", metavar="ID", help="allocation id")
    which.add_argument("--job", metavar="JOB", help="release every live allocation of this job")

    p = command("allocations", show_allocations, "list allocations, newest first")
    p.add_argument("--job", metavar="JOB", help="only this job's")
    p.add_argument("--node", metavar="NODE", help="only those with a task on this node")
    p.add_argument("--state", choices=ALLOCATION_STATES, help="only those in this state")
    p.add_argument(
        "--limit", type=_positive_int, metavar="N", help="at most N (service default 500)"
    )

    command("cluster", show_cluster, "cluster summary: nodes, GPUs, fragmentation, allocations")


def _add_place_options(p: argparse.ArgumentParser) -> None:
    # Every default is None so that an option left out is left out of the
    # request too, and the service's own defaults (docs/engine.md) apply.
    p.add_argument(
        "--gpus", type=_positive_int, metavar="N", help="GPUs per task (service default 1)"
    )
    p.add_argument(
        "--tasks", type=_positive_int, metavar="N", help="tasks in the gang, all or nothing"
    )
    p.add_argument(
        "--locality",
        choices=["nvlink", "prefer", "any"],
        help="nvlink: only NVLink-connected GPUs; prefer (default): NVLink when it fits",
    )
    p.add_argument("--policy", choices=["pack", "spread"], help="node choice (default pack)")
    p.add_argument(
        "--objective", choices=["performance", "balanced"], help="GPU choice (default performance)"
    )
    p.add_argument(
        "--numa",
        choices=["required", "preferred", "ignore"],
        help="keep a task's GPUs and CPUs on one NUMA node (default preferred)",
    )
    p.add_argument(
        "--cpus", type=_non_negative_int, metavar="N", help="CPUs per task, near its GPUs"
    )
    p.add_argument("--mig-profile", metavar="P", help="a MIG instance per task, e.g. 1g.10gb")
    p.add_argument(
        "--gpu-fraction",
        type=finite_number,
        metavar="F",
        help="a share of one GPU for one task, 0 < F < 1 (0.25: a quarter)",
    )
    p.add_argument(
        "--model",
        dest="models",
        action="extend",
        nargs="+",
        metavar="M",
        help="accepted GPU models (whole words of the GPU name, e.g. H100)",
    )
    p.add_argument("--job-id", metavar="J", help="the job the GPUs are for")
    p.add_argument("--owner", metavar="O", help="who asks (user, team)")
    p.add_argument(
        "--ttl",
        type=positive_seconds,
        metavar="SECONDS",
        help="the reservation expires unless confirmed within this time (service default)",
    )
    p.add_argument(
        "--idempotency-key",
        metavar="K",
        help="the same key again returns the same allocation instead of a second one",
    )


# Command-line option -> field of the service's place request.
PLACE_FIELDS: tuple[tuple[str, str], ...] = (
    ("gpus", "gpus"),
    ("tasks", "tasks"),
    ("locality", "locality"),
    ("policy", "policy"),
    ("objective", "objective"),
    ("numa", "numa"),
    ("cpus", "cpus_per_task"),
    ("mig_profile", "mig_profile"),
    ("gpu_fraction", "gpu_fraction"),
    ("models", "gpu_models"),
    ("job_id", "job_id"),
    ("owner", "owner"),
    ("ttl", "ttl_s"),
)


def place_request(args: argparse.Namespace) -> JSONObject:
    """The body of POST /v1/place for these options: only the ones given."""
    return {
        field: getattr(args, attr)
        for attr, field in PLACE_FIELDS
        if getattr(args, attr) is not None
    }


# -- running a command ----------------------------------------------------------


def _server(args: argparse.Namespace) -> tuple[str, str]:
    """The service URL and where it came from, to name the culprit when it is malformed."""
    if args.server:
        return args.server, "--server"
    from_env = os.environ.get(SERVER_ENV, "").strip()
    if from_env:
        return from_env, SERVER_ENV
    return DEFAULT_SERVER, "default server"


def _token(args: argparse.Namespace) -> str | None:
    """The API token: the first line of --token-file, else $TOPOPLACE_TOKEN, else none.

    A token file that cannot be read, or whose first line is blank, is an error
    (ValueError naming it): taken for "no token", the command would go on
    unauthenticated and be refused (401) for a reason that names no file.
    """
    if args.token_file:
        path = args.token_file
        try:
            with open(path, encoding="utf-8") as handle:
                token = handle.readline().strip()
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror}") from exc
        except UnicodeDecodeError:
            raise ValueError(f"cannot read {path}: not UTF-8 text") from None
        if not token:
            raise ValueError(f"{path} holds no token on its first line")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


def _exit_code(error: ApiError) -> int:
    if error.code in USAGE_CODES:
        return EXIT_USAGE
    if error.try_later:
        return EXIT_UNREACHABLE
    return EXIT_REFUSED


def run(action: Action, args: argparse.Namespace) -> int:
    from topoplace_client.api import ApiError, ServiceUnreachable, TopoplaceClient

    server, source = _server(args)
    try:
        token = _token(args)
    except ValueError as exc:
        # Where the file was named: the option, or a config file's key (the epilog's).
        named = getattr(args, "token_source", None) or "--token-file"
        print(f"error: {named}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        ca_bundle = args.ca_bundle or os.environ.get(CA_BUNDLE_ENV, "").strip() or None
        client = TopoplaceClient(server, timeout=args.timeout, token=token, ca_bundle=ca_bundle)
    except ValueError as exc:
        print(f"error: {source}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with client:
            action(client, args)
    except ApiError as exc:
        if args.json and exc.body is not None:
            # Scripts asking for JSON get the structured error (e.g. detail.reasons) too.
            print_json(exc.body)
        print(f"error: {exc.line()}", file=sys.stderr)
        return _exit_code(exc)
    except ServiceUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


# -- formatting -------------------------------------------------------------------


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = [list(header), *(list(r) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _fields(pairs: Iterable[tuple[str, str]]) -> str:
    pairs = list(pairs)
    width = max(len(k) for k, _ in pairs) + 2
    return "\n".join(f"{k.ljust(width)}{v}" for k, v in pairs)


def _indices(values: Iterable[int]) -> str:
    return ",".join(str(v) for v in values) or "-"


def _gbps(value: float) -> str:
    return f"{value:g} GB/s"


def _time(value: str | None) -> str:
    if not value:
        return "-"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is None:
        # The service's clock is UTC; SQLite hands times back without the zone.
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _task_gpus(task: Mapping[str, Any]) -> str:
    gpus = _indices(task.get("gpu_indices", []))
    # A MIG task or a share holds a slice of the GPU, not all of it: say so wherever it is
    # listed.
    if task.get("gpu_fraction") is not None:
        return f"{task['gpu_fraction']:g}@{gpus}"
    return f"mig@{gpus}" if task.get("mig_uuids") else gpus


def _placement(allocation: Mapping[str, Any], node: str | None = None) -> str:
    tasks = [t for t in allocation.get("tasks", []) if node is None or t["node"] == node]
    parts = [f"{t['node']}[{_task_gpus(t)}]" for t in tasks[:TASKS_SHOWN]]
    if len(tasks) > TASKS_SHOWN:
        parts.append(f"(+{len(tasks) - TASKS_SHOWN} tasks)")
    return " ".join(parts) or "-"


def _free_islands(node: Mapping[str, Any]) -> str:
    islands = [
        f"{i['name']}:{len(i['free'])}/{len(i['gpus'])}"
        for i in node.get("islands", [])
        if i.get("free")
    ]
    return ",".join(islands) or "-"


def _counts(counts: Mapping[str, int]) -> str:
    parts = [f"{n} {k.replace('_', '-')}" for k, n in counts.items() if k != "total"]
    total = counts.get("total")
    listed = ", ".join(parts) or "none"
    return listed if total is None else f"{total}: {listed}"


def allocation_text(allocation: Mapping[str, Any]) -> str:
    head = [("allocation", allocation["id"]), ("state", allocation["state"])]
    if allocation.get("expires_at"):
        head.append(("expires", _time(allocation["expires_at"])))
    if allocation.get("ended_at"):
        head.append(("ended", _time(allocation["ended_at"])))
    for key in ("job_id", "owner", "fabric_domain"):
        if allocation.get(key):
            head.append((key.split("_")[0], str(allocation[key])))
    head.append(("ring", _gbps(allocation["ring_gbps"])))
    head.append(("reason", allocation["reason"]))
    lines = [_fields(head)]
    for task in allocation.get("tasks", []):
        lines.append(
            f"task {task['task']}: node {task['node']}, GPUs {_task_gpus(task)},"
            f" ring {_gbps(task['score']['ring_gbps'])}"
        )
        lines.extend(f"  {key}={value}" for key, value in task.get("env", {}).items())
        if task["reason"] != allocation["reason"]:  # a single task's reason is the whole one
            lines.append(f"  reason: {task['reason']}")
    return "\n".join(lines)


def _bandwidth_matrix(labels: Sequence[str], matrix: Sequence[Sequence[float]]) -> str:
    cells = [
        ["X" if i == j else f"{value:g}" for j, value in enumerate(row)]
        for i, row in enumerate(matrix)
    ]
    width = max([len(label) for label in labels] + [len(c) for row in cells for c in row])
    row_label = max(len(label) for label in labels)
    header = " " * row_label + "".join(f"  {label:>{width}}" for label in labels)
    body = [
        label.ljust(row_label) + "".join(f"  {c:>{width}}" for c in row)
        for label, row in zip(labels, cells, strict=True)
    ]
    return "\n".join([header, *body])


# -- commands -----------------------------------------------------------------------


def _items_or_json(
    data: dict[str, Any], key: str, args: argparse.Namespace, empty: str
) -> list[dict[str, Any]]:
    """The listed items to print as a table; [] when the JSON or the empty message was printed."""
    if args.json:
        print_json(data)
        return []
    items: list[dict[str, Any]] = data.get(key, [])
    if not items:
        print(empty)
    return items


def show_nodes(client: TopoplaceClient, args: argparse.Namespace) -> None:
    nodes = _items_or_json(client.nodes(), "nodes", args, "no nodes have reported to this service")
    if not nodes:
        return
    rows = [
        [
            n["name"],
            n["state"],
            f"{len(n['free_gpus'])}/{n['gpu_count']}",
            _free_islands(n),
            n["region"],
        ]
        for n in nodes
    ]
    header = ["NAME", "STATE", "FREE/GPUS", "FREE NVLINK ISLANDS, PCIE GROUPS (free/size)"]
    print(_table([*header, "REGION"], rows))


def do_node_key(client: TopoplaceClient, args: argparse.Namespace) -> None:
    if args.delete:
        client.delete_node_key(args.name)
        print(f"node {args.name}: key deleted")
        return
    if args.register is not None:
        key = args.register
        if key.startswith("@"):
            try:
                with open(key[1:], encoding="ascii") as handle:
                    key = handle.readline()
            except (OSError, UnicodeDecodeError) as exc:
                print(f"error: --register: cannot read {key[1:]}: {exc}", file=sys.stderr)
                raise SystemExit(EXIT_USAGE) from None
        view = client.put_node_key(args.name, key.strip(), replace=args.replace)
    else:
        view = client.node_key(args.name)
    if args.json:
        print_json(view)
        return
    shown = ("node", "algorithm", "public_key", "registered_at")
    print(_fields([(k, str(view[k])) for k in shown]))


def show_node(client: TopoplaceClient, args: argparse.Namespace) -> None:
    node = client.node(args.name)
    if args.json:
        print_json(node)
        return
    # The node names its live allocations by id only; fetch each to show what it holds here.
    allocations = [client.allocation(i) for i in node.get("allocations", [])]
    labels = ",".join(f"{k}={v}" for k, v in sorted(node.get("labels", {}).items()))
    print(
        _fields(
            [
                ("node", node["name"]),
                ("state", node["state"]),
                ("region", node["region"]),
                ("labels", labels or "-"),
                ("cpu", node["cpu_isa"]),
                ("fabric", node.get("fabric_domain") or "-"),
                ("GPUs", f"{len(node['free_gpus'])} free of {node['gpu_count']}"),
                ("reported", f"seq {node['seq']} at {_time(node['reported_at'])}"),
                ("heartbeat", _time(node["heartbeat_at"])),
            ]
        )
    )
    print()
    islands = [[i["name"], _indices(i["gpus"]), _indices(i["free"])] for i in node["islands"]]
    print(_table(["ISLAND", "GPUS", "FREE"], islands))
    print()
    gpus = [
        [
            str(g["index"]),
            g["model"],
            f"{g['memory_mib']} MiB",
            "-" if g["numa_node"] is None else str(g["numa_node"]),
            g["health"],
            "yes" if g["mig_enabled"] else "-",
            "free" if g["free"] else "busy",
            g["island"],
        ]
        for g in node["gpus"]
    ]
    print(_table(["GPU", "MODEL", "MEMORY", "NUMA", "HEALTH", "MIG", "USE", "ISLAND"], gpus))
    print()
    if not allocations:
        print("no live allocations on this node")
        return
    rows = [
        [
            a["id"],
            a["state"],
            a.get("job_id") or "-",
            a.get("owner") or "-",
            _time(a.get("expires_at")),
            _placement(a, node["name"]),
        ]
        for a in allocations
    ]
    print(_table(["ALLOCATION", "STATE", "JOB", "OWNER", "EXPIRES", "GPUS HERE"], rows))


def show_topology(client: TopoplaceClient, args: argparse.Namespace) -> None:
    topo = client.topology(args.node)
    if args.json:
        print_json(topo)
        return
    print(topo["text"].rstrip("\n"))
    if args.bandwidth:
        print()
        print("Bandwidth (GB/s) per GPU pair, as the placement engine rates it:")
        print()
        print(_bandwidth_matrix(topo["gpus"], topo["bandwidth_gbps"]))


# The states in which an allocation holds its GPUs (the service's LIVE_STATES).
LIVE_STATES = frozenset({"pending", "active", "degraded"})


def do_place(client: TopoplaceClient, args: argparse.Namespace) -> None:
    from topoplace_client.api import ApiError

    allocation = client.place(place_request(args), idempotency_key=args.idempotency_key)
    if allocation.get("state") not in LIVE_STATES:
        # Only a replayed key answers an ended allocation: its GPUs are no longer held
        # for this job and may be another's now. Printed as placed (exit 0), a launcher
        # retrying with the same key ran on them.
        state = allocation.get("state")
        raise ApiError(
            "allocation_ended",
            f"allocation {allocation.get('id')} that this Idempotency-Key made is {state}:"
            " its GPUs are no longer held for it; place again with a new Idempotency-Key",
            200,
            {"allocation_id": allocation.get("id"), "state": state},
            allocation,
        )
    if args.json:
        print_json(allocation)
        return
    print(allocation_text(allocation))


def do_release(client: TopoplaceClient, args: argparse.Namespace) -> None:
    if args.job is not None:
        result = client.release_job(args.job)
    else:
        result = client.release(args.allocation_id)
    if args.json:
        print_json(result)
        return
    released = result.get("released", [])
    for allocation_id in released:
        print(f"released {allocation_id}")
    if not released:
        # Releasing is idempotent on the service: nothing live is not an error.
        if args.job is not None:
            print(f"job {args.job} has no live allocations; nothing released")
        else:
            print(f"allocation {args.allocation_id} had already ended; nothing released")


def show_allocations(client: TopoplaceClient, args: argparse.Namespace) -> None:
    data = client.allocations(job_id=args.job, node=args.node, state=args.state, limit=args.limit)
    allocations = _items_or_json(data, "allocations", args, "no allocations match")
    if not allocations:
        return
    rows = [
        [
            a["id"],
            a["state"],
            a.get("job_id") or "-",
            a.get("owner") or "-",
            _gbps(a["ring_gbps"]),
            _time(a.get("expires_at")),
            _placement(a),
        ]
        for a in allocations
    ]
    print(_table(["ID", "STATE", "JOB", "OWNER", "RING", "EXPIRES", "PLACEMENT"], rows))


def show_cluster(client: TopoplaceClient, args: argparse.Namespace) -> None:
    data = client.cluster()
    if args.json:
        print_json(data)
        return
    print(
        _fields(
            [
                ("nodes", _counts(data.get("nodes", {}))),
                ("GPUs", _counts(data.get("gpus", {}))),
                (
                    "fragmentation",
                    f"{data.get('fragmentation', 0.0):.1%} of free GPUs are outside their"
                    " node's largest free NVLink island",
                ),
                ("allocations", _counts(data.get("allocations", {}))),
            ]
        )
    )
