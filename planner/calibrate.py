"""Fit a hardware profile's free parameters to measured runs.

Every run's measured quantities (a step time, each pipeline device's peak memory, a pass's
forward / backward / weight time) are predicted with the ordinary cost model
(:func:`predict`); :func:`fit` then chooses the values of the profile's free parameters
(:mod:`planner.costmodel.parameters`) that minimise the sum over all quantities of
ln(predicted / measured)^2, each parameter kept within its declared bounds. Each measured
number is one residual, so a pass measurement with F, B and W counts three times.

The method is Levenberg-Marquardt with box bounds (:mod:`planner._least_squares`), on
parameters scaled to [0, 1] by their bounds; it is deterministic. A parameter that no
prediction depends on (zero sensitivity over every run: e.g. the memory allowance when no
run measured memory) is never moved and is reported as uninformed. Standard errors come
from the Gauss-Newton covariance s^2 (J^T J)^-1 at the solution.

A run slowed by something the model does not represent (a straggling node, an allocator
emptying its cache under memory pressure) would pull every parameter toward explaining it.
So by default the fit leaves out, and reports, the measured quantities it misses by more
than three robust standard deviations of its errors, and fits again until that set settles
(:func:`outliers`); ``exclude_outliers=False`` fits every quantity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from planner import _least_squares as least_squares
from planner.costmodel.evaluate import PlanContext, estimate, price
from planner.costmodel.memory import GIB
from planner.costmodel.parameters import PARAMETERS, FreeParameter, get_parameter
from planner.errors import StagewrightError
from planner.measurements import (
    MeasuredRun,
    PassMeasurement,
    StepMeasurement,
    candidate_config,
    measured_step_time_s,
    plan_request,
)
from planner.profiles import (
    CalibrationRecord,
    ExcludedMeasurement,
    HardwareProfile,
    LayerPoint,
)

__all__ = [
    "CalibrationResult",
    "MeasuredRun",
    "ParameterFit",
    "Quantity",
    "evaluate",
    "fit",
    "implausible",
    "measured_quantities",
    "outliers",
    "predict",
    "predict_quantities",
    "quantity_kind",
    "rms_log_error",
]

# A parameter whose largest effect on any ln(prediction), over its whole bounded range
# scaled to 1, is below this has no information in the runs.
_NO_INFORMATION = 1e-9


@dataclass(frozen=True)
class Quantity:
    """One measured number of one run and its prediction (seconds or GiB)."""

    run: int  # index into the runs given to fit()
    name: str  # 'step_time_s', 'peak_memory_gib[2]', 'forward_s', 'backward_s', 'weight_s'
    measured: float
    predicted_before: float
    predicted_after: float
    excluded: bool = False  # left out of the fit as an outlier (:func:`outliers`)

    @property
    def log_error_before(self) -> float:
        return math.log(self.predicted_before / self.measured)

    @property
    def log_error_after(self) -> float:
        return math.log(self.predicted_after / self.measured)


ParameterStatus = Literal["fitted", "at bound", "uninformed", "held"]


@dataclass(frozen=True)
class ParameterFit:
    """What the fit did to one parameter. ``status``: 'fitted' (moved to an interior
    optimum), 'at bound' (the optimum is at or beyond a bound), 'uninformed' (no run's
    prediction depends on it: left at ``start``), 'held' (not asked to be fitted).
    ``std_error`` is in the parameter's unit (None unless fitted or at bound)."""

    parameter: FreeParameter
    start: float
    value: float
    status: ParameterStatus
    std_error: float | None = None


@dataclass(frozen=True)
class CalibrationResult:
    """The fitted profile, what happened to each parameter, and every residual."""

    hardware: HardwareProfile
    parameters: list[ParameterFit]
    quantities: list[Quantity]
    iterations: int
    rms_log_error_before: float
    rms_log_error: float
    num_runs: int
    warnings: list[str] = field(default_factory=list)

    @property
    def moved(self) -> dict[str, float]:
        """The parameters the fit set (fitted or at bound), by name."""
        return {
            p.parameter.name: p.value for p in self.parameters if p.status in ("fitted", "at bound")
        }

    def record(
        self, fitted_at: str, run_ids: Sequence[int] = (), revision: int | None = None
    ) -> CalibrationRecord:
        """The calibration record to store with the fitted profile."""
        return CalibrationRecord(
            fitted_at=fitted_at,
            num_runs=self.num_runs,
            rms_log_error=self.rms_log_error,
            rms_log_error_before=self.rms_log_error_before,
            fitted=sorted(self.moved),
            uninformed=sorted(
                p.parameter.name for p in self.parameters if p.status == "uninformed"
            ),
            run_ids=list(run_ids),
            excluded=[
                ExcludedMeasurement(
                    run_id=run_ids[q.run] if run_ids else None,
                    quantity=q.name,
                    measured=q.measured,
                    predicted=q.predicted_after,
                )
                for q in self.quantities
                if q.excluded
            ],
            revision=revision,
        )


def measured_quantities(run: MeasuredRun, hardware: HardwareProfile) -> dict[str, float]:
    """The numbers ``run`` measured, by quantity name, in seconds or GiB."""
    out: dict[str, float] = {}
    measured = run.measured
    if isinstance(measured, StepMeasurement):
        step = measured_step_time_s(run, hardware.peak(run.training.precision))
        if step is not None:
            out["step_time_s"] = step
        for device, gib in enumerate(measured.peak_memory_gib or ()):
            out[f"peak_memory_gib[{device}]"] = gib
        return out
    fused = measured.weight_ms is None
    for name, ms in (
        ("forward_s", measured.forward_ms),
        ("backward_weight_s" if fused else "backward_s", measured.backward_ms),
        ("weight_s", measured.weight_ms),
    ):
        if ms is not None:
            out[name] = ms / 1e3
    return out


def predict_quantities(
    run: MeasuredRun, hardware: HardwareProfile, layer_points: Sequence[LayerPoint]
) -> dict[str, float]:
    """The cost model's prediction of every quantity :func:`measured_quantities` gives,
    with ``hardware`` (its parameters) and ``layer_points`` (measured layer points win where
    they exist; pass an empty list to predict with the analytic model alone)."""
    if run.cluster.gpu != hardware.name:
        raise StagewrightError(
            f"run measured on {run.cluster.gpu!r} cannot be predicted with profile "
            f"{hardware.name!r}"
        )
    ctx = PlanContext(plan_request(run), hardware, list(layer_points))
    measured = run.measured
    out: dict[str, float] = {}
    if isinstance(measured, PassMeasurement):
        c = run.config
        layer = ctx.layer(c.micro_batch_size, c.t, c.recompute)
        n = measured.num_layers
        times = {
            "forward_s": layer.forward,
            "backward_s": layer.backward,
            "backward_weight_s": layer.backward + layer.weight,
            "weight_s": layer.weight,
        }
        return {name: n * times[name] for name in measured_quantities(run, hardware)}
    config = candidate_config(run)
    wanted = measured_quantities(run, hardware)
    if "step_time_s" in wanted:
        priced = price(ctx, estimate(ctx, config))
        out["step_time_s"] = priced.iteration_time_s
        memory = priced.estimate.memory
    else:
        memory = estimate(ctx, config).memory
    for device, device_memory in enumerate(memory):
        name = f"peak_memory_gib[{device}]"
        if name in wanted:
            out[name] = device_memory.total / GIB
    return out


# A measured number this many times from the uncalibrated prediction is a slip of unit
# (milliseconds as seconds, MiB as GiB, a percentage as a fraction) or a profile far from the
# machine: no setting of the bounded parameters moves a prediction that far, and a stored run
# stays in every later fit.
IMPLAUSIBLE = 100.0

# quantity kind -> (field it was given in, the field's unit, its value per quantity unit)
_GIVEN_AS = {
    "step_time_s": ("measured.step_time_s", "s", 1.0),
    "peak_memory_gib": ("measured.peak_memory_gib", "GiB", 1.0),
    "forward_s": ("measured.forward_ms", "ms", 1e3),
    "backward_s": ("measured.backward_ms", "ms", 1e3),
    "backward_weight_s": ("measured.backward_ms", "ms", 1e3),
    "weight_s": ("measured.weight_ms", "ms", 1e3),
}
# What a number IMPLAUSIBLE times too large or too small in a unit most likely was.
_SLIPS = {
    ("s", True): ("milliseconds", 1e-3),
    ("ms", True): ("microseconds", 1e-3),
    ("ms", False): ("seconds", 1e3),
    ("GiB", True): ("MiB", 1 / 1024),
}


def implausible(
    run: MeasuredRun, hardware: HardwareProfile, predicted: dict[str, float]
) -> list[tuple[str, str]]:
    """(field, what to change) for each measured quantity of ``run`` more than
    :data:`IMPLAUSIBLE` times above or below ``predicted`` (:func:`predict_quantities` with
    ``hardware``): most likely a number in the wrong unit."""
    out = []
    for name, value in measured_quantities(run, hardware).items():
        ratio = value / predicted[name]
        if 1 / IMPLAUSIBLE <= ratio <= IMPLAUSIBLE:
            continue
        kind = quantity_kind(name)
        field, unit, scale = _GIVEN_AS[kind]
        index = name[len(kind) :]  # '[2]' of a device's memory
        measured = run.measured
        how_far = f"{ratio:.0f}x" if ratio > 1 else f"1/{1 / ratio:.0f} of"
        where = f"the cost model's prediction for this configuration on {hardware.name}"
        if (
            isinstance(measured, StepMeasurement)
            and kind == "step_time_s"
            and (measured.step_time_s is None)
        ):
            out.append(
                (
                    "measured.mfu",
                    f"MFU {measured.mfu:g} means a step of {value:.4g} s, {how_far} {where} "
                    f"({predicted[name]:.4g} s); give the MFU as a fraction of the peak "
                    f"({hardware.peak(run.training.precision):.4g} FLOP/s per device), "
                    "0.45 for 45%",
                )
            )
            continue
        given, expected = value * scale, predicted[name] * scale
        slip = _SLIPS.get((unit, ratio > 1))
        hint = (
            f"if it is in {slip[0]}, give {given * slip[1]:.4g}"
            if slip is not None
            else f"check its unit ({unit})"
        )
        out.append(
            (
                field + index,
                f"{given:.4g} {unit} is {how_far} {where} ({expected:.4g} {unit}); {hint}; if "
                f"it is right, the profile {hardware.name!r} is far from the machine that ran "
                "it (its peak FLOP/s, bandwidths): correct the profile first",
            )
        )
    return out


def predict(
    run: MeasuredRun, hardware: HardwareProfile, layer_points: Sequence[LayerPoint]
) -> float:
    """Predicted seconds of what ``run`` timed: its step time, or the sum of its measured
    passes; 0.0 for a memory-only measurement."""
    return sum(
        value
        for name, value in predict_quantities(run, hardware, layer_points).items()
        if not name.startswith("peak_memory")
    )


def fit(
    hardware: HardwareProfile,
    runs: Sequence[MeasuredRun],
    layer_points: Sequence[LayerPoint],
    parameters: Sequence[str] | None = None,
    *,
    exclude_outliers: bool = True,
) -> CalibrationResult:
    """Fit ``parameters`` (default: every registered one) of ``hardware`` to ``runs`` (all
    measured on it) by bounded least squares on ln(predicted / measured). Parameters not
    named keep their values; uninformed ones are left where they are.

    With ``exclude_outliers`` (the default) measured quantities the fitted model misses by
    far more than it misses the rest of their kind (step times, memory, each pass time) are
    left out of the fit and the fit repeated, until the set left out settles
    (:func:`outliers`); they stay in the result, marked ``excluded``. Raises
    StagewrightError when there is nothing to fit (no runs, no measured quantity)."""
    if not runs:
        raise StagewrightError(
            f"no measured runs of {hardware.name!r} to fit; add some with "
            "`stagewright measurements add FILE`"
        )
    names = sorted(PARAMETERS) if parameters is None else list(dict.fromkeys(parameters))
    requested = [get_parameter(name) for name in names]
    measured = _measured(runs, hardware)
    if not measured:
        raise StagewrightError("the runs measured nothing the cost model predicts")
    targets = np.log(np.array([value for _, _, value in measured]))

    # Every round of outlier exclusion starts from the same values and probes the same
    # bounds: each set of values is predicted once.
    predicted_at: dict[tuple[tuple[str, float], ...], np.ndarray] = {}

    def residuals_at(values: dict[str, float]) -> np.ndarray:
        key = tuple(sorted(values.items()))
        logs = predicted_at.get(key)
        if logs is None:
            predicted = _predicted(runs, hardware.with_parameters(values), layer_points, measured)
            logs = predicted_at[key] = np.log(predicted) - targets
        return logs

    kinds = [quantity_kind(name) for _, name, _ in measured]
    excluded: frozenset[int] = frozenset()
    kept = np.ones(len(measured), dtype=bool)
    try:
        solved = _solve(hardware, requested, residuals_at, kept)
    except _Underdetermined as exc:
        raise StagewrightError(exc.explain(len(runs))) from None
    warnings = []
    for _ in range(_OUTLIER_ROUNDS if exclude_outliers else 0):
        found = outliers(solved.residuals, kinds)
        if found == excluded:
            break
        kept_now = np.array([k not in found for k in range(len(measured))])
        try:
            solved_now = _solve(hardware, requested, residuals_at, kept_now)
        except _Underdetermined as exc:
            # Leaving these out would leave fewer numbers than parameters: keep the last fit.
            warnings.append(
                f"{len(found)} measurement(s) look like outliers, but leaving them out would "
                f"leave {exc.kept} measured quantities for {len(exc.informed)} parameters; "
                "they are kept in the fit"
            )
            break
        excluded, kept, solved = found, kept_now, solved_now
    else:
        if exclude_outliers:
            warnings.append(
                f"the measurements left out as outliers did not settle in {_OUTLIER_ROUNDS} "
                "rounds; the fit shown is the last round's"
            )
    before, after = np.exp(solved.start + targets), np.exp(solved.residuals + targets)
    quantities = [
        Quantity(i, name, value, float(before[k]), float(after[k]), k in excluded)
        for k, (i, name, value) in enumerate(measured)
    ]
    if not solved.converged:
        warnings.append(f"stopped after {solved.iterations} iterations without converging")
    warnings += _determination_warnings(solved.fits, int(kept.sum()))
    return CalibrationResult(
        hardware=hardware.with_parameters(
            {f.parameter.name: f.value for f in solved.fits if f.status in ("fitted", "at bound")}
        ),
        parameters=solved.fits,
        quantities=quantities,
        iterations=solved.iterations,
        rms_log_error_before=_rms(solved.start[kept]),
        rms_log_error=_rms(solved.residuals[kept]),
        num_runs=len(runs),
        warnings=warnings,
    )


# Outliers: the Hampel identifier on the fit's ln errors of each kind of quantity, a
# quantity more than _OUTLIER_SCALES robust standard deviations (1.4826 x the median
# absolute deviation) from their median; never closer than _OUTLIER_SCALES x _NOISE_FLOOR,
# so that a fit that leaves the others within a percent or two (few runs, several
# parameters) does not call a run 4% off an outlier. Rounds of fit-and-exclude are
# bounded, as sigma clipping bounds them.
_OUTLIER_SCALES = 3.0
_NOISE_FLOOR = 0.03
_OUTLIER_ROUNDS = 5


def quantity_kind(name: str) -> str:
    """The kind of a measured quantity: its name without a device index
    (``peak_memory_gib[2]`` is a ``peak_memory_gib``)."""
    return name.split("[")[0]


def outliers(log_errors: np.ndarray, kinds: Sequence[str] | None = None) -> frozenset[int]:
    """Indices of the ln(predicted / measured) errors that lie more than 3 robust standard
    deviations (at least 3 x 0.03) from the median of their kind: ``kinds[k]`` names error
    k's kind of quantity (step times, memory, pass times are judged apart, as the model's
    errors on each differ; default: one kind)."""
    if kinds is None:
        kinds = [""] * len(log_errors)
    out: set[int] = set()
    for kind in set(kinds):
        members = np.array([k for k, name in enumerate(kinds) if name == kind])
        errors = log_errors[members]
        centre = float(np.median(errors))
        spread = 1.4826 * float(np.median(np.abs(errors - centre)))
        limit = _OUTLIER_SCALES * max(spread, _NOISE_FLOOR)
        out.update(int(k) for k in members[np.abs(errors - centre) > limit])
    return frozenset(out)


@dataclass(frozen=True)
class _Solved:
    """One bounded least-squares fit on the quantities ``kept``: every quantity's ln error
    at the start and at the solution, and what happened to each parameter."""

    start: np.ndarray
    residuals: np.ndarray
    fits: list[ParameterFit]
    iterations: int
    converged: bool


def _solve(
    hardware: HardwareProfile,
    requested: list[FreeParameter],
    residuals_at: Callable[[dict[str, float]], np.ndarray],
    kept: np.ndarray,
) -> _Solved:
    start = {p.name: hardware.parameter(p.name) for p in requested}
    r0_all = residuals_at(start)

    def kept_residuals(values: dict[str, float]) -> np.ndarray:
        return residuals_at(values)[kept]  # type: ignore[no-any-return]

    r0 = r0_all[kept]
    informed = [p for p in requested if _informs(p, start, r0, kept_residuals)]
    if len(r0) < len(informed):
        raise _Underdetermined(informed, len(r0))

    def residuals(x: np.ndarray) -> np.ndarray:
        return kept_residuals({**start, **_unscaled(informed, x)})

    x0 = np.array([(start[p.name] - p.lower) / (p.upper - p.lower) for p in informed])
    solution = least_squares.minimise(residuals, x0, r0)
    errors = least_squares.std_errors(residuals, solution.x, solution.residuals)
    fitted = _unscaled(informed, solution.x)
    fits = _parameter_fits(
        hardware,
        requested,
        fitted,
        {
            p.name: e if e is None else e * (p.upper - p.lower)
            for p, e in zip(informed, errors, strict=True)
        },
    )
    return _Solved(
        r0_all,
        residuals_at({**start, **fitted}),
        fits,
        solution.iterations,
        solution.converged,
    )


class _Underdetermined(Exception):
    """Fewer measured quantities than parameters they inform: least squares has a whole
    family of exact solutions, and the one an iteration stops at says nothing."""

    def __init__(self, informed: list[FreeParameter], kept: int) -> None:
        super().__init__(kept, informed)
        self.informed, self.kept = informed, kept

    def explain(self, runs: int) -> str:
        names = ", ".join(p.name for p in self.informed)
        return (
            f"{runs} run(s) give {self.kept} measured quantities, fewer than the "
            f"{len(self.informed)} parameters they inform ({names}): a fit needs at least "
            "one measured number per parameter, or it can put them anywhere; add runs "
            "(other t, p, d, micro-batch sizes, single-pass times) or fit fewer, e.g. "
            f"--parameter {self.informed[0].name}"
        )


def _determination_warnings(fits: list[ParameterFit], kept: int) -> list[str]:
    """What the table's standard errors alone do not say: a fit through every measurement
    (as many numbers as parameters) has no error estimate, and a parameter whose standard
    error is wider than its whole range is not pinned down by the runs."""
    moved = [f for f in fits if f.status in ("fitted", "at bound")]
    if moved and kept == len(moved):
        return [
            f"as many measured quantities as fitted parameters ({kept}): the fit passes "
            "through every measurement and has no error estimate; add runs to check it"
        ]
    return [
        f"{f.parameter.name}: standard error {f.std_error:.3g} is wider than its whole range "
        f"[{f.parameter.lower:g}, {f.parameter.upper:g}]: these runs barely determine it; add "
        "runs that vary what it prices, or leave it out (--parameter names the ones to fit)"
        for f in moved
        if f.std_error is not None and f.std_error > f.parameter.upper - f.parameter.lower
    ]


def evaluate(
    runs: Sequence[MeasuredRun],
    before: HardwareProfile,
    after: HardwareProfile,
    layer_points: Sequence[LayerPoint],
) -> list[Quantity]:
    """Every measured quantity of ``runs`` predicted with two profiles (e.g. runs a fit did
    not use, with the profile before and after it: how the fit generalizes)."""
    measured = _measured(runs, before)
    first = _predicted(runs, before, layer_points, measured)
    second = _predicted(runs, after, layer_points, measured)
    return [
        Quantity(i, name, value, float(first[k]), float(second[k]))
        for k, (i, name, value) in enumerate(measured)
    ]


def rms_log_error(quantities: Sequence[Quantity], after: bool = True) -> float:
    """RMS of ln(predicted / measured) over ``quantities`` (after the fit, or before)."""
    if not quantities:
        return 0.0
    errors = [q.log_error_after if after else q.log_error_before for q in quantities]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def _measured(
    runs: Sequence[MeasuredRun], hardware: HardwareProfile
) -> list[tuple[int, str, float]]:
    return [
        (index, name, value)
        for index, run in enumerate(runs)
        for name, value in measured_quantities(run, hardware).items()
    ]


def _predicted(
    runs: Sequence[MeasuredRun],
    hardware: HardwareProfile,
    layer_points: Sequence[LayerPoint],
    measured: list[tuple[int, str, float]],
) -> np.ndarray:
    predicted = [predict_quantities(run, hardware, layer_points) for run in runs]
    values = np.array([predicted[i][name] for i, name, _ in measured])
    bad = [k for k, v in enumerate(values) if not (math.isfinite(v) and v > 0)]
    if bad:
        i, name, _ = measured[bad[0]]
        raise StagewrightError(
            f"the cost model predicts {values[bad[0]]} for {name} of run {i + 1}; it cannot "
            "be fitted on a log scale"
        )
    return values


def _rms(r: np.ndarray) -> float:
    return float(math.sqrt(float(np.mean(r * r))))


def _unscaled(params: list[FreeParameter], x: np.ndarray) -> dict[str, float]:
    return {
        p.name: float(p.lower + (p.upper - p.lower) * min(max(float(v), 0.0), 1.0))
        for p, v in zip(params, x, strict=True)
    }


def _informs(
    p: FreeParameter,
    start: dict[str, float],
    r0: np.ndarray,
    residuals_at: Callable[[dict[str, float]], np.ndarray],
) -> bool:
    """Does any residual move when ``p`` moves across its range? Probed at both bounds (a
    threshold term can be flat near the start and still matter)."""
    for bound in (p.lower, p.upper):
        moved = residuals_at({**start, p.name: bound})
        if float(np.max(np.abs(moved - r0))) > _NO_INFORMATION:
            return True
    return False


def _parameter_fits(
    hardware: HardwareProfile,
    requested: list[FreeParameter],
    fitted: dict[str, float],
    errors: dict[str, float | None],
) -> list[ParameterFit]:
    """One entry per registered parameter: the requested ones as fitted / at bound /
    uninformed, the rest as held."""
    names = {p.name for p in requested}
    out = []
    for name in sorted(PARAMETERS):
        p = PARAMETERS[name]
        start = hardware.parameter(name)
        if name not in names:
            out.append(ParameterFit(p, start, start, "held"))
        elif name not in fitted:
            out.append(ParameterFit(p, start, start, "uninformed"))
        else:
            value = fitted[name]
            status: ParameterStatus = (
                "at bound" if value <= p.lower or value >= p.upper else "fitted"
            )
            out.append(ParameterFit(p, start, value, status, errors[name]))
    return out
