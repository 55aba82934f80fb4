"""topoplace_client.lua (job_submit.lua's and cli_filter.lua's HTTP) over TLS, with LuaSec.

The Lua module as shipped, in Lua 5.1 as slurmctld runs it, against the
service on loopback serving a test CA's certificate: it talks to the service
with that CA in ``ca_file`` and refuses it with another CA, or in plain HTTP.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.app import create_app
from service.settings import Settings
from tests.integrations.slurm.loopback import LUA_DIR
from tests.live_server import live_server
from tests.tls_ca import Pki, make_pki
from topoplace.serve_cmd import uvicorn_options

LUA = shutil.which("lua5.1")
LUA_LIBS = Path("/usr/lib/x86_64-linux-gnu/lua/5.1")
TOKEN = "lua-tls-admin-token-0123456789abcdef"
# Prints the status and the body's node count, or "nil" and why.
SCRIPT = """
package.path = arg[1] .. "/?.lua;" .. package.path
local client = require("topoplace_client")
local status, body = client.post("/v1/score", { gpus = 1 })
if status == nil then
  print("nil", body)
else
  print(status, #body.nodes)
end
"""


def _missing() -> str | None:
    if LUA is None:
        return "no lua5.1 (Debian: apt-get install lua5.1)"
    for library, package in (("ssl.so", "lua-sec"), ("cjson.so", "lua-cjson")):
        if not (LUA_LIBS / library).exists():
            return f"no {package} (Debian: apt-get install {package})"
    if not Path("/usr/share/lua/5.1/socket.lua").exists():
        return "no lua-socket (Debian: apt-get install lua-socket)"
    return None


@pytest.fixture(scope="session")
def _prerequisites() -> None:
    """In place of the package's: these tests need Lua and its libraries, not a Slurm
    cluster. Skipped without them, unless CI requires the Slurm suite to run."""
    why = _missing()
    if why is None:
        return
    if os.environ.get("TOPOPLACE_REQUIRE_SLURM") == "1":
        pytest.fail(why)
    pytest.skip(why)


@dataclass
class TlsService:
    url: str
    pki: Pki


@pytest.fixture
def tls_service(tmp_path: Path) -> Iterator[TlsService]:
    pki = make_pki(tmp_path)
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'lua-tls.sqlite3'}",
        grpc_port=None,
        insecure_dev=False,
        bootstrap_admin_token=TOKEN,
        tls_cert=str(pki.cert),
        tls_key=str(pki.key),
    )
    app = create_app(settings, background=False)
    with live_server(app, options=uvicorn_options(settings), ca_bundle=str(pki.ca)) as url:
        yield TlsService(url, pki)


def _lua_post(directory: Path, server: str, ca_file: Path | None) -> list[str]:
    """job_submit.lua's client as shipped, configured the way topoplace.conf is."""
    directory.mkdir()
    shutil.copy(LUA_DIR / "topoplace_client.lua", directory)
    (directory / "token").write_text(TOKEN + "\n")
    conf = [f"server = {server}", "timeout_ms = 5000", f"token_file = {directory / 'token'}"]
    if ca_file is not None:
        conf.append(f"ca_file = {ca_file}")
    (directory / "topoplace.conf").write_text("\n".join(conf) + "\n")
    assert LUA is not None
    done = subprocess.run(
        [LUA, "-", str(directory)], input=SCRIPT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split("\t")


def test_the_lua_client_talks_https_with_the_service_ca(
    tls_service: TlsService, tmp_path: Path
) -> None:
    assert _lua_post(tmp_path / "ip", tls_service.url, tls_service.pki.ca) == ["200", "0"]
    # The certificate names localhost too: the name is checked, and matches.
    by_name = tls_service.url.replace("127.0.0.1", "localhost")
    assert _lua_post(tmp_path / "name", by_name, tls_service.pki.ca) == ["200", "0"]


def test_the_lua_client_refuses_a_service_another_ca_vouches_for(
    tls_service: TlsService, tmp_path: Path
) -> None:
    status, why = _lua_post(tmp_path / "other", tls_service.url, tls_service.pki.other_ca)
    assert status == "nil" and "certificate verify failed" in why


def test_the_lua_client_gets_nothing_in_plain_http_from_a_tls_port(
    tls_service: TlsService, tmp_path: Path
) -> None:
    plain = tls_service.url.replace("https://", "http://")
    status, _ = _lua_post(tmp_path / "plain", plain, None)
    assert status != "200"
