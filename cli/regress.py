"""``stagewright regress``: the CI cost-regression check.

A baseline file records scenarios (plan requests) and what the planner answered for each
when the baseline was written: the best configuration, its predicted throughput and peak
memory. ``regress`` re-plans every scenario and fails (exit status 1) when, for any of them,

- predicted throughput dropped by more than the tolerance (per scenario, else the file's,
  else ``--tolerance``),
- the best configuration is the recorded one and its predicted peak memory rose by more
  than the same tolerance (a configuration that needs more memory than it did, as a slower
  one, is a change of the cost model a team should see; a baseline recorded without
  ``peak_memory_gib`` has no memory to hold it to),
- nothing fits any more (the scenario became infeasible), or
- the best configuration changed, unless the scenario allows it (``allow_config_change``),
- or a scenario has no recorded answer yet: it would pass unchecked on every run (as a
  snapshot test's missing snapshot fails under CI), so the change that adds it must also
  record its answer with ``--update``.

Throughput that rises, peak memory that falls, or a changed configuration that a scenario
allows, is reported but passes; an allowed other configuration's peak memory is reported,
not held to the recorded one's (another configuration needs other memory: the scenario lets
the planner trade memory for speed). ``--update`` rewrites the baseline with today's
answers (keeping names, tolerances and allowances), which is how a team accepts an intended
change.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cli.extras import STORE_HINT
from planner.errors import StagewrightError
from planner.json_input import loads
from planner.plan import plan
from planner.profiles import ProfileStore, UnknownHardwareError
from planner.schedules import schedule_family
from planner.specs import CandidateConfig, Plan, PlanRequest, numbers_not_booleans

__all__ = ["BASELINE_FORMAT", "Outcome", "check_baseline", "load_baseline", "update_baseline"]

BASELINE_FORMAT = "stagewright.baseline/1"


@dataclass(frozen=True)
class Outcome:
    """One scenario's comparison. ``status`` names the first reason it failed, in the order
    "infeasible", "new", "slower", "more memory", "config changed" (``message`` says every
    one), else "improved" (throughput rose or the same configuration's peak memory fell by
    more than the tolerance) or "ok". The changes are in percent of the baseline's value,
    None where either side is missing."""

    name: str
    status: str  # "ok", "improved", "slower", "more memory", "infeasible", "config changed", "new"
    failed: bool
    baseline_samples_per_s: float | None
    samples_per_s: float | None
    change_pct: float | None
    baseline_config: dict[str, Any] | None
    config: dict[str, Any] | None
    baseline_peak_gib: float | None
    peak_gib: float | None
    tolerance_pct: float
    message: str
    peak_change_pct: float | None = None


class _Part(BaseModel):
    """A part of a baseline file: a misspelt key is an error, not a silently ignored
    setting, and a number is finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class _Config(_Part):
    """A recorded best configuration: what ``_summary`` writes (``_CONFIG_KEYS``, then cp
    and num_chunks where they are not their defaults)."""

    _numbers_not_booleans = numbers_not_booleans(
        "t", "p", "d", "micro_batch_size", "cp", "num_chunks"
    )

    t: int = Field(ge=1)
    p: int = Field(ge=1)
    d: int = Field(ge=1)
    micro_batch_size: int = Field(ge=1)
    recompute: str
    schedule: str
    cp: int | None = Field(default=None, ge=1)
    num_chunks: int | None = Field(default=None, ge=1)


# The keys every recorded configuration has; cp and num_chunks only off their defaults.
_CONFIG_KEYS = tuple(k for k in _Config.model_fields if k not in ("cp", "num_chunks"))


class _Expected(_Part):
    _numbers_not_booleans = numbers_not_booleans("samples_per_s", "peak_memory_gib")

    config: _Config
    samples_per_s: float = Field(gt=0)
    # Positive, as every peak the planner predicts: a rise is measured against it.
    peak_memory_gib: float | None = Field(default=None, gt=0)


_Tolerance = Annotated[float, Field(ge=0, lt=100)]


class _Scenario(_Part):
    _numbers_not_booleans = numbers_not_booleans("tolerance_pct")

    name: str = Field(min_length=1)
    request: dict[str, Any]
    tolerance_pct: _Tolerance | None = None
    allow_config_change: bool = False
    expected: _Expected | None = None


class _Baseline(_Part):
    _numbers_not_booleans = numbers_not_booleans("tolerance_pct")

    format: str
    tolerance_pct: _Tolerance = 1.0
    notes: str | None = None
    scenarios: list[_Scenario]


def _skeleton(name: str) -> str:
    """A baseline of one scenario called ``name`` whose plan request is left as ``{...}``."""
    return (
        f'{{"format": "{BASELINE_FORMAT}", "scenarios": [{{"name": {json.dumps(name)}, '
        '"request": {...}}]}'
    )


# Where a new user finds a whole baseline to copy (it is not in the wheel, hence "repository").
_TEMPLATE = "baselines/examples.json in stagewright's repository is one to copy"


def _start(where: str) -> str:
    """How a baseline at ``where`` starts, said where a file is missing or is other JSON."""
    return (
        f"write {_skeleton('NAME')} to {where} with a plan request (what stagewright plan "
        f"reads) for {{...}} ({_TEMPLATE})"
    )


def load_baseline(path: Path, *, updating: bool = False) -> dict[str, Any]:
    """Read and check a baseline file; every error says what to change. A file that is not
    a baseline (a missing one, a plan request, other JSON) is told how a baseline starts:
    its skeleton, the sample to copy, and ``--update`` to record the answers; ``updating``
    (the command was given ``--update``) says why that cannot start from nothing."""
    try:
        data = loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if updating:
            raise StagewrightError(
                f"cannot read {path}: no such file; --update records the answers of the "
                f"scenarios a baseline names, so a new baseline starts with them: "
                f"{_start('it')}, then run this again"
            ) from None
        raise StagewrightError(
            f"cannot read {path}: no such file; check the path, or start a baseline there: "
            f"{_start('it')}, then record its answers with stagewright regress {path} --update"
        ) from None
    except IsADirectoryError:
        raise StagewrightError(
            f"cannot read {path}: it is a folder; name the baseline file in it"
        ) from None
    except PermissionError:
        raise StagewrightError(
            f"cannot read {path}: permission denied; make the file readable"
        ) from None
    except OSError as exc:
        raise StagewrightError(f"cannot read {path}: {exc.strerror}") from exc
    except StagewrightError as exc:  # a key given twice, or nested too deep
        raise StagewrightError(f"{path}: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise StagewrightError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT:
        raise StagewrightError(_not_a_baseline(path, data))
    scenarios = data.get("scenarios")
    if not isinstance(scenarios, list) or not scenarios:
        raise StagewrightError(f"{path} has no scenarios; add at least one")
    for index, scenario in enumerate(scenarios):
        if not isinstance(scenario, dict) or "name" not in scenario or "request" not in scenario:
            raise StagewrightError(f"{path}: scenario {index} needs a name and a request")
    try:
        _Baseline.model_validate(data)
    except ValidationError as exc:
        raise StagewrightError(f"{path}: {_baseline_problems(exc, scenarios)}") from None
    names = set()
    for scenario in scenarios:
        if scenario["name"] in names:
            raise StagewrightError(f"{path}: scenario name {scenario['name']!r} is used twice")
        names.add(scenario["name"])
        try:
            PlanRequest.model_validate(scenario["request"])
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise StagewrightError(
                f"{path}: scenario {scenario['name']!r}: request.{where}: {first['msg']}"
            ) from None
    return data


def _not_a_baseline(path: Path, data: Any) -> str:
    """What to change when ``data``, read from ``path``, is JSON but not a baseline."""
    record = "record its answers with stagewright regress NEW.json --update"
    if isinstance(data, dict) and "format" not in data and {"model", "cluster"} & set(data):
        return (
            f"{path} is a plan request, not a baseline; to check its answer in CI, make it a "
            f"scenario of one: write {_skeleton(path.stem)} to NEW.json with the contents of "
            f"{path.name} for {{...}} ({_TEMPLATE}; more scenarios go in the same list), then "
            f"{record}"
        )
    if isinstance(data, dict) and "format" not in data and "scenarios" in data:
        return f'{path} has no "format"; add "format": "{BASELINE_FORMAT}" at its top level'
    if isinstance(data, dict) and "format" in data:
        return (
            f'{path} is not a stagewright baseline: its "format" is '
            f'{json.dumps(data["format"])}, not "{BASELINE_FORMAT}"; name a baseline file '
            f"(a baseline of a newer format needs the stagewright that wrote it)"
        )
    return (
        f"{path} is not a stagewright baseline; name a baseline file, or start one: "
        f"{_start('NEW.json')}, then {record}"
    )


def _baseline_problems(exc: ValidationError, scenarios: list[Any]) -> str:
    """Every problem of a baseline as ``scenario 'name': field: message``, joined by '; '."""
    problems = []
    for err in exc.errors():
        loc = list(err["loc"])
        where = ""
        if loc[:1] == ["scenarios"] and len(loc) > 1 and isinstance(loc[1], int):
            name = scenarios[loc[1]].get("name")
            where = f"scenario {name!r}: " if isinstance(name, str) else f"scenario {loc[1]}: "
            loc = loc[2:]
        field = ".".join(str(part) for part in loc) or "baseline"
        message = re.sub(r" or instance of \w+$", "", err["msg"])  # a class name says nothing
        problems.append(f"{where}{field}: {message}")
    return "; ".join(problems)


def _answer(scenario: dict[str, Any], store: ProfileStore | None) -> dict[str, Any] | None:
    """The scenario's best answer today; a request the planner refuses names its scenario."""
    try:
        return _summary(plan(PlanRequest.model_validate(scenario["request"]), store))
    except StagewrightError as error:
        hint = STORE_HINT if store is None and isinstance(error, UnknownHardwareError) else ""
        raise StagewrightError(f"scenario {scenario['name']!r}: {error}{hint}") from None


def _summary(result: Plan) -> dict[str, Any] | None:
    if result.best is None:
        return None
    best = result.best
    return {
        # cp and chunks per device only when not their default, so baselines recorded
        # before context parallelism or searched chunk counts still match.
        "config": {k: getattr(best.config, k) for k in _CONFIG_KEYS}
        | ({"cp": best.config.cp} if best.config.cp > 1 else {})
        | _chunks(best.config),
        "samples_per_s": best.predicted.samples_per_s,
        "peak_memory_gib": best.predicted.peak_memory_gib,
    }


def _chunks(config: CandidateConfig) -> dict[str, Any]:
    """The candidate's chunks per device where they are not its family's default."""
    if schedule_family(config.schedule).default_chunks(config.num_chunks):
        return {}
    return {"num_chunks": config.num_chunks}


def check_baseline(
    data: dict[str, Any], tolerance_pct: float | None = None, store: ProfileStore | None = None
) -> list[Outcome]:
    """Re-plan every scenario with the profiles of ``store`` (the bundled ones by default)
    and compare it with what the baseline recorded."""
    outcomes = []
    default_tolerance = float(data.get("tolerance_pct", 1.0))  # checked by load_baseline
    for scenario in data["scenarios"]:
        # A tolerance given on the command line overrides the scenario's own.
        own = scenario.get("tolerance_pct")  # null: the file's
        tolerance = (
            tolerance_pct
            if tolerance_pct is not None
            else float(own if own is not None else default_tolerance)
        )
        now = _answer(scenario, store)
        expected = scenario.get("expected")
        outcomes.append(_compare(scenario, expected, now, tolerance))
    return outcomes


def _compare(
    scenario: dict[str, Any],
    expected: dict[str, Any] | None,
    now: dict[str, Any] | None,
    tolerance: float,
) -> Outcome:
    """The scenario's outcome (``Outcome`` lists the statuses) from what the baseline
    recorded (``expected``, None: nothing) and today's best answer (``now``, None: nothing
    fits), within ``tolerance`` percent."""
    name = scenario["name"]
    base_rate = expected["samples_per_s"] if expected else None
    base_config = expected["config"] if expected else None
    base_peak = expected.get("peak_memory_gib") if expected else None
    if now is None:
        return Outcome(
            name,
            "infeasible",
            True,
            base_rate,
            None,
            None,
            base_config,
            None,
            base_peak,
            None,
            tolerance,
            "no configuration fits any more (every candidate rejected)"
            if expected
            else "no configuration fits (every candidate rejected)",
        )
    rate, config, peak = now["samples_per_s"], now["config"], now["peak_memory_gib"]
    if expected is None:
        return Outcome(
            name,
            "new",
            True,
            None,
            rate,
            None,
            None,
            config,
            None,
            peak,
            tolerance,
            "no recorded answer to compare with: record it with --update and commit the baseline",
        )
    assert base_rate is not None and base_config is not None  # ``expected`` is present
    change = (rate / base_rate - 1.0) * 100.0
    peak_change = (peak / base_peak - 1.0) * 100.0 if base_peak is not None else None
    same_config = config == base_config
    failures: list[tuple[str, str]] = []  # (status, why), in the order of ``Outcome``'s
    if change < -tolerance:
        failures.append(
            ("slower", f"predicted throughput fell {-change:.2f}% (tolerance {tolerance:g}%)")
        )
    if same_config and peak_change is not None and peak_change > tolerance:
        failures.append(
            (
                "more memory",
                f"predicted peak memory rose {peak_change:.2f}% (tolerance {tolerance:g}%)",
            )
        )
    if not same_config and not scenario.get("allow_config_change", False):
        # A key only one side has is at its default on the other (see ``_summary``).
        keys = [*config, *(k for k in base_config if k not in config)]
        changed = ", ".join(
            f"{k} {base_config.get(k, 'default')} -> {config.get(k, 'default')}"
            for k in keys
            if base_config.get(k) != config.get(k)
        )
        failures.append(
            (
                "config changed",
                f"the best configuration changed ({changed}); allow it with "
                f'"allow_config_change": true or accept it with --update',
            )
        )

    def outcome(status: str, failed: bool, message: str) -> Outcome:
        return Outcome(
            name,
            status,
            failed,
            base_rate,
            rate,
            change,
            base_config,
            config,
            base_peak,
            peak,
            tolerance,
            message,
            peak_change,
        )

    if failures:
        return outcome(failures[0][0], True, "; ".join(why for _, why in failures))
    if peak_change is None:
        memory = "peak memory not recorded (--update records it)"
    elif same_config:
        memory = f"peak memory {peak_change:+.2f}%"
    else:
        memory = f"peak memory {peak_change:+.2f}%, not checked: another configuration, as allowed"
    improved = change > tolerance or (
        same_config and peak_change is not None and peak_change < -tolerance
    )
    return outcome("improved" if improved else "ok", False, f"throughput {change:+.2f}%, {memory}")


def update_baseline(data: dict[str, Any], store: ProfileStore | None = None) -> dict[str, Any]:
    """The baseline with every scenario's ``expected`` replaced by today's answer, priced
    with the profiles of ``store`` (the bundled ones by default)."""
    scenarios = []
    for scenario in data["scenarios"]:
        now = _answer(scenario, store)
        updated = dict(scenario)
        if now is None:
            updated.pop("expected", None)
        else:
            updated["expected"] = now
        scenarios.append(updated)
    return {**data, "scenarios": scenarios}
