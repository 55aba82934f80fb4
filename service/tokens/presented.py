"""The token an ``Authorization: Bearer TOKEN`` header presents, and its digest.

One reading for every caller of it: the token check (service/auth.py) and the
request rate's buckets (service/edge/rate_limit.py, service/grpc/rate_limit.py).
The check accepts the scheme in any case and spaces around the token, so a
bucket keyed on the header as sent would be a new one for each spelling of one
token; keyed on the digest of the token as read here, it is the token's.
"""

from __future__ import annotations

import hashlib

from service.errors import ServiceError


class Unauthorized(ServiceError):
    status = 401
    code = "unauthorized"


def read(authorization: str) -> str | None:
    """The token a header presents, None when it is not ``Bearer TOKEN``: the one reading."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if token and scheme.lower() == "bearer" else None


def presented(authorization: str | None) -> str:
    """The token ``authorization`` presents; raises :class:`Unauthorized` for a missing
    header or one that is not ``Bearer TOKEN``."""
    if not authorization:
        raise Unauthorized(
            "this service requires a token: send 'Authorization: Bearer TOKEN'"
            " (the client reads it from --token-file or TOPOPLACE_TOKEN)"
        )
    token = read(authorization)
    if token is None:
        raise Unauthorized("the Authorization header must be 'Bearer TOKEN'")
    return token


def digest(token: str) -> bytes:
    """What a token is known by in memory (the principals' cache, the rate's buckets):
    never the token itself."""
    return hashlib.sha256(token.encode()).digest()


def identity(authorization: str | bytes | None) -> bytes | None:
    """The :func:`digest` of the token ``authorization`` presents (a REST header's raw
    bytes read as latin-1, as the token check reads them); None without one."""
    if not authorization:
        return None
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    token = read(authorization)
    return None if token is None else digest(token)
