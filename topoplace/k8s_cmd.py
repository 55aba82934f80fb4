"""`topoplace k8s labels NODE`: node labels an operator may apply, from what the agent reported.

Schedulers and people select nodes by labels; topoplace knows the wiring
behind them. For a node the service knows, this prints:

| label | value |
|---|---|
| ``topology.k8s.io/nvlink.islands`` | NVLink islands of two or more GPUs (0 on PCIe-only nodes) |
| ``topology.k8s.io/nvlink.island-size`` | GPUs in the largest NVLink island |
| ``nvidia.com/gpu.clique`` | multi-node NVLink domain ``<cluster uuid>.<clique id>``, when usable |
| ``topoplace.io/gpu.count`` | GPUs on the node |
| ``topoplace.io/gpu.model`` | their model, as a label value (when they are all one model) |

Output: ``key=value`` lines; ``--kubectl`` prints one ``kubectl label`` command;
``--json`` a JSON object. Exit status as the other client commands.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from topoplace import client_cmd, k8s_reconcile_cmd

if TYPE_CHECKING:
    from topoplace_client.api import TopoplaceClient

ISLANDS = "topology.k8s.io/nvlink.islands"
ISLAND_SIZE = "topology.k8s.io/nvlink.island-size"
CLIQUE = "nvidia.com/gpu.clique"
GPU_COUNT = "topoplace.io/gpu.count"
GPU_MODEL = "topoplace.io/gpu.model"

_LABEL_VALUE_MAX = 63


def label_value(text: str) -> str:
    """``text`` as a valid label value: [A-Za-z0-9._-], at most 63, alphanumeric at both ends."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:_LABEL_VALUE_MAX]
    return cleaned.strip("-._")


def node_labels(node: Mapping[str, Any]) -> dict[str, str]:
    """The labels for a node as the service shows it (GET /v1/nodes/NAME)."""
    # PCIe groups (kind "pcie") are not NVLink islands; a lone GPU is an NVLink "island" of 1.
    nvlink = [len(i["gpus"]) for i in node["islands"] if i.get("kind", "nvlink") == "nvlink"]
    labels = {
        ISLANDS: str(sum(1 for size in nvlink if size >= 2)),
        ISLAND_SIZE: str(max(nvlink, default=min(1, node["gpu_count"]))),
        GPU_COUNT: str(node["gpu_count"]),
    }
    models = {gpu["model"] for gpu in node["gpus"]}
    if len(models) == 1:
        labels[GPU_MODEL] = label_value(models.pop())
    if node.get("fabric_domain"):
        # NVIDIA's GPU feature discovery writes the same value: <cluster uuid>.<clique id>.
        labels[CLIQUE] = label_value(str(node["fabric_domain"]).replace("/", "."))
    return labels


def show_labels(client: TopoplaceClient, args: argparse.Namespace) -> None:
    labels = node_labels(client.node(args.node))
    if args.json:
        print(json.dumps(labels, indent=2))
    elif args.kubectl:
        pairs = " ".join(shlex.quote(f"{k}={v}") for k, v in labels.items())
        print(f"kubectl label node {shlex.quote(args.node)} {pairs} --overwrite")
    else:
        for key, value in labels.items():
            print(f"{key}={value}")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    k8s = sub.add_parser("k8s", help="Kubernetes helpers")
    k8s_sub = k8s.add_subparsers(dest="k8s_command", required=True)
    description = "print the node labels an operator may apply, from the node's reported wiring"
    labels = k8s_sub.add_parser(
        "labels",
        parents=[client_cmd._service_options()],
        help=description,
        description=description,
        epilog=client_cmd.EXIT_HELP,
    )
    labels.add_argument("node", help="node name (as the agent reports it: the Kubernetes node)")
    labels.add_argument(
        "--kubectl", action="store_true", help="print a `kubectl label node` command instead"
    )
    labels.set_defaults(func=lambda args: client_cmd.run(show_labels, args))
    k8s_reconcile_cmd.add_parser(k8s_sub)
