"""Cutting a region's summary to what the global service takes (schemas.RegionSummary).

A summary past a limit (a name too long, more than 64 GPU models, 1,000
designs or 10,000 cliques) is refused whole, and the region's next one,
built from the same cluster, is refused again: the region goes stale for
good and is never routed to. So the region cuts its summary to fit before
signing it, keeping what a job is most likely to be placed on:

- a name past its length keeps its start (the model's tokens, matched against
  a job's ``gpu_models``) and ends in a hash of the whole name, so each long
  name shortens the same way in every summary, and two stay apart;
- past 64 models, the models with the fewest free GPUs go, with their designs;
- past 1,000 designs, the designs with the fewest free GPUs go;
- a clique of a design left out goes too (the ranking reads it only through its
  design); past 10,000, the cliques with the fewest wholly free nodes go.

Ties go by name, so the same cluster gives the same summary. What went is
counted in the summary's ``cut`` (absent when nothing did), and shown with
the region on the global service. Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Any

from service.federation.schemas import (
    MAX_CLIQUE_DOMAIN,
    MAX_DESIGN_NAME,
    MAX_GPU_MODEL_NAME,
    MAX_SUMMARY_CLIQUES,
    MAX_SUMMARY_DESIGNS,
    MAX_SUMMARY_MODELS,
)

HASH_CHARS = 16  # 64 bits of SHA-256: no two names of one region meet by chance


def shortened(name: str, limit: int) -> str:
    """``name`` when it fits ``limit`` characters; else its start, '~' and a hash of it."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:HASH_CHARS]
    return f"{name[: limit - HASH_CHARS - 1]}~{digest}"


def is_shortened(name: str, limit: int) -> bool:
    """Whether ``name`` is one :func:`shortened` cut to ``limit``: not the name itself."""
    return len(name) == limit and _HASHED.fullmatch(name[-HASH_CHARS - 1 :]) is not None


_HASHED = re.compile(f"~[0-9a-f]{{{HASH_CHARS}}}")


def _most_free_designs(designs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The designs most likely to take a job first: most free GPUs, then most nodes."""
    return sorted(designs, key=lambda d: (-d["free_gpus"], -d["nodes"], d["design"]))


def _kept_models(designs: list[dict[str, Any]]) -> set[str]:
    free: Counter[str] = Counter()
    for d in designs:
        free[d["gpu_model"]] += d["free_gpus"]
    ranked = sorted(free, key=lambda model: (-free[model], model))
    return set(ranked[:MAX_SUMMARY_MODELS])


def fit(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` cut to the global service's limits, with ``cut`` saying what went;
    the same dict when it fits as it is."""
    shortened_names = 0

    def short(name: str, limit: int) -> str:
        nonlocal shortened_names
        short_name = shortened(name, limit)
        shortened_names += short_name != name
        return short_name

    designs = [
        {
            **d,
            "design": short(d["design"], MAX_DESIGN_NAME),
            "gpu_model": short(d["gpu_model"], MAX_GPU_MODEL_NAME),
        }
        for d in summary["designs"]
    ]
    cliques = [
        {
            **c,
            "domain": short(c["domain"], MAX_CLIQUE_DOMAIN),
            "design": shortened(c["design"], MAX_DESIGN_NAME),  # counted with its design
        }
        for c in summary["cliques"]
    ]
    models = _kept_models(designs)
    kept = [d for d in _most_free_designs(designs) if d["gpu_model"] in models]
    kept = kept[:MAX_SUMMARY_DESIGNS]
    names = {d["design"] for d in kept}
    kept_cliques = [c for c in cliques if c["design"] in names]
    kept_cliques.sort(key=lambda c: (-c["free_nodes"], -c["nodes"], c["domain"]))
    kept_cliques = kept_cliques[:MAX_SUMMARY_CLIQUES]
    cut = {
        "designs": len(designs) - len(kept),
        "free_gpus": sum(d["free_gpus"] for d in designs) - sum(d["free_gpus"] for d in kept),
        "cliques": len(cliques) - len(kept_cliques),
        "names": shortened_names,
    }
    if not any(cut.values()):
        return summary
    return {
        **summary,
        "designs": sorted(kept, key=lambda d: d["design"]),
        "cliques": sorted(kept_cliques, key=lambda c: c["domain"]),
        "cut": cut,
    }
