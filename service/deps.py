"""FastAPI dependencies shared by the routers."""

from __future__ import annotations

from fastapi import Request

from service.admin_actions import Caller
from service.auth import Authenticator, Principal
from service.state import ServiceState


async def get_state(request: Request) -> ServiceState:
    # Async on purpose: FastAPI runs a plain-def dependency in a worker thread, a thread
    # hop per request that cost more than a 500-node /score's own work.
    state: ServiceState = request.app.state.service
    return state


async def get_caller(request: Request) -> Caller:
    """Who sent the request, for the actions only some callers may perform: the principal
    the token middleware (service/auth.py RequireToken) authenticated and left in the
    request's state, or, where it did not run, the Authorization header checked here."""
    principal: Principal | None = request.scope.get("state", {}).get("principal")
    if principal is not None:
        return Caller(principal)
    check: Authenticator = request.app.state.token_check
    header = request.headers.get("authorization")
    found = check.cached(header)
    if found is None:
        address = request.client.host if request.client else None
        found = await check.verify_async(header, address)
    return Caller(found)
