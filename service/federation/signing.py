"""Signed region summaries: the agent's Ed25519 keys and canonical JSON, another message.

A region signs its summary exactly as a node agent signs its snapshot
(agent/signing.py: the same key files, the same canonical encoding, the
same base64 signature), over a message with its own prefix, so that a
signature over a snapshot can never pass for one over a summary, nor the
reverse.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature

from agent.signing import NodeKey, canonical_json, decode_public_key

MESSAGE_PREFIX = b"topoplace-region-summary-v1\n"


def summary_message(summary: Mapping[str, Any]) -> bytes:
    return MESSAGE_PREFIX + canonical_json(summary)


def sign_summary(key: NodeKey, summary: Mapping[str, Any]) -> str:
    return base64.b64encode(key.private.sign(summary_message(summary))).decode("ascii")


def verify_summary(public_key_b64: str, summary: Mapping[str, Any], signature_b64: str) -> bool:
    try:
        signature = base64.b64decode(signature_b64, validate=True)
        decode_public_key(public_key_b64).verify(signature, summary_message(summary))
    except (ValueError, binascii.Error, InvalidSignature):
        return False
    return True
