"""After the fact: which devices each pod really got, from the kubelet's PodResources API.

Every round (and soon after an Allocate) the plugin lists the kubelet's pod
resources, reports each pod's devices of its resources to the service
(``POST /v1/nodes/{name}/k8s/devices``), which moves or creates allocations
to match, and rebuilds its claims from the same list: a reservation whose
pod already holds devices, or whose devices another pod holds, is not
offered again. After a restart this is how the plugin learns what it gave.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import grpc

from agent.deviceplugin.gen.podresources.v1 import api_pb2 as pr
from agent.deviceplugin.gen.podresources.v1 import api_pb2_grpc as pr_grpc
from agent.deviceplugin.matching import Reservation
from agent.deviceplugin.state import Claims
from topoplace_client.api import ApiError

log = logging.getLogger("topoplace.deviceplugin")
PodKey = tuple[str, str]
# After an admission, a pod the service deferred (its kubelet's start not yet visible,
# or the List read within that second) is reported again every QUICK_S for FOLLOW_UP_S,
# not only at the next interval: until it is taken, devices the kubelet gave other than
# reserved look free to the service.
FOLLOW_UP_S = 5.0
QUICK_S = 1.0


def list_pod_devices(
    socket: str, resources: set[str], timeout_s: float
) -> dict[str, dict[PodKey, list[str]]]:
    """resource -> (namespace, pod) -> its devices of that resource, over every container."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        answer = pr_grpc.PodResourcesListerStub(channel).List(
            pr.ListPodResourcesRequest(), timeout=timeout_s
        )
    out: dict[str, dict[PodKey, list[str]]] = {r: {} for r in resources}
    for pod in answer.pod_resources:
        for c in pod.containers:
            for d in c.devices:
                if d.resource_name in out and d.device_ids:
                    held = out[d.resource_name].setdefault((pod.namespace, pod.name), [])
                    held.extend(i for i in d.device_ids if i not in held)
    return out


def given_ids(
    reservations: list[Reservation], held: dict[str, dict[PodKey, list[str]]]
) -> set[str]:
    """Reservations not to offer: their pod holds devices, or their devices are held."""
    return claimed_from(reservations, held)[0]


def claimed_from(
    reservations: list[Reservation], held: dict[str, dict[PodKey, list[str]]]
) -> tuple[set[str], dict[str, frozenset[str]]]:
    """(reservations given, reservations part-given -> their devices given): a pod holding
    some of its reservation's devices and nothing else has had only some of its
    containers admitted, and the rest is still its own."""
    given: set[str] = set()
    parts: dict[str, frozenset[str]] = {}
    for r in reservations:
        pods = held.get(r.resource, {})
        mine = set(pods.get((r.namespace, r.pod), ()))
        others = {d for key, ids in pods.items() if key != (r.namespace, r.pod) for d in ids}
        if others & set(r.devices):
            given.add(r.allocation_id)
        elif mine and mine < set(r.devices):
            parts[r.allocation_id] = frozenset(mine)
        elif mine:
            given.add(r.allocation_id)
    return given, parts


def _unknown_device(exc: ApiError) -> str | None:
    """The device a refused report names as none of the node's, or None. The service's
    other 400 with a device (one named twice for a pod) cannot come from a PodResources
    List read here: each pod's devices are listed once."""
    device = exc.detail.get("device")
    field = str(exc.detail.get("field", ""))
    if exc.status == 400 and isinstance(device, str) and field.endswith(".devices"):
        return device
    return None


def _any_deferred(answer: object) -> bool:
    """Whether the service's answer to a report deferred some pod (DeviceReportResult)."""
    outcomes = answer.get("outcomes") if isinstance(answer, dict) else None
    if not isinstance(outcomes, list):
        return False
    return any(isinstance(o, dict) and o.get("action") == "deferred" for o in outcomes)


class TruthLoop:
    def __init__(
        self,
        socket: str,
        resources: Callable[[], set[str]],
        claims: Claims,
        fetch: Callable[[], list[Reservation]],
        report: Callable[[str, list[dict[str, Any]], datetime], Any],
        interval_s: float,
        timeout_s: float = 5.0,
        on_round: Callable[[set[str]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket = socket
        self.resources = resources
        self.claims = claims
        self.fetch = fetch
        self.report = report
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.on_round = on_round  # with every device held by a pod, each round
        self.wake = threading.Event()
        self.rounds = 0
        self.deferred = False  # the last round's reports had a pod the service deferred
        self._clock = clock

    def once(self) -> bool:
        """One round; False when the kubelet or the service could not be read (tried again)."""
        # Taken before the List is asked for: the service takes a pod's devices from it
        # only if the kubelet had started that pod by then (a List names pods, not their
        # UIDs, and may show an earlier pod of the name).
        listed_at = datetime.now(UTC)
        try:
            held = list_pod_devices(self.socket, self.resources(), self.timeout_s)
        except grpc.RpcError as exc:
            log.warning("the kubelet's PodResources API did not answer: %s", exc.details())
            return False
        if self.on_round is not None:
            self.on_round({d for pods in held.values() for ids in pods.values() for d in ids})
        read_at = self.claims.now()
        try:
            reservations = self.fetch()
        except Exception as exc:  # the service is down: claims stay, reported next round
            log.warning("cannot read this node's reservations: %s", exc)
            return False
        live = {r.allocation_id for r in reservations}
        given, parts = claimed_from(reservations, held)
        self.claims.rebuild(given, live, parts, read_at)
        # A pod with only some containers admitted holds part of its reservation: reported
        # once all are, or the service would move its allocation onto that part. Meanwhile
        # its allocation holds every device of it, so none a container holds looks free.
        partway = {(r.namespace, r.pod) for r in reservations if r.allocation_id in parts}
        ok = True
        self.deferred = False
        for resource, pods in held.items():
            body = [
                {"namespace": ns, "name": n, "devices": d}
                for (ns, n), d in sorted(pods.items())
                if (ns, n) not in partway
            ]
            if not body:
                continue
            try:
                self._report_known(resource, body, listed_at)
            except Exception as exc:
                log.warning("cannot report %s allocations to the service: %s", resource, exc)
                ok = False
        self.rounds += 1
        return ok

    def _report_known(self, resource: str, body: list[dict[str, Any]], listed_at: datetime) -> None:
        """Report ``body``; a pod holding a device the node no longer has (a GPU lost or
        replaced: the service refuses the whole report for it) is left out with a warning
        and the rest sent again, so one dead GPU does not hide every other pod's truth."""
        while body:
            try:
                answer = self.report(resource, body, listed_at)
                self.deferred = self.deferred or _any_deferred(answer)
                return
            except ApiError as exc:
                gone = _unknown_device(exc)
                if gone is None:
                    raise
                kept = [pod for pod in body if gone not in pod["devices"]]
                if len(kept) == len(body):
                    raise
                for pod in body:
                    if gone in pod["devices"]:
                        log.warning(
                            "%s: pod %s/%s holds %s, which the node no longer has (a GPU"
                            " lost or replaced); left out of the report",
                            resource,
                            pod["namespace"],
                            pod["name"],
                            gone,
                        )
                body = kept

    def run(self, stop: threading.Event) -> None:
        follow_until = -1.0  # rounds until then retry a deferred pod after QUICK_S
        while not stop.is_set():
            if self.wake.is_set():  # an admission: its pod is reported as it starts
                follow_until = self._clock() + FOLLOW_UP_S
            self.wake.clear()
            try:
                self.once()
            except Exception:
                # One bad round (an answer nothing here expected) must not end the loop:
                # the thread would die with the plugin still serving, and from then on the
                # service would never learn what the kubelet gave, nor the claims be rebuilt.
                log.exception("the truth round failed; trying again in %.0f s", self.interval_s)
            # Only after an admission: a pod deferred for good (a finished pod the kubelet
            # still lists) would otherwise be reported, and read from the API, each second.
            quick = self.deferred and self._clock() < follow_until
            self.wake.wait(min(QUICK_S, self.interval_s) if quick else self.interval_s)
