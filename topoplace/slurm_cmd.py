"""`topoplace slurm gres-conf|node-conf|show|epilog`: Slurm's side of topoplace.

- ``gres-conf NODE...`` prints gres.conf lines from the nodes' stored
  snapshots: one GRES Type per GPU (``g<index>``), ``Links=`` from the
  NVLink matrix, ``Cores=`` from each GPU's NUMA node;
- ``node-conf NODE...`` prints slurm.conf node lines with ``Gres=`` and
  ``Features`` (GPU model, NVLink, largest island, NVLink domain, block);
- ``show JOBID`` prints the allocations carrying that Slurm job id;
- ``epilog`` is the ``EpilogSlurmctld`` program: it reads the job's admin
  comment (``scontrol show job``) and releases the allocations named there
  that were made for the job's user, and those carrying the job id.

NODE arguments may be Slurm host lists (``node[1-4]``). Exit status as the
other client commands: 0 done, 1 refused, 2 usage, 3 try later (the epilog's
after retrying for ``--retry-for`` seconds, naming what it left held).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from functools import partial
from typing import TYPE_CHECKING

from placement import NodeSnapshot
from slurm_formats.admin_comment import allocation_ids
from slurm_formats.conf import gres_conf_lines, node_conf_line
from slurm_formats.hostlist import expand
from topoplace import client_cmd
from topoplace.service_retry import OutOfTime, Patience, add_retry_for
from topoplace.slurm_prolog import own_record, read_config  # stdlib-only: the prolog stays quick

if TYPE_CHECKING:
    from topoplace_client.api import ApiError, TopoplaceClient

DEFAULT_CONFIG = "/etc/slurm/topoplace.conf"
# How long the epilog retries a service that asks to be asked later. The job stays
# completing while EpilogSlurmctld runs, so it must end on its own; what it leaves held
# the reconcile loop releases once Slurm no longer has the job.
EPILOG_RETRY_S = 5.0
# The most --retry-for may ask. Slurm bounds EpilogSlurmctld only by PrologEpilogTimeout,
# which is unlimited by default, and the job's nodes stay COMPLETING meanwhile; its
# requests end within twice --retry-for, so 60 s keeps the epilog within two minutes.
EPILOG_RETRY_MAX_S = 60.0
_ADMIN_COMMENT = re.compile(r"\bAdminComment=(.*?)(?=\s+[A-Z][A-Za-z/:]*=|$)")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "slurm", help="Slurm configuration from snapshots, and the job-end epilog"
    )
    commands = parser.add_subparsers(dest="slurm_command", required=True)
    common = client_cmd._service_options()

    p = commands.add_parser(
        "gres-conf",
        parents=[common],
        help="gres.conf lines: one GRES type per GPU, Links= and Cores=",
        epilog=client_cmd.EXIT_HELP,
    )
    p.add_argument("nodes", nargs="+", metavar="NODE", help="node names or host lists")
    p.add_argument(
        "--device-dir",
        default="/dev",
        metavar="DIR",
        help="where the nvidiaN device files are (default /dev)",
    )
    p.set_defaults(func=lambda args: client_cmd.run(_print_gres_conf, args))

    p = commands.add_parser(
        "node-conf",
        parents=[common],
        help="slurm.conf node lines with Gres= and Features",
        epilog=client_cmd.EXIT_HELP,
    )
    p.add_argument("nodes", nargs="+", metavar="NODE", help="node names or host lists")
    p.add_argument(
        "--extra", default="", metavar="TEXT", help="appended to every line, e.g. 'State=UNKNOWN'"
    )
    p.set_defaults(func=lambda args: client_cmd.run(_print_node_conf, args))

    p = commands.add_parser(
        "show",
        parents=[common],
        help="the allocations of a Slurm job (by its job id)",
        epilog=client_cmd.EXIT_HELP,
    )
    p.add_argument("job", metavar="JOBID", help="the Slurm job id")
    p.set_defaults(func=lambda args: client_cmd.run(_show_job, args))

    p = commands.add_parser(
        "epilog",
        parents=[common],
        help="EpilogSlurmctld: release the finished job's allocations",
        epilog=client_cmd.EXIT_HELP,
    )
    p.add_argument(
        "--config",
        metavar="PATH",
        help=f"topoplace.conf shared with job_submit.lua (default {DEFAULT_CONFIG}, whose"
        " absence means the defaults; a PATH given that does not exist is an error):"
        " server, token_file, ca_file, scontrol, slurm_conf",
    )
    p.add_argument("--job", metavar="ID", help="the job (default: $SLURM_JOB_ID)")
    p.add_argument(
        "--user",
        help="the job's user (default: $SLURM_JOB_USER): the allocations its admin comment"
        " names are released only if made for this user",
    )
    add_retry_for(
        p,
        EPILOG_RETRY_S,
        EPILOG_RETRY_MAX_S,
        waits="each request waits at most this long too",
        then="exit 3 naming what is left held",
    )
    p.set_defaults(func=run_epilog)


def _snapshots(client: TopoplaceClient, names: list[str]) -> list[NodeSnapshot]:
    from pydantic import ValidationError

    from topoplace_client.api import ApiError

    found = []
    for pattern in names:
        for name in expand(pattern):
            history = client.snapshots(name)
            try:
                found.append(NodeSnapshot.model_validate(history[0]["snapshot"]))
            except (IndexError, KeyError, TypeError, ValidationError) as exc:
                # An empty history or a snapshot this engine cannot read (a proxy's answer,
                # one stored by another version): no configuration is better than a wrong one.
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise ApiError(
                    "invalid_response",
                    f"node {name}: no snapshot this version can read ({why})",
                    200,
                ) from exc
    return found


def _print_gres_conf(client: TopoplaceClient, args: argparse.Namespace) -> None:
    print("# gres.conf written by `topoplace slurm gres-conf` from the nodes' snapshots")
    for snap in _snapshots(client, args.nodes):
        print(f"# {snap.name}: snapshot seq {snap.seq}")
        for line in gres_conf_lines(snap, args.device_dir):
            print(line)


def _print_node_conf(client: TopoplaceClient, args: argparse.Namespace) -> None:
    for snap in _snapshots(client, args.nodes):
        print(node_conf_line(snap, args.extra))


def _show_job(client: TopoplaceClient, args: argparse.Namespace) -> None:
    data = client.allocations(job_id=args.job)
    empty = f"no allocation carries job {args.job} (yet: it is known once the job starts)"
    for allocation in client_cmd._items_or_json(data, "allocations", args, empty):
        print(client_cmd.allocation_text(allocation))


def admin_comments(scontrol: str, job: str) -> list[str]:
    """What could be the job's admin comment as ``scontrol show job -o`` prints it: every
    ``AdminComment=`` in the text, for the job's name and work directory, which come
    before it, are printed as the user wrote them and may imitate one."""
    done = subprocess.run(
        [scontrol, "show", "job", "-o", job],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{scontrol} show job {job}: {done.stderr.strip() or done.returncode}")
    return [c.strip() for c in _ADMIN_COMMENT.findall(done.stdout.strip())]


def _releasable(client: TopoplaceClient, allocation_id: str, job: str, user: str | None) -> bool:
    """Whether an allocation the text names is this job's to end: made for the job's
    user (an owner never changes) and carried by no other job. Without the user
    ($SLURM_JOB_USER, --user) none is: the job's own carry its id once it has run."""
    from topoplace_client.api import ApiError  # httpx is loaded only by a command using it

    if user is None:
        return False
    try:
        found = client.allocation(allocation_id)
    except ApiError as exc:
        if exc.status == 404 and exc.code == "not_found":
            return False  # an id that names nothing, as the service says
        raise  # the service could not tell (429, 5xx) or refused: not a fact about the id
    return found.get("owner") == f"slurm:{user}" and found.get("job_id") in (None, job)


def _left_held(job: str, what: str, exc: ApiError | OutOfTime) -> int:
    """Say on stderr (slurmctld's log) what the epilog could not release and why; the
    exit status it calls for: 3 where the service asked to be asked later."""
    if isinstance(exc, OutOfTime):
        why, code = f"try later: {exc}", client_cmd.EXIT_UNREACHABLE
    else:
        why, code = exc.line(), client_cmd._exit_code(exc)
    print(
        f"error: job {job}: {what} left held ({why}), for the service's reconcile loop to"
        " release once Slurm no longer has the job",
        file=sys.stderr,
    )
    return code


def _worse(a: int, b: int) -> int:
    # A try-later failure wins: running the epilog again may mend it.
    return client_cmd.EXIT_UNREACHABLE if client_cmd.EXIT_UNREACHABLE in (a, b) else max(a, b)


def run_epilog(args: argparse.Namespace) -> int:
    try:
        config = read_config(args.config)
    except (OSError, ValueError) as exc:  # the default file's absence is no settings
        named = f"--config {args.config}" if args.config else DEFAULT_CONFIG
        print(f"error: cannot read {named}: {exc}", file=sys.stderr)
        return client_cmd.EXIT_USAGE
    job = args.job or os.environ.get("SLURM_JOB_ID", "")
    if not job:
        print("error: no job: set SLURM_JOB_ID or pass --job", file=sys.stderr)
        return client_cmd.EXIT_USAGE
    if config.get("slurm_conf"):
        os.environ["SLURM_CONF"] = config["slurm_conf"]
    args.server = args.server or config.get("server")
    if not args.token_file and config.get("token_file"):
        # An unreadable token file is named where it was set, not as an option not given.
        args.token_file = config["token_file"]
        args.token_source = f"token_file in {args.config or DEFAULT_CONFIG}"
    args.ca_bundle = getattr(args, "ca_bundle", None) or config.get("ca_file")
    user = args.user or os.environ.get("SLURM_JOB_USER")
    outcome = client_cmd.EXIT_OK
    try:
        # Its own record alone: a het job's first component (or an array's last task)
        # has the id that shows every component (or task), each with its admin comment.
        record = args.job or own_record(os.environ)
        comments = admin_comments(config.get("scontrol", "scontrol"), record)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        # What carries the job id is released all the same: it needs no admin comment.
        print(
            f"error: cannot read job {job}: {exc}; the allocations its admin comment names"
            " are left held, for the service's reconcile loop",
            file=sys.stderr,
        )
        comments, outcome = [], client_cmd.EXIT_UNREACHABLE
    ids = list(dict.fromkeys(i for c in comments for i in allocation_ids(c)))
    args.timeout = min(args.timeout, args.retry_for)

    def release(client: TopoplaceClient, _: argparse.Namespace) -> None:
        from topoplace_client.api import ApiError

        nonlocal outcome
        patience = Patience(args.retry_for)
        for allocation in ids:
            try:
                if not patience.call(partial(_releasable, client, allocation, job, user)):
                    print(f"job {job}: allocation {allocation} is not the job's: left alone")
                    continue
                released = patience.call(partial(client.release, allocation))
            except (ApiError, OutOfTime) as exc:
                outcome = _worse(outcome, _left_held(job, f"allocation {allocation}", exc))
                continue
            print(f"job {job}: allocation {allocation} released: {bool(released.get('released'))}")
        # Allocations recorded from what Slurm ran (the prolog) carry the job id instead.
        try:
            carried = patience.call(partial(client.release_job, job)).get("released", [])
        except (ApiError, OutOfTime) as exc:
            held = f"the allocations carrying job {job}"
            outcome = _worse(outcome, _left_held(job, held, exc))
            return
        for allocation in carried:
            print(f"job {job}: allocation {allocation} released: True")

    return client_cmd.run(release, args) or outcome
