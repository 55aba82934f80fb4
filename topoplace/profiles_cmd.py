"""`topoplace profiles`: list the built-in simulated machines, or print one."""

from __future__ import annotations

import argparse
import sys

from placement.profiles import (
    UnknownProfileError,
    build_profile,
    profile_description,
    profile_names,
)
from placement.topo_text import render_topo_matrix


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("profiles", help="list built-in simulated machine profiles")
    p.add_argument("name", nargs="?", help="print this profile")
    p.add_argument("--json", action="store_true", help="print the snapshot JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.name is None:
        for name in profile_names():
            print(f"{name:24} {profile_description(name)}")
        return 0
    try:
        snapshot = build_profile(args.name, args.name.replace("_", "-"))
    except UnknownProfileError as exc:
        print(f"topoplace profiles: {exc}", file=sys.stderr)
        return 2
    print(snapshot.model_dump_json(indent=2) if args.json else render_topo_matrix(snapshot))
    return 0
