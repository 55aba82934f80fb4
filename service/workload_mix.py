"""The workload mix file the service's engine states are configured with.

``TOPOPLACE_WORKLOAD_MIX_FILE`` (``serve --workload-mix FILE``) names a file in
the format of ``placement.workload_mix`` (docs/engine.md, "Configured or
observed"), read once at start: every ``ClusterState`` the service builds
weighs its choices by it, so replicas given the same file rank the same from
their first decision, where an observed mix starts from nothing at each start
and differs between replicas by the requests each happened to serve.
"""

from __future__ import annotations

from pathlib import Path

from placement.workload_mix import WorkloadMix, WorkloadMixError, parse

# A file of every part at the engine's limits (256 task types, 65 model lists of 64
# names of 128 characters) is about 600 KiB; read no more than twice that, so a wrong
# path (a disk image, /dev/zero) is refused instead of read into memory.
MAX_FILE_BYTES = 1 << 20


def read_workload_mix(path: str | None) -> WorkloadMix:
    """The mix the file configures (nothing configured without a file); ValueError
    (WorkloadMixError) in one line naming the file and the field otherwise."""
    if path is None:
        return WorkloadMix()
    where = f"the workload mix file {path} (TOPOPLACE_WORKLOAD_MIX_FILE)"
    try:
        with Path(path).open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise WorkloadMixError(f"cannot read {where}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise WorkloadMixError(f"{where}: larger than {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WorkloadMixError(f"{where}: not UTF-8 text") from None
    try:
        return parse(text)
    except WorkloadMixError as exc:
        raise WorkloadMixError(f"{where}: {exc}") from None


def describe(mix: WorkloadMix) -> str:
    """Which parts are configured and which observed, for the start's log line."""
    parts = ("size_mix", "host_mix", "task_mix", "model_demand")
    given = [p for p in parts if getattr(mix, p) is not None]
    left = [p for p in parts if getattr(mix, p) is None]
    return (
        f"configured: {', '.join(given) or 'none'};"
        f" left as without a file: {', '.join(left) or 'none'}"
    )
