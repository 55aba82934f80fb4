"""The gauges read from the state: designs follow a node's newest snapshot, gone nodes go."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from placement import ClusterState
from placement.profiles import build_profile
from service.metrics.cluster import ClusterCollector, design_of


def _state(cluster: ClusterState, cordoned: set[str] | None = None) -> Any:
    return SimpleNamespace(
        cluster=cluster,
        lock=threading.RLock(),
        cordoned=cordoned or set(),
        is_stale=lambda n: False,
    )


def test_a_node_re_reported_as_another_design_moves_group() -> None:
    cluster = ClusterState()
    cluster.upsert(build_profile("dgx1-v100", "n1"))
    cluster.upsert(build_profile("hgx-h100", "n2"))
    collector = ClusterCollector(_state(cluster))
    first = collector._groups()
    assert {g: sum(v.nodes.values()) for g, v in first.items()} == {
        ("8xTesla V100-SXM2-32GB", "default"): 1,
        ("8xNVIDIA H100 80GB HBM3", "default"): 1,
    }
    cluster.upsert(build_profile("hgx-b200", "n1").model_copy(update={"seq": 5}))
    cluster.remove("n2")
    second = collector._groups()
    assert list(second) == [("8xNVIDIA B200", "default")]
    assert second[("8xNVIDIA B200", "default")].largest_free_island == 8
    assert len(collector._designs) == 1  # the cache holds only what is served


def test_a_cordoned_node_offers_no_free_gpus() -> None:
    cluster = ClusterState()
    cluster.upsert(build_profile("dgx1-v100", "n1"))
    [group] = ClusterCollector(_state(cluster, {"n1"}))._groups().values()
    assert group.nodes["cordoned"] == 1 and group.gpus["free"] == 0
    assert group.gpus["unavailable"] == 8 and group.largest_free_island == 0


def test_the_design_is_the_count_and_most_common_model() -> None:
    assert design_of(build_profile("dgx1-v100", "n")) == "8xTesla V100-SXM2-32GB"
    assert design_of(build_profile("dgx1-v100", "n").model_copy(update={"gpus": []})) == "none"


def test_a_shared_gpu_is_held_not_unavailable() -> None:
    # A GPU holding shares is in use: counted unavailable, a cluster full of shares
    # read as idle in held / total (docs/metrics.md's utilisation query).
    cluster = ClusterState()
    snap = build_profile("dgx1-v100", "n1")
    cluster.upsert(snap)
    cluster.allocate("n1", [snap.gpus[0].uuid])
    cluster.allocate_share("n1", snap.gpus[1].uuid, 0.25)
    cluster.allocate_share("n1", snap.gpus[1].uuid, 0.5)
    cluster.allocate_share("n1", snap.gpus[2].uuid, 0.25)
    [group] = ClusterCollector(_state(cluster))._groups().values()
    assert group.gpus == {"free": 5, "held": 3, "unavailable": 0}


def test_a_held_gpu_the_node_no_longer_reports_is_not_counted() -> None:
    # Held by UUID while it is off the bus (its allocation degraded), as a share's GPU
    # is: counted, it made the design's GPUs one more than its nodes report.
    cluster = ClusterState()
    snap = build_profile("workstation-2x-a6000", "ws")
    cluster.upsert(snap)
    gone = snap.gpus[0].uuid
    cluster.allocate("ws", [gone])
    kept = [snap.gpus[1].model_copy(update={"index": 0})]
    cluster.upsert(snap.model_copy(update={"seq": 1, "gpus": kept, "links": [["X"]]}))
    assert gone in cluster.node("ws").held_gpus
    [group] = ClusterCollector(_state(cluster))._groups().values()
    assert group.gpus == {"free": 1, "held": 0, "unavailable": 0}
