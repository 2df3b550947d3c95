"""Unknown, repeated or empty query parameters are refused, not ignored.

FastAPI reads the query parameters a route declares and drops any other silently, so a
misspelt one (``?include_rejcted=true``) would answer as if it were not there; and of a
parameter given twice (``?status=done&status=failed``) it reads the last and drops the
other. An empty value meant whatever its parameter made of it: ``?source=`` matched every
measured run, ``?model=`` no plan or run, ``?gpu=`` broke the name's rule. Every route of
the API (those in its OpenAPI document; not the dashboard's pages) runs
:func:`no_unknown_query_parameters` first: a parameter the route does not declare, one of
its parameters given more than once, or one given empty, is a 422 naming it (and the ones
the route takes, or that it can be left out), through the same problem+json handler as
every other validation error. (No route takes a list in its query; one that did would read
every value and is left alone.)
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Callable
from typing import Any, Union, get_args, get_origin

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

__all__ = ["no_unknown_query_parameters"]


def _query_names(dependant: Dependant) -> dict[str, bool]:
    """The query parameters a route reads, its dependencies' included: name -> whether it
    takes several values (a list, which FastAPI reads every value of)."""
    names = {
        param.alias: _takes_several(param.field_info.annotation) for param in dependant.query_params
    }
    for sub in dependant.dependencies:
        names.update(_query_names(sub))
    return names


def _takes_several(annotation: Any) -> bool:
    if get_origin(annotation) in (Union, types.UnionType):  # list[str] | None
        return any(_takes_several(arg) for arg in get_args(annotation))
    return get_origin(annotation) in (list, set, frozenset, tuple)


async def no_unknown_query_parameters(request: Request) -> None:
    """Refuse the request (422) when its query names a parameter its route does not take,
    gives one that takes a single value more than once, or gives one empty."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    if not route.include_in_schema:  # the dashboard's pages: a browser may add anything
        return
    # Derived on each request that has a query: a walk over a handful of parameters. (A
    # cache by id(route) could answer for another application's route that reused the id;
    # routes themselves are unhashable.)
    declared = _query_names(route.dependant)
    unknown = sorted({name for name in request.query_params if name not in declared})
    takes = ", ".join(sorted(declared)) if declared else "none"
    _refuse(
        request,
        "extra_forbidden",
        unknown,
        lambda name: f"unknown query parameter {name!r}; this endpoint takes: {takes}",
    )
    given = Counter(name for name, _ in request.query_params.multi_items())
    _refuse(
        request,
        "repeated_query_parameter",
        sorted(name for name, n in given.items() if n > 1 and not declared[name]),
        lambda name: f"query parameter {name!r} is given {given[name]} times; give it once",
    )
    _refuse(
        request,
        "empty_query_parameter",
        sorted({name for name, value in request.query_params.multi_items() if value == ""}),
        lambda name: (
            f"query parameter {name!r} is empty; give it a value, or leave the parameter out"
        ),
    )


def _refuse(request: Request, kind: str, names: list[str], message: Callable[[str], str]) -> None:
    """A 422 with one entry per parameter in ``names`` (nothing when there is none)."""
    if names:
        raise RequestValidationError(
            [
                {
                    "type": kind,
                    "loc": ("query", name),
                    "msg": message(name),
                    "input": request.query_params.getlist(name),
                }
                for name in names
            ]
        )
