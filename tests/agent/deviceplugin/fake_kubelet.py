"""A kubelet for tests, speaking the real v1beta1 and podresources v1 protocols over unix sockets.

It does what the kubelet's device manager does with a plugin: serves
``Registration`` on ``kubelet.sock``, connects to the socket a plugin
registers, keeps the device list ``ListAndWatch`` streams, and admits a
container with the kubelet's sequence: ``GetPreferredAllocation`` (the
healthy devices nobody holds, and how many), ``Allocate`` with its choice,
``PreStartContainer`` when the plugin asked for it. What it allocated is
served by a ``PodResourcesLister`` on its own socket. ``restart`` does
what a kubelet restart does to the folder: a new ``kubelet.sock``, every
plugin socket deleted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2 as pb
from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from agent.deviceplugin.gen.podresources.v1 import api_pb2 as pr
from agent.deviceplugin.gen.podresources.v1 import api_pb2_grpc as pr_grpc
from tests.waiting import wait_until


@dataclass
class Plugin:
    resource: str
    endpoint: str
    options: pb.DevicePluginOptions
    channel: grpc.Channel
    stub: pb_grpc.DevicePluginStub
    devices: dict[str, pb.Device] = field(default_factory=dict)
    updates: int = 0


@dataclass
class Admitted:
    namespace: str
    name: str
    resource: str
    preferred: list[str]
    devices: list[str]
    response: pb.ContainerAllocateResponse
    container: str = "main"


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version {request.version}")
        self.kubelet.registrations.append(request)
        # As the kubelet does: dial the plugin back, then watch its devices.
        threading.Thread(target=self.kubelet.connect, args=(request,), daemon=True).start()
        return pb.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        pods: dict[tuple[str, str], list[pr.ContainerResources]] = {}
        with self.kubelet.lock:
            for a in self.kubelet.admitted:
                devices = pr.ContainerDevices(resource_name=a.resource, device_ids=a.devices)
                container = pr.ContainerResources(name=a.container, devices=[devices])
                pods.setdefault((a.namespace, a.name), []).append(container)
        return pr.ListPodResourcesResponse(
            pod_resources=[
                pr.PodResources(namespace=ns, name=n, containers=c) for (ns, n), c in pods.items()
            ]
        )


class FakeKubelet:
    def __init__(self, folder: Path, pod_resources_socket: Path) -> None:
        self.folder = folder
        self.pod_resources_socket = pod_resources_socket
        self.lock = threading.Lock()
        self.registrations: list[pb.RegisterRequest] = []
        self.plugins: dict[str, Plugin] = {}
        self.admitted: list[Admitted] = []
        # Called with (namespace, name) once a pod's container is admitted: the kubelet
        # starts the pod, which the API shows (status.startTime).
        self.on_admit: Callable[[str, str], None] | None = None
        self._server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> FakeKubelet:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.folder / 'kubelet.sock'}")
        server.start()
        self._server = server
        if self._pr_server is None:
            pr_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), pr_server)
            pr_server.add_insecure_port(f"unix://{self.pod_resources_socket}")
            pr_server.start()
            self._pr_server = pr_server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(2)
            self._server = None
        (self.folder / "kubelet.sock").unlink(missing_ok=True)
        with self.lock:
            plugins = list(self.plugins.values())
            self.plugins.clear()
        for p in plugins:
            p.channel.close()

    def close(self) -> None:
        self.stop()
        if self._pr_server is not None:
            self._pr_server.stop(0).wait(2)

    def restart(self) -> None:
        """What a kubelet restart leaves: a new kubelet.sock, no plugin sockets."""
        self.stop()
        for sock in self.folder.glob("*.sock"):
            sock.unlink()
        self.start()

    # -- plugins ---------------------------------------------------------------------

    def connect(self, request: pb.RegisterRequest) -> None:
        channel = grpc.insecure_channel(f"unix://{self.folder / request.endpoint}")
        stub = pb_grpc.DevicePluginStub(channel)
        options = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        plugin = Plugin(request.resource_name, request.endpoint, options, channel, stub)
        with self.lock:
            old = self.plugins.get(request.resource_name)
            self.plugins[request.resource_name] = plugin
        if old is not None:
            old.channel.close()
        try:
            for update in stub.ListAndWatch(pb.Empty()):
                with self.lock:
                    plugin.devices = {d.ID: d for d in update.devices}
                    plugin.updates += 1
        except grpc.RpcError:
            pass  # the plugin went away or the channel was closed

    def plugin(self, resource: str, timeout_s: float = 15.0) -> Plugin:
        wait_until(
            lambda: resource in self.plugins and self.plugins[resource].updates > 0,
            f"the plugin for {resource} registered and listed its devices",
            timeout_s=timeout_s,
        )
        return self.plugins[resource]

    def health(self, resource: str) -> dict[str, str]:
        with self.lock:
            return {i: d.health for i, d in self.plugins[resource].devices.items()}

    # -- admission -------------------------------------------------------------------

    def free(self, resource: str) -> list[str]:
        with self.lock:
            held = {d for a in self.admitted if a.resource == resource for d in a.devices}
            devices = self.plugins[resource].devices
            return [i for i, d in devices.items() if d.health == "Healthy" and i not in held]

    def admit(
        self,
        namespace: str,
        name: str,
        resource: str,
        count: int,
        choose: list[str] | None = None,
        container: str = "main",
        reuse: list[str] | None = None,
    ) -> Admitted:
        """One container asking for ``count`` devices; ``choose``: the kubelet ignores the
        preferred answer and takes these (it may: the answer is advisory). ``reuse``: the
        devices of the pod's init container, which the kubelet's device manager hands
        an app container first: it asks for the rest with them as must-include (and
        among the available ones), and asks nothing when they suffice."""
        plugin = self.plugin(resource)
        reused = list(reuse or ())[:count]
        available = reused + self.free(resource)
        preferred: list[str] = []
        if plugin.options.get_preferred_allocation_available and len(reused) < count:
            answer = plugin.stub.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=available,
                            must_include_deviceIDs=reused,
                            allocation_size=count,
                        )
                    ]
                ),
                timeout=5,
            )
            preferred = list(answer.container_responses[0].deviceIDs)
        devices = choose or preferred or available[:count]
        allocated = plugin.stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=devices)]
            ),
            timeout=5,
        )
        response = allocated.container_responses[0]
        admitted = Admitted(
            namespace, name, resource, preferred, list(devices), response, container
        )
        with self.lock:
            self.admitted.append(admitted)
        if self.on_admit is not None:
            self.on_admit(namespace, name)
        if plugin.options.pre_start_required:
            plugin.stub.PreStartContainer(
                pb.PreStartContainerRequest(devices_ids=devices), timeout=5
            )
        return admitted
