"""`topoplace serve` and `topoplace db upgrade`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.exc import OperationalError

    from service.settings import Settings

DEFAULT_GRPC_PORT = 50051  # gRPC's customary port


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the placement service",
        description=(
            "Run the placement service (FastAPI under uvicorn). Settings come from TOPOPLACE_*"
            " environment variables; the database defaults to ./topoplace.sqlite3."
        ),
    )
    serve.add_argument("--host", help="listen address (TOPOPLACE_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (TOPOPLACE_PORT, default 8080)")
    serve.add_argument("--database-url", help="TOPOPLACE_DATABASE_URL")
    serve.add_argument(
        "--demo",
        action="store_true",
        help="also run a small simulated cluster in-process (implies --insecure-dev)",
    )
    serve.add_argument(
        "--insecure-dev",
        action="store_true",
        help="accept callers without a token, as admins (TOPOPLACE_INSECURE_DEV): a laptop"
        " only. Without it serve refuses to start unless some token is configured",
    )
    serve.add_argument(
        "--no-migrate", action="store_true", help="do not apply database migrations on start"
    )
    serve.add_argument(
        "--grpc-port",
        type=int,
        help=f"gRPC API port (TOPOPLACE_GRPC_PORT, default {DEFAULT_GRPC_PORT}; 0: any free one)",
    )
    serve.add_argument(
        "--no-grpc", action="store_true", help="serve REST only (or TOPOPLACE_GRPC_PORT=off)"
    )
    serve.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="serve REST and gRPC over TLS with this certificate chain (TOPOPLACE_TLS_CERT)",
    )
    serve.add_argument(
        "--tls-key", metavar="PEM", help="the certificate's private key (TOPOPLACE_TLS_KEY)"
    )
    serve.add_argument(
        "--workload-mix",
        metavar="FILE",
        help="rank choices by this workload mix (TOPOPLACE_WORKLOAD_MIX_FILE; `topoplace sim"
        " --write-mix` writes one from a trace); without it the mix is observed per process",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log every HTTP request (TOPOPLACE_ACCESS_LOG; off by default)",
    )
    federation = serve.add_argument_group(
        "federation (a region pushing to a global service, docs/federation.md)"
    )
    federation.add_argument(
        "--federation-global",
        metavar="URL",
        help="push this region's signed summary there (TOPOPLACE_FEDERATION_GLOBAL)",
    )
    federation.add_argument("--region-name", metavar="NAME", help="this region's registered name")
    federation.add_argument(
        "--region-token-file",
        metavar="FILE",
        help="the region token `topoplace region register` printed (or TOPOPLACE_REGION_TOKEN)",
    )
    federation.add_argument(
        "--region-key", metavar="PEM", help="the Ed25519 private key summaries are signed with"
    )
    federation.add_argument(
        "--federation-push-s",
        type=float,
        metavar="S",
        help="push at least this often, besides on every change (default 10)",
    )
    federation.add_argument(
        "--federation-stale-s",
        type=float,
        metavar="S",
        help="global: a region silent this long is stale and skipped (default 30)",
    )
    serve.set_defaults(func=run_serve)

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_sub.add_parser("upgrade", help="apply the schema migrations")
    upgrade.add_argument("--database-url", help="TOPOPLACE_DATABASE_URL")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.set_defaults(func=run_upgrade)


def _settings(args: argparse.Namespace) -> Settings:
    from service.settings import Settings

    overrides: dict[str, Any] = {
        key: value
        for key, value in {
            "host": getattr(args, "host", None),
            "port": getattr(args, "port", None),
            "database_url": getattr(args, "database_url", None),
            "migrate_on_start": False if getattr(args, "no_migrate", False) else None,
            "access_log": True if getattr(args, "access_log", False) else None,
            "tls_cert": getattr(args, "tls_cert", None),
            "tls_key": getattr(args, "tls_key", None),
            "workload_mix_file": getattr(args, "workload_mix", None),
            "insecure_dev": True
            if getattr(args, "insecure_dev", False) or getattr(args, "demo", False)
            else None,
            "federation_global": getattr(args, "federation_global", None),
            "region_name": getattr(args, "region_name", None),
            "region_token_file": getattr(args, "region_token_file", None),
            "region_key": getattr(args, "region_key", None),
            "federation_push_s": getattr(args, "federation_push_s", None),
            "federation_stale_s": getattr(args, "federation_stale_s", None),
            "grpc_port": "off"
            if getattr(args, "no_grpc", False)
            else getattr(args, "grpc_port", None),
        }.items()
        if value is not None
    }
    return Settings.model_validate(overrides)


def database_unreachable_line(database_url: str, exc: OperationalError) -> str:
    """One line for the operator: where the database is (no password) and the driver's
    own words, which on the operator's terminal reveal nothing they do not know."""
    from sqlalchemy.engine import make_url

    where = make_url(database_url).render_as_string(hide_password=True)
    words = " ".join(str(exc.orig).split()) if exc.orig is not None else str(exc)
    return (
        f"the database at {where} did not answer: {words}; check TOPOPLACE_DATABASE_URL"
        " and that the database is up, then start again"
    )


def run_serve(args: argparse.Namespace) -> int:
    import sys

    import uvicorn
    from sqlalchemy.exc import OperationalError

    from service import migrate
    from service.app import INSECURE_BANNER, NoTokenSource, create_app, require_token_source

    try:
        settings = _with_grpc_port(_settings(args))
        busy = ports_in_use(settings)
        if busy is not None:
            print(f"error: {busy}", file=sys.stderr)
            return 2
        if not settings.migrate_on_start:
            # Said before anything starts: a service on another schema than its code's
            # fails on its first query of a missing column, or writes past a rule it
            # does not know.
            mismatch = migrate.schema_mismatch(settings.database_url)
            if mismatch is not None:
                print(f"error: {mismatch}", file=sys.stderr)
                return 2
        app = create_app(settings, demo=args.demo)
        # Said here, before uvicorn starts, so a refusal or a database that does not
        # answer is one clear line (the lifespan's own upgrade then finds nothing to do).
        if settings.migrate_on_start:
            migrate.upgrade(settings.database_url)
        if settings.insecure_dev:
            print(INSECURE_BANNER, file=sys.stderr)
        else:
            require_token_source(settings, app.state.service.engine, app.state.token_check)
    except (NoTokenSource, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OperationalError as exc:
        print(f"error: {database_unreachable_line(settings.database_url, exc)}", file=sys.stderr)
        return 1
    # uvicorn_options carries TLS and the slow-header deadline (docs/security.md).
    uvicorn.run(app, **uvicorn_options(settings))
    return 0


def ports_in_use(settings: Settings) -> str | None:
    """One line saying which of serve's ports is taken and which flag moves it; None if free.

    Checked before anything starts, so that a second ``serve`` says what to do
    instead of failing deep in its start. REST is checked first: ``--port``
    moves REST only, so a second ``serve --port N`` still finds gRPC's 50051
    taken.
    """
    host = settings.host
    if _taken(host, settings.port):
        return (
            f"the REST port {host}:{settings.port} is in use (another topoplace serve?):"
            " give another with --port PORT (TOPOPLACE_PORT)"
        )
    grpc_port = settings.grpc_port
    if grpc_port and _taken(host, grpc_port):
        return (
            f"the gRPC port {host}:{grpc_port} is in use (another topoplace serve?): give"
            " another with --grpc-port PORT (TOPOPLACE_GRPC_PORT; 0: any free one), or serve"
            " REST only with --no-grpc"
        )
    return None


def _taken(host: str, port: int) -> bool:
    import errno
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return False  # an address that does not resolve: the server's own start says so
    with socket.socket(family, kind, proto) as probe:
        # As the servers bind: SO_REUSEADDR lets a port in TIME_WAIT be reused, not a listener's.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            # Anything else (a privileged port, an address not on this host) is the
            # server's own start to report.
            return exc.errno == errno.EADDRINUSE
    return False


def header_deadline_protocol(seconds: float, stalled_reader_s: float = 30.0) -> type:
    from service.edge.slow_headers import with_header_deadline

    return with_header_deadline(seconds, stalled_reader_s)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's settings for ``serve``: address, TLS and the connection limits
    (docs/security.md, "Limits")."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": "info",
        "access_log": settings.access_log,
        # An idle kept-alive connection is closed after this; a slow request's headers
        # and body have their own deadline in the request guard (service/edge).
        "timeout_keep_alive": settings.keep_alive_timeout_s,
        "http": header_deadline_protocol(settings.header_timeout_s, settings.send_timeout_s),
    }
    if settings.tls:
        options["ssl_certfile"] = settings.tls_cert
        options["ssl_keyfile"] = settings.tls_key
    return options


def _with_grpc_port(settings: Settings) -> Settings:
    """serve starts gRPC beside REST: on --grpc-port, else TOPOPLACE_GRPC_PORT, else 50051."""
    if "grpc_port" not in settings.model_fields_set:  # not set, not even to 'off'
        return settings.model_copy(update={"grpc_port": DEFAULT_GRPC_PORT})
    return settings


def run_upgrade(args: argparse.Namespace) -> int:
    import sys

    from sqlalchemy.exc import OperationalError

    from service import migrate

    settings = _settings(args)
    try:
        migrate.upgrade(settings.database_url, args.revision)
    except OperationalError as exc:
        print(f"error: {database_unreachable_line(settings.database_url, exc)}", file=sys.stderr)
        return 1
    print(f"database at {settings.database_url} is at revision {args.revision}")
    return 0
