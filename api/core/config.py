"""Service settings: every knob an operator can turn, read from ``STAGEWRIGHT_*`` variables.

Each field of :class:`Settings` is set by the environment variable ``STAGEWRIGHT_`` + its name
in capitals (``planner_threads`` <- ``STAGEWRIGHT_PLANNER_THREADS``). A value that does not
parse is reported with the variable's name and what to put there instead, never ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import StagewrightError

__all__ = ["DEFAULT_DATABASE_URL", "ENV_PREFIX", "Settings", "SettingsError"]

ENV_PREFIX = "STAGEWRIGHT_"
# Embedded default: a SQLite file in the working directory, so the service needs no server.
DEFAULT_DATABASE_URL = "sqlite:///stagewright.db"


class SettingsError(StagewrightError):
    """An environment variable or option holds a value the service cannot use."""


class Settings(BaseModel):
    """How the service runs and what it accepts. Limits answer 413/422 with their value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL: sqlite:///file.db (embedded default) or "
        "postgresql+psycopg://user:password@host:5432/dbname.",
    )
    api_token: str | None = Field(
        default=None,
        repr=False,
        description="When set, every POST needs 'Authorization: Bearer <token>'; reads stay open.",
    )
    plan_wait_s: float = Field(
        default=2.0,
        ge=0,
        le=600,
        description="How long POST /v1/plans waits for a search before answering 202 with a "
        "Location to poll (clients may ask for less or more with ?wait_s=, up to max_wait_s).",
    )
    max_wait_s: float = Field(
        default=30.0, ge=0, le=600, description="Longest ?wait_s= a client may ask for."
    )
    planner_threads: int = Field(
        default=2, ge=1, le=64, description="Searches that run at once in one server process."
    )
    max_queued_jobs: int = Field(
        default=64,
        ge=1,
        description="Searches waiting for a thread; beyond this POST /v1/plans answers 503.",
    )
    job_lease_s: float = Field(
        default=30.0,
        gt=0,
        description="A running job whose process stopped renewing it for this long is "
        "queued again (the process died).",
    )
    job_poll_s: float = Field(
        default=1.0, gt=0, description="How often a process looks for queued or orphaned jobs."
    )
    job_max_attempts: int = Field(
        default=3, ge=1, description="Interrupted runs after which a job is marked failed."
    )
    max_body_bytes: int = Field(
        default=1_048_576, ge=1024, description="Largest request body accepted (413 beyond)."
    )
    max_gpus: int = Field(default=8192, ge=1, description="Largest cluster a plan may search.")
    max_global_batch_size: int = Field(
        default=16384, ge=1, description="Largest global_batch_size a plan may search."
    )
    max_top_k: int = Field(default=100, ge=1, description="Largest search.top_k.")
    max_list_items: int = Field(
        default=16, ge=1, description="Longest search.micro_batch_sizes list."
    )
    max_cpsat_time_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="search.time_limit_s above this is lowered to it (with a warning).",
    )
    max_simulate_cells: int = Field(
        default=16384,
        ge=1,
        description="Largest devices x micro-batches (x chunks or batches) /v1/simulate runs.",
    )
    max_profile_points: int = Field(
        default=10_000, ge=1, description="Most layer points one POST /v1/profiles may carry."
    )
    database_wait_s: float = Field(
        default=30.0,
        ge=0,
        description="How long `stagewright serve` waits for the database to answer at start.",
    )
    access_log: bool = Field(default=True, description="Log one line per request.")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``STAGEWRIGHT_*`` variables, then ``overrides`` (options given on the
        command line win over the environment). Raises SettingsError naming the variable."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None and raw.strip() != "":
                values[name] = raw.strip()
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                field = str(err["loc"][0]) if err["loc"] else "settings"
                source = (
                    f"{ENV_PREFIX}{field.upper()}={values.get(field)!r}"
                    if field in values
                    else field
                )
                problems.append(f"{source}: {err['msg']}")
            raise SettingsError("; ".join(problems)) from None

    def to_env(self) -> dict[str, str]:
        """The environment that reproduces these settings (for worker processes)."""
        out = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None:
                out[ENV_PREFIX + name.upper()] = str(value)
        return out
