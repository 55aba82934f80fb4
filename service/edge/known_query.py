"""Query parameters a route does not declare, or declares once and gets twice: refused.

The router reads the parameters a route declares and drops the rest, and of one
given twice it keeps the last. So a misspelt filter (``GET
/v1/allocations?jobid=a``) answered every allocation instead of job a's, a
script that releases what it lists then released them all, and ``?job_id=a&job_id=b``
answered job b's alone. Each is now 422 ``invalid_request`` naming the parameter
(``detail.field`` ``query.NAME``) and, for an unknown one, the parameters the route
takes. No route of the general API declares a list in its query, so a repeat is
always a mistake.

A dependency of the general API's routers (service/app.py), not a middleware: the
route's declared parameters are known only once the router has matched it. Routes
served before the router (service/direct_routes.py) call ``check_query`` with theirs.
"""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant

from service.errors import InvalidRequest


def _declared(dependant: Dependant) -> frozenset[str]:
    """The query parameter names ``dependant`` and its sub-dependencies read."""
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _declared(sub)
    return frozenset(names)


def check_query(request: Request, declared: frozenset[str]) -> None:
    """Refuse a query parameter not in ``declared``, or one given twice."""
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name not in declared:
            takes = ", ".join(sorted(declared)) if declared else "none"
            raise InvalidRequest(
                f"query.{name}",
                f"this route takes no query parameter {name!r} (it takes: {takes})",
            )
        if name in seen:
            raise InvalidRequest(f"query.{name}", f"{name!r} is given more than once")
        seen.add(name)


def _check(request: Request) -> None:
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:  # not a FastAPI route: nothing declared to check against
        return
    check_query(request, _declared(dependant))


KNOWN_QUERY = Depends(_check)
