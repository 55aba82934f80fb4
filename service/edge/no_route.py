"""A request that names no route: answered 404 or 405 before the role check, never redirected.

A route without a rule in the access table needs ``admin`` (service/access.py),
so that a route added without one is closed. A request that names no route at
all had no rule either: a typo, a path with a trailing slash (``POST
/v1/place/``), a route asked with a method it does not take. A caller that was
not an admin was told "this call needs the admin role", which sent a scheduler
to look for an admin token for a call that does not exist, while an admin was
redirected (307) to the path without its slash: a write's body sent again to
wherever ``Location`` says, and an answer the agent and the CLI take as an
error. Now such a request is answered as the application answers a path it has
no route for, whoever asks: 405 ``method_not_allowed`` with ``Allow`` (the
methods the table has rules for at that path), or 404 ``not_found``, naming the
route a trailing slash hid. The application does not redirect trailing slashes
(``redirect_slashes=False``, service/app.py). A path the application does route
but the table has no rule for stays an admin's.

Only requests no rule matches come here: the table answers every other one first,
so the routes are walked only on the way to a 404 or 405.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from service import access
from service.errors import MethodNotAllowed, NotFound

NO_ROUTE = "no such route; the API is described at /docs, and GET / lists the links"


class MethodNotTaken(MethodNotAllowed):
    """405, with the methods the route takes (the ``Allow`` header)."""

    def __init__(self, allow: Iterable[str]) -> None:
        super().__init__("the route does not take this method")
        methods = set(allow)
        if "GET" in methods:
            methods.add("HEAD")
        self.allow = sorted(methods)


def _routed(routes: Sequence[BaseRoute], scope: Scope) -> bool:
    return any(route.matches(scope)[0] is not Match.NONE for route in routes)


def check(routes: Sequence[BaseRoute], scope: Scope, path: str) -> None:
    """Raise :class:`MethodNotTaken` or :class:`NotFound` unless the application routes
    ``scope`` (a route the table has no rule for: the table's admin rule then applies).
    ``path``: the request's path below the application's mount point."""
    taken = access.methods_of(path)
    if taken:
        raise MethodNotTaken(taken)
    if _routed(routes, scope):
        return
    trimmed = path.rstrip("/")
    if trimmed and trimmed != path:
        cut = len(path) - len(trimmed)
        without = {**scope, "path": scope["path"][:-cut]}
        if access.methods_of(trimmed) or _routed(routes, without):
            raise NotFound(
                f"no such route: {path}; the API's paths do not end with '/': call {trimmed}",
                {"route": trimmed},
            )
    raise NotFound(NO_ROUTE)
