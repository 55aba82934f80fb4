"""The error shape, declared in the OpenAPI document for every status an operation answers.

FastAPI documents only its own 422 (``HTTPValidationError``, a shape the
service never sends) and nothing else; a client generated from that
misreads every error. Here, once the document is built, every operation
gets the service's ``Error`` schema for each status it can answer:

- every operation: 400, 408, 413 and 414 (the edge checks, service.edge),
  422 (validation, including control characters in any parameter), 500;
- every operation but the probes: 429 (the rate limit, service.edge.rate_limit);
- every operation but /healthz: 503 (the database is down);
- operations behind the token check: 401, and 403 (role or scope, service/access.py;
  admin actions, service/admin_actions.py; snapshot signatures,
  service/nodes/signatures.py), with the bearer security scheme;
- operations with path parameters: 404; operations that change state: 409, and
  507 (the database has no space to write: service/database_unreachable.py).

Every string parameter (path, query, header) is declared without control
characters, as the request guard enforces (request bodies declare it per
field, from ``placement.text.Text``).

/readyz keeps its own 503 body (``{"status": "loading"}``) beside the error
shape it gives when the database is down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from placement.text import PLAIN_PATTERN
from service.auth import OPEN_PATHS
from service.edge.rate_limit import UNLIMITED_PATHS

ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "description": "The service's one error shape; clients switch on error.code.",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "detail"],
            "properties": {
                "code": {"type": "string", "description": "stable, e.g. invalid_request"},
                "message": {"type": "string", "description": "for people"},
                "detail": {"type": "object", "description": "per code, e.g. the field"},
            },
        }
    },
}
ERROR_REF = {"$ref": "#/components/schemas/Error"}
DESCRIPTIONS = {
    400: "the request cannot be understood",
    401: "no token, or not one this service accepts",
    403: (
        "refused: the token's role or scope does not allow this call (forbidden, or an"
        " admin action such as replacing a node's key); or a snapshot not signed by the"
        " node's registered key (bad_signature, node_key_required)"
    ),
    408: "the headers or body arrived too slowly; the connection is closed",
    404: "no such node, allocation or job",
    409: "the state says no: nothing fits now (Retry-After), or a conflicting change",
    413: "the body is over the limit",
    414: "the path and query are over the limit",
    422: "a field, parameter or header is invalid, or the request could never fit",
    429: "over the request rate of this token (Retry-After)",
    500: "a fault of the service",
    503: "the database cannot be reached (Retry-After)",
    507: "the database has no space to write (disk full); nothing was written",
}
_MUTATIONS = frozenset({"post", "put", "patch", "delete"})
_UNUSED = ("HTTPValidationError", "ValidationError")


def _statuses(path: str, method: str) -> list[int]:
    statuses = [400, 408, 413, 414, 422, 500]
    if path != "/healthz":
        statuses.append(503)
    if path not in UNLIMITED_PATHS:
        statuses.append(429)
    if path not in OPEN_PATHS:
        statuses += [401, 403]
    if "{" in path:
        statuses.append(404)
    if method in _MUTATIONS:
        statuses += [409, 507]
    return sorted(statuses)


def _error_content(existing: dict[str, Any] | None) -> dict[str, Any]:
    schema = (existing or {}).get("application/json", {}).get("schema")
    if schema and schema != ERROR_REF and "HTTPValidationError" not in str(schema):
        return {"application/json": {"schema": {"anyOf": [ERROR_REF, schema]}}}
    return {"application/json": {"schema": ERROR_REF}}


def add_error_responses(schema: dict[str, Any]) -> dict[str, Any]:
    """Declare the error shape in ``schema`` (an OpenAPI document), in place; returns it."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in _UNUSED:
        schemas.pop(name, None)
    schemas["Error"] = ERROR_SCHEMA
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "an API token (docs/security.md): its role decides what it may call",
        }
    }
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for status in _statuses(path, method):
                current = responses.get(str(status), {})
                responses[str(status)] = {
                    "description": current.get("description") or DESCRIPTIONS[status],
                    "content": _error_content(current.get("content")),
                }
                if status == 422:
                    responses["422"]["description"] = DESCRIPTIONS[422]
            if path not in OPEN_PATHS:
                operation["security"] = [{"bearer": []}]
            for parameter in operation.get("parameters", ()):
                _plain_strings(parameter.get("schema", {}))
    return schema


def _plain_strings(schema: dict[str, Any]) -> None:
    if schema.get("type") == "string" and "enum" not in schema and "const" not in schema:
        schema.setdefault("pattern", PLAIN_PATTERN)
    for option in schema.get("anyOf", ()):
        _plain_strings(option)


def declare_errors(app: FastAPI) -> None:
    """Make ``app.openapi()`` answer the document with the error shape declared."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_error_responses(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
