"""Tables, a markdown report and (with matplotlib installed) plots of simulation results."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from topoplace.output_file import write_whole
from topoplace.sim.run import SimResult


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None or x != x else f"{x:,.{digits}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{100 * x:.1f}%"


HEADER = (
    "policy",
    "jobs",
    "started",
    "1st failure at",
    "unalloc GPUs at 1st failure",
    "alloc rate at end",
    "CPU alloc at end",
    "CPU-only started",
    "delay p50 s",
    "delay p99 s",
    "multi-GPU on NVLink",
    "multi-GPU bus GB/s",
    "stranded cliques",
    "sec",
)


def rows(results: Sequence[SimResult]) -> list[list[str]]:
    out = []
    for r in results:
        out.append(
            [
                r.policy + (" (cut)" if r.truncated else ""),
                str(r.jobs),
                str(r.started),
                _num(r.first_failure_at, 0),
                _num(r.unallocated_at_failure, 1),
                _pct(r.end_rate),
                _pct(r.end_cpu_rate),
                f"{r.cpu_started} of {r.cpu_jobs}",
                _num(r.delay(50), 0) if r.mode == "timed" else "-",
                _num(r.delay(99), 0) if r.mode == "timed" else "-",
                f"{_pct(r.nvlink_share)} of {r.multi}",
                _num(r.mean_ring),
                f"{r.stranded_cliques} ({r.stranded_gpus} GPUs)",
                _num(r.seconds),
            ]
        )
    return out


def text_table(results: Sequence[SimResult]) -> list[str]:
    body = rows(results)
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(HEADER)]
    out = ["  ".join(h.rjust(w) for h, w in zip(HEADER, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return out


def markdown_table(results: Sequence[SimResult]) -> list[str]:
    out = ["| " + " | ".join(HEADER) + " |", "|---|" + "---:|" * (len(HEADER) - 1)]
    out += ["| " + " | ".join(r) + " |" for r in rows(results)]
    return out


def causes(results: Sequence[SimResult], top: int = 4) -> list[str]:
    out = []
    for r in results:
        if r.causes:
            parts = ", ".join(f"{n}x {c}" for c, n in r.causes.most_common(top))
            out.append(f"- {r.policy}: {parts}")
    return out


def markdown(
    title: str, header: Sequence[str], runs: Sequence[tuple[str, Sequence[SimResult]]]
) -> str:
    lines = [f"# {title}", "", *header, ""]
    for fleet, results in runs:
        lines += [f"## {fleet}", "", *markdown_table(results), ""]
        why = causes(results)
        if why:
            lines += ["Failed attempts by cause:", "", *why, ""]
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[tuple[str, Sequence[SimResult]]], out_dir: Path) -> list[Path]:
    """allocation.png/.svg and fragmentation.png/.svg; [] without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written: list[Path] = []
    for figure, index, label in (
        ("allocation", 1, "GPU allocation rate"),
        ("fragmentation", 2, "fragmented share of free GPUs (FGD)"),
    ):
        fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), squeeze=False)
        for ax, (fleet, results) in zip(axes[0], runs, strict=True):
            for r in results:
                xs = [p[0] for p in r.timeline]
                ys = [p[index] for p in r.timeline]
                ax.plot(xs, ys, label=r.policy)
            mode = results[0].mode if results else "fill"
            ax.set_xlabel("simulated time (s)" if mode == "timed" else "jobs submitted")
            ax.set_ylabel(label)
            ax.set_title(fleet, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        try:
            for ext in ("png", "svg"):
                path = out_dir / f"{figure}.{ext}"
                image = io.BytesIO()
                fig.savefig(image, format=ext)
                write_whole(path, image.getvalue())  # whole or not at all, as report.md
                written.append(path)
        finally:
            plt.close(fig)
    return written
