"""`topoplace agent` and `topoplace agent keygen`.

Exit status (the table in docs/agent.md; ``EXIT_CODES`` below is the one list):

- 0: done (the daemon exits 0 when stopped by SIGTERM or SIGINT);
- 1: ``--once`` and the service refused the snapshot or the node's key, or the server
  URL answered with a redirect (3xx) or with a success that names no node and seq (not
  topoplace, or a proxy);
- 2: bad settings: a flag or setting value, an unknown source kind or profile,
  a missing or unreadable topology file, an invalid node name, no key or server;
- 3: ``--once`` and try later: the service could not be reached, failed (5xx) or is
  rate limiting this node (429; its Retry-After is in the message);
- 4: discovery cannot start or answer on this machine (NVML or /sys missing,
  or the source failed while reading).

The daemon itself never exits because of the service: see ``agent.runner``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import SOURCE_KINDS
from topoplace_client.arguments import positive_seconds

if TYPE_CHECKING:
    from topoplace_client.api import ApiError

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_DISCOVERY = 0, 1, 2, 3, 4
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "done (the daemon: stopped by SIGTERM or SIGINT)",
    EXIT_REFUSED: "--once: the service refused the snapshot or the node's key, or the server"
    " URL answered with a redirect (3xx) or with a success that names no node and seq (not"
    " topoplace, or a proxy)",
    EXIT_USAGE: "bad settings: a flag or setting value, an unknown source kind or profile,"
    " a missing or unreadable topology file, an invalid node name, no key or server",
    EXIT_UNREACHABLE: "--once: try later: the service could not be reached, failed (5xx) or is"
    " rate limiting this node (429)",
    EXIT_DISCOVERY: "discovery cannot start or answer on this machine (NVML or /sys missing,"
    " or the source failed while reading)",
}
# Libraries that log every request at INFO (httpx: one line per heartbeat); the agent logs
# its own lines, and theirs show with --log-level DEBUG.
QUIET_LOGGERS = ("httpx", "httpcore")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "agent",
        help="run the node agent: discover this node's GPUs and report them",
        description=(
            "Discover this node's GPU topology and report it to the service: a signed snapshot"
            " on start and on every change, heartbeats in between. Settings: flags, else"
            " TOPOPLACE_AGENT_* environment variables, else the --config TOML file."
        ),
        epilog="exit status:\n"
        + "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_CODES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML settings file")
    p.add_argument("--server", metavar="URL", help="the topoplace service")
    p.add_argument("--token-file", type=Path, metavar="PATH", help="file holding the API token")
    p.add_argument("--key-file", type=Path, metavar="PATH", help="the node's Ed25519 private key")
    p.add_argument(
        "--ca-bundle",
        type=Path,
        metavar="PEM",
        help="CA certificates an https server's certificate must chain to",
    )
    p.add_argument("--source", metavar="SOURCE", help=SOURCE_KINDS)
    p.add_argument("--node-name", metavar="NAME", help="node name (default: the host name)")
    p.add_argument("--region", metavar="REGION", help="region (default: default)")
    p.add_argument(
        "--label",
        dest="labels",
        action="append",
        metavar="KEY=VALUE",
        help="a node label (repeatable)",
    )
    p.add_argument("--gpu-model", metavar="MODEL", help="GPU model for smi:FILE sources")
    p.add_argument(
        "--gpu-memory-mib",
        type=int,
        metavar="MIB",
        help="GPU memory for smi:FILE sources (the text names none)",
    )
    p.add_argument(
        "--interval",
        dest="interval_s",
        type=positive_seconds,
        metavar="SECONDS",
        help="default 15",
    )
    p.add_argument(
        "--telemetry-interval",
        dest="telemetry_interval_s",
        type=positive_seconds,
        metavar="SECONDS",
        help="send NVLink counters with a heartbeat at most this often (default 30)",
    )
    p.add_argument("--timeout", dest="timeout_s", type=positive_seconds, metavar="SECONDS")
    p.add_argument(
        "--once",
        action="store_true",
        help="print the snapshot JSON and exit; with a server configured, send it once instead",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=run_agent)

    agent_sub = p.add_subparsers(dest="agent_command")
    keygen = agent_sub.add_parser(
        "keygen",
        help="write a new Ed25519 key pair for this node",
        description="Write the private key to PATH (mode 0600) and the public key to PATH.pub.",
    )
    keygen.add_argument("--key-file", type=Path, metavar="PATH", help="where to write the key")
    which = keygen.add_mutually_exclusive_group()
    which.add_argument("--force", action="store_true", help="replace an existing key")
    which.add_argument(
        "--if-missing",
        action="store_true",
        help="keep an existing key (and print its public key): what a container runs at every"
        " start, so that the node keeps the identity the service registered",
    )
    keygen.set_defaults(func=run_keygen)


def _fail(message: str, code: int) -> int:
    print(f"topoplace agent: {message}", file=sys.stderr)
    return code


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    from agent.config import ConfigError, parse_labels

    labels = None
    if args.labels:
        labels = {}
        for item in args.labels:
            if "=" not in item:
                raise ConfigError(f"--label {item!r} is not KEY=VALUE")
            labels.update(parse_labels(item))
    names = (
        "server",
        "token_file",
        "key_file",
        "ca_bundle",
        "source",
        "node_name",
        "region",
        "gpu_model",
        "gpu_memory_mib",
    )
    flags = {
        name: getattr(args, name)
        for name in (*names, "interval_s", "telemetry_interval_s", "timeout_s")
    }
    return {**flags, "labels": labels}


def run_keygen(args: argparse.Namespace) -> int:
    from agent.config import ConfigError, load_config
    from agent.signing import KeyFileError, NodeKey

    try:
        config = load_config({"key_file": args.key_file}, config_file=args.config)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)
    if config.key_file is None:
        return _fail("keygen needs --key-file PATH (or TOPOPLACE_AGENT_KEY_FILE)", EXIT_USAGE)
    if args.if_missing and config.key_file.exists():
        try:
            kept = NodeKey.load(config.key_file)
        except KeyFileError as exc:
            return _fail(str(exc), EXIT_USAGE)
        print(f"private key: {config.key_file} (kept)")
        print(kept.public_key)
        return EXIT_OK
    key = NodeKey.generate()
    try:
        public_path = key.save(config.key_file, overwrite=args.force)
    except KeyFileError as exc:
        return _fail(str(exc), EXIT_USAGE)
    print(f"private key: {config.key_file}")
    print(f"public key:  {public_path}")
    print(key.public_key)
    return EXIT_OK


def run_agent(args: argparse.Namespace) -> int:
    from agent.config import ConfigError, load_config
    from agent.nvml_discovery import DiscoveryError
    from agent.sources import DiscoveryUnavailable, Identity, SourceError, open_source

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.log_level != "DEBUG":
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        config = load_config(_flags(args), config_file=args.config)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)
    name = config.resolved_node_name()
    identity = Identity(name, config.region, dict(config.labels))
    try:
        source = open_source(
            config.source,
            identity,
            gpu_model=config.gpu_model,
            gpu_memory_mib=config.gpu_memory_mib,
        )
    except DiscoveryUnavailable as exc:
        return _fail(str(exc), EXIT_DISCOVERY)
    except SourceError as exc:
        return _fail(str(exc), EXIT_USAGE)
    if args.once and config.server is None:
        try:
            snap = source.read()
        except DiscoveryError as exc:
            return _fail(str(exc), EXIT_DISCOVERY)
        print(snap.model_dump_json(indent=2))
        return EXIT_OK
    return _serve(args, config, source, name)


def _once_failure(exc: ApiError) -> tuple[str, int]:
    """What ``--once`` says and exits with for an answer that is not a success: a service
    that failed or is rate limiting (429) is "try later" (3), anything else a refusal (1)."""
    return exc.line(), EXIT_UNREACHABLE if exc.try_later else EXIT_REFUSED


def _serve(args: argparse.Namespace, config: Any, source: Any, name: str) -> int:
    from agent.config import ConfigError, TokenFile
    from agent.nvml_discovery import DiscoveryError
    from agent.runner import Agent, Backoff, KeyRefused
    from agent.signing import KeyFileError, NodeKey
    from agent.sources import NvmlSource
    from topoplace_client.api import ApiError, ServiceUnreachable, TopoplaceClient

    if config.server is None:
        return _fail(
            "no service to report to: set --server or TOPOPLACE_AGENT_SERVER"
            " (or use --once to print the snapshot)",
            EXIT_USAGE,
        )
    if config.key_file is None:
        return _fail(
            "snapshots are signed: set --key-file or TOPOPLACE_AGENT_KEY_FILE"
            " (create a key with: topoplace agent keygen --key-file PATH)",
            EXIT_USAGE,
        )
    try:
        key = NodeKey.load(config.key_file)
        ca_bundle = str(config.ca_bundle) if config.ca_bundle else None
        client = TopoplaceClient(
            config.server, timeout=config.timeout_s, token=config.token(), ca_bundle=ca_bundle
        )
        tokens = TokenFile(config, client)
    except (KeyFileError, ConfigError, ValueError) as exc:
        return _fail(str(exc), EXIT_USAGE)
    backoff = Backoff(config.backoff_initial_s, config.backoff_max_s)
    agent = Agent(
        source,
        client,
        key,
        name,
        interval_s=config.interval_s,
        backoff=backoff,
        telemetry=source.nvlink if isinstance(source, NvmlSource) else None,
        telemetry_interval_s=config.telemetry_interval_s,
        key_hint=f"@{config.key_file}.pub",
        reload_token=tokens.reload,
    )
    with client:
        if args.once:
            try:
                answer = agent.send_once()
            except DiscoveryError as exc:
                return _fail(str(exc), EXIT_DISCOVERY)
            except KeyRefused as exc:
                return _fail(str(exc), EXIT_REFUSED)
            except ApiError as exc:
                return _fail(*_once_failure(exc))
            except ServiceUnreachable as exc:
                return _fail(str(exc), EXIT_UNREACHABLE)
            print(f"node {answer['node']}: snapshot seq {answer['seq']} accepted")
            return EXIT_OK
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
        agent.run(stop)
    return EXIT_OK
