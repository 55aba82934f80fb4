"""The plugin process: read the node, serve the kubelet, tell the service the truth.

Three threads besides gRPC's: the device loop (the agent's source every
``interval_s``: health for ListAndWatch), the registration watcher
(kubelet.py) and the truth loop (truth.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from agent.deviceplugin import devices as dev
from agent.deviceplugin.container import ContainerOptions
from agent.deviceplugin.kube_publish import PublishError, TopologyPublisher
from agent.deviceplugin.kubelet import Endpoint, keep_registered
from agent.deviceplugin.matching import Reservation
from agent.deviceplugin.mig_caps import MIG_MINORS, MigCaps, mig_caps, read_mig_minors
from agent.deviceplugin.plugin import ResourcePlugin
from agent.deviceplugin.state import Claims, Devices, ReservationCache
from agent.deviceplugin.token_file import TokenFile
from agent.deviceplugin.topology_object import node_resource_topology
from agent.deviceplugin.truth import TruthLoop
from agent.nvml_discovery import DiscoveryError
from agent.sources import MigIdSource, Source
from placement.snapshot import NodeSnapshot
from topoplace_client.api import ApiError, TopoplaceClient

log = logging.getLogger("topoplace.deviceplugin")
T = TypeVar("T")


@dataclass(frozen=True)
class PluginSettings:
    node: str
    resources: tuple[str, ...]  # empty: every resource the node has (whole GPUs, MIG profiles)
    whole_gpu_resource: str
    kubelet_dir: Path
    pod_resources_socket: Path
    options: ContainerOptions
    interval_s: float = 15.0
    truth_interval_s: float = 10.0
    register_poll_s: float = 1.0
    publish_topology: bool = False  # keep the node's NodeResourceTopology object
    mig_minors: Path = MIG_MINORS  # the driver's list of MIG capability files (mig_caps.py)


class ServiceLink:
    """The service, through two clients: admissions never wait behind a truth report. A
    call refused for its token (401) is made once more when the token file holds another
    token by then (a rotation)."""

    def __init__(
        self,
        node: str,
        admissions: TopoplaceClient,
        reports: TopoplaceClient,
        tokens: TokenFile | None = None,
    ) -> None:
        self.node = node
        self.admissions = admissions
        self.reports = reports
        self.tokens = tokens

    def _call(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except ApiError as exc:
            if exc.status != 401 or self.tokens is None or not self.tokens.reload():
                raise
        return call()

    def _parse(self, answer: dict[str, Any]) -> list[Reservation]:
        return [Reservation.from_json(r) for r in answer.get("reservations", [])]

    def reservations(self) -> list[Reservation]:
        return self._parse(self._call(lambda: self.admissions.k8s_reservations(self.node)))

    def reservations_for_report(self) -> list[Reservation]:
        return self._parse(self._call(lambda: self.reports.k8s_reservations(self.node)))

    def report(self, resource: str, pods: list[dict[str, Any]], listed_at: datetime) -> Any:
        return self._call(
            lambda: self.reports.k8s_report_devices(self.node, resource, pods, listed_at)
        )


class DevicePluginDaemon:
    def __init__(
        self,
        settings: PluginSettings,
        source: Source,
        link: ServiceLink,
        publisher: TopologyPublisher | None = None,
    ) -> None:
        self.settings = settings
        self.publisher = publisher
        self.snapshot: NodeSnapshot | None = None
        self.source = source
        self.link = link
        self.devices = Devices()
        self.claims = Claims()
        self.reservations = ReservationCache(link.reservations)
        self.stop = threading.Event()
        # Only ever grows: a resource whose devices all went keeps them listed Unhealthy.
        self.resources: list[str] = list(settings.resources)
        self._endpoints: dict[str, Endpoint] = {}
        self._endpoints_lock = threading.Lock()
        # MIG UUID -> why its capability files are not known, as last logged.
        self._caps_missing_logged: dict[str, str] = {}
        self.truth = TruthLoop(
            str(settings.pod_resources_socket),
            lambda: set(self.resources),
            self.claims,
            link.reservations_for_report,
            link.report,
            settings.truth_interval_s,
            on_round=self.publish_topology if publisher is not None else None,
        )

    def read_devices(self) -> None:
        """One look at the node; a source that cannot answer makes every device Unhealthy."""
        try:
            snapshot = self.source.read()
        except (DiscoveryError, ValueError) as exc:  # ValueError: a snapshot that does not validate
            log.warning("the node cannot be read (%s): every device is Unhealthy", exc)
            for resource in self.resources:
                sick = [replace(d, healthy=False) for d in self.devices.get(resource)]
                self.devices.update(resource, sick)
            return
        if self.snapshot is None:
            self._warn_index_device_files(snapshot)
        self.snapshot = snapshot
        if not self.settings.resources:
            # Resources that appear later (MIG instances created, MIG mode switched) are
            # served too: the registration watcher registers each new one.
            found = dev.resources_of(snapshot, self.settings.whole_gpu_resource)
            new = [r for r in found if r not in self.resources]
            if new:
                if self.resources:
                    log.info("new resource(s) on this node: %s", ", ".join(new))
                self.resources = [*self.resources, *new]
        caps = self._mig_caps(snapshot)
        for resource in self.resources:
            now = dev.advertised(snapshot, resource, caps)
            self.devices.update(resource, dev.merge(self.devices.get(resource), now))

    def _warn_index_device_files(self, snapshot: NodeSnapshot) -> None:
        """Once, at the first read: GPUs without a minor number (a ``nvidia-smi topo -m``
        source names GPUs by index only) get /dev/nvidia<index> in the device specs,
        which is another GPU's file where the driver numbered them otherwise."""
        if not self.settings.options.device_specs:
            return
        blind = [g.index for g in snapshot.gpus if g.minor_number is None]
        if blind:
            log.warning(
                "--device-specs: the source gives no minor number for GPU(s) %s, so their"
                " device files are taken to be /dev/nvidia<index>; where the driver numbered"
                " them otherwise (`nvidia-smi -q` shows each GPU's Minor Number) a container"
                " gets another GPU's file: use --source nvml, or a snapshot JSON with"
                " minor_number (docs/agent.md)",
                ", ".join(str(i) for i in blind),
            )

    def _mig_caps(self, snapshot: NodeSnapshot) -> dict[str, MigCaps | str]:
        """Each MIG instance's capability files, looked for only where they are listed
        (--device-specs) and re-read each time: instances are created and destroyed."""
        if not self.settings.options.device_specs or not snapshot.mig_instances:
            return {}
        ids = self.source.mig_ids() if isinstance(self.source, MigIdSource) else {}
        minors = read_mig_minors(self.settings.mig_minors)
        caps = mig_caps(snapshot, ids, minors, self.settings.mig_minors)
        self._log_caps_missing(caps)
        return caps

    def _log_caps_missing(self, caps: dict[str, MigCaps | str]) -> None:
        """Why a MIG instance is Unhealthy, once per instance and reason: the devices are
        read every few seconds, and a line each time would bury everything else."""
        for uuid, found in caps.items():
            if isinstance(found, str) and self._caps_missing_logged.get(uuid) != found:
                log.warning(
                    "--device-specs: MIG device %s is advertised Unhealthy: its"
                    " /dev/nvidia-caps files are not known (%s)",
                    uuid,
                    found,
                )
        self._caps_missing_logged = {u: f for u, f in caps.items() if isinstance(f, str)}

    def publish_topology(self, held: set[str]) -> None:
        if self.publisher is None or self.snapshot is None:
            return
        devices = {r: self.devices.get(r) for r in self.resources}
        try:
            self.publisher.publish(node_resource_topology(self.snapshot, devices, held))
        except PublishError as exc:
            log.warning("NodeResourceTopology not kept: %s", exc)

    def truth_soon(self) -> None:
        """An Allocate or PreStartContainer happened: read PodResources now."""
        self.truth.wake.set()

    def endpoints(self) -> list[Endpoint]:
        """One endpoint per resource served so far, made the first time it is asked for
        (the registration watcher asks every poll, so a new resource is served within it)."""
        with self._endpoints_lock:
            for resource in self.resources:
                if resource not in self._endpoints:
                    self._endpoints[resource] = Endpoint(
                        self.settings.kubelet_dir,
                        ResourcePlugin(
                            resource,
                            self.devices,
                            self.claims,
                            self.reservations,
                            self.settings.options,
                            self.truth_soon,
                            self.stop.is_set,
                        ),
                    )
            return list(self._endpoints.values())

    def run(self) -> None:
        self.read_devices()
        if not self.resources:
            log.warning("this node has no GPUs to advertise; waiting for some")
        while not self.resources and not self.stop.wait(self.settings.interval_s):
            self.read_devices()
        if self.stop.is_set():
            return
        # After a restart: learn from PodResources what was given before serving anything.
        self.truth.once()
        threads = [
            threading.Thread(
                target=keep_registered,
                args=(self.endpoints, self.stop, self.settings.register_poll_s),
                name="register",
                daemon=True,
            ),
            threading.Thread(target=self.truth.run, args=(self.stop,), name="truth", daemon=True),
        ]
        for t in threads:
            t.start()
        while not self.stop.wait(self.settings.interval_s):
            self.read_devices()
        self.truth.wake.set()
        for t in threads:
            t.join(10)
