"""Who may perform an admin action (register, replace or delete a node's key), in one place.

Every admin action calls :func:`require_admin`; it maps the action onto the
role table (service/access.py): the caller's role must grant the ``admin``
permission, else 403 ``forbidden``. Callers the service lets in without a
token under ``--insecure-dev`` are admins (service/auth.py ``INSECURE``).

A :class:`Caller` is what a transport knows of whoever sent the request: the
:class:`~service.auth.Principal` its token check authenticated (REST's
RequireToken middleware, gRPC's interceptor). ``INTERNAL`` is the process
itself (the demo cluster it reports): trusted, with no token.
"""

from __future__ import annotations

from dataclasses import dataclass

from service import access
from service.access import Permission
from service.auth import REST_FIELDS, Authenticator, Forbidden, NodeFields, Principal


@dataclass(frozen=True)
class Caller:
    principal: Principal | None  # None: the process itself, trusted
    # How its transport names the node and the snapshot's region: a refusal names them.
    fields: NodeFields = REST_FIELDS

    @classmethod
    def authenticated(
        cls, check: Authenticator, authorization: str | None, fields: NodeFields = REST_FIELDS
    ) -> Caller:
        """The caller an Authorization header stands for (blocking on a first sight of a
        database token; raises ``Unauthorized`` for an unknown one)."""
        return cls(check.authenticate(authorization), fields)


INTERNAL = Caller(principal=None)


def require_admin(caller: Caller, action: str) -> None:
    """Raise :class:`Forbidden` unless ``caller`` may ``action`` (named in the message)."""
    principal = caller.principal
    if principal is None or Permission.ADMIN in access.GRANTS[principal.role]:
        return
    raise Forbidden(
        f"{action} is an admin action; the token has the {principal.role} role",
        {"needed": [role.value for role in access.roles_with(Permission.ADMIN)]},
    )


def is_admin(caller: Caller) -> bool:
    try:
        require_admin(caller, "this")
    except Forbidden:
        return False
    return True
