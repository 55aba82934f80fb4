"""Snapshot validation: inconsistent input is refused, naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from placement import Gpu, MigInstance, NodeSnapshot, NumaNode
from placement.cpuset import parse_cpuset
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


@pytest.mark.parametrize("uuid", ["GPU-a,GPU-b", "GPU-a GPU-b", "GPU-a\u00a0", "GPU-\u00e9"])
def test_a_device_uuid_may_not_carry_a_list_separator(uuid: str) -> None:
    """UUIDs are joined with commas into CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES and
    the Kubernetes device annotations: a GPU reported as "GPU-a,GPU-b" beside a GPU
    "GPU-b" would expose GPU-b to the job given the first and to the job given the second."""
    gpus = _base()["gpus"]
    gpus[0]["uuid"] = uuid
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(gpus=gpus))
    assert _locs(exc) == [("gpus", 0, "uuid")]
    mig = build_profile("hgx-h100-mig", "m0").model_dump(mode="json")
    mig["mig_instances"][1]["uuid"] = uuid
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(mig)
    assert _locs(exc) == [("mig_instances", 1, "uuid")]


@pytest.mark.parametrize(
    "uuid",
    [
        "GPU-8e4b1f0a-7c3d-5b2e-9f61-0a1b2c3d4e5f",
        "MIG-0c6d5f4e-3b2a-5918-8776-f5e4d3c2b1a0",
        # MIG UUIDs of drivers before R470: the parent GPU's UUID, GPU and compute instance.
        "MIG-GPU-8e4b1f0a-7c3d-5b2e-9f61-0a1b2c3d4e5f/1/0",
        "GPU-unreadable-0-0123456789abcdef",
    ],
)
def test_real_device_uuids_are_accepted(uuid: str) -> None:
    gpus = _base()["gpus"]
    gpus[0]["uuid"] = uuid
    assert NodeSnapshot.model_validate(_base(gpus=gpus)).gpus[0].uuid == uuid


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


def test_a_name_or_label_ending_in_a_newline_is_refused() -> None:
    """The patterns' ``$`` matches before a final newline in Python: "rack1\\n" passed,
    a label value Kubernetes refuses and the OpenAPI document's own pattern forbids."""
    for labels, loc in (
        ({"topoplace.io/rack": "rack1\n"}, ("labels",)),
        ({"topoplace.io/rack\n": "rack1"}, ("labels",)),
    ):
        with pytest.raises(ValidationError) as exc:
            NodeSnapshot.model_validate(_base(labels=labels))
        assert _locs(exc) == [loc]
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(name="n1\n"))
    assert _locs(exc) == [("name",)]


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


def test_numa_nodes_name_at_most_16384_cpus_in_all() -> None:
    """Each node's cpuset was bounded, not their sum: 1,024 nodes of "0-16383" (32 KB)
    expanded into 16.7 million CPUs, 680 MB, in the engine's state lock."""
    expanded: list[int] = []

    def counting(text: str) -> tuple[int, ...]:
        cpus = parse_cpuset(text)
        expanded.append(len(cpus))
        return cpus

    hostile = [{"id": i, "cpus": "0-16383"} for i in range(1024)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("placement.snapshot.parse_cpuset", counting)
        with pytest.raises(ValidationError) as exc:
            NodeSnapshot.model_validate(_base(numa_nodes=hostile))
    assert _locs(exc) == [("numa_nodes", 1, "cpus")]
    assert "16384" in str(exc.value)
    assert sum(expanded) <= 16384
    # int() reads "9_9999" as 99999: a check of \d+ runs let "0-9_9999_9999" through.
    for cpus in ("0-9_9999", "0-9_9999_9999", "0-\u0661\u0660"):
        with pytest.raises(ValidationError) as exc:
            NodeSnapshot.model_validate(_base(numa_nodes=[{"id": 0, "cpus": cpus}]))
        assert _locs(exc) == [("numa_nodes", 0, "cpus")]
    halves = [{"id": 0, "cpus": "0-8191"}, {"id": 1, "cpus": "8192-16383"}]
    snap = NodeSnapshot.model_validate(_base(numa_nodes=halves))
    assert len(snap.numa_cpus(0) + snap.numa_cpus(1)) == 16384


def test_a_cpu_belongs_to_one_numa_node() -> None:
    """Linux puts each CPU in one NUMA node; a CPU in two could be given to two tasks."""
    nodes = [{"id": 0, "cpus": "0-7"}, {"id": 1, "cpus": "12-15"}, {"id": 2, "cpus": "6,9-11"}]
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(numa_nodes=nodes))
    assert _locs(exc) == [("numa_nodes", 0, "cpus"), ("numa_nodes", 2, "cpus")]
    assert "NUMA node 2 shares CPU 6 with NUMA node 0" in str(exc.value)
    # Every node in an overlap is named, once.
    nodes = [*nodes, {"id": 3, "cpus": "0-15"}]
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(numa_nodes=nodes))
    assert _locs(exc) == [("numa_nodes", i, "cpus") for i in range(4)]
    # One cpuset repeating a CPU is still one CPU.
    snap = NodeSnapshot.model_validate(_base(numa_nodes=[{"id": 0, "cpus": "0-3,2-5,5"}]))
    assert snap.numa_cpus(0) == (0, 1, 2, 3, 4, 5)


@pytest.mark.parametrize(
    ("field", "items", "bound"),
    [
        # GET /topology prints a NIC x NIC matrix: 3,000 NICs made 35 MB of text.
        ("nics", lambda i: {"name": f"nic{i}", "links": ["PIX", "PIX"]}, 1024),
        ("cpu_links", lambda i: {"gpu": 0, "kind": "nvlink-c2c"}, 63),
    ],
)
def test_per_snapshot_lists_are_bounded(field: str, items: Any, bound: int) -> None:
    snap = NodeSnapshot.model_validate(_base(**{field: [items(i) for i in range(bound)]}))
    assert len(getattr(snap, field)) == bound
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(**{field: [items(i) for i in range(bound + 1)]}))
    assert _locs(exc) == [(field,)]
    assert f"at most {bound} items" in str(exc.value)


def test_labels_and_mig_profile_names_are_bounded() -> None:
    labels = {f"k{i}": "v" for i in range(256)}
    assert len(NodeSnapshot.model_validate(_base(labels=labels)).labels) == 256
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(labels={**labels, "one-more": "v"}))
    assert _locs(exc) == [("labels",)]
    gpus = _base()["gpus"]
    gpus[0]["mig_enabled"] = True
    # "0,0,0,..." names one CPU, but 4 MB of it made two million ranges to sort.
    long_cpuset = ",".join(["0"] * 70_000)
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(numa_nodes=[{"id": 0, "cpus": long_cpuset}]))
    assert _locs(exc) == [("numa_nodes", 0, "cpus")]
    every_cpu = ",".join(str(cpu) for cpu in range(16384))  # 87 KB, each CPU alone
    assert NodeSnapshot.model_validate(_base(numa_nodes=[{"id": 0, "cpus": every_cpu}]))
    long_profile = {**_mig("M", 0), "profile": "1g.10gb+" + "a" * 100_000}
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(gpus=gpus, mig_instances=[long_profile]))
    assert _locs(exc) == [("mig_instances", 0, "profile")]


def test_link_labels_are_short() -> None:
    """An unknown label is echoed in the refusal: 3,969 cells of 1 KB came back as 4 MB."""
    long = "NVX" + "Q" * 1000
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(links=[["X", long], [long, "X"]]))
    assert _locs(exc) == [("links", 0, 1), ("links", 1, 0)]
    assert "Q" * 100 not in str(exc.value)
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(nics=[{"name": "mlx5_0", "links": ["PIX", long]}]))
    assert _locs(exc) == [("nics", 0, "links", 1)]
    assert "Q" * 100 not in str(exc.value)
    spaced = NodeSnapshot.model_validate(_base(links=[["X", " NVS18 "], [" NVS18 ", "X"]]))
    assert spaced.links[0][1] == "NVS18"


def test_a_minor_number_is_optional_and_left_out_of_the_json_when_unknown() -> None:
    """An older agent's snapshot (no minor numbers) reads, and dumps, as it was sent: the
    service verifies its signature over the dump."""
    old = NodeSnapshot.model_validate(_base())
    assert [g.minor_number for g in old.gpus] == [None, None]
    assert [g.device_minor for g in old.gpus] == [0, 1]
    assert all("minor_number" not in g for g in old.model_dump(mode="json")["gpus"])
    gpus = _base()["gpus"]
    gpus[0]["minor_number"], gpus[1]["minor_number"] = 1, 0
    new = NodeSnapshot.model_validate(_base(gpus=gpus))
    assert [g.device_minor for g in new.gpus] == [1, 0]
    assert [g["minor_number"] for g in new.model_dump(mode="json")["gpus"]] == [1, 0]


def test_a_minor_number_names_one_gpu() -> None:
    gpus = _base()["gpus"]
    gpus[0]["minor_number"] = gpus[1]["minor_number"] = 3
    with pytest.raises(ValidationError) as exc:
        NodeSnapshot.model_validate(_base(gpus=gpus))
    assert _locs(exc) == [("gpus", 1, "minor_number")]
    assert "GPU 1 has minor number 3, as GPU 0 has" in str(exc.value)
    # A GPU without a minor number has /dev/nvidia<index>: another GPU's minor number
    # equal to that index names the same file, and both jobs would get one GPU.
    for with_minor in (0, 1):
        gpus = _base()["gpus"]
        gpus[with_minor]["minor_number"] = 1 - with_minor
        with pytest.raises(ValidationError) as exc:
            NodeSnapshot.model_validate(_base(gpus=gpus))
        assert _locs(exc) == [("gpus", 1, "minor_number")]
        assert "/dev/nvidia" in str(exc.value)
    for bad in (-1, "2", True):
        gpus = _base()["gpus"]
        gpus[0]["minor_number"] = bad
        with pytest.raises(ValidationError):
            NodeSnapshot.model_validate(_base(gpus=gpus))
