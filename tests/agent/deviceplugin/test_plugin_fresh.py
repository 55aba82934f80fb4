"""An Allocate the kubelet makes without asking first still finds a reservation made since."""

from __future__ import annotations

from typing import Any, cast

from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2 as pb
from agent.deviceplugin.matching import Reservation
from tests.agent.deviceplugin.plugin_harness import GPU, plugin_on


def test_a_pod_bound_after_the_last_read_gets_its_reservation_without_asking() -> None:
    now = [0.0]
    reads = [0]
    listed = [Reservation("alloc-a", "ns", "pa", GPU, ("g0",), False, ())]

    def fetch() -> list[Reservation]:
        reads[0] += 1
        return list(listed)

    plugin, _ = plugin_on(2, fetch, now)

    def allocate(device: str) -> dict[str, str]:
        answer = plugin.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=[device])]
            ),
            cast(Any, None),
        )
        return dict(answer.container_responses[0].envs)

    ask = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=["g0", "g1"], allocation_size=1
    )
    plugin.GetPreferredAllocation(
        pb.PreferredAllocationRequest(container_requests=[ask]), cast(Any, None)
    )
    assert allocate("g0")["TOPOPLACE_ALLOCATION"] == "alloc-a"
    assert reads[0] == 1  # the Allocate matched the offer: nothing read again
    # pb is bound to g1 half a second later and admitted at once: g1 is all that is left,
    # so the kubelet allocates it without asking for a preference.
    now[0] += 0.5
    listed.append(Reservation("alloc-b", "ns", "pb", GPU, ("g1",), False, ()))
    now[0] += 0.5
    # Was: no TOPOPLACE_ALLOCATION (matched against the list read a second before).
    assert allocate("g1").get("TOPOPLACE_ALLOCATION") == "alloc-b"
