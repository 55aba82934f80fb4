"""An Allocate handed the previous Allocate's devices is that pod's only within its admission."""

from __future__ import annotations

from typing import Any, cast

from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2 as pb
from agent.deviceplugin.matching import Reservation
from agent.deviceplugin.plugin import ResourcePlugin
from agent.deviceplugin.state import Claims
from tests.agent.deviceplugin.plugin_harness import GPU, plugin_on


def _plugin(listed: list[Reservation], now: list[float]) -> tuple[ResourcePlugin, Claims]:
    return plugin_on(2, lambda: list(listed), now)


def _prefer(plugin: ResourcePlugin, must: list[str]) -> list[str]:
    ask = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=["g0", "g1"], must_include_deviceIDs=must, allocation_size=1
    )
    answer = plugin.GetPreferredAllocation(
        pb.PreferredAllocationRequest(container_requests=[ask]), cast(Any, None)
    )
    return list(answer.container_responses[0].deviceIDs)


def _allocate(plugin: ResourcePlugin, ids: list[str]) -> dict[str, str]:
    answer = plugin.Allocate(
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
        cast(Any, None),
    )
    return dict(answer.container_responses[0].envs)


def test_a_pod_given_a_failed_admissions_devices_is_not_labelled_with_its_allocation() -> None:
    now = [0.0]
    plugin, _ = _plugin([Reservation("alloc-a", "ns", "pa", GPU, ("g0",), False, ())], now)
    assert _prefer(plugin, []) == ["g0"]
    assert _allocate(plugin, ["g0"])["TOPOPLACE_ALLOCATION"] == "alloc-a"
    # pa fails admission on another resource; the kubelet frees g0 and, a moment later,
    # admits pb (nobody reserved it): it asks with nothing to reuse, then gives g0.
    now[0] += 0.5
    assert _prefer(plugin, []) == ["g0"]
    # Was: TOPOPLACE_ALLOCATION=alloc-a (taken for pa's app container reusing g0).
    assert "TOPOPLACE_ALLOCATION" not in _allocate(plugin, ["g0"])


def test_an_app_container_asking_with_its_init_containers_gpu_still_reuses_it() -> None:
    now = [0.0]
    whole = Reservation("alloc-a", "ns", "pa", GPU, ("g0", "g1"), True, ())
    plugin, claims = _plugin([whole], now)
    with claims.lock:
        claims.give(whole)
        claims.allocated(GPU, whole)
    # The kubelet asks with the reused device as must-include: the same pod.
    _prefer(plugin, ["g1"])
    assert _allocate(plugin, ["g1"])["TOPOPLACE_ALLOCATION"] == "alloc-a"
