"""Claims: offered, given, rebuilt from what the kubelet says pods hold."""

from __future__ import annotations

from dataclasses import replace

from agent.deviceplugin.kubelet import socket_name
from agent.deviceplugin.matching import Reservation
from agent.deviceplugin.state import OFFER_TTL_S, REUSE_S, Claims
from agent.deviceplugin.truth import given_ids

GPU = "nvidia.com/gpu"


def _r(i: str, pod: str, *devices: str) -> Reservation:
    return Reservation(i, "ns", pod, GPU, devices, False, ())


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_offer_blocks_others_until_given_or_expired():
    clock = Clock()
    claims = Claims(clock)
    a = _r("a", "pa", "g0")
    with claims.lock:
        claims.offer(a)
        assert claims.taken() == {"a"}
        assert claims.offered(GPU, {"g0"}) == a
        assert claims.offered(GPU, {"g1"}) is None
    clock.now += OFFER_TTL_S + 1
    with claims.lock:
        assert claims.taken() == set()  # the kubelet never came back with its Allocate
        claims.offer(a)
        claims.give(a)
    clock.now += OFFER_TTL_S + 1
    with claims.lock:
        assert claims.taken() == {"a"}  # given is for good


def test_the_truth_rebuilds_claims_and_forgets_ended_allocations():
    reservations = [_r("a", "pa", "g0"), _r("b", "pb", "g1"), _r("c", "pc", "g2")]
    held = {GPU: {("ns", "pa"): ["g5"], ("ns", "other"): ["g1"]}}
    # a: its pod holds devices (other ones); b: its device is another pod's; c: free.
    assert given_ids(reservations, held) == {"a", "b"}
    claims = Claims()
    claims.given = {"gone", "c"}
    claims.rebuild({"a", "b"}, live={"a", "b", "c"})
    assert claims.given == {"a", "b", "c"}


def test_socket_names_are_one_per_resource():
    assert socket_name("nvidia.com/gpu") == "topoplace-nvidia.com-gpu.sock"
    assert socket_name("nvidia.com/mig-3g.40gb") == "topoplace-nvidia.com-mig-3g.40gb.sock"


def test_a_reservation_is_given_once_all_its_parts_are():

    whole = Reservation("a", "ns", "p", GPU, ("g0", "g1"), True, (0,))
    claims = Claims()
    with claims.lock:
        claims.give(replace(whole, devices=("g0",), whole=whole.devices))
        assert claims.given == set() and claims.parts == {"a": frozenset({"g0"})}
        claims.give(replace(whole, devices=("g1",), whole=whole.devices))
        assert claims.given == {"a"} and claims.parts == {}


def test_a_pod_with_some_containers_admitted_keeps_the_rest_of_its_reservation():
    from agent.deviceplugin.truth import claimed_from

    whole = Reservation("a", "ns", "p", GPU, ("g0", "g1"), True, (0,))
    other = Reservation("b", "ns", "q", GPU, ("g2",), True, (0,))
    held = {GPU: {("ns", "p"): ["g0"], ("ns", "x"): ["g2"]}}
    assert claimed_from([whole, other], held) == ({"b"}, {"a": frozenset({"g0"})})
    claims = Claims()
    claims.rebuild({"b"}, {"a", "b"}, {"a": frozenset({"g0"})})
    assert claims.parts == {"a": frozenset({"g0"})} and claims.given == {"b"}
    claims.rebuild({"a", "b"}, {"a", "b"}, {})  # all its containers admitted
    assert claims.parts == {} and claims.given == {"a", "b"}


def test_an_init_containers_devices_handed_on_at_once_are_its_reservations():
    clock = Clock()
    claims = Claims(clock)
    a = _r("a", "pa", "g0", "g1", "g2")
    with claims.lock:
        claims.give(a)
        claims.allocated(GPU, a)
        found = claims.reused(GPU, {"g2", "g0"})
        assert found is not None and found.devices == ("g0", "g2")  # the reservation's order
        assert found.all_devices == a.devices
        assert claims.reused(GPU, {"g0", "g3"}) is None  # not all of them its own
        assert claims.reused("nvidia.com/mig-1g.10gb", {"g0"}) is None
    clock.now += REUSE_S + 1
    with claims.lock:
        assert claims.reused(GPU, {"g0"}) is None  # not the same admission any more
        claims.allocated(GPU, a)
        claims.allocated(GPU, None)  # another admission came between: the kubelet's choice
        assert claims.reused(GPU, {"g0"}) is None


def test_an_expired_offer_is_not_matched_to_an_allocate():
    clock = Clock()
    claims = Claims(clock)
    a = _r("a", "pa", "g0")
    with claims.lock:
        claims.offer(a)
    clock.now += OFFER_TTL_S + 1
    with claims.lock:
        # Was: matched (only taken() dropped expired offers), so the Allocate of another
        # pod on g0 got a's allocation and a was marked given.
        assert claims.offered(GPU, {"g0"}) is None


def test_an_offer_of_an_ended_reservation_is_forgotten():
    clock = Clock()
    claims = Claims(clock)
    a, b, c = _r("a", "pa", "g0"), _r("b", "pb", "g1"), _r("c", "pc", "g2")
    with claims.lock:
        claims.offer(a)
        claims.offer(b)
    clock.now += 1
    read_at = claims.now()  # the truth asks for the reservations...
    clock.now += 1
    with claims.lock:
        claims.offer(c)  # ...an admission offers one bound since...
    # ...and the list, read before c was bound, no longer has a (expired at the service).
    claims.rebuild(set(), live={"b"}, read_at=read_at)
    with claims.lock:
        assert claims.offered(GPU, {"g0"}) is None
        assert claims.offered(GPU, {"g1"}) == b
        assert claims.offered(GPU, {"g2"}) == c


def test_a_reservation_given_after_the_list_was_asked_for_is_kept():
    clock = Clock()
    claims = Claims(clock)
    old, a, b = _r("old", "po", "g3"), _r("a", "pa", "g0"), _r("b", "pb", "g1", "g2")
    with claims.lock:
        claims.give(old)
    clock.now += 1
    read_at = claims.now()  # the truth asks for the reservations...
    clock.now += 1
    with claims.lock:
        claims.offer(a)
        claims.give(a)  # ...an admission hands out one bound since...
        claims.give(replace(b, devices=("g1",), whole=("g1", "g2")))  # ...and part of another
    # ...and the list, read before a and b were bound, has neither (nor old, which ended).
    claims.rebuild(set(), live=set(), read_at=read_at)
    with claims.lock:
        # Was: a forgotten until the next round, so it could be offered to another pod.
        assert claims.taken() == {"a"}
        assert claims.parts == {"b": frozenset({"g1"})}
    clock.now += 1
    claims.rebuild(set(), live=set(), read_at=claims.now())  # a list asked for since: they ended
    with claims.lock:
        assert claims.taken() == set() and claims.parts == {}
