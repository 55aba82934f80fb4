"""FastAPI dependencies shared by the routers."""

from __future__ import annotations

from fastapi import Request

from service.state import ServiceState


def get_state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state
