"""With --device-specs a MIG instance whose capability files cannot be found is advertised
Unhealthy, with the reason logged once: every admission of it would fail."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.deviceplugin.daemon import DevicePluginDaemon
from agent.deviceplugin.devices import advertised
from agent.deviceplugin.mig_caps import MigCaps
from agent.sources import Identity, open_source
from placement.profiles import build_profile
from tests.agent.deviceplugin.harness import offline_daemon
from tests.agent.deviceplugin.test_mig_device_files import mig_minors

NODE = "k8s-mig"
PROFILE = "dgx-a100-mig"  # GPU 3 holds the one 4g.40gb instance
RESOURCE = "nvidia.com/mig-4g.40gb"


def test_an_instance_without_capability_files_is_unhealthy() -> None:
    snap = build_profile(PROFILE, NODE)
    first, second = [m for m in snap.mig_instances if m.profile == "3g.40gb"]
    caps: dict[str, MigCaps | str] = {first.uuid: MigCaps(12, (13,)), second.uuid: "no line"}
    health = {d.id: d.healthy for d in advertised(snap, "nvidia.com/mig-3g.40gb", caps)}
    # Was: True for the second too, so the kubelet kept choosing it and its pods failed.
    assert (health[first.uuid], health[second.uuid]) == (True, False)
    # Where they were not looked for (no --device-specs), nothing changes.
    assert all(d.healthy for d in advertised(snap, "nvidia.com/mig-3g.40gb"))


def _daemon(minors: Path) -> DevicePluginDaemon:
    return offline_daemon(NODE, open_source(f"fake:{PROFILE}", Identity(NODE)), True, minors)


def test_the_reason_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    minors = tmp_path / "mig-minors"
    minors.write_text(mig_minors(range(3)))  # GPU 3's instances are not listed
    daemon = _daemon(minors)
    with caplog.at_level(logging.WARNING, logger="topoplace.deviceplugin"):
        daemon.read_devices()
        daemon.read_devices()
    [device] = daemon.devices.get(RESOURCE)
    assert not device.healthy
    said = [r.getMessage() for r in caplog.records if device.id in r.getMessage()]
    assert said == [
        f"--device-specs: MIG device {device.id} is advertised Unhealthy: its"
        f" /dev/nvidia-caps files are not known ({minors} has no line gpu3/gi14/access or"
        " gpu3/gi14/ci0/access)"
    ]
    # Listed once the driver lists it: Healthy again, and nothing more said.
    minors.write_text(mig_minors(range(8)))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="topoplace.deviceplugin"):
        daemon.read_devices()
    assert daemon.devices.get(RESOURCE)[0].healthy
    assert not [r for r in caplog.records if device.id in r.getMessage()]
