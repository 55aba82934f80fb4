"""FastAPI dependencies shared by the routers."""

from __future__ import annotations

from fastapi import Request

from service.state import ServiceState


async def get_state(request: Request) -> ServiceState:
    # Async on purpose: FastAPI runs a plain-def dependency in a worker thread, a thread
    # hop per request that cost more than a 500-node /score's own work.
    state: ServiceState = request.app.state.service
    return state
