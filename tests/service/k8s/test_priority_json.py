"""HostPriorityList JSON from the slot records reads exactly as the dicts it stands for."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from placement import ClusterState
from placement.profiles import build_profile
from service.k8s.priority_json import MAX_MEAN_SPACES, PriorityEncoder, SlotRecords


def _expected(names: list[str], slots: list[int], scores: list[int]) -> list[dict[str, object]]:
    return [{"Host": names[s], "Score": c} for s, c in zip(slots, scores, strict=True)]


def _encode(records: SlotRecords, slots: list[int], scores: list[int]) -> list[dict[str, object]]:
    body = records.encode(np.asarray(slots, dtype=np.int64), np.asarray(scores, dtype=np.int64))
    decoded: list[dict[str, object]] = orjson.loads(body)
    return decoded


NAMES = ["gpu-a01", "gpu-a02", "", "gpu-b-long-name", 'odd"na\\me', "ünïcødé-node"]


@pytest.mark.parametrize(
    "names",
    [NAMES, [*NAMES, "x" * (MAX_MEAN_SPACES * 20)]],
    ids=["spaced", "squeezed"],
)
def test_encode_matches_the_dicts_for_any_scores(names: list[str]) -> None:
    records = SlotRecords.build(names)
    assert records.fill == (ord(" ") if len(names) == len(NAMES) else 0)
    live = [slot for slot, name in enumerate(names) if name]
    for scores in ([0] * len(live), [10] * len(live), list(range(len(live)))):
        assert _encode(records, live, scores) == _expected(names, live, scores)
    assert _encode(records, live[::-1][:2], [7, 10]) == _expected(names, live[::-1][:2], [7, 10])
    assert records.encode(np.zeros(0, np.int64), np.zeros(0, np.int64)) == b"[]"


def test_updated_reencodes_changed_slots_and_leaves_the_old_records_alone() -> None:
    old = SlotRecords.build(["n1", "n2", "n3"])
    before = old.encode(np.arange(3), np.full(3, 5))
    same = old.updated(["n1", "n2", "n3"])
    assert same is old
    new = old.updated(["n1", "", "n4", "n5"])  # n2 left, n3 replaced, a slot added
    assert _encode(new, [0, 2, 3], [1, 2, 3]) == _expected(
        ["n1", "", "n4", "n5"], [0, 2, 3], [1, 2, 3]
    )
    assert old.encode(np.arange(3), np.full(3, 5)) == before
    wider = new.updated(["n1", "a-much-longer-node-name", "n4", "n5"])
    assert wider.rows.shape[1] > new.rows.shape[1]
    assert _encode(wider, [1], [9]) == [{"Host": "a-much-longer-node-name", "Score": 9}]
    shorter = wider.updated(["n1"])
    assert _encode(shorter, [0], [4]) == [{"Host": "n1", "Score": 4}]


def test_encoder_follows_the_cluster_membership() -> None:
    cluster = ClusterState()
    cluster.upsert(build_profile("dgx1-v100", "first"))
    encoder = PriorityEncoder()
    records = encoder.records(cluster)
    assert encoder.records(cluster) is records
    cluster.remove("first")
    cluster.upsert(build_profile("hgx-h100", "second"))
    slot = cluster.slot_of("second")
    assert _encode(encoder.records(cluster), [slot], [10]) == [{"Host": "second", "Score": 10}]


def test_updated_keeps_squeezed_records_exact() -> None:
    long_name = "x" * (MAX_MEAN_SPACES * 20)
    old = SlotRecords.build(["a", long_name, "b"])
    assert old.fill == 0
    new = old.updated(["a", long_name, "c", "d"])
    assert new.fill == 0
    names = ["a", long_name, "c", "d"]
    assert _encode(new, [3, 2, 1, 0], [0, 1, 9, 10]) == _expected(
        names, [3, 2, 1, 0], [0, 1, 9, 10]
    )
