"""MIG-partitioned variants of the DGX A100 and HGX H100 profiles.

An 80 GB A100 or H100 has 8 memory slices (7 compute slices); a GPU
instance occupies ``size`` consecutive slices from one of the start
positions its profile allows. The table below is the placement geometry
NVIDIA documents for these GPUs in the MIG user guide (the same for A100
80GB and H100 80GB). ``with_mig`` refuses a start the profile does not
allow and the snapshot model refuses overlapping instances, so every layout
here is one ``nvidia-smi mig -cgi`` could create.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from placement.profiles._common import Machine, MigSpec
from placement.profiles.nvswitch import dgx_a100, hgx_h100

# profile -> (placement size in slices, allowed placement starts)
MIG_80GB_PLACEMENTS: Mapping[str, tuple[int, tuple[int, ...]]] = {
    "1g.10gb": (1, (0, 1, 2, 3, 4, 5, 6)),
    "1g.20gb": (2, (0, 2, 4, 6)),
    "2g.20gb": (2, (0, 2, 4)),
    "3g.40gb": (4, (0, 4)),
    "4g.40gb": (4, (0,)),
    "7g.80gb": (8, (0,)),
}

Layout = Mapping[int, Sequence[tuple[str, int]]]


def with_mig(machine: Machine, layout: Layout) -> Machine:
    """``machine`` with MIG enabled on the GPUs of ``layout`` and its instances,
    given per GPU as ``(profile, placement_start)`` pairs."""
    instances: list[MigSpec] = []
    for gpu, parts in sorted(layout.items()):
        for profile, start in parts:
            size, starts = MIG_80GB_PLACEMENTS[profile]
            if start not in starts:
                raise ValueError(f"{profile} cannot start at slice {start} (allowed: {starts})")
            instances.append(MigSpec(gpu, profile, start, size))
    gpus = tuple(
        replace(spec, mig_enabled=True) if i in layout else spec
        for i, spec in enumerate(machine.gpus)
    )
    return replace(machine, gpus=gpus, mig=machine.mig + tuple(instances))


DGX_A100_LAYOUT: Layout = {
    0: tuple(("1g.10gb", s) for s in range(7)),
    1: (("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)),
    2: (("3g.40gb", 0), ("3g.40gb", 4)),
    3: (("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)),
}

HGX_H100_LAYOUT: Layout = {
    0: tuple(("1g.10gb", s) for s in range(7)),
    1: (("1g.20gb", 0), ("1g.20gb", 2), ("1g.20gb", 4), ("1g.20gb", 6)),
    2: (("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)),
    3: (("3g.40gb", 0), ("3g.40gb", 4)),
    4: (("4g.40gb", 0), ("3g.40gb", 4)),
    5: (("7g.80gb", 0),),
    6: (("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)),
    7: (("3g.40gb", 0), ("2g.20gb", 4), ("1g.20gb", 6)),
}


def dgx_a100_mig() -> Machine:
    return with_mig(dgx_a100(), DGX_A100_LAYOUT)


def hgx_h100_mig() -> Machine:
    return with_mig(hgx_h100(), HGX_H100_LAYOUT)
