"""HEAD wherever GET is served (RFC 9110, section 9.3.2): the GET's status and headers,
no body.

FastAPI's routes answer only the methods they declare, so HEAD, which load balancers,
uptime checks and ``curl -I`` send, was a 405 on every endpoint, ``/healthz`` included.
:class:`HeadAsGetMiddleware` runs a HEAD to a path some route serves by GET as that GET
(with the same authentication and limits: HEAD is a read) and drops the body, keeping
its Content-Length. A HEAD to a path no route serves by GET is left as it is: the router
answers 404 or 405, whose ``Allow`` then lists HEAD beside GET where GET is allowed.
"""

from __future__ import annotations

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HeadAsGetMiddleware", "serves"]


class HeadAsGetMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD" or not serves(scope, "GET"):
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        as_get = {**scope, "method": "GET"}
        try:
            await self.app(as_get, receive, headers_only)
        finally:
            # The router notes the route it matched in the scope it was given; the metrics
            # (outside this middleware) label the request by it.
            if "route" in as_get:
                scope["route"] = as_get["route"]


def serves(scope: Scope, method: str) -> bool:
    """Whether some route of the scope's application serves ``method`` at its path."""
    routes = getattr(scope.get("app"), "routes", ())
    asked = {**scope, "method": method}
    return any(route.matches(asked)[0] == Match.FULL for route in routes)
