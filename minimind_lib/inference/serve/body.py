"""Reading a request's body (ASGI middleware, ``create_app`` installs it): a body over
``max_bytes`` gets 413 before it is read whole, and a body that does not arrive within
``timeout`` seconds gets 408 and the connection closes (uvicorn bounds the headers, not the
body: a client that sends half a POST and waits would hold a connection for good).
"""

from __future__ import annotations

import asyncio

from starlette.exceptions import HTTPException

from minimind_lib.inference.serve.errors import http_error

#: seconds a request's body may take to arrive, from the first byte of it asked for
BODY_TIMEOUT_S = 30.0


class BodySizeLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413, before it is read whole
    (at once when ``Content-Length`` says so; else as soon as the bytes received pass it); one
    that is not complete within ``timeout`` seconds gets 408."""

    def __init__(self, app: object, max_bytes: int, timeout: float = BODY_TIMEOUT_S) -> None:
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    def _too_large(self) -> HTTPException:
        return HTTPException(413, f"the request body is over this server's limit of "
                                  f"{self.max_bytes:,} bytes")

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            response = await http_error(None, self._too_large())
            response.headers["Connection"] = "close"  # the unread body ends the connection
            return await response(scope, receive, send)
        seen, done, deadline = 0, False, None
        loop = asyncio.get_running_loop()

        async def limited_receive() -> dict:
            nonlocal seen, done, deadline
            if done:  # the body is in: later messages (a disconnect) may take any time
                return await receive()
            deadline = deadline or loop.time() + self.timeout
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within "
                                         f"{self.timeout:g} s",
                                    headers={"Connection": "close"}) from None
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise self._too_large()  # FastAPI passes an HTTPException on to http_error
            done = message.get("type") != "http.request" or not message.get("more_body")
            return message

        await self.app(scope, limited_receive, send)
