"""A token revoked while its request is in flight: refused before the write lands.

The token is checked when a request's headers arrive (service/auth.py; gRPC's
interceptor, service/grpc/auth.py, when its call starts). What the request asks
for is written later: after a body a slow client sends for seconds, after a
wait on the state lock. A revocation committed meanwhile, through this process
(which drops the token at once) or through another replica (which this process
hears of within ``REVOCATION_POLL_S``, service/auth.py), must not let that write
land. So the check's admission travels with the request in a context variable
(as the audit actor does: asyncio and ``off_loop`` carry it to the worker thread
that writes), with the revocation count the check saw, and is checked again:

- REST, once the whole body has arrived (service/edge/guard.py), before any
  route reads it: 401 ``unauthorized`` in the one error shape;
- gRPC, once the call's request message has arrived, before the method runs:
  UNAUTHENTICATED;
- where a write is about to be made, after the waits that come before it (the
  state lock): a reservation's choice, an allocation's transition, a node's
  snapshot, heartbeat, cordon or key;
- a reservation once more on the group committer's thread, just before its rows
  are written (service/allocations/group_commit.py): it may wait there for
  other batches after its choice was made.

Cheap on purpose: the token check counts the revocations this process has heard
of (``Revocations.generation``). While the count is the one seen when the
request was let in, nothing was revoked, and the recheck is one comparison; a
request no token check let in (the sweep, a reconciler, a call from inside the
process) has no admission and is never refused. Only when the count moved is the
token's id looked up in the revoked set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from service.tokens.presented import Unauthorized


class Revocations(Protocol):
    """What the token check (service/auth.py Authenticator) tells of revocations."""

    @property
    def generation(self) -> int:
        """How many times this process has heard of revoked tokens; only grows."""
        ...

    def revoked_id(self, token_id: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Admission:
    revocations: Revocations
    token_id: str
    # Read before the token was looked up, so that a revocation during the lookup
    # counts as one made meanwhile.
    generation: int


_admitted: ContextVar[Admission | None] = ContextVar("topoplace_admitted", default=None)


@contextlib.contextmanager
def admitted(admission: Admission) -> Iterator[None]:
    """The request running in this block was let in as ``admission`` says."""
    reset = _admitted.set(admission)
    try:
        yield
    finally:
        _admitted.reset(reset)


def current() -> Admission | None:
    """This request's admission, for a write made on another thread (the group
    committer's) to be checked with :func:`refusal_of` just before it lands."""
    return _admitted.get()


def refusal() -> Unauthorized | None:
    """The refusal of this request when its token was revoked since it was let in."""
    return refusal_of(_admitted.get())


def refusal_of(admission: Admission | None) -> Unauthorized | None:
    """The refusal of the request let in as ``admission`` when its token was revoked
    since; None for one no token check let in."""
    if admission is None or admission.revocations.generation == admission.generation:
        return None  # nearly every request: nothing was revoked meanwhile
    if not admission.revocations.revoked_id(admission.token_id):
        return None
    return Unauthorized(
        "the token was revoked while this request was in flight: nothing was written"
    )


def refuse_if_revoked() -> None:
    """Raise :class:`Unauthorized` when this request's token was revoked since it was let
    in. Called just before a write, after whatever the request waited on."""
    refused = refusal()
    if refused is not None:
        raise refused
