"""Signatures checked with nothing but the recipe in docs/agent.md, and the key files."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from agent.signing import KeyFileError, NodeKey, canonical_json, verify
from placement.profiles import build_profile

DOCS = Path(__file__).resolve().parents[2] / "docs" / "agent.md"


def documented_verify(public_key_b64: str, snapshot: dict, signature_b64: str) -> None:
    """The verifier docs/agent.md describes, written from the text alone."""
    message = b"topoplace-snapshot-v1\n" + json.dumps(
        snapshot, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64, validate=True))
    key.verify(base64.b64decode(signature_b64, validate=True), message)  # raises if wrong


def test_the_docs_state_the_recipe_used_here() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for fact in ("topoplace-snapshot-v1\\n", "sort_keys=True", 'separators=(",", ":")', "base64"):
        assert fact in text, fact


def test_agent_signature_verifies_with_the_documented_recipe() -> None:
    key = NodeKey.generate()
    snapshot = build_profile(
        "gb200-tray", "tray-ü1".replace("ü", "u"), labels={"team": "ml"}
    ).model_dump(mode="json")
    snapshot["hostname"] = "tray-ü1"  # non-ASCII is written as itself, in UTF-8
    signature = key.sign(snapshot)
    assert len(base64.b64decode(signature)) == 64 and len(signature) == 88
    documented_verify(key.public_key, snapshot, signature)
    # Key order in the sent object does not matter; content does.
    documented_verify(key.public_key, dict(reversed(list(snapshot.items()))), signature)
    assert verify(key.public_key, snapshot, signature)
    tampered = {**snapshot, "seq": snapshot["seq"] + 1}
    with pytest.raises(InvalidSignature):
        documented_verify(key.public_key, tampered, signature)
    assert not verify(key.public_key, tampered, signature)
    assert not verify(NodeKey.generate().public_key, snapshot, signature)


def test_canonical_json_is_compact_sorted_utf8() -> None:
    assert (
        canonical_json({"b": 1, "a": [1.5, 450.0, "é"], "c": None})
        == '{"a":[1.5,450.0,"é"],"b":1,"c":null}'.encode()
    )
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_keygen_files_and_loading(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "node.key"
    key = NodeKey.generate()
    public_path = key.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public_path.read_text().strip() == key.public_key
    assert NodeKey.load(path).public_key == key.public_key
    with pytest.raises(KeyFileError, match="already exists"):
        NodeKey.generate().save(path)
    NodeKey.generate().save(path, overwrite=True)
    assert NodeKey.load(path).public_key != key.public_key


def test_bad_key_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="keygen --key-file"):
        NodeKey.load(tmp_path / "missing.key")
    junk = tmp_path / "junk.key"
    junk.write_text("not a key")
    with pytest.raises(KeyFileError, match=r"junk\.key"):
        NodeKey.load(junk)
