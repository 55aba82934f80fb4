"""Which pod an admission is for: the kubelet says only "N devices of this resource".

The plugin matches the request to the reservations the service lists for the
node (pods the extender bound here, oldest bind first): the first one not yet
claimed, of the same resource and size, whose devices are all among those
the kubelet offers and which contains every device the kubelet insists on.
A claim is taken under the plugin's lock, so two admissions never take the
same reservation; the kubelet admits pods one at a time anyway. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reservation:
    allocation_id: str
    namespace: str
    pod: str
    resource: str
    devices: tuple[str, ...]  # in the reservation's order
    nvlink_connected: bool
    numa_nodes: tuple[int, ...]

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> Reservation:
        return cls(
            allocation_id=str(item["allocation_id"]),
            namespace=str(item["namespace"]),
            pod=str(item["pod"]),
            resource=str(item["resource"]),
            devices=tuple(str(d) for d in item["devices"]),
            nvlink_connected=bool(item.get("nvlink_connected")),
            numa_nodes=tuple(int(n) for n in item.get("numa_nodes") or ()),
        )


def pick(
    reservations: Iterable[Reservation],
    claimed: set[str],
    resource: str,
    size: int,
    available: Sequence[str],
    must_include: Sequence[str] = (),
) -> Reservation | None:
    """The oldest unclaimed reservation that fits this request, or None."""
    offered = set(available)
    needed = set(must_include)
    for r in reservations:
        if r.allocation_id in claimed or r.resource != resource or len(r.devices) != size:
            continue
        devices = set(r.devices)
        if devices <= offered and needed <= devices:
            return r
    return None


def exact(
    reservations: Iterable[Reservation], claimed: set[str], resource: str, devices: Sequence[str]
) -> Reservation | None:
    """The oldest unclaimed reservation of exactly these devices (Allocate's match)."""
    wanted = set(devices)
    for r in reservations:
        if r.allocation_id not in claimed and r.resource == resource and set(r.devices) == wanted:
            return r
    return None


def fallback(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    numa_of: dict[str, int | None],
) -> list[str]:
    """No reservation fits: what the kubelet would pick, kept on as few NUMA nodes as
    possible (the must-include devices first, then the NUMA node they are on)."""
    chosen = list(dict.fromkeys(must_include))[:size]
    rest = [d for d in available if d not in chosen]
    anchor = {numa_of.get(d) for d in chosen}
    rest.sort(
        key=lambda d: (numa_of.get(d) not in anchor, numa_of.get(d) is None, numa_of.get(d) or 0)
    )
    return chosen + rest[: size - len(chosen)]
