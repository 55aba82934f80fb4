"""The plugin's memory, shared by every resource it serves: devices, reservations, claims.

Claims are allocation ids already given to a container (or offered to the
admission in progress). They live in the process and are rebuilt from the
kubelet's PodResources List after a restart (truth.py), so nothing is
allocated twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from agent.deviceplugin.devices import Device
from agent.deviceplugin.matching import Reservation

OFFER_TTL_S = 30.0  # an offer not followed by its Allocate is given up after this
# The kubelet allocates a pod's init and app containers in one pass: an app container
# handed its init container's devices comes within this of the init container's Allocate.
REUSE_S = 5.0
RESERVATIONS_FRESH_S = 2.0  # Allocate reuses the list GetPreferredAllocation just read


class Devices:
    """Each resource's devices as the source last said, with a version for ListAndWatch."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._devices: dict[str, list[Device]] = {}
        self._index: dict[str, tuple[int, dict[str, Device]]] = {}
        self.version = 0

    def update(self, resource: str, devices: list[Device]) -> bool:
        with self._cond:
            if self._devices.get(resource) == devices:
                return False
            self._devices[resource] = list(devices)
            self.version += 1
            self._cond.notify_all()
            return True

    def get(self, resource: str) -> list[Device]:
        with self._cond:
            return list(self._devices.get(resource, ()))

    def by_id(self, resource: str) -> dict[str, Device]:
        """Device id -> device, built once per change (every kubelet call looks devices up);
        callers only read it."""
        with self._cond:
            cached = self._index.get(resource)
            if cached is not None and cached[0] == self.version:
                return cached[1]
            index = {d.id: d for d in self._devices.get(resource, ())}
            self._index[resource] = (self.version, index)
            return index

    def wait_change(self, version: int, timeout_s: float) -> int:
        """Block until the version moves past ``version`` or the timeout; the version now."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != version, timeout=timeout_s)
            return self.version


class Claims:
    """Which reservations are taken: given to a container, or offered to the current admission."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.lock = threading.Lock()
        self._clock = clock
        self.given: set[str] = set()
        # Reservations of pods split over containers, part given: id -> the devices given.
        self.parts: dict[str, frozenset[str]] = {}
        self._offered: dict[str, tuple[float, Reservation]] = {}
        # id -> when a container last got it (or a part of it): what rebuild must keep
        # whatever a list asked for before then says.
        self._given_at: dict[str, float] = {}
        # Per resource: when the latest Allocate was, and the reservation it gave (None:
        # the kubelet's own choice).
        self._last: dict[str, tuple[float, Reservation | None]] = {}
        # Per resource: the offer the latest GetPreferredAllocation made, until the
        # Allocate that follows it (the kubelet calls the two in a row per container).
        self._answered: dict[str, Reservation] = {}

    def taken(self) -> set[str]:
        """Under ``lock``: every id not to offer again now."""
        now = self._clock()
        self._offered = {k: v for k, v in self._offered.items() if v[0] > now}
        return self.given | set(self._offered)

    def given_now(self) -> set[str]:
        """Under ``lock``: the ids given to containers (expired offers dropped)."""
        self.taken()
        return set(self.given)

    def offer(self, reservation: Reservation) -> None:
        self._offered[reservation.allocation_id] = (self._clock() + OFFER_TTL_S, reservation)
        self._answered[reservation.resource] = reservation

    def declined(self, resource: str, devices: set[str]) -> None:
        """Under ``lock``: an Allocate of ``resource`` got ``devices``. When they are not
        what the GetPreferredAllocation just before it offered, the kubelet chose others
        for the very pod that offer was for: that reservation is given (its pod now holds
        devices, as the truth will say), not left offered to the next pod admitted."""
        answered = self._answered.pop(resource, None)
        if answered is None or set(answered.devices) == devices:
            return
        if answered.allocation_id in self._offered:
            self.give(answered)

    def offered(self, resource: str, devices: set[str]) -> Reservation | None:
        """Under ``lock``: the offered reservation of exactly these devices, while its offer
        stands. One past its time is not this Allocate's: its reservation may have ended
        meanwhile, and the pod now admitted on these devices is another."""
        self.taken()  # drops the offers past their time
        for _, r in self._offered.values():
            if r.resource == resource and set(r.devices) == devices:
                return r
        return None

    def allocated(self, resource: str, reservation: Reservation | None) -> None:
        """Under ``lock``: what the latest Allocate of ``resource`` gave."""
        self._last[resource] = (self._clock(), reservation)

    def asked(self, resource: str, must_include: list[str]) -> None:
        """Under ``lock``: the kubelet asks for a container's devices of ``resource``. An
        app container handed its init container's devices has them as must-include; one
        asking with none reuses nothing, so it is another pod's (the previous admission
        failed and freed them), and what the previous Allocate gave is not its own."""
        if not must_include:
            self._last.pop(resource, None)
        self._answered.pop(resource, None)

    def reused(self, resource: str, devices: set[str]) -> Reservation | None:
        """Under ``lock``: the reservation the previous Allocate of ``resource`` gave, just
        now, when it holds all of ``devices``: an app container the kubelet hands its init
        container's devices (it does so in the same pass, asking nothing first), as the
        part of that reservation they are, in its order."""
        last = self._last.get(resource)
        if last is None or last[1] is None or self._clock() - last[0] > REUSE_S:
            return None
        whole = last[1].all_devices
        if not devices <= set(whole):
            return None
        return replace(last[1], devices=tuple(d for d in whole if d in devices), whole=whole)

    def give(self, reservation: Reservation) -> None:
        """Under ``lock``: a container got ``reservation`` (or a part of it); the whole is
        given once every part is."""
        key = reservation.allocation_id
        self._offered.pop(key, None)
        self._given_at[key] = self._clock()
        got = self.parts.get(key, frozenset()) | set(reservation.devices)
        if got >= set(reservation.all_devices):
            self.parts.pop(key, None)
            self.given.add(key)
        else:
            self.parts[key] = got

    def now(self) -> float:
        return self._clock()

    def rebuild(
        self,
        given: set[str],
        live: set[str],
        parts: dict[str, frozenset[str]] | None = None,
        read_at: float | None = None,
    ) -> None:
        """From the truth: ``given`` ids are held by admitted pods, ``parts`` part-held by
        the containers admitted so far; ids no longer ``live`` (their allocation ended)
        are forgotten, and so are offers of them, unless given or offered at or after
        ``read_at`` (``now()`` when the list ``live`` comes from was asked for: what was
        handed out since may be of a reservation that list predates, and forgetting it
        would let the next admission be offered it again until the next round)."""
        with self.lock:
            kept = set(live)
            if read_at is not None:
                kept |= {k for k, at in self._given_at.items() if at >= read_at}
            self.given = (self.given & kept) | given
            if read_at is not None:
                self._offered = {
                    k: (expires, r)
                    for k, (expires, r) in self._offered.items()
                    if k in live or expires - OFFER_TTL_S >= read_at
                }
            merged = {k: v | (parts or {}).get(k, frozenset()) for k, v in self.parts.items()}
            merged.update({k: v for k, v in (parts or {}).items() if k not in merged})
            self.parts = {k: v for k, v in merged.items() if k in kept and k not in self.given}
            self._given_at = {
                k: at for k, at in self._given_at.items() if k in self.given or k in self.parts
            }


class ReservationCache:
    """The service's list of this node's reservations, read at most once per admission."""

    def __init__(
        self, fetch: Callable[[], list[Reservation]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._at = -1e9
        self._value: list[Reservation] = []

    def fresh(self) -> list[Reservation]:
        """Read now (raises what ``fetch`` raises when the service cannot answer)."""
        value = self._fetch()
        with self._lock:
            self._value, self._at = value, self._clock()
        return value

    def recent(self) -> list[Reservation] | None:
        with self._lock:
            if self._clock() - self._at <= RESERVATIONS_FRESH_S:
                return list(self._value)
        return None
