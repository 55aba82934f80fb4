from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement import islands
from placement.cpuset import CpusetError, format_cpuset, parse_cpuset
from placement.profiles import build_profile


def test_cpuset_parse_and_format() -> None:
    assert parse_cpuset("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpuset("") == ()
    assert format_cpuset([3, 1, 2, 7, 9, 8]) == "1-3,7-9"
    for bad in ("1-", "a", "3-1", "1,,2", "-2"):
        with pytest.raises(CpusetError):
            parse_cpuset(bad)


@given(st.sets(st.integers(0, 300)))
def test_cpuset_round_trip(cpus: set[int]) -> None:
    assert parse_cpuset(format_cpuset(cpus)) == tuple(sorted(cpus))


def test_islands_have_stable_names() -> None:
    dgx1 = islands(build_profile("dgx1-v100", "a"))
    assert [(i.name, i.gpus) for i in dgx1] == [("nvl0", tuple(range(8)))]
    pcie = islands(build_profile("pcie-8x-l40s", "b"))
    # GPUs without NVLink are not islands: PCIe groups, one per socket.
    assert [(i.name, i.kind, i.gpus) for i in pcie] == [
        ("pcie0", "pcie", (0, 1, 2, 3)),
        ("pcie1", "pcie", (4, 5, 6, 7)),
    ]
    ws = islands(build_profile("workstation-2x-a6000", "c"))
    assert len(ws) == 1 and ws[0].size == 2 and ws[0].is_nvlink
