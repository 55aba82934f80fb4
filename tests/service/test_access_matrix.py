"""Role x endpoint: every REST route and gRPC method, from the app's own tables.

The routes come from the application (its OpenAPI paths, built from its
route table, and the direct routes) and the methods from the gRPC service
descriptor, so a route or method added without a rule in service/access.py
fails here. Each route is also called once with each query parameter it
declares (``?replace=true`` of a key, ``/score``'s ``limit`` and ``offset``),
judged by the rule that query selects. Each cell is allowed (anything but
401/403: the call may still be a 404 or a 422, which is the handler's answer,
past the check) or 403 ``forbidden``; without a token every one is 401.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fastapi.testclient import TestClient

from service import access
from service.access import Permission, Role
from service.app import create_app
from service.grpc.gen import topoplace_pb2 as pb
from service.settings import Settings
from service.slurm import endpoints as slurm_routes
from tests.service.conftest import ADMIN_TOKEN, secured
from tests.service.grpc.conftest import Running, reason, start

AGENT_NODE = "node-a"
OPEN = {
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
}


def app_routes(client: TestClient) -> list[tuple[str, str]]:
    """(method, path template) of every route the application answers."""
    return sorted({(m, p) for m, p, _ in app_calls(client)})


SAMPLES = {"boolean": "true", "integer": "1", "number": "1"}


def app_calls(client: TestClient) -> list[tuple[str, str, str]]:
    """(method, path template, query string) of every route the application answers: once
    without a query, and once with each query parameter it declares."""
    app = client.app
    found = {(m, p, "") for m, p in slurm_routes.DIRECT}
    for path, operations in app.openapi()["paths"].items():  # type: ignore[attr-defined]
        for method, operation in operations.items():
            found.add((method.upper(), path, ""))
            for parameter in operation.get("parameters", ()):
                if parameter["in"] != "query":
                    continue
                kinds = [parameter["schema"].get("type")]
                kinds += [o.get("type") for o in parameter["schema"].get("anyOf", ())]
                sample = next((SAMPLES[k] for k in kinds if k in SAMPLES), "x")
                found.add((method.upper(), path, f"{parameter['name']}={sample}"))
    return sorted(c for c in found if c[1] not in OPEN)


def concrete(path: str) -> str:
    return re.sub(r"\{name\}", AGENT_NODE, re.sub(r"\{(?!name\})[^}]+\}", "x", path))


def make_tokens(client: TestClient) -> dict[Role, str]:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    tokens = {}
    for role in Role:
        body: dict[str, object] = {"role": role.value, "name": f"matrix {role}"}
        if role is Role.AGENT:
            body["nodes"] = [AGENT_NODE]
        if role is Role.REGION:
            body["region"] = "x"  # the {region} of a concrete path
        created = client.post("/v1/tokens", json=body, headers=admin)
        assert created.status_code == 201, created.text
        tokens[role] = created.json()["token"]
    return tokens


@pytest.fixture
def secured_client(tmp_path: Path) -> Iterator[TestClient]:
    settings = secured(Settings(database_url=f"sqlite:///{tmp_path / 'matrix.sqlite3'}"))
    with TestClient(create_app(settings, background=False)) as client:
        yield client


def test_every_route_has_a_rule_and_every_rule_a_route(secured_client: TestClient) -> None:
    calls = app_calls(secured_client)
    missing = [(m, p, q) for m, p, q in calls if access.rest_rule(m, concrete(p), q).rule is None]
    assert not missing, f"routes without a rule in service/access.py: {missing}"
    matched = {access.rest_rule(m, concrete(p), q).rule for m, p, q in calls}
    stale = [r for r in access.REST_RULES if r not in matched]
    assert not stale, f"rules for routes (or query parameters) that do not exist: {stale}"


def test_the_query_selects_the_admin_rule_of_a_key() -> None:
    key = f"/v1/nodes/{AGENT_NODE}/key"
    assert access.rest_rule("PUT", key).permission is Permission.REPORT
    for query in ("replace=true", "replace=1", "replace=yes", "replace=false&replace=true"):
        assert access.rest_rule("PUT", key, query).permission is Permission.ADMIN, query
    for query in ("replace=false", "replace=0", "other=true"):
        assert access.rest_rule("PUT", key, query).permission is Permission.REPORT, query


def test_every_grpc_method_has_a_rule() -> None:
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["Topoplace"].methods}
    assert methods == set(access.GRPC_RULES)


def test_rest_role_matrix(secured_client: TestClient) -> None:
    tokens = make_tokens(secured_client)
    cells = 0
    for method, template, query in app_calls(secured_client):
        path = concrete(template)
        url = f"{path}?{query}" if query else path
        permission = access.rest_rule(method, path, query).permission
        anonymous = secured_client.request(method, url, json={})
        assert anonymous.status_code == 401, (method, url)
        assert anonymous.json()["error"]["code"] == "unauthorized"
        for role, token in tokens.items():
            if role is Role.ADMIN and path.startswith("/v1/tokens/"):
                continue  # revoking "x": a 404, but skip mutating the token table
            headers = {"Authorization": f"Bearer {token}"}
            answer = secured_client.request(method, url, json={}, headers=headers)
            cells += 1
            if permission in access.GRANTS[role]:
                assert answer.status_code not in (401, 403), (role, method, url, answer.text)
            else:
                assert answer.status_code == 403, (role, method, url, answer.text)
                error = answer.json()["error"]
                assert error["code"] == "forbidden"
                needed = access.roles_with(permission)
                assert all(r.value in error["message"] for r in needed), error["message"]
    assert cells >= 4 * 30


@pytest.fixture
def grpc_running(tmp_path: Path) -> Iterator[Running]:
    settings = secured(Settings(database_url=f"sqlite:///{tmp_path / 'grpc.sqlite3'}"))
    yield from start(settings)


def _call(running: Running, method: str, metadata: tuple[tuple[str, str], ...]) -> grpc.RpcError:
    """Call ``method`` with an empty request; the error it ends with (or None-like OK)."""
    descriptor = pb.DESCRIPTOR.services_by_name["Topoplace"].methods_by_name[method]
    request_type = getattr(pb, descriptor.input_type.name)
    request = (
        request_type(node=AGENT_NODE)
        if "node" in request_type.DESCRIPTOR.fields_by_name
        else request_type()
    )
    stub_method = getattr(running.stub, method)
    try:
        if descriptor.server_streaming:
            stream = stub_method(request, metadata=metadata, timeout=5)
            next(stream)
            stream.cancel()
        else:
            stub_method(request, metadata=metadata, timeout=5)
    except grpc.RpcError as error:
        return error
    return None  # type: ignore[return-value]


def test_grpc_role_matrix(grpc_running: Running) -> None:
    tokens = make_tokens(grpc_running.rest)
    for method, permission in access.GRPC_RULES.items():
        error = _call(grpc_running, method, ())
        assert error is not None and error.code() == grpc.StatusCode.UNAUTHENTICATED, method
        for role, token in tokens.items():
            error = _call(grpc_running, method, (("authorization", f"Bearer {token}"),))
            refused = error is not None and error.code() in (
                grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.PERMISSION_DENIED,
            )
            if permission in access.GRANTS[role]:
                assert not refused, (role, method, error)
            else:
                assert refused and error.code() == grpc.StatusCode.PERMISSION_DENIED, (role, method)
                assert reason(error) == "forbidden"


# Each gRPC method and the REST call doing the same (Watch streams what the reads list).
REST_TWINS = {
    "ReportSnapshot": ("PUT", "/v1/nodes/{name}/snapshot"),
    "Heartbeat": ("POST", "/v1/nodes/{name}/heartbeat"),
    "ListNodes": ("GET", "/v1/nodes"),
    "GetNode": ("GET", "/v1/nodes/{name}"),
    "Place": ("POST", "/v1/place"),
    "Score": ("POST", "/v1/score"),
    "GetAllocation": ("GET", "/v1/allocations/{allocation_id}"),
    "ListAllocations": ("GET", "/v1/allocations"),
    "ConfirmAllocation": ("POST", "/v1/allocations/{allocation_id}/confirm"),
    "ExtendAllocation": ("POST", "/v1/allocations/{allocation_id}/extend"),
    "ReleaseAllocation": ("POST", "/v1/allocations/{allocation_id}/release"),
    "ReleaseJob": ("POST", "/v1/jobs/{job_id}/release"),
    "Watch": ("GET", "/v1/allocations"),
}


def test_every_grpc_method_needs_what_its_rest_twin_needs() -> None:
    assert set(REST_TWINS) == set(access.GRPC_RULES)
    for method, (verb, template) in REST_TWINS.items():
        rule = access.rest_rule(verb, concrete(template)).rule
        assert rule is not None and rule.path == template, (method, template)
        assert access.GRPC_RULES[method] is rule.permission, method


def test_the_docs_show_the_table() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert access.markdown_table() in docs, (
        "docs/security.md's role table is out of date: paste service.access.markdown_table()"
    )


def test_roles_grant_what_docs_say() -> None:
    assert access.GRANTS[Role.VIEWER] == {Permission.READ}
    assert Permission.REPORT not in access.GRANTS[Role.SCHEDULER]
    assert access.GRANTS[Role.ADMIN] == set(Permission)
