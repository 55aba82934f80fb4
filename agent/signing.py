"""Snapshot signatures: the node's Ed25519 key, the canonical encoding, the signed bytes.

The format is a contract with every future verifier (docs/agent.md, "Signing
format"), so it is spelled out here once and nowhere else:

- the signed value is the ``snapshot`` object of ``PUT /v1/nodes/{name}/snapshot``
  in the snapshot model's JSON form (every field, defaults included; times in
  UTC with ``Z``), which is what the agent sends and what the service verifies;
- its canonical encoding is JSON with object keys sorted by code point, no
  whitespace, non-ASCII characters written as themselves, UTF-8; integers as
  decimal digits, other numbers as Python's ``repr`` of the double (``450.0``,
  ``0.1``); NaN and infinities are refused;
- the signed message is ``MESSAGE_PREFIX`` followed by those bytes, so a
  signature over a snapshot can never be mistaken for one over anything else;
- the signature is the 64-byte Ed25519 signature (RFC 8032) in standard
  base64 with padding (RFC 4648, section 4): 88 characters.

Keys on disk: the private key is PKCS#8 PEM without a passphrase (what
``openssl genpkey -algorithm ed25519`` writes), readable by its owner only;
the public key is the raw 32-byte key in standard base64 on one line, which
is also what the service stores.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

MESSAGE_PREFIX = b"topoplace-snapshot-v1\n"
PUBLIC_KEY_SUFFIX = ".pub"


class KeyFileError(ValueError):
    """A key file that cannot be read, written or understood; the message names the file."""


def canonical_json(value: Any) -> bytes:
    """The canonical encoding of a JSON value (see the module docstring)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def signed_message(snapshot: Mapping[str, Any]) -> bytes:
    """The exact bytes an agent signs for ``snapshot`` (the JSON object it sends)."""
    return MESSAGE_PREFIX + canonical_json(snapshot)


def encode_public_key(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def decode_public_key(text: str) -> Ed25519PublicKey:
    """A public key from its base64 form; ValueError if it is not 32 bytes of base64."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64: {exc}") from None
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, this one is {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True)
class NodeKey:
    """A node's signing key."""

    private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> NodeKey:
        return cls(Ed25519PrivateKey.generate())

    @property
    def public_key(self) -> str:
        """The public key as registered with the service (base64 of the raw 32 bytes)."""
        return encode_public_key(self.private.public_key())

    def sign(self, snapshot: Mapping[str, Any]) -> str:
        """The base64 Ed25519 signature over ``signed_message(snapshot)``."""
        return base64.b64encode(self.private.sign(signed_message(snapshot))).decode("ascii")

    @classmethod
    def load(cls, path: Path) -> NodeKey:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise KeyFileError(
                f"cannot read the key file {path}: {exc.strerror or exc}"
                f" (create one with: topoplace agent keygen --key-file {path})"
            ) from None
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise KeyFileError(f"{path} is not an unencrypted PEM private key: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)

    def save(self, path: Path, *, overwrite: bool = False) -> Path:
        """Write the private key to ``path`` (mode 0600) and the public key next to it.

        Returns the public key's path. Refuses to replace an existing key
        unless ``overwrite``: a new key means re-registering the node.
        """
        public_path = path.with_name(path.name + PUBLIC_KEY_SUFFIX)
        if not overwrite:
            for existing in (path, public_path):
                if existing.exists():
                    raise KeyFileError(f"{existing} already exists (use --force to replace it)")
        pem = self.private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Created with the final mode, so the key is never readable by others.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(pem)
            os.chmod(path, 0o600)
            public_path.write_text(self.public_key + "\n", encoding="ascii")
        except OSError as exc:
            raise KeyFileError(f"cannot write {exc.filename or path}: {exc.strerror}") from None
        return public_path


def verify(public_key_b64: str, snapshot: Mapping[str, Any], signature_b64: str) -> bool:
    """True when ``signature_b64`` is the node's signature over ``snapshot``."""
    try:
        signature = base64.b64decode(signature_b64, validate=True)
        decode_public_key(public_key_b64).verify(signature, signed_message(snapshot))
    except (ValueError, binascii.Error, InvalidSignature):
        return False
    return True
