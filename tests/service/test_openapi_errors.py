"""The committed document declares the service's error shape for every status it answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.auth import OPEN_PATHS

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
ERROR = {"$ref": "#/components/schemas/Error"}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(COMMITTED.read_text(encoding="utf-8"))
    return loaded


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(p, m, op) for p, ops in schema["paths"].items() for m, op in ops.items()]


def test_fastapis_validation_shape_is_gone(schema: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in json.dumps(schema)
    assert set(schema["components"]["schemas"]["Error"]["required"]) == {"error"}


def test_every_operation_declares_the_error_shape(schema: dict[str, Any]) -> None:
    for path, method, operation in _operations(schema):
        responses = operation["responses"]
        expected = {"400", "413", "422", "500"} | ({"401"} if path not in OPEN_PATHS else set())
        if "{" in path:
            expected.add("404")
        if method in {"post", "put", "delete"}:
            expected.add("409")
        if path != "/healthz":
            expected.add("503")
        assert expected <= set(responses), f"{method.upper()} {path}: {sorted(responses)}"
        for status in expected:
            declared = responses[status]["content"]["application/json"]["schema"]
            assert declared == ERROR or ERROR in declared.get("anyOf", ()), (path, status)


def test_string_parameters_refuse_control_characters(schema: dict[str, Any]) -> None:
    for path, method, operation in _operations(schema):
        for parameter in operation.get("parameters", ()):
            options = parameter["schema"].get("anyOf", [parameter["schema"]])
            for option in options:
                if option.get("type") == "string" and "enum" not in option:
                    assert "pattern" in option, (method, path, parameter["name"])
