"""Bearer-token authentication, one check for every transport.

Tokens come from ``TOPOPLACE_API_TOKENS`` (comma-separated) and/or
``TOPOPLACE_API_TOKEN_FILE`` (one per line, ``#`` comments). With neither set
the service is open, as on a laptop or behind a mesh that authenticates for
it; the log says so at start. REST reads ``Authorization: Bearer TOKEN``;
other transports pass the same header value to :meth:`TokenCheck.verify`.

Health probes and the API's own documentation stay open: a kubelet or a load
balancer cannot present a token, and the schema is not a secret.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ServiceError
from service.responses import error_response

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/openapi.json"})


class Unauthorized(ServiceError):
    status = 401
    code = "unauthorized"


def read_token_file(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the token file {path}: {exc.strerror}") from exc
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


class TokenCheck:
    """Compares a presented token with every configured one in constant time."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._tokens = [t.encode() for t in tokens if t]
        self._open_prefixes: tuple[str, ...] = ()

    def open_prefix(self, prefix: str) -> None:
        """Let paths under ``prefix`` through without a token (a caller that cannot send one,
        such as kube-scheduler's extender client, protected by mTLS or network policy)."""
        self._open_prefixes += (prefix,)

    def is_open(self, path: str) -> bool:
        return path in OPEN_PATHS or path.startswith(self._open_prefixes)

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def verify(self, authorization: str | None) -> None:
        """Raise :class:`Unauthorized` unless ``authorization`` is ``Bearer <known token>``."""
        if not self._tokens:
            return
        if not authorization:
            raise Unauthorized(
                "this service requires a token: send 'Authorization: Bearer TOKEN'"
                " (the client reads it from --token-file or TOPOPLACE_TOKEN)"
            )
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise Unauthorized("the Authorization header must be 'Bearer TOKEN'")
        candidate = presented.strip().encode()
        # Check every token, not the first match only, so timing says nothing.
        matched = False
        for token in self._tokens:
            matched |= hmac.compare_digest(candidate, token)
        if not matched:
            raise Unauthorized("the token is not one this service accepts")


class RequireToken:
    """ASGI middleware applying :class:`TokenCheck` to every HTTP request but the open paths."""

    def __init__(self, app: ASGIApp, check: TokenCheck) -> None:
        self.app = app
        self.check = check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.check.enabled and not self.check.is_open(scope["path"]):
            header = None
            for key, value in scope.get("headers", ()):
                if key == b"authorization":
                    header = value.decode("latin-1")
                    break
            try:
                self.check.verify(header)
            except Unauthorized as error:
                response = error_response(error)
                response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
