"""FastAPI dependencies: the application's state, who is asking, and strict bodies (the
route class that parses them once, refusing a key given twice, and the dependency that
validates them strictly)."""

from __future__ import annotations

import email.message
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from api.limits import check_list_lengths
from api.problems import ERRORS_LISTED, FirstValidationErrors, empty_body, not_json
from api.security import Principal, bearer_scheme, get_principal
from api.state import AppState
from planner.json_input import DuplicateKeyError, JsonTooDeepError, loads

__all__ = ["WRITE", "JsonBodyRoute", "PrincipalDep", "StateDep", "get_state", "strict_body"]


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
    validation coerces; this runs first and refuses instead, with the same 422 shape. The
    lists a setting bounds are measured before (``api.limits.check_list_lengths``)."""

    async def check(request: Request) -> None:
        raw = await request.body()  # already read (and cached) by FastAPI
        if not raw.strip():
            raise empty_body(model.__name__)
        try:
            parsed = await request.json()  # parsed once by JsonBodyRoute
        except ValueError:
            pass  # not JSON: the model's validation says so
        else:
            check_list_lengths(model, parsed, get_state(request).settings)
        try:
            model.model_validate_json(raw, strict=True)
        except ValidationError as exc:
            found = exc.errors(include_url=False)
            errors: list[dict[str, Any]] = [
                {**_said_of_a_boolean(err), "loc": ("body", *err["loc"])}
                for err in found[:ERRORS_LISTED]
            ]
            raise FirstValidationErrors(errors, len(found) - len(errors)) from None

    return check


def _said_of_a_boolean(err: Any) -> Any:
    """Strict mode refuses true for a number as "Input should be a valid integer"; say it as
    the planner's models (and so ``stagewright plan``) do: a number is needed, not true."""
    if err["type"] in ("int_type", "float_type") and isinstance(err.get("input"), bool):
        word = "true" if err["input"] else "false"
        return {**err, "type": "number_not_boolean", "msg": f"a number is needed, not {word}"}
    return err


class _JsonBodyRequest(Request):
    """A request whose JSON body FastAPI reads through :func:`planner.json_input.loads`
    (parsed once, then kept)."""

    _parsed: Any

    async def json(self) -> Any:
        if not hasattr(self, "_parsed"):
            self._parsed = loads(await self.body())
        return self._parsed


def _is_json(content_type: str | None) -> bool:
    """FastAPI's rule for a body it parses as JSON: application/json or application/*+json
    (parameters such as charset aside). A body without a Content-Type is not JSON here,
    whatever the FastAPI version (some parse it as JSON, newer ones refuse it)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


class JsonBodyRoute(APIRoute):
    """A route that parses its JSON body once, before FastAPI reads it, and answers a key
    given twice with the usual 422 naming the key and where it is: ``json.loads``, which
    FastAPI parses with, keeps the last of two equal keys and says nothing. Any other body
    that does not parse is left to FastAPI's own answer (400), and a body nested too deep
    to parse gets that 400 with the reason. A body whose Content-Type is not JSON (or
    missing: ``curl -d`` sends a form) is a 415 naming the header to send, not FastAPI's
    422 that the body 'should be a valid dictionary'."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def parse_then_handle(request: Request) -> Response:
            request = _JsonBodyRequest(request.scope, request.receive)
            if await request.body():
                content_type = request.headers.get("content-type")
                if not _is_json(content_type):
                    raise not_json(content_type)
                try:
                    await request.json()
                except DuplicateKeyError as exc:
                    error: dict[str, Any] = {
                        "type": "duplicate_key",
                        "loc": ("body", *exc.where),
                        "msg": exc.reason,
                        "input": exc.key,
                    }
                    raise RequestValidationError([error]) from None
                except JsonTooDeepError as exc:
                    error = {
                        "type": "json_invalid",
                        "loc": ("body",),
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": str(exc)},
                    }
                    raise RequestValidationError([error]) from None
                except ValueError:
                    pass  # not JSON (or not UTF-8): FastAPI's own answer, as for any body
            return await handler(request)

        return parse_then_handle
