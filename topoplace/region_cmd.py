"""`topoplace region register|list|show|update|retire`: a global service's regions.

Through the global service's API, as every other client command (an admin
token in --token-file or $TOPOPLACE_TOKEN for register, update and retire). The
region's signing key is an Ed25519 key pair in the node agent's format
(`topoplace agent keygen --key-file region.pem` writes one, and
``region.pem.pub`` beside it); registration takes the public half
(docs/federation.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topoplace import client_cmd
from topoplace_client.arguments import finite_number

if TYPE_CHECKING:
    from topoplace_client.api import TopoplaceClient


def _price(text: str) -> dict[str, Any]:
    """MODEL=ON_DEMAND[/SPOT], per GPU-hour: ``H100=4.10/1.60``."""
    model, sep, prices = text.partition("=")
    on_demand, _, spot = prices.partition("/")
    try:
        price: dict[str, Any] = {"gpu_model": model.strip(), "on_demand": float(on_demand)}
        if spot:
            price["spot"] = float(spot)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give MODEL=ON_DEMAND or MODEL=ON_DEMAND/SPOT, e.g. H100=4.10/1.60"
        ) from None
    if not sep or not model.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: give MODEL=ON_DEMAND[/SPOT]")
    return price


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE")
    return key, value


def _region_command(
    region_sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
    command: str,
    help: str,
) -> argparse.ArgumentParser:
    """A command that writes a region named by its first argument (register, update)."""
    parser = region_sub.add_parser(
        command, parents=[common], help=help, epilog=client_cmd.EXIT_HELP
    )
    parser.add_argument("name")
    return parser


# The settings that register sets and update sets again, checked the same at both.
def _add_url(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--url", required=required, help="the region's own topoplace service")


def _add_forward_token_file(options: argparse._ActionsContainer) -> None:
    options.add_argument(
        "--forward-token-file",
        type=Path,
        metavar="FILE",
        help="a scheduler token of the region's service, sent with forwarded placements",
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = client_cmd._service_options()
    region = sub.add_parser("region", help="register, list, update and retire federated regions")
    region_sub = region.add_subparsers(dest="region_command", required=True)

    register = _region_command(
        region_sub, common, "register", "register a region; prints its region token once"
    )
    register.add_argument("--cloud", required=True, help="aws, gcp, onprem, ...")
    register.add_argument("--location", default="", help="e.g. us-east-1, or a site")
    _add_url(register, required=True)
    register.add_argument(
        "--public-key-file",
        required=True,
        type=Path,
        metavar="FILE",
        help="the region's signing public key (KEY.pem.pub of `topoplace agent keygen`)",
    )
    _add_forward_token_file(register)
    register.add_argument(
        "--price",
        action="append",
        type=_price,
        required=True,
        metavar="MODEL=ON_DEMAND[/SPOT]",
        help="price per GPU-hour (repeatable): H100=4.10/1.60",
    )
    register.add_argument(
        "--egress-region",
        type=finite_number,
        required=True,
        metavar="PER_GB",
        help="egress price per GB to another region of the same cloud",
    )
    register.add_argument(
        "--egress-internet",
        type=finite_number,
        required=True,
        metavar="PER_GB",
        help="egress price per GB to another cloud or the internet",
    )
    register.add_argument(
        "--label",
        action="append",
        type=_label,
        default=[],
        metavar="KEY=VALUE",
        help="a capability (repeatable): multi-node-nvlink=true",
    )
    register.set_defaults(func=run_register)

    listing = region_sub.add_parser("list", parents=[common], help="list the regions")
    listing.add_argument("--retired", action="store_true", help="include retired regions")
    listing.set_defaults(func=lambda args: client_cmd.run(show_regions, args))

    show = region_sub.add_parser("show", parents=[common], help="one region and its summary")
    show.add_argument("name")
    show.set_defaults(func=lambda args: client_cmd.run(show_region, args))

    update = _region_command(
        region_sub,
        common,
        "update",
        "set a region's URL or forward token again (checked as at registration)",
    )
    _add_url(update, required=False)
    token = update.add_mutually_exclusive_group()
    _add_forward_token_file(token)
    token.add_argument(
        "--no-forward-token", action="store_true", help="send no token with forwards any more"
    )
    update.set_defaults(func=run_update)

    retire = region_sub.add_parser(
        "retire", parents=[common], help="stop routing to a region and revoke its token"
    )
    retire.add_argument("name")
    retire.add_argument(
        "--force", action="store_true", help="even while it reports live allocations"
    )
    retire.set_defaults(func=lambda args: client_cmd.run(do_retire, args))


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SystemExit(f"error: cannot read the {what} {path}: {exc.strerror}") from None


def run_register(args: argparse.Namespace) -> int:
    try:
        body: dict[str, Any] = {
            "name": args.name,
            "cloud": args.cloud,
            "location": args.location,
            "url": args.url,
            "public_key": _read(args.public_key_file, "public key file"),
            "prices": args.price,
            "egress": {"region_gb": args.egress_region, "internet_gb": args.egress_internet},
            "labels": dict(args.label),
        }
        if args.forward_token_file is not None:
            body["forward_token"] = _read(args.forward_token_file, "forward token file")
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return client_cmd.EXIT_USAGE
    args.region_body = body
    return client_cmd.run(do_register, args)


def do_register(client: TopoplaceClient, args: argparse.Namespace) -> None:
    created = client.register_region(args.region_body)
    if args.json:
        client_cmd.print_json(created)
        return
    # The token alone on stdout, so that `TOKEN=$(topoplace region register ...)` works.
    print(
        f"region {created['name']} ({created['cloud']}) registered; its region token, shown"
        " only now:",
        file=sys.stderr,
    )
    print(created["token"])


def run_update(args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {}
    if args.url is not None:
        changes["url"] = args.url
    if args.no_forward_token:
        changes["forward_token"] = None
    elif args.forward_token_file is not None:
        try:
            changes["forward_token"] = _read(args.forward_token_file, "forward token file")
        except SystemExit as exc:
            print(exc, file=sys.stderr)
            return client_cmd.EXIT_USAGE
    if not changes:
        print("error: give --url, --forward-token-file or --no-forward-token", file=sys.stderr)
        return client_cmd.EXIT_USAGE
    args.region_changes = changes
    return client_cmd.run(do_update, args)


def do_update(client: TopoplaceClient, args: argparse.Namespace) -> None:
    updated = client.update_region(args.name, args.region_changes)
    if args.json:
        client_cmd.print_json(updated)
        return
    what = " and ".join(
        "its forward token" if name == "forward_token" else f"url {updated['url']}"
        for name in sorted(args.region_changes)
    )
    print(f"region {updated['name']} updated: {what}")


def _summary_text(region: dict[str, Any]) -> tuple[str, str, str]:
    summary = region.get("summary")
    if summary is None:
        return "-", "-", "never pushed"
    state = "stale" if summary["stale"] else "fresh"
    return str(summary["free_gpus"]), str(summary["live_allocations"]), state


def _cut_text(region: dict[str, Any]) -> str | None:
    """What the region left out of its summary to fit the global service's limits
    (summary_limits.py), the non-zero counts alone; None when nothing was."""
    cut = (region.get("summary") or {}).get("cut") or {}
    parts = []
    if cut.get("designs"):
        parts.append(f"{cut['designs']} designs ({cut.get('free_gpus', 0)} free GPUs) left out")
    if cut.get("cliques"):
        parts.append(f"{cut['cliques']} cliques left out")
    if cut.get("names"):
        parts.append(f"{cut['names']} names shortened")
    return ", ".join(parts) or None


def show_regions(client: TopoplaceClient, args: argparse.Namespace) -> None:
    answer = client.regions(include_retired=args.retired)
    if args.json:
        client_cmd.print_json(answer)
        return
    regions = answer["regions"]
    rows = [
        [
            r["name"],
            r["cloud"],
            r["location"] or "-",
            *_summary_text(r),
            "retired" if r["retired_at"] else "live",
        ]
        for r in regions
    ]
    header = ["NAME", "CLOUD", "LOCATION", "FREE GPUS", "LIVE ALLOCS", "SUMMARY", "STATE"]
    cuts = [_cut_text(r) for r in regions]
    if any(cuts):
        # A region that cut its summary may have GPUs free that no job is routed to.
        header.append("CUT TO FIT")
        for row, cut in zip(rows, cuts, strict=True):
            row.append(cut or "-")
    print(client_cmd._table(header, rows))


def show_region(client: TopoplaceClient, args: argparse.Namespace) -> None:
    region = client.region(args.name)
    if args.json:
        client_cmd.print_json(region)
        return
    free, live, state = _summary_text(region)
    print(f"region {region['name']}: {region['cloud']} {region['location']} at {region['url']}")
    print(f"  summary: {state}; free GPUs {free}; live allocations {live}")
    cut = _cut_text(region)
    if cut:
        print(f"  summary cut to fit the global service's limits: {cut}")
    for price in region["prices"]:
        spot = f", spot {price['spot']:g}" if price.get("spot") is not None else ""
        print(f"  {price['gpu_model']}: {price['on_demand']:g}/GPU-hour on demand{spot}")
    egress = region["egress"]
    print(f"  egress per GB: {egress['region_gb']:g} in-cloud, {egress['internet_gb']:g} out")
    for key, value in sorted(region["labels"].items()):
        print(f"  label {key}={value}")
    if region["retired_at"]:
        print(f"  retired at {region['retired_at']}")


def do_retire(client: TopoplaceClient, args: argparse.Namespace) -> None:
    retired = client.retire_region(args.name, force=args.force)
    if args.json:
        client_cmd.print_json(retired)
        return
    print(f"region {retired['name']} retired; its token is revoked")
