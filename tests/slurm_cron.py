"""The crontab line docs/slurm.md gives for pushing squeue's answer, as cron runs it."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "slurm.md"
CRON_FIELDS = "* * * * * root "
DOCUMENTED_URL = "http://topoplace.example:8080"
DOCUMENTED_HEADERS = "/etc/slurm/topoplace-reconcile.headers"


def documented_cron_command(url: str, headers: Path) -> str:
    """docs/slurm.md's crontab line, as cron hands it to /bin/sh (``\\%`` read as ``%``),
    sent to ``url`` with the headers file ``headers``: the tests run what the document
    tells operators to install, not a copy of it."""
    [line] = [
        line
        for line in DOCS.read_text().splitlines()
        if line.startswith(CRON_FIELDS) and "read_at" in line
    ]
    command = line.removeprefix(CRON_FIELDS).replace("\\%", "%")
    return command.replace(DOCUMENTED_URL, url).replace(DOCUMENTED_HEADERS, str(headers))
