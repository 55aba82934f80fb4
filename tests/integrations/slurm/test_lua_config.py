"""topoplace_client.lua's topoplace.conf, read in Lua 5.1 as slurmctld reads it.

A missing or unreadable file means the defaults, logged once through slurmctld's
log: failing inside slurmctld would fail every submission.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integrations.slurm.loopback import LUA_DIR
from tests.integrations.slurm.test_lua_tls import LUA
from tests.integrations.slurm.test_lua_tls import _prerequisites as _prerequisites  # Lua only

# The module as job_submit.lua loads it, with slurmctld's slurm.log_error recorded.
SCRIPT = """
package.path = arg[1] .. "/?.lua;" .. package.path
local logged = {}
slurm = { log_error = function(f, ...) logged[#logged + 1] = string.format(f, ...) end }
local client = require("topoplace_client")
print(client.config.server)
print(client.timeout_s)
print(#logged)
print(logged[1] or "")
"""


def _load(directory: Path) -> list[str]:
    shutil.copy(LUA_DIR / "topoplace_client.lua", directory)
    assert LUA is not None
    done = subprocess.run(
        [LUA, "-", str(directory)], input=SCRIPT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:4]


def test_a_readable_config_is_read_and_nothing_logged(tmp_path: Path) -> None:
    (tmp_path / "topoplace.conf").write_text("# x = y\nserver = http://h:1\r\ntimeout_ms=250\n")
    assert _load(tmp_path) == ["http://h:1", "0.25", "0", ""]


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda path: None, "No such file or directory"),
        (lambda path: path.mkdir(), "Is a directory"),
    ],
    ids=["missing", "directory"],
)
def test_a_config_that_cannot_be_read_means_the_defaults_logged_once(
    tmp_path: Path, make: Callable[[Path], object], why: str
) -> None:
    """Was: a missing file was the defaults without a word, and a directory failed the
    module's load (job_submit.lua with it)."""
    conf = tmp_path / "topoplace.conf"
    make(conf)
    server, timeout_s, count, line = _load(tmp_path)
    assert (server, timeout_s, count) == ("http://127.0.0.1:8080", "0.1", "1")
    assert line == (
        f"topoplace: cannot read {conf}: {why}; using the defaults"
        " (server http://127.0.0.1:8080, timeout_ms 100)"
    )
