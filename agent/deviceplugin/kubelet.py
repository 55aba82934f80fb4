"""Serving the plugin's socket and registering it with the kubelet, again after a kubelet restart.

A restarted kubelet recreates ``kubelet.sock`` and deletes every plugin
socket in its folder; a plugin must then serve a new socket and register
again. The watcher notices either (the kubelet socket's inode changed, or
the plugin's own socket is gone) within ``poll_s``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2 as pb
from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from agent.deviceplugin.plugin import ResourcePlugin

log = logging.getLogger("topoplace.deviceplugin")
KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"


def socket_name(resource: str) -> str:
    """``nvidia.com/mig-3g.40gb`` -> ``topoplace-nvidia.com-mig-3g.40gb.sock``."""
    return "topoplace-" + resource.replace("/", "-") + ".sock"


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


class Endpoint:
    """One resource's socket, its gRPC server and its registration."""

    def __init__(self, folder: Path, plugin: ResourcePlugin, workers: int = 8) -> None:
        self.folder = folder
        self.plugin = plugin
        self.path = folder / socket_name(plugin.resource)
        self.workers = workers
        self.server: grpc.Server | None = None
        self.registered_with: int | None = None  # the kubelet socket's inode

    def serve(self) -> None:
        self.stop()
        self.path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.workers))
        pb_grpc.add_DevicePluginServicer_to_server(self.plugin, server)
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self.server = server

    def register(self, timeout_s: float = 5.0) -> None:
        kubelet = self.folder / KUBELET_SOCKET
        inode = _inode(kubelet)
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.path.name,
                    resource_name=self.plugin.resource,
                    options=pb.DevicePluginOptions(
                        pre_start_required=True, get_preferred_allocation_available=True
                    ),
                ),
                timeout=timeout_s,
            )
        self.registered_with = inode
        log.info("registered %s with the kubelet on %s", self.plugin.resource, self.path.name)

    def needs_renewal(self) -> bool:
        inode = _inode(self.folder / KUBELET_SOCKET)
        if inode is None:
            return False  # the kubelet is down: wait for its socket
        return inode != self.registered_with or not self.path.exists()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0.5).wait(2)
            self.server = None


def keep_registered(
    endpoints: Callable[[], list[Endpoint]], stop: threading.Event, poll_s: float
) -> None:
    """Serve and register every endpoint (asked for again each poll: a resource that
    appeared since is registered then); do it again whenever the kubelet restarts."""
    while not stop.is_set():
        for ep in endpoints():
            if ep.server is None or ep.needs_renewal():
                try:
                    if ep.server is None or not ep.path.exists() or ep.registered_with is not None:
                        ep.serve()
                    ep.register()
                except grpc.RpcError as exc:
                    log.warning("cannot register %s yet: %s", ep.plugin.resource, exc.details())
                    ep.registered_with = None
                except (OSError, RuntimeError) as exc:  # the folder, the socket: tried again
                    log.warning("cannot serve %s on %s: %s", ep.plugin.resource, ep.path, exc)
                    ep.stop()
                    ep.registered_with = None
        stop.wait(poll_s)
    for ep in endpoints():
        ep.stop()
        ep.path.unlink(missing_ok=True)
