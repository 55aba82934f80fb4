"""A device plugin on a node of a few whole GPUs, for the plugin's own tests."""

from __future__ import annotations

from collections.abc import Callable

from agent.deviceplugin.container import ContainerOptions
from agent.deviceplugin.devices import Device
from agent.deviceplugin.matching import Reservation
from agent.deviceplugin.plugin import ResourcePlugin
from agent.deviceplugin.state import Claims, Devices, ReservationCache

GPU = "nvidia.com/gpu"


def plugin_on(
    gpus: int, fetch: Callable[[], list[Reservation]], now: list[float] | None = None
) -> tuple[ResourcePlugin, Claims]:
    """The plugin for GPUs g0..g{gpus-1}, healthy, on NUMA node 0, reading the node's
    reservations from ``fetch``; ``now[0]`` is its clock when given (else the real one)."""
    devices = Devices()
    devices.update(GPU, [Device(f"g{i}", True, 0, i) for i in range(gpus)])
    if now is None:
        claims, cache = Claims(), ReservationCache(fetch)
    else:
        claims, cache = Claims(lambda: now[0]), ReservationCache(fetch, lambda: now[0])
    plugin = ResourcePlugin(
        GPU, devices, claims, cache, ContainerOptions(), lambda: None, lambda: False
    )
    return plugin, claims
