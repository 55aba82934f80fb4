"""Snapshot validation: inconsistent input is refused, naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from placement import Gpu, MigInstance, NodeSnapshot, NumaNode
from placement.profiles import build_profile


def _base(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "n1",
        "numa_nodes": [{"id": 0, "cpus": "0-7"}],
        "gpus": [
            {"index": 0, "uuid": "GPU-a", "model": "NVIDIA H100", "numa_node": 0},
            {"index": 1, "uuid": "GPU-b", "model": "NVIDIA H100", "numa_node": 0},
        ],
        "links": [["X", "NV18"], ["NV18", "X"]],
    }
    data.update(overrides)
    return data


def _locs(exc: pytest.ExceptionInfo[ValidationError]) -> list[tuple[Any, ...]]:
    return [tuple(e["loc"]) for e in exc.value.errors()]


def test_valid_snapshot_and_label_normalisation() -> None:
    snap = NodeSnapshot.model_validate(_base(links=[["x", "nv18"], ["NV18", "X"]]))
    assert snap.links == [["X", "NV18"], ["NV18", "X"]]
    old = NodeSnapshot.model_validate(_base(links=[["X", "SOC"], ["SOC", "X"]]))
    assert old.links[0][1] == "SYS"


def test_asymmetric_matrix_names_the_cell() -> None:
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(links=[["X", "NV18"], ["SYS", "X"]]))
    assert _locs(exc) == [("links", 0, 1)]
    assert "not symmetric" in str(exc.value)


def test_unknown_link_label_names_the_cell() -> None:
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(links=[["X", "NVX"], ["NVX", "X"]]))
    assert ("links", 0, 1) in _locs(exc)
    assert "unknown link label 'NVX'" in str(exc.value)


def test_gpu_count_mismatch() -> None:
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(links=[["X"]]))
    assert _locs(exc) == [("links",)]
    assert "1 rows but the snapshot lists 2 GPUs" in str(exc.value)


def test_duplicate_uuid() -> None:
    gpus = _base()["gpus"]
    gpus[1]["uuid"] = "GPU-a"
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(gpus=gpus))
    assert _locs(exc) == [("gpus", 1, "uuid")]


def test_a_device_uuid_may_not_read_as_a_held_cpu() -> None:
    """The service stores held CPUs as "cpu:<id>" beside held GPU and MIG UUIDs."""
    gpus = _base()["gpus"]
    gpus[1]["uuid"] = "cpu:x1"
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(gpus=gpus))
    assert _locs(exc) == [("gpus", 1, "uuid")] and "names a CPU" in str(exc.value)
    mig = build_profile("hgx-h100-mig", "m0").model_dump(mode="json")
    mig["mig_instances"][2]["uuid"] = "cpu:0"
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(mig)
    assert _locs(exc) == [("mig_instances", 2, "uuid")]
    # Only the exact prefix: a UUID that merely contains it is a UUID.
    gpus[1]["uuid"] = "GPU-cpu:1"
    assert NodeSnapshot.model_validate(_base(gpus=gpus)).gpus[1].uuid == "GPU-cpu:1"


def test_index_gap_and_bad_numa_reference() -> None:
    gpus = _base()["gpus"]
    gpus[1]["index"] = 3
    gpus[0]["numa_node"] = 5
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(gpus=gpus))
    assert set(_locs(exc)) == {("gpus", 1, "index"), ("gpus", 0, "numa_node")}


def test_bad_labels_and_names() -> None:
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(labels={"bad key!": "x"}))
    assert _locs(exc) == [("labels",)]
    with pytest.raises(ValidationError):
        NodeSnapshot.model_validate(_base(name="Upper_Case"))
    with pytest.raises(ValidationError):
        NodeSnapshot.model_validate(_base(cpu_isa="sparc"))
    with pytest.raises(ValidationError):
        NodeSnapshot.model_validate(_base(numa_nodes=[{"id": 0, "cpus": "7-3"}]))


def test_mig_instances_must_sit_on_mig_gpus_without_overlap() -> None:
    gpus = _base()["gpus"]
    gpus[0]["mig_enabled"] = True
    migs = [
        {
            "uuid": "MIG-1",
            "parent_gpu": 0,
            "profile": "3g.40gb",
            "placement_start": 0,
            "placement_size": 4,
        },
        {
            "uuid": "MIG-2",
            "parent_gpu": 0,
            "profile": "2g.20gb",
            "placement_start": 2,
            "placement_size": 2,
        },
        {
            "uuid": "MIG-3",
            "parent_gpu": 1,
            "profile": "1g.10gb",
            "placement_start": 0,
            "placement_size": 1,
        },
    ]
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(gpus=gpus, mig_instances=migs))
    assert set(_locs(exc)) == {
        ("mig_instances", 1, "placement_start"),
        ("mig_instances", 2, "parent_gpu"),
    }
    with pytest.raises(ValidationError):
        MigInstance(uuid="m", parent_gpu=0, profile="big", placement_start=0, placement_size=1)


def _mig(uuid: str, start: int, size: int = 1) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "parent_gpu": 0,
        "profile": "1g.10gb",
        "placement_start": start,
        "placement_size": size,
    }


def test_mig_slices_are_bounded_and_each_overlap_is_named_once() -> None:
    """The engine lists a MIG GPU's slices up to its last instance's end, per MIG
    placement: a slice in the millions made each such request take minutes."""
    gpus = _base()["gpus"]
    gpus[0]["mig_enabled"] = True
    for start, size in ((20_000_000, 1), (62, 4), (64, 1)):
        with pytest.raises(ValidationError) as exc:
            NodeSnapshot.model_validate(_base(gpus=gpus, mig_instances=[_mig("M", start, size)]))
        assert _locs(exc) == [("mig_instances", 0, "placement_start")]
    last = NodeSnapshot.model_validate(_base(gpus=gpus, mig_instances=[_mig("M", 63, 1)]))
    assert last.mig_instances[0].placement_start == 63
    # Two hundred instances on one slice: each overlap named once, not once per pair.
    same_slice = [_mig(f"M{i}", 0) for i in range(200)]
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(gpus=gpus, mig_instances=same_slice))
    assert len(exc.value.errors()) == 199
    # No more instances than 64 slices on each of 63 GPUs could hold.
    many = [_mig(f"M{i}", i % 64) for i in range(63 * 64 + 1)]
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(gpus=gpus, mig_instances=many))
    assert _locs(exc) == [("mig_instances",)]


def test_nic_relations_must_cover_every_gpu() -> None:
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(nics=[{"name": "mlx5_0", "links": ["PIX"]}]))
    assert _locs(exc) == [("nics", 0, "links")]


def test_snapshots_are_immutable_values() -> None:
    snap = build_profile("hgx-h100", "h0")
    with pytest.raises(ValidationError):
        snap.name = "other"  # type: ignore[misc]
    assert NodeSnapshot.model_validate_json(snap.model_dump_json()) == snap


def test_fabric_domain_only_when_registration_completed() -> None:
    tray = build_profile("gb200-tray", "t0")
    assert tray.fabric is not None and tray.fabric_domain() is not None
    pending = tray.model_copy(
        update={"fabric": tray.fabric.model_copy(update={"state": "in_progress"})}
    )
    assert pending.fabric_domain() is None


def test_numa_helpers() -> None:
    node = NumaNode(id=1, cpus="4-5,8")
    assert node.cpu_list == (4, 5, 8)
    gpu = Gpu(index=0, uuid="u", model="m")
    assert gpu.health.value == "healthy"
