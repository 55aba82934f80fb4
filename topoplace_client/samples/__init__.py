"""Real ``nvidia-smi topo -m`` outputs shipped with the package, reachable by name.

``topoplace plan --topology dgx1-v100`` and ``topoplace agent --source
smi:dgx1-v100`` read them; ``topoplace samples`` lists them. README.md in
this folder notes where each output was published.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# name -> what the machine is (README.md in this folder says where each was published)
SAMPLES: dict[str, str] = {
    "dgx1-v100": "8x V100 SXM2: NVLink hybrid cube-mesh, 4 NICs",
    "hgx-h100": "8x H100 SXM: NVSwitch, two NUMA nodes",
    "pcie-8x-l40s": "8x L40S: PCIe only, two NUMA nodes",
    "workstation-3x-a6000": "3x RTX A6000: one NVLink bridge between two of them",
}


def sample_names() -> list[str]:
    return sorted(SAMPLES)


def sample_text(name: str) -> str:
    """The sample's text; KeyError for a name that is not a sample."""
    if name not in SAMPLES:
        raise KeyError(name)
    return files(__name__).joinpath(f"{name}.txt").read_text(encoding="utf-8")


def is_sample(spec: str | Path) -> bool:
    """Whether ``spec`` names a sample rather than a file: a file that exists always wins."""
    return str(spec) in SAMPLES and not Path(spec).exists()
