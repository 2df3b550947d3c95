"""FastAPI dependencies: the settings, a database session, the job runner, the metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session

from api.core.config import Settings
from api.core.db import Database
from api.jobs import JobRunner
from api.metrics import Metrics
from api.security import bearer_scheme

__all__ = [
    "AppState",
    "SessionDep",
    "SettingsDep",
    "StateDep",
    "WRITE",
    "get_session",
    "strict_body",
]


@dataclass
class AppState:
    """What one application instance owns."""

    settings: Settings
    database: Database
    metrics: Metrics
    runner: JobRunner


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.stagewright
    return state


def get_settings(request: Request) -> Settings:
    return get_state(request).settings


def get_session(request: Request) -> Iterator[Session]:
    with get_state(request).database.session() as session:
        yield session


StateDep = Annotated[AppState, Depends(get_state)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]

# Declares the bearer scheme on write operations (OpenAPI); WriteAuthMiddleware enforces it.
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
