"""Unknown query parameters are refused, not ignored.

FastAPI reads the query parameters a route declares and drops any other silently, so a
misspelt one (``?include_rejcted=true``) would answer as if it were not there. Every route
of the API (those in its OpenAPI document; not the dashboard's pages) runs
:func:`no_unknown_query_parameters` first: a parameter the route does not
declare is a 422 naming it and the ones the route takes, through the same problem+json
handler as every other validation error.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

__all__ = ["no_unknown_query_parameters"]


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route reads, its dependencies' included."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def no_unknown_query_parameters(request: Request) -> None:
    """Refuse the request (422) when its query names a parameter its route does not take."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    if not route.include_in_schema:  # the dashboard's pages: a browser may add anything
        return
    # Derived on each request that has a query: a walk over a handful of parameters. (A
    # cache by id(route) could answer for another application's route that reused the id;
    # routes themselves are unhashable.)
    declared = frozenset(_query_names(route.dependant))
    unknown = sorted({name for name in request.query_params if name not in declared})
    if not unknown:
        return
    takes = ", ".join(sorted(declared)) if declared else "none"
    raise RequestValidationError(
        [
            {
                "type": "extra_forbidden",
                "loc": ("query", name),
                "msg": f"unknown query parameter {name!r}; this endpoint takes: {takes}",
                "input": request.query_params.get(name),
            }
            for name in unknown
        ]
    )
