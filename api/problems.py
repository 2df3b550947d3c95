"""RFC 9457 problem details: the one place where errors become HTTP responses.

Every error answer has the media type ``application/problem+json`` and the fields ``type``
(a ``urn:stagewright:problem:...`` name), ``title``, ``status``, ``detail`` (what went wrong
and what to change) and ``instance`` (the request path); validation problems add ``errors``
with one entry per invalid field, the first 20 of them (``errors_not_listed`` counts the
others), a long value or key they quote cut to its first 64 characters. Bad input is a 4xx,
an unreachable database a 503 with Retry-After, and only a bug is a 500, whose body names
an id to find the traceback in the server log without showing it to the client.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import DataError, SQLAlchemyError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from api.core.db import is_unavailable, storage_trouble
from api.head_requests import serves
from api.schemas import HARDWARE_NAME_PATTERN, HARDWARE_NAME_RULE, NO_NUL_PATTERN
from planner.errors import (
    NO_NUL_RULE,
    ScheduleConfigError,
    SimulationError,
    StagewrightError,
    error_message,
)
from planner.profiles import UnknownHardwareError

__all__ = [
    "ERRORS_LISTED",
    "PROBLEM_MEDIA_TYPE",
    "ApiProblem",
    "FirstValidationErrors",
    "install_problem_handlers",
    "problem_body",
    "problem_response",
    "problem_type",
]

log = logging.getLogger("stagewright.api")

PROBLEM_MEDIA_TYPE = "application/problem+json"
RETRY_AFTER_S = 5


def problem_type(slug: str) -> str:
    return f"urn:stagewright:problem:{slug}"


class ApiProblem(Exception):
    """An error the API answers with a problem document. Raise it from routes and services;
    the handler below renders it."""

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        *,
        title: str | None = None,
        headers: Mapping[str, str] | None = None,
        errors: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.detail = detail
        self.title = title or HTTPStatus(status).phrase
        self.headers = dict(headers or {})
        self.errors = list(errors) if errors is not None else None


ERRORS_LISTED = 20
"""A problem's ``errors`` lists at most this many entries; ``errors_not_listed`` counts the
others (a body of 30,000 invalid entries answered 20 MB of them, the detail naming 5)."""


class FirstValidationErrors(RequestValidationError):
    """A validation error that carries the first :data:`ERRORS_LISTED` errors of many, and
    how many it leaves out (``not_listed``): describing every one of 200,000 took seconds
    of the event loop."""

    def __init__(self, errors: Sequence[Any], not_listed: int) -> None:
        super().__init__(errors)
        self.not_listed = not_listed


def problem_body(
    status: int,
    slug: str,
    detail: str,
    *,
    title: str | None = None,
    instance: str | None = None,
    errors: Sequence[Mapping[str, Any]] | None = None,
    errors_not_listed: int = 0,
    error_id: str | None = None,
) -> dict[str, Any]:
    """The problem document. ``errors`` beyond the first :data:`ERRORS_LISTED` are left out
    and counted, with ``errors_not_listed`` (the errors the caller left out already)."""
    body: dict[str, Any] = {
        "type": problem_type(slug) if slug != "about:blank" else slug,
        "title": title or HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    if instance is not None:
        body["instance"] = instance
    if errors is not None:
        body["errors"] = [dict(e) for e in errors[:ERRORS_LISTED]]
        errors_not_listed += max(0, len(errors) - ERRORS_LISTED)
    if errors_not_listed:
        body["errors_not_listed"] = errors_not_listed
    if error_id is not None:
        body["error_id"] = error_id
    return body


def problem_response(body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        content=json.dumps(body).encode(),
        status_code=int(body["status"]),
        media_type=PROBLEM_MEDIA_TYPE,
        headers=dict(headers or {}),
    )


# -- the catalogue: every problem the service answers with, written once ----------------


def not_found(slug: str, title: str, detail: str) -> ApiProblem:
    return ApiProblem(404, slug, detail, title=title)


_ECHOED_CHARACTERS = 64


def echoed(value: str) -> str:
    """``value`` quoted for a detail line, cut to its first 64 characters when longer (the
    problem's ``instance`` carries the whole path already; a 10 kB id need not come back
    twice)."""
    if len(value) <= _ECHOED_CHARACTERS:
        return repr(value)
    return f"{value[:_ECHOED_CHARACTERS]!r}... ({len(value)} characters)"


def plan_not_found(plan_id: str) -> ApiProblem:
    return not_found(
        "plan-not-found",
        "Plan not found",
        f"no plan with id {echoed(plan_id)}; ids come from POST /v1/plans, GET /v1/plans "
        "lists them",
    )


def plan_not_done(plan_id: str, status: str, what: str) -> ApiProblem:
    if status == "failed":  # it never will be done: polling would not end
        detail = (
            f"plan {plan_id} failed, so you cannot {what}; GET /v1/plans/{plan_id} says "
            "why in its 'error': submit a corrected request to POST /v1/plans"
        )
    else:
        detail = (
            f"plan {plan_id} is {status}; {what} once its search is done (poll GET "
            f"/v1/plans/{plan_id} until status is 'done')"
        )
    return ApiProblem(409, "plan-not-done", detail, title="Plan not done")


def not_json(content_type: str | None) -> ApiProblem:
    """415: a body sent without a JSON media type (``curl -d @file`` sends it as a form),
    which FastAPI would read as bytes and refuse as 'not an object'."""
    sent = f"as {content_type!r}" if content_type else "without a Content-Type"
    return ApiProblem(
        415,
        "unsupported-media-type",
        f"the body is sent {sent}; send it as JSON with the header Content-Type: "
        "application/json (curl: -H 'Content-Type: application/json')",
        title="Unsupported media type",
    )


def empty_body(expected: str) -> ApiProblem:
    """400: a write sent without a body (``curl -X POST URL`` with no ``-d``), which read as
    'not valid JSON (EOF while parsing a value at line 1 column 0)'."""
    return ApiProblem(
        400,
        "empty-body",
        f"the request body is empty; send a JSON object ({expected}, described at /docs) "
        "with Content-Type: application/json",
        title="Empty request body",
    )


def limit_error(loc: Sequence[str | int], message: str) -> dict[str, Any]:
    """One entry of a limit problem's ``errors``: where, and the limit with the value."""
    return {"loc": ["body", *loc], "msg": message, "type": "limit"}


def limit_exceeded(detail: str, errors: Sequence[Mapping[str, Any]] | None = None) -> ApiProblem:
    return ApiProblem(
        422, "limit-exceeded", detail, title="Request beyond the server's limits", errors=errors
    )


def too_costly(detail: str, errors: Sequence[Mapping[str, Any]] | None = None) -> ApiProblem:
    """413: a request every field of which is within its limit, but whose work (estimated
    before any is done) is more than the server takes in one request."""
    return ApiProblem(413, "request-too-costly", detail, title="Request too costly", errors=errors)


QUEUE_RETRY_AFTER_S = 30


def queue_full(queued: int) -> ApiProblem:
    """503: the queue holds ``queued`` searches, the server's limit. The detail and the
    Retry-After header name the same wait (the detail said "a minute" beside 30 s)."""
    waiting = "1 search is" if queued == 1 else f"{queued} searches are"
    return ApiProblem(
        503,
        "queue-full",
        f"{waiting} waiting, this server's limit; retry in {QUEUE_RETRY_AFTER_S} s",
        title="Planner queue full",
        headers={"Retry-After": str(QUEUE_RETRY_AFTER_S)},
    )


def server_busy(seconds: float) -> ApiProblem:
    return ApiProblem(
        503,
        "timeout",
        f"the server could not answer within {seconds:g} s (the database is slow or "
        "unreachable, or the server is overloaded); retry in a few seconds",
        title="Service unavailable",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def forbidden(detail: str) -> ApiProblem:
    return ApiProblem(403, "forbidden", detail, title="Not allowed")


def forbidden_body(detail: str, instance: str) -> dict[str, Any]:
    return problem_body(403, "forbidden", detail, title="Not allowed", instance=instance)


def database_unavailable_body(instance: str | None, storage: str | None = None) -> dict[str, Any]:
    """503: the database could not answer. ``storage`` (from ``storage_trouble``) says what
    the operator must fix when it could not write for want of storage, which no retry mends
    by itself."""
    detail = (
        "the database is unreachable or not ready; retry in a few seconds "
        "(operators: check that it runs and that STAGEWRIGHT_DATABASE_URL points at it)"
        if storage is None
        else "the database could not write (the change in progress was rolled back); retry "
        f"once an operator has fixed it (operators: {storage})"
    )
    return problem_body(
        503, "database-unavailable", detail, title="Database unavailable", instance=instance
    )


def database_unavailable() -> ApiProblem:
    body = database_unavailable_body(None)
    return ApiProblem(
        503,
        "database-unavailable",
        body["detail"],
        title=body["title"],
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def unauthorized_body(detail: str, instance: str) -> dict[str, Any]:
    return problem_body(
        401, "unauthorized", detail, title="Authentication required", instance=instance
    )


def body_too_large_body(size: int | None, limit: int, instance: str) -> dict[str, Any]:
    """413. ``size`` is the Content-Length, or None for a body sent without one (chunked),
    refused as soon as more than ``limit`` bytes of it arrived."""
    told = (
        f"the request body is {size:,} bytes"
        if size is not None
        else "the request body (sent without a Content-Length) grew past that"
    )
    return problem_body(
        413,
        "body-too-large",
        f"this server accepts a request body of at most {limit:,} bytes, and {told}; send "
        "fewer entries per request (e.g. split a profile upload)",
        title="Request body too large",
        instance=instance,
    )


def body_timeout_body(limit_s: float, instance: str) -> dict[str, Any]:
    return problem_body(
        408,
        "body-timeout",
        f"the request body did not arrive within {limit_s:g} s; send it in one go",
        title="Request timeout",
        instance=instance,
    )


def search_refused_body(detail: str, instance: str) -> dict[str, Any]:
    """A search the planner refused (the request cannot be planned): stored on the plan."""
    return problem_body(
        422, "invalid-input", detail, title="Request cannot be planned", instance=instance
    )


def search_over_limit_body(detail: str, instance: str) -> dict[str, Any]:
    """A search stopped by its job's wall-clock or memory limit: stored on the plan."""
    return problem_body(
        422,
        "search-limit-exceeded",
        detail,
        title="Search beyond the server's limits",
        instance=instance,
    )


def search_bug_body(error_id: str, instance: str) -> dict[str, Any]:
    return problem_body(
        500,
        "internal-error",
        f"the planner failed on this request; this is a bug, not your input. Report it "
        f"with error id {error_id} (the server log has the details)",
        title="Internal server error",
        instance=instance,
        error_id=error_id,
    )


def search_interrupted_body(plan_id: str, attempts: int) -> dict[str, Any]:
    return problem_body(
        500,
        "job-interrupted",
        f"the search was interrupted {attempts} times (the server stopped or crashed while "
        "it ran); submit the request again, and if it keeps failing ask the operator to "
        "look at the server's memory and logs",
        title="Search interrupted",
        instance=f"/v1/plans/{plan_id}",
    )


def _instance(request: Request) -> str:
    return request.url.path


async def _api_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiProblem)
    body = problem_body(
        exc.status,
        exc.slug,
        exc.detail,
        title=exc.title,
        instance=_instance(request),
        errors=exc.errors,
    )
    return problem_response(body, exc.headers)


# The patterns of the API's own models and query parameters, said as what to send.
_PATTERN_RULES = {
    HARDWARE_NAME_PATTERN: HARDWARE_NAME_RULE,
    NO_NUL_PATTERN: NO_NUL_RULE,
}


def _location(loc: Sequence[str | int]) -> str:
    return ".".join(str(part) for part in loc) or "request"


def _short(value: str) -> str:
    """``value`` cut as :func:`echoed` cuts it, unquoted: for a location's key."""
    if len(value) <= _ECHOED_CHARACTERS:
        return value
    return f"{value[:_ECHOED_CHARACTERS]}... ({len(value)} characters)"


_LONGEST_MESSAGE = 2000


def _message(err: Mapping[str, Any]) -> str:
    given = err.get("input")
    if err.get("type") == "string_pattern_mismatch":
        rule = _PATTERN_RULES.get(str((err.get("ctx") or {}).get("pattern")))
        if rule is not None:  # instead of "String should match pattern '^[a-z0-9]...'"
            shown = echoed(given) if isinstance(given, str) else repr(given)[:80]
            return f"{rule}; got {shown}"
    # Pydantic prefixes the text of a ValueError raised by a validator (error_message takes
    # that off) or of an assert; ours already reads as a sentence that says what to change.
    msg = error_message(err).removeprefix("Assertion failed, ")
    # A validator that names the value it refuses ("unknown schedule 'x...'") would answer a
    # 500,000-character name with all of it: cut as a 404 cuts a long id.
    if isinstance(given, str) and len(given) > _ECHOED_CHARACTERS and given in msg:
        msg = msg.replace(repr(given), echoed(given)).replace(given, _short(given))
    if len(msg) > _LONGEST_MESSAGE:  # whatever else it quotes
        msg = f"{msg[:_LONGEST_MESSAGE]}... ({len(msg)} characters)"
    return msg


def _item(err: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "loc": [p if isinstance(p, int) else _short(str(p)) for p in err.get("loc", ())],
        "msg": _message(err),
        "type": str(err.get("type", "value_error")),
    }


async def _validation(request: Request, exc: Exception) -> Response:
    """422 naming the invalid fields: the first :data:`ERRORS_LISTED` are described (the
    work is bounded by that, not by how many a body of a million entries has), the rest
    counted."""
    assert isinstance(exc, RequestValidationError)
    raw = exc.errors()
    first = raw[:ERRORS_LISTED]
    invalid_json = next((e for e in first if e.get("type") == "json_invalid"), None)
    if invalid_json is not None:
        reason = (invalid_json.get("ctx") or {}).get("error", "malformed JSON")
        position = invalid_json.get("loc", ("body",))[-1]
        where = f" at character {position}" if isinstance(position, int) else ""
        body = problem_body(
            400,
            "malformed-json",
            f"the request body is not valid JSON ({reason}{where}); "
            "send a JSON object with Content-Type: application/json",
            instance=_instance(request),
        )
        return problem_response(body)
    total = len(raw) + (exc.not_listed if isinstance(exc, FirstValidationErrors) else 0)
    items = [_item(err) for err in first]
    shown = "; ".join(f"{_location(item['loc'])}: {item['msg']}" for item in items[:5])
    more = ""
    if total > len(items):
        more = f" (and {total - 5} more; errors lists the first {len(items)})"
    elif total > 5:
        more = f" (and {total - 5} more, see errors)"
    body = problem_body(
        422,
        "validation-error",
        f"the request is invalid: {shown}{more}",
        title="Invalid request",
        instance=_instance(request),
        errors=items,
        errors_not_listed=total - len(items),
    )
    return problem_response(body)


async def _planner_error(request: Request, exc: Exception) -> Response:
    slug = "unknown-hardware" if isinstance(exc, UnknownHardwareError) else "invalid-input"
    # A schedule's own parameters or run (what /v1/simulate builds) are not a plan's.
    scheduling = isinstance(exc, ScheduleConfigError | SimulationError)
    body = problem_body(
        422,
        slug,
        str(exc),
        title="Schedule cannot be built" if scheduling else "Request cannot be planned",
        instance=_instance(request),
    )
    return problem_response(body)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    if exc.status_code == 404:
        detail = _no_resource(request)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        allowed = _allowed_methods(request)
        if allowed:
            headers["Allow"] = ", ".join(allowed)
        detail = (
            f"{request.method} is not allowed on {request.url.path}; "
            f"allowed: {headers.get('Allow', 'see /docs')}"
        )
    body = problem_body(exc.status_code, "about:blank", detail, instance=_instance(request))
    return problem_response(body, headers)


def _no_resource(request: Request) -> str:
    """A 404's detail: the service's paths end without a slash (a redirect to that path,
    Starlette's default, sends curl an empty 307 and a proxied client to the proxy's inner
    scheme and host), so a path that some route serves without its trailing slash is named."""
    path = request.url.path
    shown = echoed(path)
    trimmed = path.rstrip("/")
    if trimmed and trimmed != path:
        if any(serves({**request.scope, "path": trimmed}, method) for method in _METHODS):
            return f"no resource at {shown}; the path has no trailing slash: {trimmed}"
    return f"no resource at {shown}; the API is described at /docs"


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette names only the first
    matching route's): ask the router about each method; HEAD wherever GET is."""
    allowed = [method for method in _METHODS if serves(request.scope, method)]
    if "GET" in allowed and "HEAD" not in allowed:  # api.head_requests serves it
        allowed.insert(allowed.index("GET") + 1, "HEAD")
    return allowed


async def _database_error(request: Request, exc: Exception) -> Response:
    if is_unavailable(exc):
        log.warning("database unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
        return problem_response(
            database_unavailable_body(_instance(request), storage_trouble(exc)),
            {"Retry-After": str(RETRY_AFTER_S)},
        )
    if isinstance(exc, DataError):
        # The database refused a value the validation let through (out of its range).
        body = problem_body(
            422,
            "invalid-value",
            "the database cannot store a value of this request (a number out of range or "
            "a character it does not accept); check the values against /docs",
            instance=_instance(request),
        )
        return problem_response(body)
    return await _internal(request, exc)


async def _internal(request: Request, exc: Exception) -> Response:
    error_id = uuid.uuid4().hex[:12]
    log.error(
        "internal error %s on %s %s", error_id, request.method, request.url.path, exc_info=exc
    )
    body = problem_body(
        500,
        "internal-error",
        f"the server failed on this request; this is a bug, not your input. Report it with "
        f"error id {error_id} (the server log has the details)",
        title="Internal server error",
        instance=_instance(request),
        error_id=error_id,
    )
    return problem_response(body)


def install_problem_handlers(app: FastAPI) -> None:
    """Register the handlers; the most specific class wins (Starlette walks the MRO)."""
    app.add_exception_handler(ApiProblem, _api_problem)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StagewrightError, _planner_error)
    app.add_exception_handler(HTTPException, _http_exception)
    app.add_exception_handler(SQLAlchemyError, _database_error)
    app.add_exception_handler(Exception, _internal)
