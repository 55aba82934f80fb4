"""`topoplace device-plugin`'s settings: flags, else TOPOPLACE_DEVICE_PLUGIN_* variables."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from topoplace.cli import build_parser, main


def test_the_driver_root_is_a_flag_or_a_variable_and_root_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert build_parser().parse_args(["device-plugin"]).driver_root == "/"
    flag = ["device-plugin", "--driver-root", "/run/nvidia/driver"]
    assert build_parser().parse_args(flag).driver_root == "/run/nvidia/driver"
    monkeypatch.setenv("TOPOPLACE_DEVICE_PLUGIN_DRIVER_ROOT", "/run/nvidia/driver")
    assert build_parser().parse_args(["device-plugin"]).driver_root == "/run/nvidia/driver"


def test_a_driver_root_without_device_specs_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It moves only the device specs' host paths: set without them it does nothing."""
    args = ["device-plugin", "--server", "http://127.0.0.1:9", "--node-name", "n1"]
    args += ["--kubelet-dir", str(tmp_path / "absent")]  # stops right after the checks
    with caplog.at_level(logging.WARNING, logger="topoplace.deviceplugin"):
        assert main([*args, "--driver-root", "/run/nvidia/driver"]) == 2
        assert main([*args, "--driver-root", "/run/nvidia/driver", "--device-specs"]) == 2
        assert main(args) == 2
    warned = [r.getMessage() for r in caplog.records if "--driver-root" in r.getMessage()]
    assert warned == [
        "--driver-root /run/nvidia/driver changes only the host paths of --device-specs,"
        " which is off: the runtime finds the devices itself"
    ]
