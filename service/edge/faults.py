"""The outermost middleware: a fault is answered 500 in the one error shape.

Starlette's own last resort answers a fault in plain text and then raises it
again to the server, and uvicorn closes the connection of any request whose
application raised: the client's next request on that keep-alive connection
fails. Here the fault is logged with its traceback and answered, and nothing
is raised, so the connection stays open for the next request. Only when part
of an answer was already sent is the fault raised on: closing the
connection is then the only way to tell the client the answer is broken.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ServiceError
from service.responses import error_response

log = logging.getLogger("topoplace.service")


class FaultBarrier:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception:
            log.exception("fault answering %s %s", scope["method"], scope["path"])
            if started:
                raise
            fault = ServiceError("the service failed to answer this request; see its log")
            await error_response(fault)(scope, receive, send)
