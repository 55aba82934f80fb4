"""`topoplace token create|list|revoke`: API tokens with a role and a scope.

Through the service's admin API (an admin token in --token-file or
$TOPOPLACE_TOKEN), as every other client command. ``create --database-url``
writes to the database instead, so an operator can make the first admin
token before the service has any (docs/security.md, "Bootstrap").
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from topoplace import client_cmd

if TYPE_CHECKING:
    from topoplace_client.api import TopoplaceClient

ROLES = ("agent", "region", "scheduler", "viewer", "admin")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = client_cmd._service_options()
    token = sub.add_parser("token", help="make, list and revoke API tokens (admin)")
    token_sub = token.add_subparsers(dest="token_command", required=True)

    create = token_sub.add_parser(
        "create",
        parents=[common],
        help="make a token; prints its secret once",
        epilog=client_cmd.EXIT_HELP,
    )
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument(
        "--node", action="append", default=[], metavar="NODE", help="agent: a node (repeatable)"
    )
    create.add_argument(
        "--region",
        metavar="REGION",
        help="agent: every node of this region; region: its own region",
    )
    create.add_argument("--name", default="", help="what the token is for")
    create.add_argument(
        "--database-url",
        metavar="URL",
        help="write to this database directly (the first admin token, before any exists)",
    )
    create.set_defaults(func=run_create)

    listing = token_sub.add_parser(
        "list", parents=[common], help="list tokens (never their secrets)"
    )
    listing.add_argument("--revoked", action="store_true", help="include revoked tokens")
    listing.set_defaults(func=lambda args: client_cmd.run(show_tokens, args))

    revoke = token_sub.add_parser("revoke", parents=[common], help="revoke a token by its id")
    revoke.add_argument("token_id", metavar="ID")
    revoke.set_defaults(func=lambda args: client_cmd.run(do_revoke, args))


def run_create(args: argparse.Namespace) -> int:
    if args.database_url:
        return _create_in_database(args)
    return client_cmd.run(do_create, args)


def _print_created(created: dict[str, Any], as_json: bool) -> None:
    if as_json:
        client_cmd.print_json(created)
        return
    scope = ", ".join(created.get("nodes") or [])
    if created.get("region"):
        scope = f"{scope}; region {created['region']}" if scope else f"region {created['region']}"
    # The secret alone on stdout, so that `TOKEN=$(topoplace token create ...)` works;
    # what it is, for people, on stderr.
    described = f"{created['role']}: {scope}" if scope else created["role"]
    print(f"token {created['id']} ({described}); its secret, shown only now:", file=sys.stderr)
    print(created["token"])


def do_create(client: TopoplaceClient, args: argparse.Namespace) -> None:
    created = client.create_token(args.role, nodes=args.node, region=args.region, name=args.name)
    _print_created(created, args.json)


def _create_in_database(args: argparse.Namespace) -> int:
    from service import migrate
    from service.access import Role
    from service.audit.actor import Actor, acting
    from service.db import make_engine
    from service.settings import Settings
    from service.tokens import store

    try:
        url = Settings(database_url=args.database_url).database_url
    except ValueError as exc:
        print(f"error: --database-url: {exc}", file=sys.stderr)
        return client_cmd.EXIT_USAGE
    migrate.upgrade(url)
    engine = make_engine(url)
    # The audit log names this way in: no token, straight to the database.
    operator = Actor(None, "topoplace token create --database-url", None, "database")
    try:
        scope = store.Scope(frozenset(args.node), args.region)
        with acting(operator):
            record, secret = store.create(engine, Role(args.role), scope, args.name)
    except store.ScopeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return client_cmd.EXIT_USAGE
    finally:
        engine.dispose()
    _print_created({**record.view(), "token": secret}, args.json)
    return client_cmd.EXIT_OK


def show_tokens(client: TopoplaceClient, args: argparse.Namespace) -> None:
    answer = client.tokens(include_revoked=args.revoked)
    if args.json:
        client_cmd.print_json(answer)
        return
    rows = [
        (
            t["id"],
            t["role"],
            ", ".join(t["nodes"]) + (f" region {t['region']}" if t["region"] else ""),
            t["name"],
            t["created_at"],
            t["revoked_at"] or "-",
        )
        for t in answer["tokens"]
    ]
    print(client_cmd._table(("ID", "ROLE", "SCOPE", "NAME", "CREATED", "REVOKED"), rows))


def do_revoke(client: TopoplaceClient, args: argparse.Namespace) -> None:
    client.revoke_token(args.token_id)
    if not args.json:
        print(f"token {args.token_id} revoked")
