"""A node whose source gives no minor numbers (``--source smi:`` with a ``nvidia-smi topo
-m`` text) has its device files taken by index: the plugin says so once, at start."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.deviceplugin.daemon import DevicePluginDaemon
from agent.sources import Identity, SimSource, SmiSource
from tests.agent.deviceplugin.harness import offline_daemon

NODE = "k8s-smi"
SAMPLE = Path(__file__).resolve().parents[3] / "topoplace_client" / "samples" / "hgx-h100.txt"


def _daemon(source: SmiSource | SimSource, device_specs: bool) -> DevicePluginDaemon:
    return offline_daemon(NODE, source, device_specs)


def test_device_files_by_index_are_warned_of_once(caplog: pytest.LogCaptureFixture):
    daemon = _daemon(SmiSource(SAMPLE, Identity(NODE), "NVIDIA H100 80GB HBM3"), True)
    with caplog.at_level(logging.WARNING, logger="topoplace.deviceplugin"):
        daemon.read_devices()
        daemon.read_devices()
    warned = [r.getMessage() for r in caplog.records if "minor number" in r.getMessage()]
    # Was: nothing said; containers silently got /dev/nvidia<index>.
    assert len(warned) == 1
    assert "GPU(s) 0, 1, 2, 3, 4, 5, 6, 7" in warned[0]
    assert "/dev/nvidia<index>" in warned[0]
    assert daemon.devices.get("nvidia.com/gpu")[3].minor == 3


def test_no_warning_where_minor_numbers_are_known_or_no_device_files_are_listed(
    caplog: pytest.LogCaptureFixture,
):
    with caplog.at_level(logging.WARNING, logger="topoplace.deviceplugin"):
        _daemon(SimSource("hgx-h100", Identity(NODE)), True).read_devices()
        _daemon(SmiSource(SAMPLE, Identity(NODE), "NVIDIA H100 80GB HBM3"), False).read_devices()
    assert not [r for r in caplog.records if "minor number" in r.getMessage()]
