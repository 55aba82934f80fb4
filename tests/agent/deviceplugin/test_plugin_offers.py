"""An Allocate is matched to an offer only while the offer stands."""

from __future__ import annotations

from typing import Any, cast

from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2 as pb
from agent.deviceplugin.matching import Reservation
from agent.deviceplugin.state import OFFER_TTL_S
from tests.agent.deviceplugin.plugin_harness import GPU, plugin_on


def test_an_allocate_after_the_offer_expired_does_not_get_its_reservation() -> None:
    now = [0.0]
    listed = [Reservation("alloc-a", "ns", "pa", GPU, ("g0",), False, ())]
    plugin, claims = plugin_on(2, lambda: list(listed), now)
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


def test_an_offer_the_kubelet_chose_against_is_not_offered_to_the_next_pod() -> None:
    listed = [
        Reservation("alloc-b", "ns", "pb", GPU, ("g0",), False, ()),
        Reservation("alloc-c", "ns", "pc", GPU, ("g1",), False, ()),
    ]
    plugin, _ = plugin_on(3, lambda: list(listed))

    def admit(available: list[str], choose: str | None = None) -> tuple[str, dict[str, str]]:
        ask = pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, allocation_size=1
        )
        preferred = plugin.GetPreferredAllocation(
            pb.PreferredAllocationRequest(container_requests=[ask]), cast(Any, None)
        )
        chosen = choose or preferred.container_responses[0].deviceIDs[0]
        allocated = plugin.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=[chosen])]
            ),
            cast(Any, None),
        )
        return chosen, dict(allocated.container_responses[0].envs)

    # pb is offered g0, but the kubelet gives it g2 (its own choice, e.g. for alignment).
    assert admit(["g0", "g1", "g2"], choose="g2") == ("g2", admit_envs("g2"))
    # pc, admitted next (before any truth round), gets its own reservation. Was: g0 and
    # TOPOPLACE_ALLOCATION=alloc-b, the offer of pb's reservation standing for 30 s.
    assert admit(["g0", "g1"]) == ("g1", admit_envs("g1", "alloc-c"))


def admit_envs(device: str, allocation: str | None = None) -> dict[str, str]:
    envs = {
        "NVIDIA_VISIBLE_DEVICES": device,
        "CUDA_VISIBLE_DEVICES": device,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    if allocation is not None:
        envs["TOPOPLACE_ALLOCATION"] = allocation
    return envs
