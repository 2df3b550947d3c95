"""What every spec shares: the frozen, extra-forbidding base model and the enumerations
(precision, recompute mode, solver status, time provenance, schedule and runtime names)."""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError

from planner.schedules import (
    SCHEDULE_NAMES,
    families,
    schedule_family,
)

__all__ = [
    "DEFAULT_MICRO_BATCH_SIZES",
    "SCHEDULES",
    "STORED",
    "Precision",
    "Recompute",
    "RuntimeChoice",
    "ScheduleName",
    "SolverStatus",
    "Spec",
    "TimeSource",
    "default_schedules",
    "number_fields",
    "numbers_not_booleans",
]

Precision = Literal["bf16", "fp16", "fp32"]
SolverStatus = Literal["optimal", "feasible", "timed out", "infeasible"]
Recompute = Literal["none", "selective", "full"]
TimeSource = Literal[
    "measured point", "scaled measurement", "calibrated model", "uncalibrated model"
]


def _registered(name: str) -> str:
    schedule_family(name)  # raises ScheduleConfigError (a ValueError) naming the known ones
    return name


ScheduleName = Annotated[
    str,
    AfterValidator(_registered),
    WithJsonSchema({"type": "string", "enum": list(SCHEDULE_NAMES)}),
]
"""A registered schedule's name (:mod:`planner.schedules`)."""
SCHEDULES: tuple[str, ...] = SCHEDULE_NAMES
DEFAULT_MICRO_BATCH_SIZES = (1, 2, 4, 8)  # searched when a request gives none
RuntimeChoice = Literal["any", "megatron", "torch", "stagewright"]

STORED = "stored"
"""Validation context key, ``context={STORED: True}``: the document was written by
stagewright itself (a plan the service stored, a queued job), maybe by an earlier version.
Checks that refuse what a person may no longer send, but whose value the planner reads
as it always did, let it through (``search.time_limit_s`` given with method grid, which
the planner has always ignored), so that stored plans keep loading."""


def default_schedules(*, allow_stale_weights: bool) -> list[str]:
    """The schedules a request that names none searches: every registered synchronous one,
    and the stale-weight ones when allowed."""
    return [
        family.name
        for family in families()
        if family.semantics == "synchronous" or allow_stale_weights
    ]


Where = tuple[str | int, ...]


def _misplaced_boolean(annotation: Any, value: Any) -> Where | None:
    """Where in ``value`` a true or false stands for a number ``annotation`` expects (() for
    the value itself, else the list indices and dict keys down to it), or None."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _misplaced_boolean(get_args(annotation)[0], value)
    if origin is Union or origin is types.UnionType:
        members = [a for a in get_args(annotation) if a is not type(None)]
        if isinstance(value, bool) and any(_plain(m) in (bool, Any) for m in members):
            return None  # a boolean is one of the things this field takes
        for member in members:
            found = _misplaced_boolean(member, value)
            if found is not None:
                return found
        return None
    if annotation in (int, float):
        return () if isinstance(value, bool) else None
    if isinstance(value, Mapping) and origin in (dict, Mapping):
        item = get_args(annotation)[1] if get_args(annotation) else Any
        for key, entry in value.items():
            found = _misplaced_boolean(item, entry)
            if found is not None:
                return (key, *found)
        return None
    if isinstance(value, list | tuple) and origin in (list, tuple, Sequence, set, frozenset):
        args = get_args(annotation)
        if origin is not tuple and args and _plain(args[0]) in (int, float):
            # A list of numbers, the common case: one pass in C-speed steps rather than a
            # call per entry (250,000 entries took 0.09 s of CPU, now 0.025 s).
            first = next((i for i, entry in enumerate(value) if entry.__class__ is bool), None)
            return None if first is None else (first,)
        for index, entry in enumerate(value):
            if origin is tuple and args and args[-1] is not Ellipsis:
                item = args[index] if index < len(args) else Any
            else:
                item = args[0] if args else Any
            found = _misplaced_boolean(item, entry)
            if found is not None:
                return (index, *found)
    return None


def _plain(annotation: Any) -> Any:
    """``annotation`` without its Annotated metadata."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _refuse_booleans(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    if not isinstance(value, bool | list | tuple | dict) or info.field_name is None:
        return value  # what most fields get: nothing to look into
    where = _misplaced_boolean(cls.model_fields[info.field_name].annotation, value)
    if where is None:
        return value
    found: Any = value
    for part in where:
        found = found[part]
    entry = f" (entry {', '.join(repr(p) for p in where)})" if where else ""
    raise PydanticCustomError(
        "number_not_boolean",
        "a number is needed, not {found}{entry}",
        {"found": "true" if found else "false", "entry": entry},
    )


def numbers_not_booleans(*fields: str) -> Any:
    """A field validator that refuses true and false in the number fields ``fields`` (int
    and float, alone or in lists, tuples, dicts and unions; a union that also takes bool
    keeps taking it): assign it to a name in the body of a model a person's documents are
    validated with, naming every field :func:`number_fields` lists.

    Pydantic's lax mode reads ``"num_layers": true`` as 1 and says nothing. Strict mode
    refuses it, but also "8" and 8.0 for 8, which a request file has always been read
    with. The fields are named rather than "*": a before validator hands the field's
    value on as a Python object, and strict validation of a JSON body (the service's)
    then refuses a date's ISO string or a list for a tuple, so it stays off the fields
    that take no number."""
    return field_validator(*fields, mode="before", check_fields=False)(_refuse_booleans)


def number_fields(model: type[BaseModel]) -> list[str]:
    """The fields of ``model`` whose type takes an int or a float somewhere (alone or in a
    list, tuple, dict or union) and not a boolean there: what
    :func:`numbers_not_booleans` should name."""
    return [n for n, f in model.model_fields.items() if _takes_numbers(f.annotation)]


def _takes_numbers(annotation: Any) -> bool:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _takes_numbers(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        members = [_plain(a) for a in get_args(annotation)]
        return bool not in members and any(_takes_numbers(m) for m in members)
    if annotation in (int, float):
        return True
    if origin in (list, tuple, Sequence, set, frozenset, dict, Mapping):
        args = get_args(annotation)
        items = args[1:] if origin in (dict, Mapping) else args
        return any(_takes_numbers(a) for a in items if a is not Ellipsis)
    return False


class Spec(BaseModel):
    """Frozen, and an unknown field is an error rather than a silently ignored setting."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
