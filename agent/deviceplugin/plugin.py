"""The ``DevicePlugin`` service for one resource, as the kubelet calls it (v1beta1).

The kubelet's sequence per container: ``GetPreferredAllocation`` (the devices
it may give, those it must give, how many), then ``Allocate`` with the
devices it chose, then ``PreStartContainer`` (the plugin asks for it) just
before the container starts. The preferred answer is the matched
reservation's devices; Allocate hands out whatever the kubelet chose, with
the reservation's order and wiring when it chose the reservation, and the
kubelet's choice as it is otherwise (the truth loop reports it afterwards).
Nothing here waits on the service longer than its client timeout, and the
kubelet is answered even when the service is down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import grpc

from agent.deviceplugin import container, matching
from agent.deviceplugin.devices import HEALTHY, UNHEALTHY, Device
from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2 as pb
from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from agent.deviceplugin.matching import Reservation
from agent.deviceplugin.state import Claims, Devices, ReservationCache

log = logging.getLogger("topoplace.deviceplugin")
WATCH_POLL_S = 1.0  # how often ListAndWatch checks that the kubelet is still listening


def device_list(devices: list[Device]) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(
        devices=[
            pb.Device(
                ID=d.id,
                health=HEALTHY if d.healthy else UNHEALTHY,
                topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa_node)])
                if d.numa_node is not None
                else None,
            )
            for d in devices
        ]
    )


class ResourcePlugin(pb_grpc.DevicePluginServicer):
    def __init__(
        self,
        resource: str,
        devices: Devices,
        claims: Claims,
        reservations: ReservationCache,
        options: container.ContainerOptions,
        on_allocated: Callable[[], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.resource = resource
        self.devices = devices
        self.claims = claims
        self.reservations = reservations
        self.options = options
        self.on_allocated = on_allocated
        self.stopping = stopping

    # -- helpers -------------------------------------------------------------------

    def _known(self) -> dict[str, Device]:
        return self.devices.by_id(self.resource)

    def _read_reservations(self) -> list[Reservation]:
        try:
            return self.reservations.fresh()
        except Exception as exc:  # any failure of the service: the kubelet is answered anyway
            log.warning("no reservations from the service (%s): the kubelet's choice stands", exc)
            return []

    @staticmethod
    def _refuse(context: grpc.ServicerContext, message: str) -> None:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    def _unknown(self, ids: list[str], known: dict[str, Device]) -> list[str]:
        return [i for i in ids if i not in known]

    # -- the RPCs ------------------------------------------------------------------

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=True, get_preferred_allocation_available=True
        )

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        version = self.devices.version
        sent = self.devices.get(self.resource)
        yield device_list(sent)
        while context.is_active() and not self.stopping():
            version = self.devices.wait_change(version, WATCH_POLL_S)
            now = self.devices.get(self.resource)
            if now != sent:
                sent = now
                yield device_list(now)

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        known = self._known()
        answers = []
        if not request.container_requests:
            self._refuse(context, "PreferredAllocationRequest has no container_requests")
        reservations: list[Reservation] | None = None
        for i, req in enumerate(request.container_requests):
            available = list(req.available_deviceIDs)
            must = list(req.must_include_deviceIDs)
            size = req.allocation_size
            unknown = self._unknown(available + must, known)
            if unknown:
                self._refuse(context, f"container_requests[{i}]: unknown device(s) {unknown}")
            if size < 1 or size > len(available):
                self._refuse(
                    context,
                    f"container_requests[{i}]: allocation_size {size} is not between 1 and the"
                    f" {len(available)} available devices",
                )
            if not set(must) <= set(available) or len(set(must)) > size:
                self._refuse(
                    context,
                    f"container_requests[{i}]: must_include_deviceIDs must be among the"
                    f" available ones and at most allocation_size",
                )
            if reservations is None:
                reservations = self._read_reservations()
            with self.claims.lock:
                self.claims.asked(self.resource, must)
                # Offers are not excluded: the kubelet admits one pod at a time, so an offer
                # not yet given is this pod's own, asked again after a failed admission.
                chosen = matching.pick(
                    reservations,
                    self.claims.given_now(),
                    self.resource,
                    size,
                    available,
                    must,
                    self.claims.parts,
                )
                if chosen is not None:
                    self.claims.offer(chosen)
            if chosen is not None:
                ids = list(chosen.devices)
            else:
                numa = {d.id: d.numa_node for d in known.values()}
                ids = matching.fallback(available, must, size, numa)
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=answers)

    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        known = self._known()
        if not request.container_requests:
            self._refuse(context, "AllocateRequest has no container_requests")
        responses = []
        for i, req in enumerate(request.container_requests):
            ids = list(req.devices_ids)
            if not ids:
                self._refuse(context, f"container_requests[{i}]: no devices_ids")
            unknown = self._unknown(ids, known)
            if unknown:
                self._refuse(context, f"container_requests[{i}]: unknown device(s) {unknown}")
            if len(set(ids)) != len(ids):
                self._refuse(context, f"container_requests[{i}]: a device is named twice")
            if self.options.device_specs:
                self._refuse_without_caps(ids, known, context)
            responses.append(self._allocate_one(ids, known))
        self.on_allocated()
        return pb.AllocateResponse(container_responses=responses)

    def _refuse_without_caps(
        self, ids: list[str], known: dict[str, Device], context: grpc.ServicerContext
    ) -> None:
        """A MIG instance whose capability files are unknown would reach the container
        without them, where CUDA cannot open it: the kubelet is told why instead (the
        pod fails admission with this message)."""
        blind = [f"{i} ({known[i].caps_missing})" for i in ids if known[i].caps_missing]
        if blind:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "--device-specs: the /dev/nvidia-caps files of MIG device(s) "
                + ", ".join(blind)
                + " are not known, and without them the container cannot open the instance",
            )

    def _exact(self, ids: list[str]) -> Reservation | None:
        """The free reservation of exactly ``ids``: from the list the GetPreferredAllocation
        just before read, and when that has none, from a list read now. The kubelet
        allocates without asking when it has no choice, and the pod may have been bound
        since that list was read: matched against it alone, it got no reservation."""
        recent = self.reservations.recent()
        for reservations in ([recent] if recent is not None else []) + [None]:
            if reservations is None:
                reservations = self._read_reservations()
            with self.claims.lock:
                found = matching.exact(
                    reservations, self.claims.taken(), self.resource, ids, self.claims.parts
                )
            if found is not None:
                return found
        return None

    def _allocate_one(
        self, ids: list[str], known: dict[str, Device]
    ) -> pb.ContainerAllocateResponse:
        wanted = set(ids)
        with self.claims.lock:
            chosen = self.claims.offered(self.resource, wanted)
            self.claims.declined(self.resource, wanted)
        if chosen is None:
            chosen = self._exact(ids)
        with self.claims.lock:
            if chosen is not None:
                self.claims.give(chosen)
                self.claims.allocated(self.resource, chosen)
            else:
                # Devices of a reservation given already: an init container's, handed on
                # to an app container of the same pod (nothing is given anew).
                chosen = self.claims.reused(self.resource, wanted)
                if chosen is None:
                    self.claims.allocated(self.resource, None)
        if chosen is not None:
            order = list(chosen.devices)
            wiring = container.Wiring(chosen.nvlink_connected, chosen.allocation_id)
            log.info(
                "%s: pod %s/%s gets its reservation %s: %s",
                self.resource,
                chosen.namespace,
                chosen.pod,
                chosen.allocation_id,
                ",".join(order),
            )
        else:
            order = ids
            wiring = container.Wiring()
            log.warning(
                "%s: no reservation is %s; the kubelet's choice is given and reported",
                self.resource,
                ",".join(ids),
            )
        minors = {d.id: d.minor for d in known.values()}
        caps = {d.id: d.caps for d in known.values() if d.caps is not None}
        out = container.answer(order, minors, wiring, self.options, caps)
        return pb.ContainerAllocateResponse(
            envs=out.envs,
            annotations=out.annotations,
            cdi_devices=[pb.CDIDevice(name=n) for n in out.cdi_devices],
            devices=[
                pb.DeviceSpec(container_path=c, host_path=h, permissions=p)
                for c, h, p in out.device_specs
            ],
        )

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        known = self._known()
        unknown = self._unknown(list(request.devices_ids), known)
        if unknown:
            self._refuse(context, f"unknown device(s) {unknown}")
        sick = [i for i in request.devices_ids if not known[i].healthy]
        if sick:
            # The kubelet does not start a container whose PreStartContainer failed: a GPU
            # that went bad between Allocate and start is not handed to the workload.
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"device(s) {sick} are unhealthy")
        # By now the kubelet has recorded the allocation: PodResources can tell the truth.
        self.on_allocated()
        return pb.PreStartContainerResponse()
