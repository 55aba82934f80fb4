"""Per-job choices written by users in the job's comment.

``sbatch --comment="topoplace:locality=nvlink,policy=spread"`` (the word
``topoplace:`` may follow other text, separated by a space). Keys:
``locality`` (nvlink|prefer|any), ``policy`` (pack|spread), ``objective``
(performance|balanced), ``numa`` (required|preferred|ignore); ``off`` leaves
the job to Slurm alone. What a job does not choose comes from the settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from placement.request import Locality, NumaMode, Objective, Policy
from service.slurm.settings import SlurmSettings

PREFIX = "topoplace:"
_CHOICES: dict[str, tuple[str, ...]] = {
    "locality": get_args(Locality),
    "policy": get_args(Policy),
    "objective": get_args(Objective),
    "numa": get_args(NumaMode),
}


class JobOptionError(ValueError):
    """The comment's topoplace options cannot be read; the message says how to fix them."""


@dataclass(frozen=True, slots=True)
class JobOptions:
    locality: str
    policy: str
    objective: str
    numa: str
    off: bool = False


def parse(comment: str | None, defaults: SlurmSettings) -> JobOptions:
    chosen: dict[str, str] = {}
    off = False
    for word in (comment or "").split():
        if not word.lower().startswith(PREFIX):
            continue
        for item in word[len(PREFIX) :].split(","):
            key, sep, value = item.strip().partition("=")
            key, value = key.strip().lower(), value.strip().lower()
            if not key:
                continue
            if key == "off" and not sep:
                off = True
                continue
            if key not in _CHOICES:
                raise JobOptionError(
                    f"topoplace: unknown option {key!r} in the job comment; known:"
                    f" {', '.join(sorted(_CHOICES))}, off"
                )
            if value not in _CHOICES[key]:
                raise JobOptionError(
                    f"topoplace: {key}={value!r} is not one of {'|'.join(_CHOICES[key])}"
                )
            chosen[key] = value
    return JobOptions(
        locality=chosen.get("locality", defaults.locality),
        policy=chosen.get("policy", defaults.policy),
        objective=chosen.get("objective", defaults.objective),
        numa=chosen.get("numa", defaults.numa),
        off=off,
    )
