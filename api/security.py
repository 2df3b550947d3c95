"""Who may do what: bearer tokens with scopes, checked before the body is read.

The operator configures tokens, each with a name, scopes and a secret
(``STAGEWRIGHT_API_TOKENS='ci:write:s3cret; ops:admin:t0p'``). Scopes:

- ``read``: GET and HEAD. Reads are open to anyone unless some token lists ``read``;
  ``GET /healthz``, the readiness probe, is open always, and so are the pages that hold no
  data: the dashboard's page and assets, and the API documentation with its schema (the
  dashboard sends the token a person enters on it with every request it makes).
- ``write``: POST (plans, measurements, profiles, simulate), DELETE of the plans this
  token created and of any measured run (a withdrawal, which adding the run again
  undoes); a write token may also read.
- ``admin``: everything, including DELETE of anyone's plan.

With no token configured every request is allowed (a local, single-user service). The
single token of earlier versions (``STAGEWRIGHT_API_TOKEN``) still works: it is the token
``default`` with write and admin scopes, and reads stay open. Secrets are compared in
constant time against every configured token; a plan records only the token's name.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from typing import Literal

from fastapi import Request
from fastapi.security import HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

from api.core.config import SettingsError
from api.problems import forbidden_body, problem_response, unauthorized_body

__all__ = [
    "AuthMiddleware",
    "Principal",
    "Token",
    "bearer_scheme",
    "get_principal",
    "parse_tokens",
]

ScopeName = Literal["read", "write", "admin"]
_SCOPES: tuple[ScopeName, ...] = ("read", "write", "admin")
# A scope grants the ones listed after it too (admin can write, write can read).
_IMPLIES: dict[str, frozenset[str]] = {
    "read": frozenset({"read"}),
    "write": frozenset({"read", "write"}),
    "admin": frozenset({"read", "write", "admin"}),
}
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_READS = ("GET", "HEAD", "OPTIONS")
# Read without a token even when reads need one: the readiness probe of the image's
# HEALTHCHECK and of load balancers, which have no token to send. Such a caller is marked
# (``request.state.probe_only``) and told only the status, not the backend, the version or
# the job counts, which a reader is.
_PROBES = frozenset({"/healthz"})
# Read without a token even when reads need one: the dashboard's page and assets and the API
# documentation pages with their schema. They hold no data (what they show is read through
# the API, with the token the person enters on the page), and a browser cannot add a header
# to loading a page.
_SHELLS = frozenset({"/", "/docs", "/redoc", "/openapi.json"})
_SHELL_FOLDERS = ("/static/", "/docs-assets/")

# Only documents the scheme in OpenAPI (and lets /docs send a token); the middleware below
# does the checking.
bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="Needed for writes (and reads, when the operator configured read tokens).",
)


@dataclass(frozen=True)
class Token:
    name: str
    scopes: frozenset[str]  # as granted, implications included
    listed: frozenset[str]  # as the operator wrote them
    secret: bytes


@dataclass(frozen=True)
class Principal:
    """Who sends a request: a token's name and scopes, or anonymous (no token needed)."""

    name: str | None
    scopes: frozenset[str]

    def can(self, scope: str) -> bool:
        return scope in self.scopes


# No token configured: anyone may do anything. Tokens configured, reads open: an
# anonymous reader.
ANONYMOUS_OPEN = Principal(None, frozenset(_SCOPES))
ANONYMOUS_READER = Principal(None, frozenset({"read"}))


def parse_tokens(api_tokens: str | None, api_token: str | None) -> list[Token]:
    """The configured tokens. ``api_tokens`` holds ``name:scope+scope:secret`` entries
    separated by ';' or new lines; ``api_token`` is the single write token of earlier
    versions. Raises SettingsError naming the entry that does not parse."""
    tokens: list[Token] = []
    if api_token:
        tokens.append(_token("default", ("write", "admin"), api_token))
    entries = [raw.strip() for raw in re.split(r"[;\n]", api_tokens or "")]
    for position, entry in enumerate((e for e in entries if e), start=1):
        parts = entry.split(":", 2)
        if len(parts) != 3 or not parts[2]:
            # An entry without ':' may be a bare secret: named by its place, not shown.
            which = f"{parts[0]!r}..." if len(parts) > 1 else f"{position} (it has no ':')"
            raise SettingsError(
                f"STAGEWRIGHT_API_TOKENS entry {which}: write name:scopes:secret, "
                "e.g. ci:write:s3cret (scopes joined by '+': read, write, admin)"
            )
        name, scopes, secret = (part.strip() for part in parts)
        listed = tuple(s for s in scopes.split("+") if s)
        unknown = [s for s in listed if s not in _SCOPES]
        if not _NAME.fullmatch(name) or unknown or not listed:
            raise SettingsError(
                f"STAGEWRIGHT_API_TOKENS entry {name!r}: the name is letters, digits, '.', '_' "
                f"or '-' (at most 64) and the scopes are read, write or admin joined by '+'"
                + (f" (not {', '.join(unknown)})" if unknown else "")
            )
        tokens.append(_token(name, listed, secret))
    names = [t.name for t in tokens]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise SettingsError(
            f"STAGEWRIGHT_API_TOKENS: token name(s) {', '.join(doubled)} given twice; name each "
            "once (STAGEWRIGHT_API_TOKEN is the token named 'default')"
        )
    for i, token in enumerate(tokens):
        for other in tokens[i + 1 :]:
            if hmac.compare_digest(token.secret, other.secret):
                # Otherwise the name and scopes a request gets depend on the entries' order.
                raise SettingsError(
                    f"STAGEWRIGHT_API_TOKENS: tokens {token.name} and {other.name} have the "
                    "same secret; give each token a secret of its own"
                )
    if api_tokens and api_tokens.strip() and not any(entries):
        raise SettingsError(
            "STAGEWRIGHT_API_TOKENS is set but lists no token (only separators); write "
            "name:scopes:secret entries, e.g. ci:write:s3cret, or unset it"
        )
    return tokens


def _token(name: str, listed: tuple[str, ...], secret: str) -> Token:
    granted = frozenset().union(*(_IMPLIES[s] for s in listed))
    return Token(name, granted, frozenset(listed), secret.encode())


class AuthMiddleware:
    """Finds who sends each request and refuses it (401/403 problem+json) when that
    principal lacks the scope the method needs, before any body is read. The principal is
    left in ``scope['state']['principal']`` for the services (plan ownership)."""

    def __init__(self, app: ASGIApp, tokens: list[Token]) -> None:
        self.app = app
        self.tokens = tokens
        self.reads_open = not any("read" in t.listed for t in tokens)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        needed = "read" if scope["method"] in _READS else "write"
        header = _authorization(scope)
        principal = self._principal(header)
        state = scope.setdefault("state", {})
        if needed == "read" and scope.get("path") in _PROBES:
            reader = (principal is not None and principal.can("read")) or self.reads_open
            state["principal"] = principal if principal is not None else ANONYMOUS_READER
            state["probe_only"] = not reader
            await self.app(scope, receive, send)
            return
        if needed == "read" and _is_shell(str(scope.get("path", ""))):
            state["principal"] = principal if principal is not None else ANONYMOUS_READER
            await self.app(scope, receive, send)
            return
        if principal is not None and principal.can(needed):
            state["principal"] = principal
            await self.app(scope, receive, send)
            return
        if not self.tokens or (needed == "read" and self.reads_open):
            state["principal"] = ANONYMOUS_OPEN if not self.tokens else ANONYMOUS_READER
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if principal is not None:  # a valid token without the scope
            body = forbidden_body(
                f"the token {principal.name!r} has no {needed!r} scope; ask the operator for "
                "a token with it",
                path,
            )
            await problem_response(body)(scope, receive, send)
            return
        if not header:
            detail = (
                f"this server requires a token for {'reads' if needed == 'read' else 'writes'}; "
                "send the header 'Authorization: Bearer <token>' (ask the operator for one)"
            )
            challenge = 'Bearer realm="stagewright"'
        else:
            detail = (
                "the bearer token is missing or wrong; send 'Authorization: Bearer <token>' "
                "with a token the operator configured (STAGEWRIGHT_API_TOKENS)"
            )
            challenge = 'Bearer realm="stagewright", error="invalid_token"'
        response = problem_response(
            unauthorized_body(detail, path), {"WWW-Authenticate": challenge}
        )
        await response(scope, receive, send)

    def _principal(self, header: bytes) -> Principal | None:
        scheme, _, credentials = header.partition(b" ")
        if scheme.lower() != b"bearer" or not self.tokens:
            return None
        given = credentials.strip()
        found: Token | None = None
        for token in self.tokens:  # every one compared: the time does not tell which matched
            if hmac.compare_digest(given, token.secret):
                found = token
        return None if found is None else Principal(found.name, found.scopes)


def _is_shell(path: str) -> bool:
    return path in _SHELLS or path.startswith(_SHELL_FOLDERS)


def _authorization(scope: Scope) -> bytes:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return bytes(value)
    return b""


def get_principal(request: Request) -> Principal:
    """The principal AuthMiddleware found (anonymous when the app runs without it)."""
    principal = request.scope.get("state", {}).get("principal")
    return principal if isinstance(principal, Principal) else ANONYMOUS_OPEN
