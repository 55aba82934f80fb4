"""Which reservation an admission is for, and the choice when none fits."""

from __future__ import annotations

from agent.deviceplugin.matching import Reservation, exact, fallback, pick

GPU = "nvidia.com/gpu"


def _r(i: str, *devices: str, resource: str = GPU) -> Reservation:
    return Reservation(i, "ns", f"pod-{i}", resource, devices, True, (0,))


RESERVATIONS = [
    _r("a", "g0", "g1"),
    _r("b", "g2"),
    _r("c", "g3", "g4"),
    _r("m", "mig0", resource="nvidia.com/mig-1g.10gb"),
]
ALL = ["g0", "g1", "g2", "g3", "g4", "g5"]


def test_the_oldest_unclaimed_reservation_of_that_size_and_resource_is_picked():
    assert pick(RESERVATIONS, set(), GPU, 2, ALL) == RESERVATIONS[0]
    assert pick(RESERVATIONS, {"a"}, GPU, 2, ALL) == RESERVATIONS[2]
    assert pick(RESERVATIONS, {"a", "c"}, GPU, 2, ALL) is None
    assert pick(RESERVATIONS, set(), GPU, 1, ALL) == RESERVATIONS[1]
    assert pick(RESERVATIONS, set(), "nvidia.com/mig-1g.10gb", 1, ["mig0"]) == RESERVATIONS[3]


def test_a_reservation_with_a_device_not_offered_or_missing_a_required_one_is_skipped():
    assert pick(RESERVATIONS, set(), GPU, 2, ["g1", "g3", "g4"]) == RESERVATIONS[2]
    assert pick(RESERVATIONS, set(), GPU, 2, ALL, must_include=["g4"]) == RESERVATIONS[2]
    assert pick(RESERVATIONS, set(), GPU, 2, ALL, must_include=["g5"]) is None


def test_allocate_matches_exactly_the_devices_in_any_order():
    assert exact(RESERVATIONS, set(), GPU, ["g4", "g3"]) == RESERVATIONS[2]
    assert exact(RESERVATIONS, {"c"}, GPU, ["g4", "g3"]) is None
    assert exact(RESERVATIONS, set(), GPU, ["g3"]) is None


def test_the_fallback_keeps_must_include_and_stays_on_its_numa_node():
    numa = {"g0": 0, "g1": 0, "g2": 1, "g3": 1, "g4": 1, "g5": None}
    assert fallback(ALL, ["g2"], 3, numa) == ["g2", "g3", "g4"]
    assert fallback(ALL, [], 2, numa) == ["g0", "g1"]
    assert len(fallback(ALL, [], 6, numa)) == 6


def test_a_pod_split_over_containers_gets_its_reservation_in_parts():
    whole = [_r("a", "g0", "g1", "g2", "g3"), _r("b", "g4")]
    # The first container (one GPU): no one-GPU reservation older than "b" is free, so
    # "b" is it; once "b" is given, a one-GPU request starts the split of "a".
    assert pick(whole, set(), GPU, 1, ALL) == whole[1]
    first = pick(whole, {"b"}, GPU, 1, ALL)
    assert first is not None and (first.allocation_id, first.devices) == ("a", ("g0",))
    assert first.all_devices == ("g0", "g1", "g2", "g3")
    # The next container is the same pod's: the rest of "a" comes first, in its order.
    parts = {"a": frozenset({"g0"})}
    rest = pick(whole, set(), GPU, 3, ALL, parts=parts)
    assert rest is not None and rest.devices == ("g1", "g2", "g3")
    second = pick(whole, set(), GPU, 1, ALL, parts=parts)
    assert second is not None and (second.allocation_id, second.devices) == ("a", ("g1",))
    assert pick(whole, set(), GPU, 4, ALL, parts=parts) is None  # only 3 are left of "a"
    # Allocate's match of a part, in any order.
    found = exact(whole, set(), GPU, ["g3", "g2", "g1"], parts)
    assert found is not None and found.devices == ("g1", "g2", "g3")


def test_a_container_reusing_its_init_containers_gpus_gets_the_rest_of_its_reservation():
    # The kubelet gives an app container its init container's devices first and asks for
    # the rest with those as must_include (available: the free ones and those): the
    # answer is the reservation, not the reused devices and the nearest free ones.
    whole = [_r("a", "g0", "g1", "g2"), _r("b", "g3", "g4")]
    parts = {"a": frozenset({"g0"})}  # the init container's one GPU
    free = ["g3", "g4", "g5", "g1", "g2"]
    found = pick(whole, set(), GPU, 3, ["g0", *free], must_include=["g0"], parts=parts)
    assert found is not None and found.allocation_id == "a", found
    assert found.devices == ("g0", "g1", "g2")
    two = pick(whole, set(), GPU, 2, ["g0", *free], must_include=["g0"], parts=parts)
    assert two is not None and two.devices == ("g0", "g1"), two
    # Allocate's match: the reused device and the part the kubelet chose, or the reused
    # one alone (the kubelet asks nothing when the init container's devices suffice).
    reused = exact(whole, set(), GPU, ["g2", "g0", "g1"], parts)
    assert reused is not None and reused.devices == ("g0", "g1", "g2"), reused
    alone = exact(whole, set(), GPU, ["g0"], parts)
    assert alone is not None and (alone.allocation_id, alone.devices) == ("a", ("g0",)), alone
