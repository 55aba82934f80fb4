"""Reading /metrics with prometheus-client's own parser, and the list docs/metrics.md gives."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DOC = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def documented() -> dict[str, str]:
    """Every metric docs/metrics.md's table lists, name -> type."""
    rows = re.findall(r"^\| `(topoplace_\w+)` \| (\w+) \|", DOC.read_text(), re.MULTILINE)
    return dict(rows)


def family_name(name: str, kind: str) -> str:
    """The family name the parser gives a documented name (counters lose ``_total``)."""
    return name.removesuffix("_total") if kind == "counter" else name


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """(family name -> type, every sample's value by name and labels)."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return types, samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, lb), v in samples.items() if n == name and wanted <= lb)
