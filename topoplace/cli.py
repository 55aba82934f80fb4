"""Command-line entry point: `topoplace <command> ...`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from agent import cli as agent_cli
from topoplace import (
    client_cmd,
    export_cmd,
    k8s_cmd,
    openapi_cmd,
    plan_cmd,
    profiles_cmd,
    serve_cmd,
    sim_cmd,
    slurm_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topoplace", description="Topology-aware GPU placement.")
    sub = parser.add_subparsers(dest="command", required=True)
    plan_cmd.add_parser(sub)
    profiles_cmd.add_parser(sub)
    serve_cmd.add_parsers(sub)
    openapi_cmd.add_parser(sub)
    client_cmd.add_parsers(sub)
    agent_cli.add_parser(sub)
    slurm_cmd.add_parser(sub)
    k8s_cmd.add_parser(sub)
    sim_cmd.add_parser(sub)
    export_cmd.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
