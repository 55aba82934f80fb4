"""Host capacity of fleet nodes: the node list's figures, the snapshot's, or not known."""

from __future__ import annotations

import json
from pathlib import Path

from placement.profiles import build_profile
from topoplace.sim.fleet import host_of, parse_cluster, snapshot_nodes, trace_nodes


def test_trace_nodes_carry_the_node_lists_cpu_and_memory(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "n0,16000,122880,2,P100\n"
        "n1,96000,393216,8,G2\n"
        "n2,32000,262144,0,\n"  # no GPU: not a GPU node
        "n3,,,1,T4\n"
    )
    nodes = trace_nodes(path)
    assert [(n.snapshot.name, n.cpu_milli, n.memory_mib) for n in nodes] == [
        ("n0", 16000, 122880),
        ("n1", 96000, 393216),
        ("n3", None, None),  # not given: not known, never short
    ]


def test_profiles_and_snapshots_take_what_the_snapshot_knows(tmp_path: Path) -> None:
    (node,) = parse_cluster("1xdgx1-v100")
    assert (node.cpu_milli, node.memory_mib) == (80_000, 524_288)  # 2 NUMA nodes, 40 CPUs each
    bare = build_profile("dgx1-v100", "bare").model_copy(update={"numa_nodes": []})
    assert host_of(bare) == (None, None)
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"nodes": [bare.model_dump(mode="json")]}))
    (exported,) = snapshot_nodes(path)
    assert (exported.cpu_milli, exported.memory_mib) == (None, None)
