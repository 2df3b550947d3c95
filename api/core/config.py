"""Service settings: every knob an operator can turn, read from ``STAGEWRIGHT_*`` variables.

Each field of :class:`Settings` is set by the environment variable ``STAGEWRIGHT_`` + its name
in capitals (``planner_threads`` <- ``STAGEWRIGHT_PLANNER_THREADS``). A value that does not
parse is reported with the variable's name and what to put there instead, never ignored.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import StagewrightError

__all__ = ["DEFAULT_DATABASE_URL", "ENV_PREFIX", "Settings", "SettingsError"]

ENV_PREFIX = "STAGEWRIGHT_"
# Read elsewhere, not settings of the service: the profile folders the planner reads
# (planner.profiles), and the switches of stagewright's own test suite (tests/).
OTHER_VARIABLES = frozenset(
    {
        "STAGEWRIGHT_PROFILES",
        "STAGEWRIGHT_REQUIRE_BROWSER",
        "STAGEWRIGHT_REQUIRE_POSTGRES",
        "STAGEWRIGHT_SCHEMATHESIS_EXAMPLES",
        "STAGEWRIGHT_TEST_CORRUPT",
        "STAGEWRIGHT_TEST_MARK",
        "STAGEWRIGHT_TEST_POSTGRES_URL",
    }
)
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
        description="A single token for writes (every POST and DELETE needs 'Authorization: "
        "Bearer <token>'); kept for existing set-ups, the same as api_tokens "
        "'default:write+admin:<token>'.",
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
        le=86_400,
        description="A running job whose process stopped renewing it for this long is "
        "queued again (the process died).",
    )
    job_poll_s: float = Field(
        default=1.0,
        ge=0.01,
        le=3600,
        description="How often a process looks for queued or orphaned jobs.",
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
        default=16,
        ge=1,
        description="Longest search.micro_batch_sizes and search.num_chunks lists.",
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
    db_statement_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="PostgreSQL cancels a statement or lock wait of the service longer than this.",
    )
    db_operation_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="A database connection held longer than this by one request or job step "
        "is cut (a database that stopped answering cannot hang the service).",
    )
    request_timeout_s: float = Field(
        default=15.0,
        gt=0,
        le=600,
        description="A request whose database or compute work takes longer answers 503.",
    )
    request_threads: int = Field(
        default=16, ge=1, le=256, description="Threads one process gives requests' blocking work."
    )
    health_timeout_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="/healthz and /metrics wait at most this long for the database.",
    )
    body_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="A request body that has not fully arrived after this long answers 408.",
    )
    job_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Wall-clock limit of one search; a search over it fails with the reason.",
    )
    job_memory_mb: int = Field(
        default=4096,
        ge=256,
        # 16 TiB: beyond what the kernel's address-space limit takes (it failed every search).
        le=16_777_216,
        description="Memory (address space) limit of a search process; a search over it fails "
        "with the reason and the process is replaced.",
    )
    search_processes_at_start: bool = Field(
        default=True,
        description="Start the search processes with the server (else at the first search, "
        "which then waits the fraction of a second one takes to start).",
    )
    max_plan_work: int = Field(
        default=30_000_000,
        ge=1,
        description="Largest estimated work of one plan request (schedule actions generated "
        "and simulated); beyond it POST /v1/plans answers 413 with the estimate.",
    )
    max_plan_bytes: int = Field(
        default=1_000_000,
        ge=10_000,
        description="Largest estimated size of a plan's JSON; beyond it POST /v1/plans answers "
        "413 with the estimate.",
    )
    max_simulate_work: int = Field(
        default=2_000_000,
        ge=1,
        description="Largest estimated work of one /v1/simulate request (generator steps and "
        "actions simulated); beyond it the request answers 413 with the estimate.",
    )
    max_timeline_actions: int = Field(
        default=200_000,
        ge=1,
        description="A candidate's timeline is simulated action by action up to this many "
        "actions; beyond it the timeline is a per-device summary.",
    )
    plan_cache_mb: int = Field(
        default=64,
        ge=0,
        le=65_536,
        description="Memory one server process gives the JSON of done plans it has answered, "
        "so reading one again costs one primary-key lookup (0: no cache).",
    )
    max_launch_actions: int = Field(
        default=1_000_000,
        ge=1,
        description="Largest schedule (in actions) whose full launch artefacts one request "
        "materializes; beyond it use `stagewright plan --emit`.",
    )
    api_tokens: str | None = Field(
        default=None,
        repr=False,
        description="Tokens with scopes, 'name:scope+scope:secret' entries separated by ';' "
        "or new lines (scopes: read, write, admin). See the README.",
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

    @classmethod
    def unknown_variables(cls, environ: Mapping[str, str] | None = None) -> list[str]:
        """One line per ``STAGEWRIGHT_*`` variable that names no setting (a misspelt one
        would otherwise leave its setting at the default without a word), with the setting
        it most resembles."""
        env = os.environ if environ is None else environ
        known = {ENV_PREFIX + name.upper() for name in cls.model_fields} | OTHER_VARIABLES
        lines = []
        # Matched without the prefix every name shares, which would make any two look alike
        # (STAGEWRIGHT_LOG_LEVEL was "did you mean STAGEWRIGHT_JOB_LEASE_S?").
        names = sorted(name[len(ENV_PREFIX) :] for name in known)
        for variable in sorted(v for v in env if v.startswith(ENV_PREFIX) and v not in known):
            close = difflib.get_close_matches(variable[len(ENV_PREFIX) :], names, n=1)
            hint = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""
            lines.append(f"{variable} is not a stagewright setting{hint}; it is ignored")
        return lines

    def to_env(self) -> dict[str, str]:
        """The environment that reproduces these settings (for worker processes)."""
        out = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None:
                out[ENV_PREFIX + name.upper()] = str(value)
        return out
