"""FastAPI dependencies: the application's state, who is asking, and strict bodies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from api.security import Principal, bearer_scheme, get_principal
from api.state import AppState

__all__ = ["WRITE", "PrincipalDep", "StateDep", "get_state", "strict_body"]


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.stagewright
    return state


StateDep = Annotated[AppState, Depends(get_state)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]

# Declares the bearer scheme on write operations (OpenAPI); AuthMiddleware enforces it.
WRITE = [Security(bearer_scheme)]


def strict_body(model: type[BaseModel]) -> Callable[[Request], Awaitable[None]]:
    """A dependency that validates the JSON body against ``model`` in strict mode: what the
    schema says is what is accepted (no "128" for 128, no 0 for false). FastAPI's own body
    validation coerces; this runs first and refuses instead, with the same 422 shape."""

    async def check(request: Request) -> None:
        raw = await request.body()  # already read (and cached) by FastAPI
        try:
            model.model_validate_json(raw, strict=True)
        except ValidationError as exc:
            errors: list[dict[str, Any]] = [
                {**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)
            ]
            raise RequestValidationError(errors) from None

    return check
