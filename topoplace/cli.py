"""Command-line entry point: `topoplace <command> ...`.

The commands of this package are added directly. Commands that belong to
another package (``topoplace agent``, the node agent's) are found through the
``topoplace.commands`` entry-point group that pyproject.toml declares, so the
dependency is stated in the packaging and this package imports none of them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from importlib.metadata import distribution

from topoplace import (
    audit_cmd,
    client_cmd,
    export_cmd,
    k8s_cmd,
    openapi_cmd,
    plan_cmd,
    profiles_cmd,
    region_cmd,
    samples_cmd,
    serve_cmd,
    sim_cmd,
    slurm_cmd,
    token_cmd,
)

COMMANDS_GROUP = "topoplace.commands"
DISTRIBUTION = "topoplace"

AddParser = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def plugin_commands() -> list[AddParser]:
    """The ``add_parser`` functions registered under ``topoplace.commands``, by name.

    Read from this distribution's own metadata: scanning every installed
    distribution (``entry_points(group=...)``) costs ~10 ms of each command's
    start-up, reading one costs ~0.1 ms.
    """
    found = [ep for ep in distribution(DISTRIBUTION).entry_points if ep.group == COMMANDS_GROUP]
    return [ep.load() for ep in sorted(found, key=lambda ep: ep.name)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topoplace", description="Topology-aware GPU placement.")
    sub = parser.add_subparsers(dest="command", required=True)
    plan_cmd.add_parser(sub)
    profiles_cmd.add_parser(sub)
    samples_cmd.add_parser(sub)
    serve_cmd.add_parsers(sub)
    openapi_cmd.add_parser(sub)
    client_cmd.add_parsers(sub)
    token_cmd.add_parser(sub)
    region_cmd.add_parser(sub)
    audit_cmd.add_parser(sub)
    for add_parser in plugin_commands():
        add_parser(sub)
    slurm_cmd.add_parser(sub)
    k8s_cmd.add_parser(sub)
    sim_cmd.add_parser(sub)
    export_cmd.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
