"""`topoplace samples`: list the shipped ``nvidia-smi topo -m`` samples, or print one."""

from __future__ import annotations

import argparse
import sys

from topoplace_client.samples import SAMPLES, sample_names, sample_text


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "samples",
        help="list the real nvidia-smi topo -m outputs shipped for trying the engine",
        description=(
            "Real `nvidia-smi topo -m` outputs of four machine designs. Each name works where a"
            " topology file does: `topoplace plan --topology NAME`, `topoplace agent --source"
            " smi:NAME`."
        ),
    )
    p.add_argument("name", nargs="?", help="print this sample")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.name is None:
        for name in sample_names():
            print(f"{name:24} {SAMPLES[name]}")
        return 0
    try:
        text = sample_text(args.name)
    except KeyError:
        known = ", ".join(sample_names())
        print(f"topoplace samples: no sample {args.name!r}; samples: {known}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0
