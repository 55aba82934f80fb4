"""Who is acting, for the audit log: set once where a request comes in, read where it is written.

The transports know the caller (REST's token check, gRPC's interceptor) and
the writers of audit rows sit several calls below them, under the one
allocations API that a dozen adapters call (service/allocations/api.py). The
caller is a property of the request, not of each call, so it travels in a
context variable rather than through every signature: asyncio tasks and
``off_loop`` (``asyncio.to_thread``) carry it to the code that writes, and
code no request started (the sweep, the reconcilers) is the service itself.

No project imports: service/auth.py sets it, and everything below reads it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar, Token
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Actor:
    token_id: str | None  # None: the service itself (or a caller let in without a token)
    name: str
    role: str | None
    route: str  # "POST /v1/place", "gRPC Place", "sweep", ...


SERVICE = Actor(None, "topoplace service", None, "internal")

_current: ContextVar[Actor] = ContextVar("topoplace_audit_actor", default=SERVICE)


def current() -> Actor:
    """Who is acting here: the request's caller, else the service itself."""
    return _current.get()


def enter(actor: Actor) -> Token[Actor]:
    """Make ``actor`` the current one; undo with :func:`leave` and the token."""
    return _current.set(actor)


def leave(token: Token[Actor]) -> None:
    _current.reset(token)


@contextlib.contextmanager
def acting(actor: Actor) -> Iterator[Actor]:
    token = enter(actor)
    try:
        yield actor
    finally:
        leave(token)


def service_task(route: str) -> Actor:
    """The service acting on its own, as ``route`` (the sweep, a reconciler)."""
    return Actor(None, SERVICE.name, None, route)
