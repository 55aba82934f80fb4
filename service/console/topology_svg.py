"""A node's wiring picture (service/console/wiring.py) written as SVG.

Every element a reader (or a test, or the console's what-if highlight) looks for
carries a ``data-`` attribute: ``data-gpu``, ``data-island``, ``data-allocation``,
``data-nvlink`` (``a-b``), ``data-nic``, ``data-numa``. The style is inside the
document, so the file stands alone in a ticket; the console inlines the same
document and adds only the ``whatif`` class to the GPUs a /score would give.
"""

from __future__ import annotations

import re
from xml.sax import saxutils

from placement.islands import PCIE
from service.console.wiring import Box, Edge, GpuBox, Picture

# What XML 1.0 cannot carry at all, escaped or not. Names and job ids refuse control
# characters where they are read (placement/text.py), but U+FFFE and U+FFFF pass, and one
# of them in a job id or a GPU model made the whole picture unreadable.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def escape(text: str) -> str:
    """``text`` as XML character data: markup escaped, non-characters shown as U+FFFD."""
    return saxutils.escape(_NOT_XML.sub("\ufffd", text))


def quoteattr(text: str) -> str:
    """``text`` as a quoted XML attribute value, as ``escape`` writes character data."""
    return saxutils.quoteattr(_NOT_XML.sub("\ufffd", text))


STYLE = """
.tp-title{font:600 16px sans-serif;fill:#222}
.tp-sub{font:12px sans-serif;fill:#555}
.tp-band{fill:#f6f7f9;stroke:#c9ced6}
.tp-band-label{font:600 12px sans-serif;fill:#444}
.tp-group{fill:#fff;stroke:#9aa3ad;stroke-dasharray:4 3}
.tp-gpu rect.tp-chip{stroke:#333;stroke-width:1.2}
.tp-gpu.free rect.tp-chip{fill:#fff}
.tp-gpu.unhealthy rect.tp-chip{stroke:#c00;stroke-width:2.5;stroke-dasharray:5 3}
.tp-gpu.whatif rect.tp-chip{stroke:#d4006a;stroke-width:4}
.tp-gpu text{font:11px sans-serif;fill:#111}
.tp-gpu text.tp-name{font-weight:600;font-size:13px}
.tp-island-tag{font:10px monospace;fill:#333}
.tp-nic rect{fill:#e8eef7;stroke:#5b6b80}
.tp-nic text{font:10px monospace;fill:#223}
.tp-nvlink{fill:none;stroke:#76b900}
.tp-lanes{font:600 10px sans-serif;fill:#3d6000}
.tp-lanes-bg{fill:#fff;opacity:.85}
.tp-switch rect{fill:#eaf5d8;stroke:#76b900}
.tp-switch text{font:600 11px sans-serif;fill:#3d6000}
.tp-port{stroke:#76b900;stroke-width:2}
.tp-legend text{font:11px sans-serif;fill:#222}
"""


def _rect(box: Box, cls: str, rx: int = 4) -> str:
    return (
        f'<rect class="{cls}" x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}"'
        f' height="{box.h:.1f}" rx="{rx}"/>'
    )


def _text(x: float, y: float, text: str, cls: str = "", anchor: str = "start") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<text{klass} x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">{escape(text)}</text>'


def _gpu(gpu: GpuBox) -> str:
    classes = ["tp-gpu", "held" if gpu.holder else "free"]
    if gpu.health != "healthy":
        classes.append("unhealthy")
    attrs = f' data-gpu="{gpu.index}" data-island={quoteattr(gpu.island)}'
    if gpu.holder is not None:
        attrs += f" data-allocation={quoteattr(gpu.holder.allocation_id)}"
    box = gpu.box
    fill = f' style="fill:{gpu.colour}"' if gpu.colour else ""
    title = f"GPU{gpu.index} {gpu.model}, island {gpu.island}, {gpu.health}"
    if gpu.holder is not None:
        job = f" job {gpu.holder.job_id}" if gpu.holder.job_id else ""
        title += f"; held by {gpu.holder.allocation_id}{job} ({gpu.holder.state})"
    else:
        title += "; free"
    parts = [
        f'<g class="{" ".join(classes)}"{attrs}>',
        f"<title>{escape(title)}</title>",
        f'<rect class="tp-chip" x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}"'
        f' height="{box.h:.1f}" rx="6"{fill}/>',
        _text(box.x + 8, box.y + 18, f"GPU{gpu.index}", "tp-name"),
        _text(box.x + 8, box.y + 33, gpu.model),
        _text(box.x + 8, box.y + 56, gpu.island, "tp-island-tag"),
    ]
    marks = [
        m
        for m in ("MIG" if gpu.mig_enabled else "", "" if gpu.health == "healthy" else gpu.health)
        if m
    ]
    if marks:
        parts.append(_text(box.x + box.w - 6, box.y + 18, " ".join(marks), anchor="end"))
    parts.append("</g>")
    return "".join(parts)


def _edge(edge: Edge) -> str:
    (x1, y1), (cx, cy), (x2, y2) = edge.start, edge.via, edge.end
    width = 1.5 + 1.5 * min(edge.lanes, 6)
    lx, ly = edge.label_at
    label = f"NV{edge.lanes}"
    return (
        f'<g class="tp-nvlink-pair" data-nvlink="{edge.a}-{edge.b}" data-lanes="{edge.lanes}">'
        f"<title>GPU{edge.a} - GPU{edge.b}: {edge.lanes} NVLink lane(s)</title>"
        f'<path class="tp-nvlink" d="M{x1:.1f},{y1:.1f} Q{cx:.1f},{cy:.1f} {x2:.1f},{y2:.1f}"'
        f' stroke-width="{width:.1f}"/>'
        f'<rect class="tp-lanes-bg" x="{lx - 14:.1f}" y="{ly - 9:.1f}" width="28" height="13"/>'
        + _text(lx, ly + 1, label, "tp-lanes", "middle")
        + "</g>"
    )


def render_svg(picture: Picture) -> str:
    """The SVG document of ``picture``."""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tp-topology"'
        f' data-node={quoteattr(picture.node)} width="{picture.width:.0f}"'
        f' height="{picture.height:.0f}" viewBox="0 0 {picture.width:.0f} {picture.height:.0f}">',
        f"<style>{STYLE}</style>",
        '<rect width="100%" height="100%" fill="#fff"/>',
        _text(20, 24, f"{picture.node}: GPU wiring", "tp-title"),
        _text(
            20,
            42,
            "NUMA bands · dashed boxes share a PCIe switch · green: NVLink (lanes)"
            " · colour: allocation",
            "tp-sub",
        ),
    ]
    for band in picture.bands:
        numa = "host" if band.numa == -1 else ("unknown" if band.numa is None else band.numa)
        out.append(f'<g class="tp-numa" data-numa="{numa}">')
        out.append(_rect(band.box, "tp-band", 8))
        out.append(_text(band.box.x + 10, band.box.y + band.box.h - 7, band.label, "tp-band-label"))
        out.extend(_rect(group.box, "tp-group", 6) for group in band.groups)
        out.append("</g>")
    gpu_at = {gpu.index: gpu.box for gpu in picture.gpus}
    for switch in picture.switches:
        out.append(f'<g class="tp-switch" data-island={quoteattr(switch.island)}>')
        for gpu, lanes in switch.ports:
            box = gpu_at[gpu]
            out.append(
                f'<line class="tp-port" data-port="{gpu}" data-lanes="{lanes}" x1="{box.cx:.1f}"'
                f' y1="{switch.box.y + switch.box.h:.1f}" x2="{box.cx:.1f}" y2="{box.y:.1f}"/>'
            )
        out.append(_rect(switch.box, "", 5))
        lane_text = "/".join(str(n) for n in sorted({n for _, n in switch.ports}))
        out.append(
            _text(
                switch.box.cx,
                switch.box.y + 17,
                f"NVSwitch · island {switch.island} · {lane_text} lanes per GPU",
                anchor="middle",
            )
        )
        out.append("</g>")
    out.extend(_edge(edge) for edge in picture.edges)
    out.extend(_gpu(gpu) for gpu in picture.gpus)
    for nic in picture.nics:
        out.append(
            f'<g class="tp-nic" data-nic={quoteattr(nic.name)}>{_rect(nic.box, "", 3)}'
            + _text(nic.box.cx, nic.box.y + 15, nic.name, anchor="middle")
            + "</g>"
        )
    y = picture.height - 18 * (len(picture.legend) + 1) + 4
    groups = "; ".join(
        f"{name}: GPU {', '.join(str(g) for g in gpus)}" for name, gpus in picture.islands
    )
    # GPUs without NVLink are PCIe groups (pcie0...), not islands (placement/islands.py).
    pcie = any(name.startswith(PCIE) for name, _ in picture.islands)
    nvlink = any(not name.startswith(PCIE) for name, _ in picture.islands)
    title = " and ".join(
        what for what, shown in (("NVLink islands", nvlink), ("PCIe groups", pcie)) if shown
    )
    out.append(f'<g class="tp-legend">{_text(20, y, f"{title}: {groups}")}')
    for row, entry in enumerate(picture.legend, start=1):
        job = f" · job {entry.holder.job_id}" if entry.holder.job_id else ""
        gpus = ", ".join(str(g) for g in entry.gpus)
        allocation = quoteattr(entry.holder.allocation_id)
        out.append(
            f'<rect x="20" y="{y + 18 * row - 10:.1f}" width="12" height="12"'
            f' style="fill:{entry.colour}" data-allocation={allocation}/>'
        )
        out.append(
            _text(
                38,
                y + 18 * row,
                f"{entry.holder.allocation_id}{job} · {entry.holder.state} · GPU {gpus}",
            )
        )
    out.append("</g></svg>")
    return "".join(out)
