"""GPU model names to NVLink generations ("families").

The per-lane NVLink rate depends on the generation, and the only thing every
source (NVML, nvidia-smi, a hand-written profile) agrees on is the marketing
name. Matching is by substring on the upper-cased name, most specific first.
"""

from __future__ import annotations

# (substring, family). Order matters: "GB200" before "B200", "H200" before "H20".
_FAMILY_PATTERNS: tuple[tuple[str, str], ...] = (
    ("GB300", "blackwell"),
    ("GB200", "blackwell"),
    ("B300", "blackwell"),
    ("B200", "blackwell"),
    ("B100", "blackwell"),
    ("GH200", "hopper"),
    ("H200", "hopper"),
    ("H100", "hopper"),
    ("H800", "hopper"),
    ("H20", "hopper"),
    ("A100", "ampere"),
    ("A800", "ampere"),
    ("A40", "ampere"),
    ("A30", "ampere"),
    ("A10", "ampere"),
    ("A6000", "ampere"),
    ("A5000", "ampere"),
    ("RTX 3090", "ampere"),
    ("V100", "volta"),
    ("P100", "pascal"),
    ("L40", "ada"),
    ("L4", "ada"),
    ("T4", "turing"),
)


def gpu_family(model: str) -> str:
    """The family of a GPU model name, or ``"unknown"``."""
    upper = model.upper()
    for needle, family in _FAMILY_PATTERNS:
        if needle in upper:
            return family
    return "unknown"
