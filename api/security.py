"""Bearer-token protection of writes.

When the operator sets ``STAGEWRIGHT_API_TOKEN``, every request that is not a read (any
method but GET, HEAD and OPTIONS) must carry ``Authorization: Bearer <token>``; reads stay
open. It is checked before the body is read, so an unauthenticated client learns nothing
about the endpoint and cannot make the server parse a large body. The token is compared in
constant time.
"""

from __future__ import annotations

import hmac

from fastapi.security import HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

from api.problems import problem_body, problem_response

__all__ = ["WriteAuthMiddleware", "bearer_scheme"]

# Only documents the scheme in OpenAPI (and lets /docs send a token); the middleware below
# does the checking.
bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="Needed for every POST when the server sets STAGEWRIGHT_API_TOKEN.",
)

_READS = ("GET", "HEAD", "OPTIONS")


class WriteAuthMiddleware:
    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] != "http" or scope["method"] in _READS:
            await self.app(scope, receive, send)
            return
        header = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value
                break
        scheme, _, credentials = header.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.token):
            await self.app(scope, receive, send)
            return
        if not header:
            detail = (
                "this server requires a token for writes; send the header "
                "'Authorization: Bearer <token>' (ask the operator for the token)"
            )
            challenge = 'Bearer realm="stagewright"'
        else:
            detail = (
                "the bearer token is missing or wrong; send 'Authorization: Bearer <token>' "
                "with the token the operator set in STAGEWRIGHT_API_TOKEN"
            )
            challenge = 'Bearer realm="stagewright", error="invalid_token"'
        body = problem_body(
            401,
            "unauthorized",
            detail,
            title="Authentication required",
            instance=str(scope.get("path", "")),
        )
        await problem_response(body, {"WWW-Authenticate": challenge})(scope, receive, send)
