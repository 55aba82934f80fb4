"""Bearer tokens: one check in front of every route but health and the docs.

The static (bootstrap, compatibility) tokens here; database tokens, roles and
scopes in tests/service/test_access_*.py.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement import ClusterState
from placement.node_view import NodeView
from placement.profiles import build_profile
from service import auth, migrate
from service.access import Role
from service.app import NoTokenSource, create_app
from service.auth import Authenticator, Unauthorized
from service.db import make_engine
from service.settings import Settings
from service.tokens import secrets, store
from tests.live_server import live_server
from tests.service.raw_asgi import raw_post
from topoplace.serve_cmd import uvicorn_options
from topoplace_client.api import ApiError, TopoplaceClient

ADMIN = "test-admin-token-0123456789abcdef"


def _client(tmp_path: Path, insecure_dev: bool = False, **settings: str) -> TestClient:
    url = f"sqlite:///{tmp_path / 'auth.sqlite3'}"
    configured = Settings(database_url=url, insecure_dev=insecure_dev, **settings)
    return TestClient(create_app(configured, background=False))


def test_without_tokens_the_service_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(NoTokenSource, match="insecure-dev"), _client(tmp_path):
        pass


def test_insecure_dev_is_open_and_says_so(tmp_path: Path) -> None:
    with _client(tmp_path, insecure_dev=True) as client:
        assert client.get("/v1/nodes").status_code == 200
        assert client.get("/readyz").json()["insecure"] is True
        # A token that is presented is still checked.
        wrong = client.get("/v1/nodes", headers={"Authorization": "Bearer tpp_0123456789ab_x"})
        assert wrong.status_code == 401


def test_a_secured_service_does_not_say_insecure(tmp_path: Path) -> None:
    with _client(tmp_path, api_tokens="s3cret-0123456789abcdef") as client:
        assert "insecure" not in client.get("/readyz").json()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"api_tokens": "changeme"}, "well-known default"),
        ({"api_tokens": "short"}, "shorter than 16"),
        ({"bootstrap_admin_token": ""}, "set but empty"),
        ({"api_tokens": " , "}, "set but empty"),
    ],
)
def test_a_default_empty_or_short_token_is_refused(
    tmp_path: Path, settings: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _client(tmp_path, **settings)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "requires a token"),
        ("Bearer wrong", "not one this service accepts"),
        ("Basic czNjcmV0", "must be 'Bearer TOKEN'"),
        ("Bearer ", "must be 'Bearer TOKEN'"),
    ],
)
def test_a_missing_or_wrong_token_is_refused(
    tmp_path: Path, header: str | None, message: str
) -> None:
    with _client(tmp_path, api_tokens="s3cret-0123456789abcdef,other-0123456789abcdef") as client:
        headers = {"Authorization": header} if header else {}
        response = client.post("/v1/place", json={"gpus": 1}, headers=headers)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        error = response.json()["error"]
        assert error["code"] == "unauthorized"
        assert message in error["message"]


def test_every_configured_token_is_accepted(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("# agents\nfrom-file-0123456789abcdef\n\n")
    with _client(
        tmp_path, api_tokens="s3cret-0123456789abcdef", api_token_file=str(token_file)
    ) as client:
        for token in ("s3cret-0123456789abcdef", "from-file-0123456789abcdef"):
            response = client.get("/v1/nodes", headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == 200, token
        assert client.get("/v1/nodes", headers={"Authorization": "Bearer # agents"}).status_code
        assert client.get("/v1/nodes").status_code == 401


def test_health_and_docs_stay_open(tmp_path: Path) -> None:
    with _client(tmp_path, api_tokens="s3cret-0123456789abcdef") as client:
        for path in ("/", "/healthz", "/readyz", "/openapi.json", "/docs", "/redoc"):
            assert client.get(path).status_code == 200, path


def test_an_unreadable_token_file_is_a_clear_startup_error(tmp_path: Path) -> None:
    settings = Settings(database_url="sqlite://", api_token_file=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="cannot read the token file"):
        settings.accepted_tokens()


def test_the_check_itself() -> None:
    check = Authenticator(None, ["a-static-token-0123456789", ""])
    assert check.has_static
    assert check.authenticate("bearer a-static-token-0123456789").role == "admin"
    with pytest.raises(Unauthorized):
        check.authenticate("Bearer b")
    with pytest.raises(Unauthorized):
        Authenticator(None).authenticate(None)  # closed, not open
    assert Authenticator(None, insecure=True).authenticate(None).role == "admin"


def test_the_client_sends_its_token(tmp_path: Path) -> None:
    with _client(tmp_path, api_tokens="s3cret-0123456789abcdef") as app_client:
        transport = httpx.MockTransport(
            lambda request: httpx.Response(
                app_client.get(
                    request.url.path,
                    headers={"Authorization": request.headers.get("authorization", "")},
                ).status_code,
                json={"nodes": []},
            )
        )
        with TopoplaceClient(
            "http://svc", transport=transport, token="s3cret-0123456789abcdef"
        ) as good:
            assert good.nodes() == {"nodes": []}
        with (
            TopoplaceClient("http://svc", transport=transport) as anonymous,
            pytest.raises(ApiError),
        ):
            anonymous.nodes()


def test_a_token_revoked_while_its_hash_is_checked_is_not_kept(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    record, secret = store.create(engine, Role.VIEWER, name="dashboard")
    check = Authenticator(engine)
    real = secrets.verify_secret

    def revoked_meanwhile(presented: str, stored: str) -> bool:
        matched = real(presented, stored)
        # The read saw it live; DELETE /v1/tokens lands in this process before the cache does.
        store.revoke(engine, record.id)
        check.drop(record.id)
        return matched

    monkeypatch.setattr(auth.secrets, "verify_secret", revoked_meanwhile)
    with pytest.raises(Unauthorized, match="revoked"):
        check.authenticate(f"Bearer {secret}")
    monkeypatch.setattr(auth.secrets, "verify_secret", real)
    with pytest.raises(Unauthorized):
        principal = check.authenticate(f"Bearer {secret}")
        pytest.fail(f"the revoked token {principal.token_id} was accepted from the cache")
    engine.dispose()


def test_a_principal_revoked_by_another_process_is_known_revoked(database_url: str) -> None:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    record, secret = store.create(engine, Role.VIEWER, name="dashboard")
    check = Authenticator(engine)
    principal = check.authenticate(f"Bearer {secret}")
    check.forget_revoked()
    assert not check.revoked(principal)
    store.revoke(engine, record.id)  # through another replica: this one learns it by its poll
    check.forget_revoked()
    assert check.revoked(principal)
    with pytest.raises(Unauthorized):
        check.authenticate(f"Bearer {secret}")
    engine.dispose()


# What a page of another site makes a browser send: a form or a no-cors fetch needs no
# permission from this service, and without a token an --insecure-dev service took it as
# an admin's call (a laptop's browser visiting any site could cordon, place, mint tokens).
CROSS_SITE = {"Sec-Fetch-Site": "cross-site", "Origin": "https://elsewhere.example"}


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
def test_insecure_dev_refuses_another_sites_tokenless_writes(settings: Settings, site: str) -> None:
    demo_settings = settings.model_copy(update={"insecure_dev": True})
    with TestClient(create_app(demo_settings, demo=True, background=False)) as client:
        headers = {**CROSS_SITE, "Sec-Fetch-Site": site}
        writes = [
            ("POST", "/v1/nodes/h100-b/cordon", None),
            ("POST", "/v1/tokens", b'{"role": "admin", "name": "planted"}'),
            ("POST", "/v1/slurm/job-submit", b'{"job_id": 1, "gres": "gpu:2"}'),
            ("DELETE", "/v1/nodes/h100-b", None),
        ]
        for method, path, body in writes:
            answer = client.request(method, path, content=body, headers=headers)
            assert answer.status_code == 403, (path, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "forbidden" and "token" in error["message"], error
        nodes = client.get("/v1/nodes").json()["nodes"]
        assert not [n["name"] for n in nodes if n["state"] == "cordoned"]
        assert len(nodes) == 12
        assert client.get("/v1/tokens").json()["tokens"] == []
        assert client.get("/v1/allocations").json()["allocations"] == []


@pytest.mark.parametrize(
    "origin", ["https://elsewhere.example", "null", "http://testserver:3000", "ftp://testserver"]
)
def test_insecure_dev_refuses_tokenless_writes_from_another_origin(
    settings: Settings, origin: str
) -> None:
    """A browser that sends no Sec-Fetch-Site (older ones, some embedded ones) still sends
    Origin with a form post: refused on Sec-Fetch-Site alone, such a page of another
    site cordoned a node of an --insecure-dev service. ``null`` is a sandboxed frame's."""
    demo_settings = settings.model_copy(update={"insecure_dev": True})
    with TestClient(create_app(demo_settings, demo=True, background=False)) as client:
        headers = {"Origin": origin, "Content-Type": "application/x-www-form-urlencoded"}
        for method, path in (("POST", "/v1/nodes/h100-b/cordon"), ("DELETE", "/v1/nodes/h100-b")):
            answer = client.request(method, path, headers=headers)
            assert answer.status_code == 403, (method, path, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "forbidden" and "token" in error["message"], error
            assert error["detail"]["origin"] == origin
        nodes = client.get("/v1/nodes").json()["nodes"]
        assert len(nodes) == 12
        assert not [n["name"] for n in nodes if n["state"] == "cordoned"]
        # Its own origin, as the service's pages send it, and no Origin at all (curl, a
        # script) are served; so is a read from anywhere, which the page cannot see.
        own = {"Origin": "http://testserver"}
        assert client.post("/v1/nodes/h100-b/cordon", headers=own).status_code == 200
        assert client.post("/v1/nodes/h100-b/uncordon").status_code == 200
        assert client.get("/v1/nodes", headers=headers).status_code == 200
        # A browser that sends Sec-Fetch-Site is judged on it: behind a proxy that passes
        # the upstream's Host on, the service's own pages name the proxy's origin.
        proxied = {"Origin": "http://proxy.localhost:9000", "Sec-Fetch-Site": "same-origin"}
        assert client.post("/v1/score", json={"gpus": 1}, headers=proxied).status_code == 200


def test_insecure_dev_reads_a_host_port_of_any_bytes(settings: Settings) -> None:
    """A Host whose port is a byte past 0x7F that Python calls a digit (0xB2, '²' in
    latin-1): h11 passes it on, and the Origin check's int() raised, a 500 for a tokenless
    write naming an Origin. It is no port: the Origin is another one, refused as such."""
    demo_settings = settings.model_copy(update={"insecure_dev": True})
    with TestClient(create_app(demo_settings, demo=True, background=False)) as client:
        origin = [(b"origin", b"http://localhost:8000")]
        for host in (b"localhost:\xb2", b"localhost:\xb9\xb2\xb3"):
            status, body = raw_post(client, "/v1/nodes/h100-b/cordon", None, origin, host=host)
            assert status == 403, (host, body)
            error = json.loads(body)["error"]
            assert (
                error["code"] == "forbidden" and error["detail"]["origin"] == origin[0][1].decode()
            )
        nodes = client.get("/v1/nodes").json()["nodes"]
        assert not [n["name"] for n in nodes if n["state"] == "cordoned"]


def test_insecure_dev_still_serves_its_own_pages_and_programs(settings: Settings) -> None:
    demo_settings = settings.model_copy(update={"insecure_dev": True})
    with TestClient(create_app(demo_settings, demo=True, background=False)) as client:
        # The console's own calls (same origin), a program (no browser headers), and a
        # link followed from elsewhere (a read: another site cannot read the answer).
        same = {"Sec-Fetch-Site": "same-origin", "Origin": str(client.base_url)}
        assert client.post("/v1/score", json={"gpus": 1}, headers=same).status_code == 200
        assert client.post("/v1/nodes/h100-b/cordon").status_code == 200
        assert client.get("/v1/nodes", headers=CROSS_SITE).status_code == 200
        # A token is the caller's own, whichever page sent it: checked as always.
        made = client.post("/v1/tokens", json={"role": "viewer", "name": "v"}).json()
        viewer = {**CROSS_SITE, "Authorization": f"Bearer {made['token']}"}
        assert client.get("/v1/nodes", headers=viewer).status_code == 200
        refused = client.post("/v1/nodes/h100-b/uncordon", headers=viewer)
        assert refused.status_code == 403 and "viewer role" in refused.json()["error"]["message"]


# DNS rebinding: a page of another site points a name of its own at the service, so the
# browser sends its calls as same-origin (no Sec-Fetch-Site to refuse) and lets the page
# read the answers; only the Host header still names that site.
REBOUND = {"Host": "rebound.attacker.example:8000", "Sec-Fetch-Site": "same-origin"}


def test_insecure_dev_refuses_tokenless_calls_for_another_host(settings: Settings) -> None:
    demo_settings = settings.model_copy(update={"insecure_dev": True})
    with TestClient(create_app(demo_settings, demo=True, background=False)) as client:
        calls = [
            ("GET", "/v1/nodes", None),
            ("GET", "/v1/tokens", None),
            ("POST", "/v1/nodes/h100-b/cordon", None),
            ("POST", "/v1/tokens", b'{"role": "admin", "name": "planted"}'),
        ]
        for method, path, body in calls:
            answer = client.request(method, path, content=body, headers=REBOUND)
            assert answer.status_code == 403, (path, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "forbidden", error
            assert "TOPOPLACE_INSECURE_DEV_HOSTS" in error["message"], error
            assert error["detail"]["host"] == REBOUND["Host"]
        nodes = client.get("/v1/nodes").json()["nodes"]
        assert not [n["name"] for n in nodes if n["state"] == "cordoned"]
        assert client.get("/v1/tokens").json()["tokens"] == []
        # Loopback names, and the probes and pages that need no token, are served.
        for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "console.localhost"):
            assert client.get("/v1/nodes", headers={"Host": host}).status_code == 200, host
        assert client.get("/healthz", headers=REBOUND).status_code == 200
        # A token is checked as always, whatever the Host.
        made = client.post("/v1/tokens", json={"role": "viewer", "name": "v"}).json()
        viewer = {**REBOUND, "Authorization": f"Bearer {made['token']}"}
        assert client.get("/v1/nodes", headers=viewer).status_code == 200


def test_insecure_dev_hosts_lists_more_names(settings: Settings) -> None:
    listed = settings.model_copy(
        update={"insecure_dev": True, "insecure_dev_hosts": "testserver, laptop.lan"}
    )
    with TestClient(create_app(listed, demo=True, background=False)) as client:
        assert client.get("/v1/nodes", headers={"Host": "laptop.lan:8000"}).status_code == 200
        assert client.get("/v1/nodes", headers=REBOUND).status_code == 403


def test_a_token_that_cannot_be_looked_up_is_a_503_not_a_fault(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database token is verified against its row: with the database unreachable that
    is the service's trouble, told as on every other route (503, retry), not a 500."""
    secure = settings.model_copy(
        update={"insecure_dev": False, "api_tokens": "s3cret-0123456789abcdef"}
    )
    with TestClient(create_app(secure, background=False)) as client:
        admin = {"Authorization": "Bearer s3cret-0123456789abcdef"}
        made = client.post("/v1/tokens", json={"role": "viewer", "name": "v"}, headers=admin)

        def unreachable(*_: object) -> None:
            raise sa.exc.OperationalError("SELECT", {}, Exception("connection refused"))

        monkeypatch.setattr(store, "live_token", unreachable)
        answer = client.get(
            "/v1/nodes", headers={"Authorization": f"Bearer {made.json()['token']}"}
        )
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "database_unavailable"
        assert answer.headers["retry-after"] == "5"


# fetch() may send a header with an empty value, and a page that rebound its own name to
# the service makes same-origin calls (no preflight): 'Authorization:' with nothing in it
# was taken as no token, an admin's call, yet skipped the checks of a call without one.
def test_an_empty_authorization_header_is_no_token_for_the_insecure_dev_checks(
    settings: Settings,
) -> None:
    empty = ""
    demo_settings = settings.model_copy(update={"insecure_dev": True})
    with TestClient(create_app(demo_settings, demo=True, background=False)) as client:
        rebound = {**REBOUND, "Authorization": empty}
        cross_site = {**CROSS_SITE, "Authorization": empty}
        calls = [
            ("GET", "/v1/tokens", None, rebound),
            ("POST", "/v1/tokens", b'{"role": "admin", "name": "planted"}', rebound),
            ("POST", "/v1/nodes/h100-b/cordon", None, rebound),
            ("POST", "/v1/nodes/h100-b/cordon", None, cross_site),
        ]
        for method, path, body, headers in calls:
            answer = client.request(method, path, content=body, headers=headers)
            assert answer.status_code == 403, (path, headers, answer.text)
            assert answer.json()["error"]["code"] == "forbidden"
        nodes = client.get("/v1/nodes").json()["nodes"]
        assert not [n["name"] for n in nodes if n["state"] == "cordoned"]
        assert client.get("/v1/tokens").json()["tokens"] == []
        # From a loopback host and this origin it is a call without a token, as before.
        assert client.get("/v1/nodes", headers={"Authorization": empty}).status_code == 200


def test_a_region_agents_snapshot_body_has_the_body_deadline(tmp_path: Path) -> None:
    """A region-scoped agent's snapshot is read by the token check itself (the region it
    claims decides), before the request guard that holds every body to its deadline: a
    body dripped a byte at a time held the connection for as long as the client liked."""
    deadline_s = 1.0
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'drip.sqlite3'}",
        insecure_dev=False,
        bootstrap_admin_token=ADMIN,
        header_timeout_s=deadline_s,
        body_timeout_s=deadline_s,
    )
    app = create_app(settings, background=False)
    with live_server(app, options=uvicorn_options(settings)) as url:
        made = httpx.post(
            f"{url}/v1/tokens",
            json={"role": "agent", "region": "us-east"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert made.status_code == 201, made.text
        host, port = url.removeprefix("http://").split(":")
        head = (
            "PUT /v1/nodes/gpu-001/snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {made.json()['token']}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )
        started = time.monotonic()
        received = b""
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(head.encode())
            sock.setblocking(False)
            while time.monotonic() - started < 6 * deadline_s:
                time.sleep(0.2)
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    sock.send(b" ")  # one more byte of a body that never ends
                    continue
                if not chunk:
                    break  # closed by the service
                received += chunk
        closed_after = time.monotonic() - started
    assert closed_after < deadline_s + 1.5, f"the drip was served for {closed_after:.1f} s"
    head_part, _, body = received.partition(b"\r\n\r\n")
    assert int(head_part.split(b" ", 2)[1]) == 408, received
    assert b"connection: close" in head_part.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout"
    assert error["detail"] == {"limit_s": deadline_s, "part": "body"}


class _RemovedWhileRead:
    """A cluster whose node is removed (a delete heard by the listener thread) after a
    request's auth has seen it there, before it reads the node."""

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster

    def __contains__(self, name: object) -> bool:
        return True  # there when asked

    def node(self, name: str) -> NodeView:
        self.cluster.remove(name)  # gone when read
        return self.cluster.node(name)


def test_a_node_removed_while_its_region_is_read_has_none() -> None:
    """Every REST call naming a node reads its region from memory, without the state lock
    (its own thread may be the event loop's): a node removed between the two reads raised
    UnknownNodeError, answered 500, where the node is now unknown (no region)."""
    cluster = ClusterState()
    cluster.upsert(build_profile("hgx-h100", "h0"))
    state = SimpleNamespace(cluster=_RemovedWhileRead(cluster))
    assert auth.region_checker(state)("h0") is None
