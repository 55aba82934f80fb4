"""An answer sent before its request's body was read closes the connection.

The body's deadline (guard.py) runs only while the body is being read. A request
answered before that (no token: 401; a rate limit: 429; a route that reads no
body) left the rest of its body to arrive when the client liked: uvicorn waits
for the request to end before it reuses the connection, and starts no deadline
meanwhile, so a client with no token could drip a declared body a byte at a time
and hold a connection for good, as many as it opened. Such an answer now says
``Connection: close`` and the server closes the connection once it is sent.

A request whose body was read to its end, or that declared none, keeps its
connection. One that sent a body to a route that never reads it loses a
kept-alive connection it could have reused: rare, and the client just opens
another.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_CLOSE = (b"connection", b"close")


def _declares_body(scope: Scope) -> bool:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            return value.strip() not in (b"0", b"")
        if key == b"transfer-encoding":
            return True
    return False


class CloseUnreadBody:
    """ASGI middleware: ``Connection: close`` on an answer sent while its request's
    body has not all been received."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _declares_body(scope):
            await self.app(scope, receive, send)
            return
        ended = False

        async def tracked_receive() -> Message:
            nonlocal ended
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                ended = True  # the whole body, or the client gone
            return message

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not ended:
                message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
            await send(message)

        await self.app(scope, tracked_receive, closing_send)
