"""GPU requests in Slurm's TRES strings.

job_submit.lua sees ``--gpus=4`` as ``tres_per_job="gres:gpu:4"``,
``--gres=gpu:h100:2`` as ``tres_per_node="gres:gpu:h100:2"``; several entries
are comma-separated (``gres:gpu:2,gres:shard:1``). Per-GPU types written by
``topoplace slurm gres-conf`` are ``g<index>`` (``gres:gpu:g4:1``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Must match what gres_conf writes: one GRES Type per GPU.
GPU_TYPE_PREFIX = "g"
# ASCII digits, no more than an index has: ``\d`` took "g\u0661" (read as g1) and a
# type of 5,000 digits, which int() refuses past 4,300 (a 500 for an srun's job-submit).
_PER_GPU_TYPE = re.compile(rf"^{GPU_TYPE_PREFIX}([0-9]{{1,9}})$")
# More digits than any count Slurm keeps (64 bits): read as a number, 4,300 digits and
# more made int() raise a ValueError the caller does not expect (a 500).
_MAX_COUNT_DIGITS = 20


class TresError(ValueError):
    """A TRES string this adapter cannot read."""


@dataclass(frozen=True, slots=True)
class GpuAsk:
    """The GPUs one TRES field asks for: a count and the types named, if any."""

    count: int
    types: tuple[str, ...] = ()

    @property
    def per_gpu_indices(self) -> tuple[int, ...] | None:
        """GPU indices when every type is a per-GPU type (``g4``), else None."""
        found = [_PER_GPU_TYPE.match(t) for t in self.types]
        if not found or any(m is None for m in found):
            return None
        return tuple(int(m.group(1)) for m in found if m is not None)

    @property
    def model_types(self) -> tuple[str, ...]:
        return tuple(t for t in self.types if _PER_GPU_TYPE.match(t) is None)


def gpu_ask(tres: str | None) -> GpuAsk | None:
    """The GPU part of a TRES string, or None when it asks for no GPU."""
    if not tres:
        return None
    count = 0
    types: list[str] = []
    for entry in tres.split(","):
        parts = entry.strip().split(":")
        if parts and parts[0] in ("gres", "gres/gpu"):
            parts = parts[1:] if parts[0] == "gres" else ["gpu", *parts[1:]]
        if not parts or parts[0] != "gpu":
            continue
        if len(parts) == 2:
            name_count = parts[1]
        elif len(parts) == 3:
            types.append(parts[1])
            name_count = parts[2]
        else:
            raise TresError(f"cannot read the GPU request {entry.strip()!r}")
        # ASCII digits only: str.isdigit() takes "\u00b2", which int() refuses, and
        # "\u0661", which int() reads as 1.
        if (
            not (name_count.isascii() and name_count.isdigit())
            or len(name_count) > _MAX_COUNT_DIGITS
            or int(name_count) < 1
        ):
            raise TresError(
                f"GPU count {name_count[:40]!r} in {entry.strip()[:80]!r} is not a positive"
                f" number of at most {_MAX_COUNT_DIGITS} digits"
            )
        count += int(name_count)
    return GpuAsk(count, tuple(types)) if count else None


def per_gpu_tres(indices: tuple[int, ...] | list[int]) -> str:
    """``gres:gpu:g2:1,gres:gpu:g3:1``: exactly these GPUs on every node of the job."""
    return ",".join(f"gres:gpu:{GPU_TYPE_PREFIX}{i}:1" for i in sorted(indices))
