"""The workload mix as a file's text: what ``ClusterState.from_mix`` is configured with.

Four parts, each optional (docs/engine.md, "Configured or observed"):

- ``size_mix``: GPUs per request -> how often (placement.what_is_left); left out, the
  engine's default mix (``DEFAULT_SIZE_MIX``);
- ``host_mix``: milli-CPU and MiB per GPU (placement.host); left out, observed;
- ``task_mix``: task types with weights (placement.task_mix); left out, observed;
- ``model_demand``: GPUs asked per model list (placement.model_demand); left out,
  observed.

The text is JSON (version 1)::

    {"version": 1,
     "size_mix": {"1": 3911, "8": 44},
     "host_mix": {"cpu_milli_per_gpu": 6000, "memory_mib_per_gpu": 24576},
     "task_mix": [{"gpus": 1, "gpu_milli": 500, "cpu_milli": 4000,
                   "memory_mib": 15000, "weight": 80}],
     "model_demand": [{"models": [], "gpus": 5000}, {"models": ["T4"], "gpus": 1200}]}

Read strictly: an unknown key, a duplicate key, a wrong type or a figure out of
bounds is refused with ``WorkloadMixError`` naming the field. The bounds are the
engine's own (a request's GPUs, CPU and memory, ``task_mix.MAX_TYPES``,
``model_demand.MAX_LISTS``, a request's model list), so a file can neither hold
what no request could ask nor grow the state past what an observed mix may.
Order is kept both ways: the engine sums the weights in the order given, so the
same text gives the same floating-point figures and the same rankings.

Pure text in, values out: reading the file is the caller's (service/workload_mix.py).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from placement.model_demand import MAX_LISTS, model_list
from placement.request import MAX_CPU_MILLI, MAX_FILTER_ENTRIES, MAX_GPU_MEMORY_MIB, MAX_TASK_GPUS
from placement.task_mix import FULL, MAX_TYPES, TaskType
from placement.text import forbidden_character

VERSION = 1
# Any weight's or count's ceiling: "any scale" still needs one, and a year of a large
# cluster's jobs or GPUs is below 1e12; past 1e15 a float no longer counts single units.
MAX_WEIGHT = 1e15
MAX_MODEL_NAME = 128  # a request's model name (PlacementRequest.gpu_models)
_SIZE_KEY = re.compile(r"[1-9][0-9]{0,2}")
_TOP = ("version", "size_mix", "host_mix", "task_mix", "model_demand")
_HOST = ("cpu_milli_per_gpu", "memory_mib_per_gpu")
_TYPE = ("gpus", "gpu_milli", "cpu_milli", "memory_mib", "weight")
_DEMAND = ("models", "gpus")


class WorkloadMixError(ValueError):
    """A workload mix the engine will not take; the message names the field."""


@dataclass(frozen=True, slots=True)
class WorkloadMix:
    """What ``ClusterState`` weighs its choices by; None: the part is not configured (the
    default size mix; the other parts observed from the requests decided)."""

    size_mix: Mapping[int, float] | None = None
    host_mix: tuple[float, float] | None = None
    task_mix: Mapping[TaskType, float] | None = None
    model_demand: Mapping[tuple[str, ...], float] | None = None


def to_text(mix: WorkloadMix) -> str:
    """The mix as the file's JSON, in the engine's order. Raises WorkloadMixError for a
    mix ``parse`` would refuse, so nothing writes a file that will not read back."""
    data: dict[str, Any] = {"version": VERSION}
    if mix.size_mix is not None:
        data["size_mix"] = {str(k): float(w) for k, w in mix.size_mix.items()}
    if mix.host_mix is not None:
        data["host_mix"] = dict(zip(_HOST, map(float, mix.host_mix), strict=True))
    if mix.task_mix is not None:
        data["task_mix"] = [
            {**dict(zip(_TYPE, t, strict=False)), "weight": float(w)}
            for t, w in mix.task_mix.items()
        ]
    if mix.model_demand is not None:
        data["model_demand"] = [
            {"models": list(models), "gpus": float(gpus)}
            for models, gpus in mix.model_demand.items()
        ]
    try:
        # One part per line, one task type or model list per line: readable, and diffs
        # of two months' mixes show which types moved.
        parts = []
        for key, value in data.items():
            if isinstance(value, list):
                rows = ",\n".join(f"  {json.dumps(row, allow_nan=False)}" for row in value)
                parts.append(f" {json.dumps(key)}: [\n{rows}\n ]")
            else:
                parts.append(f" {json.dumps(key)}: {json.dumps(value, allow_nan=False)}")
    except ValueError:
        raise WorkloadMixError("a weight is not a finite number") from None
    text = "{\n" + ",\n".join(parts) + "\n}\n"
    parse(text)
    return text


def parse(text: str) -> WorkloadMix:
    """The mix a file's text configures; WorkloadMixError naming the field otherwise."""
    try:
        data = json.loads(text, object_pairs_hook=_unique, parse_constant=_no_constant)
    except WorkloadMixError:
        raise
    except ValueError as exc:  # JSONDecodeError, or an integer of too many digits
        raise WorkloadMixError(f"not JSON: {' '.join(str(exc).split())}") from None
    top = _object(data, "the file", _TOP)
    if "version" not in top:
        raise WorkloadMixError(f"version: missing (this format is version {VERSION})")
    if top["version"] != VERSION or isinstance(top["version"], bool):
        raise WorkloadMixError(f"version: {top['version']!r} is not {VERSION}")
    return WorkloadMix(
        size_mix=_size_mix(top["size_mix"]) if "size_mix" in top else None,
        host_mix=_host_mix(top["host_mix"]) if "host_mix" in top else None,
        task_mix=_task_mix(top["task_mix"]) if "task_mix" in top else None,
        model_demand=_model_demand(top["model_demand"]) if "model_demand" in top else None,
    )


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise WorkloadMixError(f"the key {key!r} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise WorkloadMixError(f"{name} is not a number this file may hold")


def _object(value: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WorkloadMixError(f"{where}: an object, not {_kind(value)}")
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise WorkloadMixError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(keys)})")
    return value


def _list(value: Any, where: str, most: int) -> list[Any]:
    if not isinstance(value, list):
        raise WorkloadMixError(f"{where}: a list, not {_kind(value)}")
    if not value:
        raise WorkloadMixError(f"{where}: empty; leave it out to have it observed")
    if len(value) > most:
        raise WorkloadMixError(f"{where}: {len(value)} entries, at most {most}")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false"}.get(
        type(value), "null" if value is None else repr(value)
    )


def _whole(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadMixError(f"{where}: a whole number, not {_kind(value)}")
    if not low <= value <= high:
        raise WorkloadMixError(f"{where}: {value} is not within {low}..{high}")
    return value


def _number(value: Any, where: str, high: float, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WorkloadMixError(f"{where}: a number, not {_kind(value)}")
    if not (0 <= value <= high) or (positive and value == 0):
        bound = f"more than 0 and at most {high:g}" if positive else f"within 0..{high:g}"
        raise WorkloadMixError(f"{where}: {value} is not {bound}")
    out = float(value)
    assert math.isfinite(out)  # bounded above and below
    return out


def _size_mix(value: Any) -> dict[int, float]:
    if not isinstance(value, dict):
        raise WorkloadMixError(f"size_mix: an object, not {_kind(value)}")
    if not value:
        raise WorkloadMixError("size_mix: empty; leave it out for the default mix")
    mix: dict[int, float] = {}
    for key, weight in value.items():
        where = f"size_mix[{key!r}]"
        if not _SIZE_KEY.fullmatch(key) or int(key) > MAX_TASK_GPUS:
            raise WorkloadMixError(
                f'{where}: a size is GPUs per request, 1..{MAX_TASK_GPUS} written as "8"'
            )
        mix[int(key)] = _number(weight, where, MAX_WEIGHT)
    if not any(mix.values()):
        raise WorkloadMixError("size_mix: every weight is 0; at least one must be more")
    return mix


def _host_mix(value: Any) -> tuple[float, float]:
    host = _object(value, "host_mix", _HOST)
    missing = [k for k in _HOST if k not in host]
    if missing:
        raise WorkloadMixError(f"host_mix.{missing[0]}: missing")
    return (
        _number(host["cpu_milli_per_gpu"], "host_mix.cpu_milli_per_gpu", MAX_CPU_MILLI),
        _number(host["memory_mib_per_gpu"], "host_mix.memory_mib_per_gpu", MAX_GPU_MEMORY_MIB),
    )


def _task_mix(value: Any) -> dict[TaskType, float]:
    mix: dict[TaskType, float] = {}
    where_of: dict[TaskType, str] = {}
    for i, entry in enumerate(_list(value, "task_mix", MAX_TYPES)):
        where = f"task_mix[{i}]"
        fields = _object(entry, where, _TYPE)
        missing = [k for k in _TYPE if k not in fields]
        if missing:
            raise WorkloadMixError(f"{where}.{missing[0]}: missing")
        gpus = _whole(fields["gpus"], f"{where}.gpus", 1, MAX_TASK_GPUS)
        milli = _whole(fields["gpu_milli"], f"{where}.gpu_milli", 1, FULL)
        if milli < FULL and gpus != 1:
            raise WorkloadMixError(
                f"{where}.gpu_milli: a share ({milli} < {FULL}) is of one GPU, not {gpus}"
            )
        t = (
            gpus,
            milli,
            _whole(fields["cpu_milli"], f"{where}.cpu_milli", 0, MAX_CPU_MILLI),
            _whole(fields["memory_mib"], f"{where}.memory_mib", 0, MAX_GPU_MEMORY_MIB),
        )
        if t in mix:
            raise WorkloadMixError(f"{where}: the same type as {where_of[t]}")
        mix[t] = _number(fields["weight"], f"{where}.weight", MAX_WEIGHT, positive=True)
        where_of[t] = where
    return mix


def _model_demand(value: Any) -> dict[tuple[str, ...], float]:
    demand: dict[tuple[str, ...], float] = {}
    where_of: dict[tuple[str, ...], str] = {}
    # One entry per model list, and one for any model (()): the engine's limit plus one.
    for i, entry in enumerate(_list(value, "model_demand", MAX_LISTS + 1)):
        where = f"model_demand[{i}]"
        fields = _object(entry, where, _DEMAND)
        missing = [k for k in _DEMAND if k not in fields]
        if missing:
            raise WorkloadMixError(f"{where}.{missing[0]}: missing")
        models = fields["models"]
        if not isinstance(models, list):
            raise WorkloadMixError(
                f"{where}.models: a list ([] for any model), not {_kind(models)}"
            )
        if len(models) > MAX_FILTER_ENTRIES:
            raise WorkloadMixError(
                f"{where}.models: {len(models)} models, at most {MAX_FILTER_ENTRIES}"
            )
        for j, name in enumerate(models):
            if (
                not isinstance(name, str)
                or not name
                or name != name.strip()
                or len(name) > MAX_MODEL_NAME
                or forbidden_character(name) is not None
            ):
                raise WorkloadMixError(
                    f"{where}.models[{j}]: a model name of 1..{MAX_MODEL_NAME} printable"
                    " characters, no space around it"
                )
        key = model_list(models)
        if key in where_of:
            raise WorkloadMixError(f"{where}.models: the same list as {where_of[key]}")
        where_of[key] = where
        demand[tuple(models)] = _number(fields["gpus"], f"{where}.gpus", MAX_WEIGHT)
    if sum(1 for key in where_of if key) > MAX_LISTS:
        raise WorkloadMixError(f"model_demand: at most {MAX_LISTS} model lists besides []")
    if not any(demand.values()):
        raise WorkloadMixError("model_demand: every entry's gpus is 0; at least one must be more")
    return demand
