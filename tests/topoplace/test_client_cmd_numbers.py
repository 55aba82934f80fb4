"""Client commands given a number that is not finite: argparse's exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from topoplace.cli import main


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("command", ["place", "region"])
def test_a_number_that_is_not_finite_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, value: str
) -> None:
    # Was: "ValueError: Out of range float values are not JSON compliant" traceback, exit 1,
    # while writing the request body (nothing reached the service: it is unreachable here).
    key = tmp_path / "region.pub"
    key.write_text("x\n")
    args = {
        "place": ["place", "--gpus", "1", f"--gpu-fraction={value}"],
        "region": [
            "region", "register", "r1", "--cloud", "aws", "--url", "https://r1.invalid",
            "--public-key-file", str(key), "--price", "H100=1", "--egress-internet", "1",
            f"--egress-region={value}",
        ],
    }[command]  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        main([*args, "--server", "http://127.0.0.1:1"])
    assert exited.value.code == 2
    assert f"must be a finite number, got {value}" in capsys.readouterr().err
