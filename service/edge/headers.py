"""The browser's safety headers, on every answer the service gives.

Much of what the service answers was named by someone else: a node's name and GPU
models come from its agent, job ids and owners from whoever placed, messages echo
what a caller sent. A browser shows those answers as documents of this origin (a
node's ``topology.svg`` opened on its own, a JSON error opened from a link), so each
answer says what it is and that it may run nothing:

- ``X-Content-Type-Options: nosniff``: JSON stays JSON, never read as a page;
- ``Content-Security-Policy``: an answer that sets none (everything but the pages,
  service/console/endpoints.py) may load and run nothing; the SVG's inline styles
  only are allowed;
- ``X-Frame-Options`` / ``frame-ancestors``: no other site frames the console;
- ``Referrer-Policy: no-referrer``: no address of the service goes elsewhere.

A header a route set itself (a page's own policy) is kept.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Nothing may run or load; the wiring SVG's <style> and fills are inline styles.
DEFAULT_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:;"
    " frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)
HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"SAMEORIGIN"),
    (b"content-security-policy", DEFAULT_POLICY.encode()),
)


class SafetyHeaders:
    """ASGI middleware adding ``HEADERS`` to each HTTP answer that lacks them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {key.lower() for key, _ in headers}
                headers.extend(item for item in HEADERS if item[0] not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
