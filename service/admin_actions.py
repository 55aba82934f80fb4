"""Who may perform an admin action (register, replace or delete a node's key), in one place.

Every admin action calls :func:`require_admin`; it is the one place a table
of roles maps. Today's tokens carry no role, so today's rule is the token
check itself (service/auth.py): a caller with an accepted token is an
admin, and a service started without tokens (development) has only admins.

A :class:`Caller` is what a transport knows of whoever sent the request:
the Authorization header as presented, and the check it is judged by.
``INTERNAL`` is the process itself (the demo cluster it reports).
"""

from __future__ import annotations

from dataclasses import dataclass

from service.auth import TokenCheck, Unauthorized


@dataclass(frozen=True)
class Caller:
    authorization: str | None
    check: TokenCheck | None  # None: the process itself, trusted


INTERNAL = Caller(authorization=None, check=None)


def require_admin(caller: Caller, action: str) -> None:
    """Raise :class:`Unauthorized` unless ``caller`` may ``action`` (for the message)."""
    if caller.check is None:
        return
    try:
        caller.check.verify(caller.authorization)
    except Unauthorized as refused:
        raise Unauthorized(f"{action} is an admin action: {refused.message}") from None


def is_admin(caller: Caller) -> bool:
    try:
        require_admin(caller, "this")
    except Unauthorized:
        return False
    return True
