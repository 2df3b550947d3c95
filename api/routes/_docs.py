"""OpenAPI response declarations shared by the routes."""

from __future__ import annotations

from typing import Any

from api.problems import PROBLEM_MEDIA_TYPE

__all__ = ["PROBLEM_REF", "problems"]

# create_app() adds the Problem schema to the OpenAPI components under this name.
PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}

_WHY = {
    400: "The body is not valid JSON.",
    401: "A write without the bearer token this server requires.",
    404: "No such resource.",
    409: "The resource is not in a state that allows this.",
    413: "The request body is larger than this server accepts.",
    422: "The request is invalid, cannot be planned, or is beyond this server's limits; "
    "'detail' says what to change.",
    503: "The database is unreachable (retry after Retry-After seconds) or the queue is full.",
}


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries: each status answers a problem document. 500 is always
    listed (a bug, never bad input)."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in (*statuses, 500):
        out[status] = {
            "description": _WHY.get(status, "Internal error (a bug): the body names an error id."),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": PROBLEM_REF}},
        }
    return out
