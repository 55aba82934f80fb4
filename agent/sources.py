"""Where a snapshot comes from: NVML, a saved ``nvidia-smi topo -m``, or a built-in profile.

``--source`` takes one of:

- ``nvml`` (default): the driver, through nvidia-ml-py;
- ``smi:FILE``: ``nvidia-smi topo -m`` text (or a snapshot JSON), re-read on
  every round so an edited file is reported as a change;
- ``sim:PROFILE``: one of the engine's built-in profiles, as it is;
- ``fake:PROFILE``: NVML discovery run against the in-memory NVML fake built
  from PROFILE, to see what discovery makes of a machine.

Every source returns a snapshot with the node's identity (name, region,
labels) and ``seq`` 0; the runner stamps seq and time when it sends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import ValidationError

from agent import SOURCE_KINDS
from agent.host import Host, HostError, HostFacts, SysfsHost
from agent.nvml_api import Nvml, NvmlUnavailable, load_nvml
from agent.nvml_discovery import DiscoveryError, discover
from agent.nvml_fake import FakeNvml, fake_host
from agent.nvml_mig import MigIds
from agent.nvml_telemetry import read_nvlink
from placement.profiles import UnknownProfileError, build_profile
from placement.snapshot import Gpu, NodeSnapshot
from topoplace_client.topology_file import TopologyFileError, load_topology

log = logging.getLogger("topoplace.agent")


class SourceError(ValueError):
    """A --source that is wrong as given: unknown kind or profile, a missing or unreadable
    topology file (bad settings, exit status 2)."""


class DiscoveryUnavailable(SourceError):
    """A right --source that cannot start on this machine: NVML missing, /sys unreadable
    (exit status 4)."""


def unknown_gpu_facts(snap: NodeSnapshot, source: str) -> str | None:
    """What a topology text left unknown about the GPUs, and how to give it; None if nothing."""
    missing: list[tuple[str, str, str]] = []
    if any(gpu.model == "unknown" for gpu in snap.gpus):
        missing.append(
            (
                "model",
                "model 'unknown' (no GPU family for NVLink speeds or model requests)",
                "--gpu-model MODEL (TOPOPLACE_AGENT_GPU_MODEL)",
            )
        )
    if any(gpu.memory_mib == 0 for gpu in snap.gpus):
        missing.append(
            (
                "memory",
                "0 MiB of memory (requests for GPU memory never fit)",
                "--gpu-memory-mib MIB (TOPOPLACE_AGENT_GPU_MEMORY_MIB)",
            )
        )
    if not missing:
        return None
    what = " or ".join(name for name, _, _ in missing)
    shown = " and ".join(effect for _, effect, _ in missing)
    how = " and ".join(flag for _, _, flag in missing)
    return (
        f"--source {source}: the topology text names no GPU {what}, so the GPUs are reported"
        f" with {shown}; give {how}"
    )


@dataclass(frozen=True)
class Identity:
    name: str
    region: str = "default"
    labels: dict[str, str] = field(default_factory=dict)


class Source(Protocol):
    def read(self) -> NodeSnapshot:
        """The node as it is now; ``DiscoveryError`` when nothing can be said."""
        ...


@runtime_checkable
class MigIdSource(Protocol):
    """A source that knows each MIG instance's GPU and compute instance ids (NVML's)."""

    def mig_ids(self) -> dict[str, MigIds]:
        """MIG instance UUID -> its ids, as of the last ``read``."""
        ...


class NvmlSource:
    def __init__(self, nvml: Nvml, host: Host, identity: Identity) -> None:
        self.nvml = nvml
        self.host = host
        self.identity = identity
        self._known: dict[int, Gpu] = {}
        self._mig_ids: dict[str, MigIds] = {}

    def read(self) -> NodeSnapshot:
        try:
            facts = self.host.facts()
        except HostError as exc:
            raise DiscoveryError(str(exc)) from None
        report = discover(self.nvml, self.host, facts, self._known, self.identity.name)
        try:
            snap = NodeSnapshot(
                name=self.identity.name,
                region=self.identity.region,
                labels=self.identity.labels,
                hostname=facts.hostname,
                cpu_isa=facts.cpu_isa,
                numa_nodes=list(facts.numa_nodes),
                gpus=report.gpus,
                links=report.links,
                cpu_links=report.cpu_links,
                nics=self.host.nics([g.pci_bus_id for g in report.gpus]),
                mig_instances=report.mig_instances,
                fabric=report.fabric,
                driver_version=report.driver_version,
                cuda_version=report.cuda_version,
            )
        except ValidationError as exc:
            raise DiscoveryError(f"NVML reported an inconsistent node: {exc}") from None
        self._known = {g.index: g for g in snap.gpus}
        self._mig_ids = dict(report.mig_ids)
        return snap

    def mig_ids(self) -> dict[str, MigIds]:
        return dict(self._mig_ids)

    def nvlink(self) -> list[dict[str, int]]:
        """Each active NVLink's counters, for a heartbeat (agent/nvml_telemetry.py)."""
        return read_nvlink(self.nvml)


class SmiSource:
    """``host`` fills what topology text cannot say (host name, CPU ISA); a JSON file says it."""

    def __init__(
        self,
        path: Path,
        identity: Identity,
        gpu_model: str,
        host: HostFacts | None = None,
        gpu_memory_mib: int = 0,
    ) -> None:
        self.path = path
        self.identity = identity
        self.gpu_model = gpu_model
        self.gpu_memory_mib = gpu_memory_mib
        self.host = host

    def read(self) -> NodeSnapshot:
        try:
            snap = load_topology(self.path, node_name=self.identity.name, gpu_model=self.gpu_model)
        except TopologyFileError as exc:
            raise DiscoveryError(str(exc)) from None
        from_text: dict[str, object] = {}
        if self.host is not None and not snap.hostname:
            from_text = {"hostname": self.host.hostname, "cpu_isa": self.host.cpu_isa}
        body = snap.model_dump()
        if self.gpu_memory_mib:
            for gpu in body["gpus"]:
                gpu["memory_mib"] = gpu["memory_mib"] or self.gpu_memory_mib
        return NodeSnapshot.model_validate(
            {
                **body,
                **from_text,
                "name": self.identity.name,
                "region": self.identity.region,
                "labels": self.identity.labels,
                "seq": 0,
                "timestamp": None,
            }
        )


class SimSource:
    """A built-in profile as it is, its GPUs' device files numbered as their indexes."""

    def __init__(self, profile: str, identity: Identity) -> None:
        self.profile = profile
        self.identity = identity

    def read(self) -> NodeSnapshot:
        snap = build_profile(
            self.profile,
            self.identity.name,
            region=self.identity.region,
            labels=self.identity.labels,
        )
        gpus = [g.model_copy(update={"minor_number": g.index}) for g in snap.gpus]
        return snap.model_copy(update={"timestamp": None, "gpus": gpus})


def open_source(
    spec: str, identity: Identity, *, gpu_model: str = "unknown", gpu_memory_mib: int = 0
) -> Source:
    """The source a ``--source`` value names, ready to read.

    ``SourceError`` when the value is wrong (a smi file is read once here, so a
    missing or garbage one is caught before the agent starts),
    ``DiscoveryUnavailable`` when this machine cannot run it. A smi text that
    names no GPU model or memory is logged as a warning saying how to give them.
    """
    kind, _, arg = spec.partition(":")
    if kind == "nvml" and not arg:
        try:
            nvml = load_nvml()
        except NvmlUnavailable as exc:
            raise DiscoveryUnavailable(str(exc)) from None
        host = SysfsHost()
        try:
            host.facts()
        except HostError as exc:
            raise DiscoveryUnavailable(str(exc)) from None
        return NvmlSource(nvml, host, identity)
    if kind == "smi" and arg:
        try:
            facts: HostFacts | None = SysfsHost().facts()
        except HostError:
            facts = None  # text from a machine of another kind: x86_64 is assumed
        source = SmiSource(Path(arg), identity, gpu_model, facts, gpu_memory_mib)
        try:
            first = source.read()
        except DiscoveryError as exc:
            raise SourceError(f"--source {spec}: {exc}") from None
        unknown = unknown_gpu_facts(first, spec)
        if unknown is not None:
            log.warning("%s", unknown)
        return source
    if kind in ("sim", "fake") and arg:
        try:
            profile = build_profile(arg, identity.name)
        except UnknownProfileError as exc:
            raise SourceError(f"--source {spec}: {exc}") from None
        if kind == "sim":
            return SimSource(arg, identity)
        fake = FakeNvml.from_snapshot(profile)
        fake.nvmlInit()
        return NvmlSource(fake, fake_host(profile), identity)
    raise SourceError(f"--source {spec!r} is not one of: {SOURCE_KINDS}")
