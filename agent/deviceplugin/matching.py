"""Which pod an admission is for: the kubelet says only "N devices of this resource".

The plugin matches the request to the reservations the service lists for the
node (pods the extender bound here, oldest bind first): the first one not yet
claimed, of the same resource and size, whose devices are all among those
the kubelet offers and which contains every device the kubelet insists on.
A claim is taken under the plugin's lock, so two admissions never take the
same reservation; the kubelet admits pods one at a time anyway.

A pod whose GPUs are split over several containers is admitted container by
container (the kubelet calls the plugin once per container): its reservation
is handed out in parts, in the reservation's order. A reservation part of
which a container already got is the pod being admitted now, so the next
request is matched to its rest before anything else; a request smaller than
every free reservation of its size starts the split of the oldest larger one.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
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
    # For a part of a reservation (one container of a pod): the whole reservation's devices.
    whole: tuple[str, ...] = ()

    @property
    def all_devices(self) -> tuple[str, ...]:
        return self.whole or self.devices

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
    parts: Mapping[str, frozenset[str]] | None = None,
) -> Reservation | None:
    """The reservation (or the part of one) that fits this request, or None: the rest of
    a reservation part-given already, else the oldest unclaimed one of this size, else
    the first part of the oldest larger one."""
    offered = set(available)
    needed = set(must_include)
    given = parts or {}

    def fits(devices: Iterable[str]) -> bool:
        chosen = set(devices)
        return chosen <= offered and needed <= chosen

    return _first(reservations, claimed, resource, given, size, fits, needed)


def exact(
    reservations: Iterable[Reservation],
    claimed: set[str],
    resource: str,
    devices: Sequence[str],
    parts: Mapping[str, frozenset[str]] | None = None,
) -> Reservation | None:
    """The reservation (or the rest's part) of exactly these devices, in any order
    (Allocate's match). A split is not started here: devices the kubelet chose against
    the preferred answer are not taken for the first part of another pod's reservation."""
    wanted = set(devices)
    return _first(
        reservations,
        claimed,
        resource,
        parts or {},
        len(wanted),
        lambda d: set(d) == wanted,
        wanted,
        split=False,
    )


def _first(
    reservations: Iterable[Reservation],
    claimed: set[str],
    resource: str,
    parts: Mapping[str, frozenset[str]],
    size: int,
    fits: Callable[[Iterable[str]], bool],
    named: set[str],
    split: bool = True,
) -> Reservation | None:
    """``named``: the devices the request names (must-include, or Allocate's): those of
    them already given are the pod's own init container's, which the kubelet reuses."""
    free = [r for r in reservations if r.allocation_id not in claimed and r.resource == resource]
    for r in free:  # the pod being admitted, container by container
        given = parts.get(r.allocation_id)
        if given is not None:
            found = _part(r, given, size, fits, given & named)
            if found is not None:
                return found
    for r in free:
        if r.allocation_id not in parts and len(r.devices) == size and fits(r.devices):
            return r
    for r in free if split else ():
        if r.allocation_id not in parts and len(r.devices) > size:
            found = _part(r, frozenset(), size, fits)
            if found is not None:
                return found
    return None


def _part(
    r: Reservation,
    given: frozenset[str],
    size: int,
    fits: Callable[[Iterable[str]], bool],
    reused: frozenset[str] = frozenset(),
) -> Reservation | None:
    """``size`` of the devices of ``r`` that ``fits`` accepts: the ``reused`` ones (given
    to the pod's init container, which the kubelet hands its app containers first) and
    the rest from those not yet given, in the reservation's order (neighbours on its
    ring stay together), or None."""
    rest = [d for d in r.devices if d not in given]
    want = size - len(reused)
    if want < 0:
        return None
    for start in range(len(rest) - want + 1):
        window = set(rest[start : start + want]) | reused
        chosen = [d for d in r.devices if d in window]
        if fits(chosen):
            return replace(r, devices=tuple(chosen), whole=r.devices)
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
