"""An Allocate is matched to an offer only while the offer stands."""

from __future__ import annotations

from typing import Any, cast

from agent.deviceplugin.container import ContainerOptions
from agent.deviceplugin.devices import Device
from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2 as pb
from agent.deviceplugin.matching import Reservation
from agent.deviceplugin.plugin import ResourcePlugin
from agent.deviceplugin.state import OFFER_TTL_S, Claims, Devices, ReservationCache

GPU = "nvidia.com/gpu"


def test_an_allocate_after_the_offer_expired_does_not_get_its_reservation() -> None:
    now = [0.0]
    listed = [Reservation("alloc-a", "ns", "pa", GPU, ("g0",), False, ())]
    devices = Devices()
    devices.update(GPU, [Device("g0", True, 0, 0), Device("g1", True, 0, 1)])
    claims = Claims(lambda: now[0])
    plugin = ResourcePlugin(
        GPU,
        devices,
        claims,
        ReservationCache(lambda: list(listed), lambda: now[0]),
        ContainerOptions(),
        lambda: None,
        lambda: False,
    )
    ask = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=["g0", "g1"], allocation_size=1
    )
    preferred = plugin.GetPreferredAllocation(
        pb.PreferredAllocationRequest(container_requests=[ask]), cast(Any, None)
    )
    assert list(preferred.container_responses[0].deviceIDs) == ["g0"]
    # The kubelet never came back; pa's reservation expired at the service, and later
    # another pod is admitted on g0 without asking first.
    now[0] += OFFER_TTL_S + 1
    listed.clear()
    allocated = plugin.Allocate(
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["g0"])]),
        cast(Any, None),
    )
    # Was: TOPOPLACE_ALLOCATION=alloc-a, and alloc-a marked given.
    assert "TOPOPLACE_ALLOCATION" not in allocated.container_responses[0].envs
    assert "alloc-a" not in claims.given
