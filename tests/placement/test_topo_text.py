"""Tests for placement.topo_text: parsing and printing `nvidia-smi topo -m` matrices."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from placement.cpuset import format_cpuset, parse_cpuset
from placement.islands import islands
from placement.snapshot import Nic, NodeSnapshot, NumaNode
from placement.topo_text import TopoParseError, parse_topo_matrix, render_topo_matrix
from topoplace_client.samples import sample_names, sample_text

REAL_FILES = sample_names()
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def real(name: str) -> str:
    return sample_text(name)


def essence(snap: NodeSnapshot) -> tuple[object, ...]:
    """What the text carries: links, GPU NUMA map, NUMA CPUs, NICs."""
    return (
        snap.links,
        [gpu.numa_node for gpu in snap.gpus],
        {node.id: node.cpu_list for node in snap.numa_nodes},
        [(nic.name, nic.links) for nic in snap.nics],
    )


def matrix(
    labels: list[list[str]],
    *,
    cpus: list[str] | None = None,
    numa: list[str] | None = None,
    sep: str = "\t",
) -> str:
    """A synthetic matrix; labels[i][j] for i != j, diagonal printed as X."""
    n = len(labels)
    header = ["", *(f"GPU{i}" for i in range(n))]
    header += ["CPU Affinity"] if cpus is not None else []
    header += ["NUMA Affinity"] if numa is not None else []
    lines = [sep.join(header)]
    for i in range(n):
        cells = [f"GPU{i}", *(" X " if i == j else labels[i][j] for j in range(n))]
        cells += [cpus[i]] if cpus is not None else []
        cells += [numa[i]] if numa is not None else []
        lines.append(sep.join(cells))
    return "\n".join(lines) + "\n"


def uniform(n: int, label: str) -> list[list[str]]:
    return [[label] * n for _ in range(n)]


# Real machines ---------------------------------------------------------------


def test_dgx1_v100() -> None:
    snap = parse_topo_matrix(real("dgx1-v100"), node_name="dgx1", gpu_model="V100")
    assert snap.gpu_count == 8
    assert snap.links[0][1] == "NV1"
    assert snap.links[0][3] == "NV2"
    assert snap.links[0][5] == "SYS"
    assert snap.links[4][7] == "NV2"
    assert [nic.name for nic in snap.nics] == ["mlx5_2", "mlx5_0", "mlx5_3", "mlx5_1"]
    assert snap.nics[0].links == ["SYS", "SYS", "SYS", "SYS", "PIX", "PIX", "PHB", "PHB"]
    assert snap.nics[0].links[4] == "PIX"
    assert snap.nics[1].links[0] == "PIX"
    # NUMA Affinity is N/A everywhere: the one CPU Affinity set is one NUMA node.
    assert [gpu.numa_node for gpu in snap.gpus] == [0] * 8
    assert [node.cpus for node in snap.numa_nodes] == ["0-19,40-59"]
    assert {gpu.model for gpu in snap.gpus} == {"V100"}
    assert [island.gpus for island in islands(snap)] == [tuple(range(8))]


def test_hgx_h100() -> None:
    snap = parse_topo_matrix(real("hgx-h100"))
    for i in range(8):
        for j in range(8):
            assert snap.links[i][j] == ("X" if i == j else "NV18")
    assert [gpu.numa_node for gpu in snap.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert snap.numa_cpus(0) == parse_cpuset("0-47,96-143")
    assert snap.numa_cpus(1) == parse_cpuset("48-95,144-191")
    assert [node.cpus for node in snap.numa_nodes] == ["0-47,96-143", "48-95,144-191"]
    assert snap.nics == []
    assert len(islands(snap)) == 1


def test_pcie_l40s() -> None:
    snap = parse_topo_matrix(real("pcie-8x-l40s"))
    assert snap.links[0][3] == "NODE"
    assert snap.links[4][7] == "NODE"
    assert snap.links[3][4] == "SYS"
    assert snap.links[0][7] == "SYS"
    assert [(nic.name, nic.links) for nic in snap.nics] == [("NIC0", ["SYS"] * 8)]
    assert snap.numa_cpus(0) == tuple(range(90))
    assert snap.numa_cpus(1) == tuple(range(90, 180))
    assert [(island.name, island.gpus) for island in islands(snap)] == [
        ("pcie0", (0, 1, 2, 3)),
        ("pcie1", (4, 5, 6, 7)),
    ]


def test_workstation_a6000() -> None:
    snap = parse_topo_matrix(real("workstation-3x-a6000"))
    assert snap.links == [["X", "NV4", "NODE"], ["NV4", "X", "NODE"], ["NODE", "NODE", "X"]]
    assert [gpu.numa_node for gpu in snap.gpus] == [0, 0, 0]
    assert [node.cpus for node in snap.numa_nodes] == ["0-31,64-95"]
    assert [(island.name, island.gpus) for island in islands(snap)] == [
        ("nvl0", (0, 1)),
        ("pcie0", (2,)),
    ]


VARIANTS = {
    "tabs-expanded": lambda text: text.expandtabs(8),
    "two-spaces": lambda text: text.replace("\t", "  "),
    "single-spaces": lambda text: text.replace("\t", " "),
    "aligned-no-ansi": lambda text: ANSI_RE.sub("", text).expandtabs(16),
    "crlf": lambda text: text.replace("\n", "\r\n"),
    "blank-lines-around": lambda text: "\n\n  \n" + text + "\n\n\n",
    "ansi-everywhere": lambda text: re.sub(r"(GPU\d+|NIC\d+)", "\x1b[4m\\1\x1b[0m", text),
    "no-legends": lambda text: text.split("\nLegend:")[0],
}


@pytest.mark.parametrize("name", REAL_FILES)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_real_file_variants_parse_the_same(name: str, variant: str) -> None:
    text = real(name)
    expected = essence(parse_topo_matrix(text))
    if variant == "no-legends":
        # Without the NIC legend, NICs keep their column names.
        expected = (*expected[:3], [(f"NIC{k}", links) for k, (_, links) in enumerate(expected[3])])
    assert essence(parse_topo_matrix(VARIANTS[variant](text))) == expected


@pytest.mark.parametrize("name", REAL_FILES)
def test_real_files_round_trip(name: str) -> None:
    snap = parse_topo_matrix(real(name))
    assert essence(parse_topo_matrix(render_topo_matrix(snap))) == essence(snap)


# Synthetic matrices ------------------------------------------------------------


def test_soc_is_read_as_sys() -> None:
    snap = parse_topo_matrix(matrix(uniform(4, "SOC")))
    assert snap.links[0][1] == "SYS"


def test_no_numa_columns() -> None:
    snap = parse_topo_matrix(matrix(uniform(2, "PIX")))
    assert [gpu.numa_node for gpu in snap.gpus] == [None, None]
    assert snap.numa_nodes == []


# Each sample's NUMA nodes (GPU -> node) and each node's CPUs, as the text prints them.
SAMPLE_NUMA = {
    "dgx1-v100": ([0] * 8, {0: "0-19,40-59"}),
    "hgx-h100": ([0] * 4 + [1] * 4, {0: "0-47,96-143", 1: "48-95,144-191"}),
    "pcie-8x-l40s": ([0] * 4 + [1] * 4, {0: "0-89", 1: "90-179"}),
    "workstation-3x-a6000": ([0] * 3, {0: "0-31,64-95"}),
}


def test_every_sample_has_its_numa_table() -> None:
    assert sorted(SAMPLE_NUMA) == sample_names()


@pytest.mark.parametrize("name", sorted(SAMPLE_NUMA))
def test_sample_keeps_cpu_and_numa_affinity(name: str) -> None:
    gpu_nodes, cpus = SAMPLE_NUMA[name]
    snap = parse_topo_matrix(real(name))
    assert [gpu.numa_node for gpu in snap.gpus] == gpu_nodes
    assert {node.id: node.cpus for node in snap.numa_nodes} == cpus
    assert {node.id: node.cpu_list for node in snap.numa_nodes} == {
        node: parse_cpuset(text) for node, text in cpus.items()
    }


def test_cpu_affinity_without_numa_column_makes_one_node_per_cpu_set() -> None:
    snap = parse_topo_matrix(matrix(uniform(3, "SYS"), cpus=["0-7", "8-15", "0-7"]))
    assert [gpu.numa_node for gpu in snap.gpus] == [0, 1, 0]
    assert [(node.id, node.cpus) for node in snap.numa_nodes] == [(0, "0-7"), (1, "8-15")]


def test_cpu_affinity_with_numa_na_makes_one_node_per_cpu_set() -> None:
    text = matrix(uniform(2, "PHB"), cpus=["0-7", "0-7"], numa=["N/A", "N/A"])
    snap = parse_topo_matrix(text)
    assert [gpu.numa_node for gpu in snap.gpus] == [0, 0]
    assert [node.cpus for node in snap.numa_nodes] == ["0-7"]


def test_overlapping_cpu_sets_without_numa_make_no_node() -> None:
    text = matrix(uniform(3, "SYS"), cpus=["0-7", "4-11", "16-23"], numa=["N/A"] * 3)
    snap = parse_topo_matrix(text)
    assert [gpu.numa_node for gpu in snap.gpus] == [None, None, 0]
    assert [(node.id, node.cpus) for node in snap.numa_nodes] == [(0, "16-23")]


def test_cpu_affinity_of_a_multi_node_gpu_makes_no_node() -> None:
    # 0-1 is a GPU equally near two nodes: no node is its own, and none is made up.
    text = matrix(uniform(2, "SYS"), cpus=["0-15", "0-15"], numa=["0-1", "0-1"])
    snap = parse_topo_matrix(text)
    assert [gpu.numa_node for gpu in snap.gpus] == [None, None]
    assert snap.numa_nodes == []


def test_cpus_two_numa_nodes_list_go_to_neither() -> None:
    # nvidia-smi printed the whole machine's CPUs as each GPU's affinity: which of them
    # are NUMA node 1's is not in the text, and none is given twice.
    text = matrix(uniform(3, "SYS"), cpus=["0-15", "0-15", "8-23"], numa=["0", "1", "1"])
    snap = parse_topo_matrix(text)
    assert [gpu.numa_node for gpu in snap.gpus] == [0, 1, 1]
    assert [(node.id, node.cpus) for node in snap.numa_nodes] == [(0, ""), (1, "16-23")]


def test_numa_cpus_are_the_union_over_gpus() -> None:
    text = matrix(uniform(3, "NODE"), cpus=["0-3", "8-11", "N/A"], numa=["0", "0", "0"])
    snap = parse_topo_matrix(text)
    assert [node.cpus for node in snap.numa_nodes] == ["0-3,8-11"]


def test_numa_range_or_na_gives_no_numa_node() -> None:
    text = matrix(uniform(3, "SYS"), cpus=["0-3", "0-7", "N/A"], numa=["0-1", "N/A", "2"])
    snap = parse_topo_matrix(text)
    assert [gpu.numa_node for gpu in snap.gpus] == [None, None, 2]
    assert [(node.id, node.cpus) for node in snap.numa_nodes] == [(2, "")]


def test_single_gpu() -> None:
    snap = parse_topo_matrix("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-7\t0\n")
    assert snap.links == [["X"]]
    assert [node.cpus for node in snap.numa_nodes] == ["0-7"]


def test_sixteen_gpus_behind_nvswitch() -> None:
    text = matrix(
        uniform(16, "NV18"), cpus=["0-55"] * 8 + ["56-111"] * 8, numa=["0"] * 8 + ["1"] * 8
    )
    snap = parse_topo_matrix(text)
    assert snap.gpu_count == 16
    assert snap.links[15][0] == "NV18"
    assert [gpu.numa_node for gpu in snap.gpus] == [0] * 8 + [1] * 8
    assert len(islands(snap)) == 1


@pytest.mark.parametrize("sep", ["\t", "   "])
def test_twenty_gpus_in_two_nvlink_islands(sep: str) -> None:
    labels = [["NV12" if i // 10 == j // 10 else "SYS" for j in range(20)] for i in range(20)]
    snap = parse_topo_matrix(matrix(labels, numa=[str(i // 10) for i in range(20)], sep=sep))
    assert snap.gpu_count == 20
    assert snap.links[9][10] == "SYS"
    assert snap.links[19][10] == "NV12"
    assert [island.gpus for island in islands(snap)] == [tuple(range(10)), tuple(range(10, 20))]


def test_old_driver_names_nic_columns_by_device() -> None:
    text = (
        "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\n"
        "GPU0\t X \tSOC\tPHB\t0-7\n"
        "GPU1\tSOC\t X \tSOC\t8-15\n"
        "mlx5_0\tPHB\tSOC\t X \n"
    )
    snap = parse_topo_matrix(text)
    assert [(nic.name, nic.links) for nic in snap.nics] == [("mlx5_0", ["PHB", "SYS"])]


def test_nic_relations_come_from_gpu_rows_when_nic_rows_are_absent() -> None:
    text = "\tGPU0\tGPU1\tNIC0\nGPU0\t X \tPIX\tPXB\nGPU1\tPIX\t X \tSYS\n"
    snap = parse_topo_matrix(text)
    assert [(nic.name, nic.links) for nic in snap.nics] == [("NIC0", ["PXB", "SYS"])]


def test_snapshot_fields_and_placeholder_uuids() -> None:
    text = matrix(uniform(4, "NV2"))
    snap = parse_topo_matrix(
        text, node_name="gpu-7", region="eu-west", labels={"rack": "r12"}, gpu_model="A100"
    )
    assert (snap.name, snap.region, snap.labels) == ("gpu-7", "eu-west", {"rack": "r12"})
    assert [gpu.index for gpu in snap.gpus] == [0, 1, 2, 3]
    assert len({gpu.uuid for gpu in snap.gpus}) == 4
    assert all(gpu.uuid.startswith("GPU-") for gpu in snap.gpus)
    again = parse_topo_matrix(text, node_name="gpu-7")
    other = parse_topo_matrix(text, node_name="gpu-8")
    assert [g.uuid for g in again.gpus] == [g.uuid for g in snap.gpus]
    assert not {g.uuid for g in other.gpus} & {g.uuid for g in snap.gpus}


def test_bad_arguments_are_not_parse_errors() -> None:
    with pytest.raises(ValidationError):
        parse_topo_matrix(matrix(uniform(2, "PIX")), node_name="Not A Node")
    with pytest.raises(ValidationError):
        parse_topo_matrix(matrix(uniform(2, "PIX")), gpu_model="")


# Rendering -------------------------------------------------------------------


def test_render_prints_nvswitch_as_nv_and_legends() -> None:
    snap = NodeSnapshot(
        name="n1",
        numa_nodes=[NumaNode(id=1, cpus="0-3, 8")],
        gpus=[
            {"index": 0, "uuid": "GPU-a", "model": "H100", "numa_node": 1},
            {"index": 1, "uuid": "GPU-b", "model": "H100"},
        ],
        links=[["X", "NVS18"], ["NVS18", "X"]],
        nics=[Nic(name="mlx5_4", links=["PIX", "SYS"])],
    )
    text = render_topo_matrix(snap)
    lines = text.splitlines()
    assert lines[0] == "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity"
    assert lines[1] == "GPU0\t X \tNV18\tPIX\t0-3,8\t1"
    assert lines[2] == "GPU1\tNV18\t X \tSYS\tN/A\tN/A"
    assert lines[3] == "NIC0\tPIX\tSYS\t X "
    assert "Legend:" in lines
    assert lines[-3:] == ["NIC Legend:", "", "  NIC0: mlx5_4"]
    back = parse_topo_matrix(text)
    assert back.links == [["X", "NV18"], ["NV18", "X"]]
    assert [gpu.numa_node for gpu in back.gpus] == [1, None]
    assert back.numa_cpus(1) == (0, 1, 2, 3, 8)


def test_render_without_nics_has_no_nic_legend() -> None:
    text = render_topo_matrix(parse_topo_matrix(matrix(uniform(2, "PIX"))))
    assert "NIC" not in text


def test_render_refuses_a_snapshot_without_gpus() -> None:
    with pytest.raises(ValueError, match="no GPUs"):
        render_topo_matrix(NodeSnapshot(name="empty"))


# Malformed text --------------------------------------------------------------

BASE = (
    "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\n"  # line 1
    "GPU0\t X \tNV4\tSYS\tPIX\t0-7\t0\n"  # 2
    "GPU1\tNV4\t X \tSYS\tPIX\t0-7\t0\n"  # 3
    "GPU2\tSYS\tSYS\t X \tSYS\t8-15\t1\n"  # 4
    "NIC0\tPIX\tPIX\tSYS\t X \n"  # 5
    "\n"  # 6
    "Legend:\n"  # 7
    "\n"  # 8
    "  X    = Self\n"  # 9
    "\n"  # 10
    "NIC Legend:\n"  # 11
    "\n"  # 12
    "  NIC0: mlx5_0\n"  # 13
)

GPU2_ROW = "GPU2\tSYS\tSYS\t X \tSYS\t8-15\t1\n"
NIC0_ROW = "NIC0\tPIX\tPIX\tSYS\t X \n"

MALFORMED = {
    # name: (old text, new text, line, expected message fragment)
    "no GPU columns": ("\tGPU0\tGPU1\tGPU2", "\tTopology\tmatrix", 1, "GPU0 GPU1"),
    "GPU column gap": ("GPU1\tGPU2\tNIC0", "GPU1\tGPU3\tNIC0", 1, "GPU2 after GPU1"),
    "duplicate column": ("NIC0\tCPU", "NIC0\tNIC0\tCPU", 1, "distinct column names"),
    "too few cells": ("NV4\t X \tSYS\tPIX\t0-7\t0\n", "NV4\t X \tSYS\tPIX\t0-7\n", 3, "6 cells"),
    "too many cells": ("8-15\t1\n", "8-15\t1\t1\n", 4, "6 cells after GPU2"),
    "unknown label": (GPU2_ROW, GPU2_ROW.replace("SYS\t X", "FOO\t X"), 4, "'FOO'"),
    "no diagonal X": ("GPU1\tNV4\t X ", "GPU1\tNV4\tNV4", 3, "X (the diagonal)"),
    "X off diagonal": ("GPU1\tNV4\t X ", "GPU1\t X \t X ", 3, "link label"),
    "asymmetric": (GPU2_ROW, GPU2_ROW.replace("SYS\t X", "PHB\t X"), 4, "SYS in column GPU1"),
    "rows out of order": ("GPU0\t X ", "GPU1\t X ", 2, "row GPU0"),
    "missing GPU row": (GPU2_ROW, "", 4, "row GPU2, found 'NIC0'"),
    "matrix ends early": (GPU2_ROW + NIC0_ROW, "", 4, "row GPU2, found the end"),
    "bad CPU affinity": ("0-7\t0\nGPU1", "7-0\t0\nGPU1", 2, "CPU Affinity"),
    "bad NUMA affinity": ("8-15\t1", "8-15\tnode1", 4, "NUMA Affinity"),
    "NIC row disagrees": (NIC0_ROW, NIC0_ROW.replace("PIX\tSYS", "PHB\tSYS"), 5, "PIX in column"),
    "NIC diagonal": (NIC0_ROW, NIC0_ROW.replace(" X ", "SYS"), 5, "X (the diagonal)"),
    "NIC row name": (NIC0_ROW, NIC0_ROW.replace("NIC0", "NIC9"), 5, "row NIC0"),
    "extra row": (NIC0_ROW, NIC0_ROW + "NIC1\tSYS\tSYS\tSYS\tSYS\n", 6, "end of the matrix"),
    "long NIC name": ("NIC0: mlx5_0", "NIC0: " + "m" * 65, 13, "at most 64"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_text_names_the_line(case: str) -> None:
    old, new, line, fragment = MALFORMED[case]
    assert old in BASE
    with pytest.raises(TopoParseError) as info:
        parse_topo_matrix(BASE.replace(old, new))
    assert info.value.line == line
    assert f"line {line}" in str(info.value)
    assert fragment in str(info.value)


def test_base_text_is_valid() -> None:
    snap = parse_topo_matrix(BASE)
    assert [(nic.name, nic.links) for nic in snap.nics] == [("mlx5_0", ["PIX", "PIX", "SYS"])]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_line_numbers_count_leading_blank_lines_and_crlf(newline: str) -> None:
    text = "\n\n" + BASE.replace(GPU2_ROW, GPU2_ROW.replace("SYS\t X", "PHB\t X"))
    with pytest.raises(TopoParseError) as info:
        parse_topo_matrix(text.replace("\n", newline))
    assert info.value.line == 6


@pytest.mark.parametrize("text", ["", "\n  \n\t\n"])
def test_empty_text(text: str) -> None:
    with pytest.raises(TopoParseError) as info:
        parse_topo_matrix(text)
    assert info.value.line == 1


def test_text_ending_before_the_last_gpu_row() -> None:
    with pytest.raises(TopoParseError) as info:
        parse_topo_matrix("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\tPIX\nGPU1\tPIX\t X \tPIX")
    assert info.value.line == 4


def test_missing_nic_row() -> None:
    text = "\tGPU0\tNIC0\tNIC1\nGPU0\t X \tPIX\tSYS\nNIC0\tPIX\t X \tSYS\n\n"
    with pytest.raises(TopoParseError) as info:
        parse_topo_matrix(text)
    assert info.value.line == 4
    assert "row NIC1" in str(info.value)


def test_what_the_model_refuses_is_still_a_parse_error() -> None:
    text = "\n\tGPU0\t" + "n" * 65 + "\nGPU0\t X \tPIX\n"
    with pytest.raises(TopoParseError, match="valid topology matrix") as info:
        parse_topo_matrix(text)
    assert info.value.line == 2


def test_too_many_gpus() -> None:
    with pytest.raises(TopoParseError, match="at most 256") as info:
        parse_topo_matrix("\n" + matrix(uniform(257, "SYS")))
    assert info.value.line == 2


# Properties --------------------------------------------------------------------

GPU_LABELS = [
    "NV1",
    "NV2",
    "NV4",
    "NV12",
    "NV18",
    "NVS4",
    "NVS18",
    "PIX",
    "PXB",
    "PHB",
    "NODE",
    "SYS",
]
PCIE_LABELS = ["PIX", "PXB", "PHB", "NODE", "SYS"]


@st.composite
def snapshots(draw: st.DrawFn) -> NodeSnapshot:
    n = draw(st.integers(1, 20))
    links = [["X"] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            links[i][j] = links[j][i] = draw(st.sampled_from(GPU_LABELS))
    numa = draw(st.lists(st.none() | st.integers(0, 3), min_size=n, max_size=n))
    ids = sorted({x for x in numa if x is not None})
    # A CPU belongs to one NUMA node: node k draws CPUs k, k + 4, k + 8, ...
    numa_nodes = [
        NumaNode(
            id=node,
            cpus=format_cpuset(4 * x + k for x in draw(st.lists(st.integers(0, 63), max_size=12))),
        )
        for k, node in enumerate(ids)
    ]
    names = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
    nics = draw(
        st.lists(
            st.builds(
                Nic,
                name=names,
                links=st.lists(st.sampled_from(PCIE_LABELS), min_size=n, max_size=n),
            ),
            max_size=4,
        )
    )
    gpus = [{"index": i, "uuid": f"GPU-{i}", "model": "X1", "numa_node": numa[i]} for i in range(n)]
    return NodeSnapshot(name="prop", numa_nodes=numa_nodes, gpus=gpus, links=links, nics=nics)


@given(snapshots())
@settings(max_examples=150, deadline=None)
def test_parse_inverts_render(snap: NodeSnapshot) -> None:
    back = parse_topo_matrix(render_topo_matrix(snap))
    assert back.links == [[label.replace("NVS", "NV") for label in row] for row in snap.links]
    assert [gpu.numa_node for gpu in back.gpus] == [gpu.numa_node for gpu in snap.gpus]
    assert essence(back)[2:] == essence(snap)[2:]


MUTATIONS = st.sampled_from(
    [
        "",
        "X",
        " X ",
        "NV3",
        "NVS0",
        "SOC",
        "N/A",
        "FOO",
        "GPU9",
        "NIC0",
        "0-1",
        "-1",
        "\t",
        ":",
        "\n",
    ]
)


@given(
    # Only the real files present, so the test still runs on BASE without them.
    name=st.sampled_from([*REAL_FILES, "base"]),
    edits=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 12), MUTATIONS), max_size=4),
)
@settings(max_examples=300, deadline=None)
def test_damaged_text_parses_or_raises_topo_parse_error(
    name: str, edits: list[tuple[int, int, str]]
) -> None:
    text = BASE if name == "base" else real(name)
    for at, length, replacement in edits:
        at %= len(text)
        text = text[:at] + replacement + text[at + length :]
    try:
        parse_topo_matrix(text)
    except TopoParseError as exc:
        assert exc.line >= 1
        assert f"line {exc.line}: expected " in str(exc)
