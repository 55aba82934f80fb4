"""`topoplace audit`: the service's audit log, newest first (an admin token).

Placements and every change to an allocation, admin actions and refused
snapshots, each with the token that asked and the route it came through
(docs/security.md, "Audit log"). Filters are the API's; ``--all`` follows
the cursor to the oldest row, else one page is shown and the cursor of the
next is printed on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from topoplace import client_cmd

if TYPE_CHECKING:
    from topoplace_client.api import TopoplaceClient

KINDS = ("allocation", "admin", "snapshot")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = sub.add_parser(
        "audit",
        parents=[client_cmd._service_options()],
        help="show the audit log (admin)",
        description=__doc__,
        epilog=client_cmd.EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.add_argument("--kind", choices=KINDS)
    audit.add_argument("--action", help="placed, released, token_created, bad_signature, ...")
    audit.add_argument("--actor", metavar="TOKEN_ID", help="what this token did")
    audit.add_argument("--node", help="rows that concern this node")
    audit.add_argument("--job-id")
    audit.add_argument("--allocation", metavar="ID", help="one allocation's history")
    audit.add_argument("--since", metavar="TIME", help="ISO 8601, at or after (UTC by default)")
    audit.add_argument("--until", metavar="TIME", help="ISO 8601, before")
    audit.add_argument("--limit", type=int, default=50, help="rows a page (1-1000; default 50)")
    audit.add_argument("--cursor", help="the next_cursor a previous page printed")
    audit.add_argument("--all", action="store_true", help="every page, to the oldest row")
    audit.set_defaults(func=lambda args: client_cmd.run(show_audit, args))


def _pages(client: TopoplaceClient, args: argparse.Namespace) -> tuple[list[Any], str | None]:
    entries: list[Any] = []
    cursor = args.cursor
    while True:
        page = client.audit(
            kind=args.kind,
            action=args.action,
            actor=args.actor,
            node=args.node,
            job_id=args.job_id,
            allocation_id=args.allocation,
            since=args.since,
            until=args.until,
            limit=args.limit,
            cursor=cursor,
        )
        entries += page["entries"]
        cursor = page["next_cursor"]
        if cursor is None or not args.all:
            return entries, cursor


def _actor(entry: dict[str, Any]) -> str:
    actor = entry["actor"]
    if actor["token_id"] is None:
        return str(actor["name"])
    return f"{actor['name'] or actor['token_id']} ({actor['role']}, {actor['token_id']})"


def show_audit(client: TopoplaceClient, args: argparse.Namespace) -> None:
    entries, cursor = _pages(client, args)
    if args.json:
        client_cmd.print_json({"entries": entries, "next_cursor": cursor})
        return
    rows = [
        (
            e["at"],
            e["kind"],
            e["action"],
            _actor(e),
            e["route"],
            ",".join(e["nodes"]) or "-",
            e["job_id"] or "-",
            e["allocation_id"] or "-",
        )
        for e in entries
    ]
    header = ("AT", "KIND", "ACTION", "ACTOR", "ROUTE", "NODES", "JOB", "ALLOCATION")
    print(client_cmd._table(header, rows))
    if cursor is not None:
        print(f"more: --cursor {cursor}", file=sys.stderr)
