"""The planner's exception tree.

Every error a person can cause by bad input derives from :class:`StagewrightError` and
carries a message that says what to change. The interfaces (CLI, REST) translate this tree
once, at their boundary; nothing below them prints or exits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

__all__ = [
    "NO_NUL_PATTERN",
    "NO_NUL_RULE",
    "InvalidScheduleError",
    "ScheduleConfigError",
    "SimulationError",
    "StagewrightError",
    "error_message",
    "validation_problems",
]


# Free text a person sends (names, sources, notes, descriptions) may hold anything but a NUL
# character: PostgreSQL text holds none (SQLite's store would strip it), and nothing a person
# writes needs one. Every free-text field states the rule as this pattern; the service's
# problems and :func:`validation_problems` say it as ``NO_NUL_RULE``.
NO_NUL_PATTERN = r"^[^\x00]*$"
NO_NUL_RULE = "a NUL character (\\u0000) cannot be stored or searched for; leave it out"


class StagewrightError(ValueError):
    """Base of all errors caused by input that stagewright cannot honour."""


class ScheduleConfigError(StagewrightError):
    """A schedule was requested with parameters it cannot be built for.

    Example: interleaved 1F1B with a number of micro-batches that is not a multiple of the
    number of devices.
    """


class InvalidScheduleError(StagewrightError):
    """A schedule (generated, hand-written or loaded from JSON) breaks a rule of the IR.

    ``rule`` is the number of the violated rule in :mod:`planner.schedules._validate`, so that
    tests and tools can tell violations apart without parsing the message.
    """

    def __init__(self, rule: int, message: str) -> None:
        super().__init__(f"rule {rule}: {message}")
        self.rule = rule


class SimulationError(StagewrightError):
    """The simulator was given durations or options it cannot use."""


def validation_problems(exc: ValidationError, whole: str = "request") -> str:
    """A pydantic error as one line a person can act on: every problem as
    ``dotted.location: message``, joined by '; ' (``whole`` names a problem of the whole
    object)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or whole}: {error_message(err)}"
        for err in exc.errors()
    )


def error_message(err: Mapping[str, Any]) -> str:
    """Pydantic's message of one problem (an item of ``ValidationError.errors()``, or one
    built in its shape), as a sentence that says what to change."""
    if (
        err.get("type") == "string_pattern_mismatch"
        and (err.get("ctx") or {}).get("pattern") == NO_NUL_PATTERN
    ):  # instead of "String should match pattern '^[^\x00]*$'"
        return NO_NUL_RULE
    return str(err.get("msg", "invalid value")).removeprefix("Value error, ")
