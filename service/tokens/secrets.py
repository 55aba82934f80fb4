"""The token format and its hash.

A token is ``tpp_<id>_<secret>``: the id finds the row in one indexed
read, and the secret is checked against one scrypt hash (the standard
library's ``hashlib.scrypt``, memory-hard, salted per token). Only the hash
is stored; the secret is shown once, when the token is made.

scrypt costs tens of milliseconds by design, so each process keeps the
tokens it has verified in memory, keyed by their SHA-256 (service/auth.py):
a request pays a dictionary lookup, not a hash.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "tpp"
ID_BYTES = 6  # 12 hex characters: ids are not secret, only unique
SECRET_BYTES = 32
# scrypt's cost: 16 MiB and about 40 ms a verification on one core.
N, R, P = 2**14, 8, 1
MAXMEM = 64 * 1024 * 1024

# Values no deployment may use as a token: the placeholders of examples and
# manifests, and words a person types when asked for "a secret".
KNOWN_DEFAULTS = frozenset(
    {
        "changeme",
        "change-me",
        "replace-me",
        "secret",
        "token",
        "password",
        "admin",
        "topoplace",
        "test",
        "default",
    }
)
MIN_STATIC_LENGTH = 16


def new_id() -> str:
    return secrets.token_hex(ID_BYTES)


def new_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def compose(token_id: str, secret: str) -> str:
    return f"{PREFIX}_{token_id}_{secret}"


def split(token: str) -> tuple[str, str] | None:
    """(id, secret) of a ``tpp_`` token; None for anything else."""
    prefix, _, rest = token.partition("_")
    token_id, _, secret = rest.partition("_")
    if prefix != PREFIX or len(token_id) != 2 * ID_BYTES or not secret:
        return None
    return token_id, secret


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_secret(secret: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=N, r=R, p=P, maxmem=MAXMEM, dklen=32)
    return f"scrypt${N}${R}${P}${_b64(salt)}${_b64(digest)}"


def verify_secret(secret: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        expected = base64.b64decode(digest)
        got = hashlib.scrypt(
            secret.encode(),
            salt=base64.b64decode(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            maxmem=MAXMEM,
            dklen=len(expected),
        )
    except ValueError:
        return False
    return hmac.compare_digest(got, expected)


def weak_reason(token: str) -> str | None:
    """Why a configured (static) token may not be used; None when it may."""
    if not token.strip():
        return "it is empty"
    if token.strip().lower() in KNOWN_DEFAULTS:
        return "it is a well-known default"
    if len(token) < MIN_STATIC_LENGTH:
        return f"it is shorter than {MIN_STATIC_LENGTH} characters"
    return None
