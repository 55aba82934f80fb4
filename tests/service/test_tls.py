"""TLS end to end on loopback, with a CA made for the test: REST, gRPC, the agent, the CLI.

The service is started as `topoplace serve` starts it (its settings, its
uvicorn options, its gRPC server); each client is given the test CA as its
bundle and must succeed, and given another CA (or none) must refuse the
service's certificate.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from service.app import create_app
from service.grpc.gen import topoplace_pb2 as pb
from service.grpc.gen import topoplace_pb2_grpc as pb_grpc
from service.settings import Settings
from tests.live_server import live_server
from tests.tls_ca import Pki, make_pki
from topoplace.cli import main
from topoplace.serve_cmd import uvicorn_options


@dataclass
class TlsService:
    url: str
    grpc_port: int
    pki: Pki


@pytest.fixture
def tls_service(tmp_path: Path) -> Iterator[TlsService]:
    pki = make_pki(tmp_path)
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'tls.sqlite3'}",
        grpc_port=0,
        tls_cert=str(pki.cert),
        tls_key=str(pki.key),
    )
    app = create_app(settings, background=False)
    options = uvicorn_options(settings)
    assert options["ssl_certfile"] == str(pki.cert)
    with live_server(app, options=options, ca_bundle=str(pki.ca)) as url:
        assert url.startswith("https://")
        yield TlsService(url, app.state.grpc.port, pki)


def test_rest_speaks_tls_with_the_configured_certificate(tls_service: TlsService) -> None:
    trusted = ssl.create_default_context(cafile=str(tls_service.pki.ca))
    answer = httpx.get(f"{tls_service.url}/healthz", verify=trusted, trust_env=False)
    assert answer.json() == {"status": "ok"}
    other = ssl.create_default_context(cafile=str(tls_service.pki.other_ca))
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{tls_service.url}/healthz", verify=other, trust_env=False)
    plain = tls_service.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{plain}/healthz", trust_env=False, timeout=3)


def test_grpc_speaks_tls_with_the_same_certificate(tls_service: TlsService) -> None:
    target = f"localhost:{tls_service.grpc_port}"
    trusted = grpc.ssl_channel_credentials(root_certificates=tls_service.pki.ca.read_bytes())
    with grpc.secure_channel(target, trusted) as channel:
        listing = pb_grpc.TopoplaceStub(channel).ListNodes(pb.ListNodesRequest(), timeout=10)
        assert list(listing.nodes) == []
    other = grpc.ssl_channel_credentials(root_certificates=tls_service.pki.other_ca.read_bytes())
    with grpc.secure_channel(target, other) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.TopoplaceStub(channel).ListNodes(pb.ListNodesRequest(), timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError):
        pb_grpc.TopoplaceStub(channel).ListNodes(pb.ListNodesRequest(), timeout=5)


def test_the_agent_reports_over_tls_with_its_ca_bundle(
    tls_service: TlsService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "node.key"
    assert main(["agent", "keygen", "--key-file", str(key)]) == 0
    base = ["agent", "--server", tls_service.url, "--source", "sim:hgx-h100"]
    base += ["--node-name", "tls-h100", "--key-file", str(key), "--timeout", "5", "--once"]
    # Without the CA the service's certificate is refused: unreachable, exit 3.
    assert main([*base, "--ca-bundle", str(tls_service.pki.other_ca)]) == 3
    assert main([*base, "--ca-bundle", str(tls_service.pki.ca)]) == 0
    monkeypatch.setenv("TOPOPLACE_AGENT_CA_BUNDLE", str(tls_service.pki.ca))
    assert main(base) == 0  # the same from the environment


def test_the_cli_verifies_the_service_with_its_ca_bundle(
    tls_service: TlsService, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TOPOPLACE_CA_BUNDLE", raising=False)
    base = ["nodes", "--server", tls_service.url, "--json"]
    assert main([*base, "--ca-bundle", str(tls_service.pki.other_ca)]) == 3
    assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
    assert main(base) == 3  # the system's CAs do not know the test CA either
    assert main([*base, "--ca-bundle", str(tls_service.pki.ca)]) == 0
    assert '"nodes"' in capsys.readouterr().out
    monkeypatch.setenv("TOPOPLACE_CA_BUNDLE", str(tls_service.pki.ca))
    assert main(base) == 0
