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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from agent import SOURCE_KINDS
from agent.host import Host, HostError, HostFacts, SysfsHost
from agent.nvml_api import Nvml, NvmlUnavailable, load_nvml
from agent.nvml_discovery import DiscoveryError, discover
from agent.nvml_fake import FakeNvml, fake_host
from agent.nvml_telemetry import read_nvlink
from placement.profiles import UnknownProfileError, build_profile
from placement.snapshot import Gpu, NodeSnapshot
from topoplace_client.topology_file import TopologyFileError, load_topology


class SourceError(ValueError):
    """A --source that cannot be started: unknown kind, unknown profile, NVML missing."""


@dataclass(frozen=True)
class Identity:
    name: str
    region: str = "default"
    labels: dict[str, str] = field(default_factory=dict)


class Source(Protocol):
    def read(self) -> NodeSnapshot:
        """The node as it is now; ``DiscoveryError`` when nothing can be said."""
        ...


class NvmlSource:
    def __init__(self, nvml: Nvml, host: Host, identity: Identity) -> None:
        self.nvml = nvml
        self.host = host
        self.identity = identity
        self._known: dict[int, Gpu] = {}

    def read(self) -> NodeSnapshot:
        try:
            facts = self.host.facts()
        except HostError as exc:
            raise DiscoveryError(str(exc)) from None
        report = discover(self.nvml, self.host, facts, self._known)
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
        return snap

    def nvlink(self) -> list[dict[str, int]]:
        """Each active NVLink's counters, for a heartbeat (agent/nvml_telemetry.py)."""
        return read_nvlink(self.nvml)


class SmiSource:
    """``host`` fills what topology text cannot say (host name, CPU ISA); a JSON file says it."""

    def __init__(
        self, path: Path, identity: Identity, gpu_model: str, host: HostFacts | None = None
    ) -> None:
        self.path = path
        self.identity = identity
        self.gpu_model = gpu_model
        self.host = host

    def read(self) -> NodeSnapshot:
        try:
            snap = load_topology(self.path, node_name=self.identity.name, gpu_model=self.gpu_model)
        except TopologyFileError as exc:
            raise DiscoveryError(str(exc)) from None
        from_text = {}
        if self.host is not None and not snap.hostname:
            from_text = {"hostname": self.host.hostname, "cpu_isa": self.host.cpu_isa}
        return NodeSnapshot.model_validate(
            {
                **snap.model_dump(),
                **from_text,
                "name": self.identity.name,
                "region": self.identity.region,
                "labels": self.identity.labels,
                "seq": 0,
                "timestamp": None,
            }
        )


class SimSource:
    def __init__(self, profile: str, identity: Identity) -> None:
        self.profile = profile
        self.identity = identity

    def read(self) -> NodeSnapshot:
        return build_profile(
            self.profile,
            self.identity.name,
            region=self.identity.region,
            labels=self.identity.labels,
        ).model_copy(update={"timestamp": None})


def open_source(spec: str, identity: Identity, *, gpu_model: str = "unknown") -> Source:
    """The source a ``--source`` value names, ready to read; ``SourceError`` if it cannot start."""
    kind, _, arg = spec.partition(":")
    if kind == "nvml" and not arg:
        try:
            nvml = load_nvml()
        except NvmlUnavailable as exc:
            raise SourceError(str(exc)) from None
        host = SysfsHost()
        try:
            host.facts()
        except HostError as exc:
            raise SourceError(str(exc)) from None
        return NvmlSource(nvml, host, identity)
    if kind == "smi" and arg:
        path = Path(arg)
        if not path.is_file():
            raise SourceError(f"--source smi:{arg}: no such file")
        try:
            facts: HostFacts | None = SysfsHost().facts()
        except HostError:
            facts = None  # text from a machine of another kind: x86_64 is assumed
        return SmiSource(path, identity, gpu_model, facts)
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
