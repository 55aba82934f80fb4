"""`topoplace export`: the service's nodes as snapshots, for `topoplace sim --snapshots`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from topoplace.client_cmd import EXIT_HELP, UsageError, _service_options, run
from topoplace.output_file import write_whole

if TYPE_CHECKING:
    from topoplace_client.api import TopoplaceClient


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    text = (
        'write every node\'s latest snapshot as {"nodes": [...]}, the fleet'
        " `topoplace sim --snapshots FILE` replays a trace over"
    )
    p = sub.add_parser(
        "export", parents=[_service_options()], help=text, description=text, epilog=EXIT_HELP
    )
    p.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    p.set_defaults(func=lambda args: run(export, args))


def export(client: TopoplaceClient, args: argparse.Namespace) -> None:
    """GET /v1/nodes, then each node's newest stored snapshot; ``-o`` is written whole or
    left as it was."""
    from topoplace_client.api import ApiError

    listed = client.nodes().get("nodes", [])
    names = sorted(str(n["name"]) for n in listed if isinstance(n, dict))
    snapshots = []
    for name in names:
        history = client.snapshots(name)
        if history:
            newest = history[0]
            if not isinstance(newest, dict) or not isinstance(newest.get("snapshot"), dict):
                raise ApiError(
                    "invalid_response", f"node {name}'s snapshot history holds no snapshot", 200
                )
            snapshots.append(newest["snapshot"])
    text = json.dumps({"nodes": snapshots}, indent=1)
    if args.output is None:
        print(text)
        return
    try:
        write_whole(args.output, text + "\n")
    except OSError as exc:
        raise UsageError(f"-o: cannot write {args.output}: {exc.strerror or exc}") from None
    print(f"wrote {len(snapshots)} node snapshots to {args.output}", file=sys.stderr)
