"""`topoplace k8s reconcile`: where the kubelet gave pods other devices than topoplace reserved.

The device plugin reports what each pod really got (the kubelet's
PodResources); the service moves the pod's allocation onto those GPUs, or
creates one for a pod nobody reserved, and counts each difference. This
shows the counts since the service started and the latest differences.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from topoplace import client_cmd

if TYPE_CHECKING:
    from topoplace_client.api import TopoplaceClient


def mismatches_text(answer: Mapping[str, Any]) -> str:
    counts = answer["counts"]
    lines = [
        f"moved {counts['moved']}, created {counts['created']}, not moved {counts['unmatched']},"
        f" others' allocations released {counts['superseded']}"
    ]
    recent = answer["recent"]
    if not recent:
        lines.append("no pod got other devices than reserved")
        return "\n".join(lines)
    rows = [
        (
            m["at"][:19],
            m["node"],
            f"{m['namespace']}/{m['pod']}",
            m["action"],
            ",".join(m["reserved"]) or "-",
            ",".join(m["allocated"]),
        )
        for m in recent
    ]
    lines.append(client_cmd._table(("at", "node", "pod", "action", "reserved", "allocated"), rows))
    return "\n".join(lines)


def show_mismatches(client: TopoplaceClient, args: argparse.Namespace) -> None:
    answer = client.k8s_mismatches()
    if args.json:
        client_cmd.print_json(answer)
    else:
        print(mismatches_text(answer))


def add_parser(k8s_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    description = "show where the kubelet gave pods other devices than reserved, and what moved"
    p = k8s_sub.add_parser(
        "reconcile",
        parents=[client_cmd._service_options()],
        help=description,
        description=description,
        epilog=client_cmd.EXIT_HELP,
    )
    p.set_defaults(func=lambda args: client_cmd.run(show_mismatches, args))
