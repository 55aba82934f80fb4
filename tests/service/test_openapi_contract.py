"""The committed OpenAPI document (`openapi/openapi.json`) is the API the code serves."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from topoplace import openapi_cmd
from topoplace.openapi_cmd import render_openapi

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
REGENERATE = "regenerate it from the repository root with `.venv/bin/topoplace openapi`"


@pytest.fixture(scope="module")
def rendered() -> str:
    return render_openapi()


@pytest.fixture(scope="module")
def schema(rendered: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(rendered)
    return parsed


def test_committed_document_matches_the_code(rendered: str) -> None:
    assert COMMITTED.exists(), f"{COMMITTED} is missing; {REGENERATE}"
    committed = COMMITTED.read_text(encoding="utf-8")
    if committed != rendered:
        ours, theirs = json.loads(committed), json.loads(rendered)
        changed = sorted(set(ours["paths"]) ^ set(theirs["paths"]))
        pytest.fail(
            f"openapi/openapi.json differs from the API the code serves; {REGENERATE}"
            " and commit it"
            + (f" (paths added or removed: {', '.join(changed)})" if changed else ""),
            pytrace=False,
        )


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/v1/place", "post"),
        ("/v1/score", "post"),
        ("/v1/nodes/{name}/snapshot", "put"),
        ("/v1/allocations/{allocation_id}/release", "post"),
        ("/healthz", "get"),
        ("/readyz", "get"),
    ],
)
def test_contract_paths(schema: dict[str, Any], path: str, method: str) -> None:
    assert method in schema["paths"].get(path, {}), f"{method.upper()} {path} is not documented"


def test_place_documents_created_and_replayed(schema: dict[str, Any]) -> None:
    responses = schema["paths"]["/v1/place"]["post"]["responses"]
    assert {"201", "200"} <= set(responses)
    parameters = schema["paths"]["/v1/place"]["post"]["parameters"]
    assert any(p["in"] == "header" and p["name"] == "idempotency-key" for p in parameters)


def test_rendering_is_canonical(rendered: str) -> None:
    assert rendered.endswith("}\n")
    assert rendered == json.dumps(json.loads(rendered), indent=2, sort_keys=True) + "\n"


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="topoplace")
    openapi_cmd.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["openapi", *argv])
    code: int = args.func(args)
    return code


def test_command_writes_then_check_passes(tmp_path: Path, rendered: str) -> None:
    out = tmp_path / "api" / "openapi.json"
    assert _run("--output", str(out)) == 0
    assert out.read_text(encoding="utf-8") == rendered
    assert _run("--output", str(out), "--check") == 0


def test_check_fails_on_a_stale_file(
    tmp_path: Path, rendered: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "openapi.json"
    out.write_text(rendered.replace('"title": "topoplace"', '"title": "old"'), encoding="utf-8")
    assert _run("--output", str(out), "--check") == 1
    err = capsys.readouterr().err
    assert "is out of date; run `topoplace openapi`" in err
    assert '-    "title": "old",' in err and '+    "title": "topoplace",' in err
    assert out.read_text(encoding="utf-8") != rendered  # --check writes nothing


def test_check_fails_on_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("--output", str(tmp_path / "none.json"), "--check") == 1
    assert "does not exist; run `topoplace openapi`" in capsys.readouterr().err
