"""PrologSlurmctld: tell the service which node(s) and GPUs a starting job really got.

``python -m topoplace.slurm_prolog --config /etc/slurm/topoplace.conf`` (the
shipped ``topoplace-prolog`` script runs it). slurmctld runs it when a job is
allocated, before the job is launched, with ``SLURM_JOB_ID`` and no PATH; it
reads the job as ``scontrol -d show job -o`` prints it (per node:
``GRES=gpu:g1:1(IDX:1),...``) and posts that to ``POST
/v1/slurm/job-started``. The job's launch waits for this program, so it uses
only the standard library and the project's modules that do too (about 0.1
s, where the ``topoplace`` command takes 0.6 s to import the engine), and it
exits 0 whatever the service or scontrol did: a prolog that fails makes
slurmctld requeue the job, and a placement service must never stop a job.
Only a usage error (argparse's, or a --config that cannot be read) exits 2;
the shipped script exits 0 regardless.

A service that asks to be asked later (429 with its Retry-After, a 5xx, no
answer) is asked again as the epilog asks it (topoplace/service_retry.py),
for ``--retry-for`` seconds in all: the report of the GPUs the job really got
survives a brief overload, and the launch it holds back is bounded. Then the
prolog gives up, saying so, and the reconcile loop records the job at its
next read.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from email.message import Message
from pathlib import Path
from typing import IO

from topoplace.service_retry import OutOfTime, Patience, add_retry_for

DEFAULT_CONFIG = "/etc/slurm/topoplace.conf"
TIMEOUT_S = 2.0  # one request's; a retry's timeout is no longer than --retry-for either
# How long the prolog asks again a service that asks to be asked later. slurmctld
# launches the job only once the prolog has ended, so this is time the job waits, and
# the reconcile loop records the job within an interval (10 s) anyway: a brief overload
# is all it outlasts.
RETRY_S = 5.0
# The most --retry-for may ask: with scontrol's 10 s and one request's 2 s past the
# limit, the prolog ends within a minute and a quarter. Where PrologEpilogTimeout is set,
# keep the whole well under it: a prolog Slurm kills has failed.
RETRY_MAX_S = 60.0


def read_config(path: str | None) -> dict[str, str]:
    """``key = value`` lines, ``#`` comments: the file job_submit.lua reads too.

    ``path`` None means the default file, whose absence means the defaults (a node
    set up by environment alone). A path the caller named that does not exist is an
    error (FileNotFoundError saying so): a misspelt --config would otherwise send to
    the default server, without the token it names.
    """
    values: dict[str, str] = {}
    try:
        text = Path(path or DEFAULT_CONFIG).read_text(encoding="utf-8")
    except FileNotFoundError:
        if path is None:
            return values
        raise FileNotFoundError("no such file") from None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    return values


def _token(config: dict[str, str]) -> str | None:
    """The token of topoplace.conf's token_file, else $TOPOPLACE_TOKEN, else none. A
    token_file that cannot be read, or holds no token, is an error (OSError naming it):
    sent without its token the report is refused (401) for a reason no log names."""
    path = config.get("token_file")
    if not path:
        return os.environ.get("TOPOPLACE_TOKEN")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError) as exc:
        raise OSError(f"cannot read the token_file {path}: {exc}") from None
    token = lines[0].strip() if lines else ""
    if not token:
        raise OSError(f"the token_file {path} holds no token on its first line")
    return token


def report(config: dict[str, str], job: str, name: str, retry_for: float = RETRY_S) -> str:
    """Post the job's `scontrol -d show job -o` to the service, with its name (which
    tells the text the user wrote from Slurm's fields); the answer's text. A try-later
    answer (``try_later``) is posted again for ``retry_for`` seconds in all, then
    OutOfTime."""
    if config.get("slurm_conf"):
        os.environ["SLURM_CONF"] = config["slurm_conf"]
    command = [config.get("scontrol", "scontrol"), "-d", "show", "job", "-o", job]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S * 5)
    if done.returncode != 0:
        # scontrol's own words (slurmctld busy, no such job) are what the log needs.
        why = " ".join(done.stderr.split())[:300] or f"exit status {done.returncode}"
        raise subprocess.SubprocessError(f"{' '.join(command)}: {why}")
    shown = done.stdout
    server = config.get("server", "http://127.0.0.1:8080").rstrip("/")
    request = urllib.request.Request(
        f"{server}/v1/slurm/job-started",
        data=json.dumps({"show_job": shown, "job_name": name}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    token = _token(config)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    # https: the CA bundle of topoplace.conf's ca_file, else the system's.
    handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
    if server.startswith("https://"):
        context = ssl.create_default_context(cafile=config.get("ca_file") or None)
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    timeout = min(TIMEOUT_S, retry_for)

    def post() -> str:
        with opener.open(request, timeout=timeout) as answer:
            return str(answer.read().decode(errors="replace"))

    try:
        # scontrol's text is posted again as it was read: the job waits for this prolog
        # to launch, so what it holds has not changed since.
        text = Patience(retry_for, try_later=try_later).call(post)
    except urllib.error.HTTPError as exc:
        raise ValueError(_refusal(exc)) from None
    try:
        said = json.loads(text)
    except ValueError:
        said = None
    if not isinstance(said, dict):
        # A proxy's page or another program at that address: nothing was recorded.
        raise ValueError(f"{server} answered with no JSON object: {' '.join(text.split())[:200]}")
    return text


def try_later(exc: Exception) -> tuple[str, str | None] | None:
    """urllib's failures that the same report may outlast, as the epilog's client reads
    them (service_retry.client_try_later): a 429 or 5xx answer, with its Retry-After, and
    no answer (refused, reset, timed out). A certificate that does not verify is a
    refusal: asking again only holds the job's launch back."""
    if isinstance(exc, urllib.error.HTTPError):
        later = exc.code == 429 or exc.code >= 500
        return (_refusal(exc), exc.headers.get("Retry-After")) if later else None
    if isinstance(exc, urllib.error.URLError):
        if isinstance(exc.reason, ssl.SSLCertVerificationError):
            return None
        return f"no answer: {exc.reason}", None
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return f"no answer: {exc or type(exc).__name__}", None
    return None


def _refusal(exc: urllib.error.HTTPError) -> str:
    """An error answer in one line: its status, and the service's code and message where
    it sent its error shape (why a report was turned away), with any Retry-After."""
    line = f"HTTP {exc.code} {exc.reason}"
    try:
        error = json.loads(exc.read()).get("error")
        line += f": {error['code']}: {error['message']}"
    except (OSError, ValueError, AttributeError, TypeError, KeyError, http.client.HTTPException):
        pass  # not the service's shape (a proxy's page): the status says what there is
    if exc.headers.get("Retry-After"):
        line += f" (Retry-After: {exc.headers['Retry-After']})"
    return line


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is an error, as for the client library: followed, the report would be
    resent as a GET, with the token, to wherever the Location points, and its page
    taken for the service's answer."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        raise urllib.error.HTTPError(
            req.full_url, code, f"{msg}, redirected to {newurl}: nothing delivered", headers, fp
        )


def own_record(env: Mapping[str, str]) -> str:
    """The job as scontrol names it alone: an array task as ``ARRAY_TASK``, a het job
    component as ``HETJOB+OFFSET``. The task that keeps the array's id (the last one,
    ``SLURM_JOB_ID`` equal to ``SLURM_ARRAY_JOB_ID``), and a het job's first component
    (whose id is the het job's), would otherwise be shown with every other task or
    component, and the service reads the first record it is given."""
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array and task and array.isdigit() and task.isdigit():
        return f"{array}_{task}"
    het, offset = env.get("SLURM_HET_JOB_ID"), env.get("SLURM_HET_JOB_OFFSET")
    if het and offset and het.isdigit() and offset.isdigit():
        return f"{het}+{offset}"
    return env.get("SLURM_JOB_ID", "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="topoplace.slurm_prolog", description=__doc__)
    parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"topoplace.conf (default {DEFAULT_CONFIG}, whose absence means the defaults;"
        " a PATH given that does not exist is an error, exit 2)",
    )
    parser.add_argument(
        "--job",
        metavar="ID",
        help="the job (default: $SLURM_JOB_ID; an array task: ARRAY_TASK; a het job"
        " component: HETJOB+OFFSET)",
    )
    parser.add_argument("--name", help="the job's name (default: $SLURM_JOB_NAME)")
    add_retry_for(
        parser,
        RETRY_S,
        RETRY_MAX_S,
        waits="the job's launch waits",
        then="give up, saying so, and exit 0: the reconcile loop records the job",
    )
    args = parser.parse_args(argv)
    job = args.job or own_record(os.environ)
    name = args.name if args.name is not None else os.environ.get("SLURM_JOB_NAME", "")
    if not job:
        print("topoplace prolog: no job: set SLURM_JOB_ID or pass --job", file=sys.stderr)
        return 0
    try:
        config = read_config(args.config)
    except (OSError, ValueError) as exc:
        # A usage error, as argparse's own: the shipped topoplace-prolog exits 0 all the same.
        named = f"--config {args.config}" if args.config else DEFAULT_CONFIG
        print(f"topoplace prolog: cannot read {named}: {exc}", file=sys.stderr)
        return 2
    try:
        print(f"job {job}: {report(config, job, name, args.retry_for)}")
    except OutOfTime as exc:
        print(f"topoplace prolog: job {job} not reported: try later: {exc}", file=sys.stderr)
    except (
        OSError,
        ValueError,
        subprocess.SubprocessError,
        urllib.error.URLError,
        http.client.HTTPException,  # no HTTP at that address (BadStatusLine), a cut answer
    ) as exc:
        # The reconcile loop records the job at its next read instead.
        print(f"topoplace prolog: job {job} not reported: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
