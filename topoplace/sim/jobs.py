"""Job traces for ``topoplace sim``: the Alibaba 2023 format and our own CSV/JSON format.

Our format, one job per row (CSV with a header) or per object (JSON: a list,
or ``{"jobs": [...]}``):

| field | meaning | default |
|---|---|---|
| `name` | job name | `job-<row>` |
| `gpus` | GPUs per task (0: a CPU-only job, placed on CPU and memory) | required |
| `gpu_fraction` | a share of one GPU, 0 < f < 1 (then `gpus` is 1) | whole GPUs |
| `gpu_models` | accepted models, `|`-separated | any |
| `submit` | submit time, seconds | the row number |
| `duration` | run time, seconds; empty = never ends | never ends |
| `cpu_milli` | CPU per task, thousandths of a core | 0 (not counted) |
| `memory_mib` | memory per task, MiB | 0 (not counted) |

The Alibaba v2023 pod lists (``openb_pod_list_*.csv``) are read as they are:
``cpu_milli``, ``memory_mib``, ``num_gpu`` (0: a CPU-only pod, placed on
CPU and memory), ``gpu_milli`` (< 1000: a share), ``gpu_spec``,
``creation_time``, ``scheduled_time`` and ``deletion_time`` (duration =
deletion - scheduled, or - creation when never scheduled). Lists without
times (multigpuNN) get the row number as submit time and no end.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

FULL = 1000


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and row."""


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    gpus: int
    milli: int  # per GPU: 1000 = whole GPUs, less = a share of one GPU
    models: tuple[str, ...]
    submit: float
    duration: float | None  # None: runs to the end of the replay
    cpu_milli: int = 0  # per task; 0: not counted
    memory_mib: int = 0

    @property
    def shape(self) -> tuple[int, int, tuple[str, ...], int, int]:
        """What decides where the job fits (jobs of one shape fit the same places)."""
        return (self.gpus, self.milli, self.models, self.cpu_milli, self.memory_mib)

    @property
    def gpu_demand(self) -> float:
        return self.gpus * self.milli / FULL


@dataclass(frozen=True, slots=True)
class JobTrace:
    jobs: tuple[Job, ...]  # every job (CPU-only ones too), by submit time then file order
    rows: int
    cpu_only: int  # jobs without GPUs
    timed: bool  # every job has a submit time from the file

    def size_mix(self) -> dict[int, float]:
        """GPUs per whole-GPU job -> count (shares count as 1-GPU jobs)."""
        return dict(Counter(j.gpus for j in self.jobs if j.gpus))


def file_text(path: Path) -> str:
    """The text of an input file; ValueError saying, for a person, why it cannot be read
    (a directory, no permission, not UTF-8). A UTF-8 byte order mark (a spreadsheet's
    CSV) is not part of the first column's name."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError("no such file") from None
    except IsADirectoryError:
        raise ValueError("a directory, not a file") from None
    except OSError as exc:
        raise ValueError(f"cannot read it: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x})") from None


def read_trace(path: Path) -> JobTrace:
    try:
        text = file_text(path)
    except ValueError as exc:
        raise TraceError(f"{path}: {exc}") from None
    if path.suffix.lower() == ".json":
        return _from_rows(path, _json_rows(path, text))
    return _from_rows(path, list(csv.DictReader(io.StringIO(text, newline=""))))


def _json_rows(path: Path, text: str) -> list[dict[str, object]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not JSON: {exc}") from exc
    if isinstance(data, dict):
        data = data.get("jobs")
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise TraceError(f'{path}: expected a list of jobs or {{"jobs": [...]}}')
    return data


def _from_rows(path: Path, rows: Iterable[Mapping[str, object]]) -> JobTrace:
    jobs: list[Job] = []
    total = cpu_only = 0
    timed = True
    for i, row in enumerate(rows):
        total += 1
        name = _text(row, "name")
        where = f"{path}: job {i + 1}" + (f" ({name})" if name else "")
        try:
            job, had_time = _alibaba(row, i) if "num_gpu" in row else _ours(row, i)
        except (KeyError, ValueError, TypeError) as exc:
            raise TraceError(f"{where}: {exc}") from exc
        timed &= had_time
        if job is None:
            continue
        cpu_only += job.gpus == 0
        jobs.append(job)
    jobs.sort(key=lambda j: j.submit)  # stable: file order among equal times
    return JobTrace(jobs=tuple(jobs), rows=total, cpu_only=cpu_only, timed=timed and total > 0)


def _text(row: Mapping[str, object], key: str) -> str:
    value = row.get(key)
    return "" if value is None else str(value).strip()


def _models(text: str) -> tuple[str, ...]:
    return tuple(m.strip().upper() for m in text.split("|") if m.strip())


def whole_amount(row: Mapping[str, object], key: str) -> int:
    """A non-negative whole amount (CPU milli, MiB) of a trace or node row; empty or
    missing = 0, not counted."""
    text = _text(row, key)
    if not text:
        return 0
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{key} must be a whole number >= 0, not {text!r}") from None
    if value < 0:
        raise ValueError(f"{key} must be a whole number >= 0, not {text!r}")
    return value


def _seconds(row: Mapping[str, object], key: str) -> float | None:
    """A time or duration in seconds; None when empty. Infinite or NaN is refused: an
    infinite submit time kept the timed replay from ever ending, and NaN compares false
    with everything, so the replay's figures would mean nothing."""
    text = _text(row, key)
    if not text:
        return None
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number of seconds, not {text!r}")
    return value


def _alibaba(row: Mapping[str, object], i: int) -> tuple[Job | None, bool]:
    gpus = int(_text(row, "num_gpu"))
    milli = int(_text(row, "gpu_milli") or FULL)
    created = _seconds(row, "creation_time")
    scheduled = _seconds(row, "scheduled_time")
    deleted = _seconds(row, "deletion_time")
    if gpus < 0:
        raise ValueError("num_gpu must be >= 0")
    if gpus == 0 or milli < 1:
        gpus, milli = 0, FULL
    if gpus > 1 and milli < FULL:
        milli = FULL  # a multi-GPU share is not a share: FGD counts such pods whole
    submit = created if created is not None else float(i)
    duration = None
    if created is not None and deleted is not None:
        start = scheduled or submit
        duration = max(0.0, deleted - start)
    job = Job(
        name=_text(row, "name") or f"job-{i}",
        gpus=gpus,
        milli=min(milli, FULL),
        models=_models(_text(row, "gpu_spec")),
        submit=submit,
        duration=duration,
        cpu_milli=whole_amount(row, "cpu_milli"),
        memory_mib=whole_amount(row, "memory_mib"),
    )
    return job, created is not None


def _ours(row: Mapping[str, object], i: int) -> tuple[Job | None, bool]:
    gpus = int(_text(row, "gpus"))
    if gpus < 0:
        raise ValueError("gpus must be >= 0")
    fraction = _text(row, "gpu_fraction")
    milli = FULL
    if fraction:
        f = float(fraction)
        if not 0.0 < f < 1.0:
            raise ValueError(f"gpu_fraction must be between 0 and 1, not {f}")
        if gpus != 1:
            raise ValueError("gpu_fraction is a share of one GPU: gpus must be 1")
        milli = max(1, round(f * FULL))
    submit = _seconds(row, "submit")
    duration = _seconds(row, "duration")
    if duration is not None and duration < 0:
        raise ValueError("duration must be >= 0")
    job = Job(
        name=_text(row, "name") or f"job-{i}",
        gpus=gpus,
        milli=milli,
        models=_models(_text(row, "gpu_models")),
        submit=submit if submit is not None else float(i),
        duration=duration,
        cpu_milli=whole_amount(row, "cpu_milli"),
        memory_mib=whole_amount(row, "memory_mib"),
    )
    return job, submit is not None
