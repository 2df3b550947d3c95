"""Bounded nonlinear least squares on the unit box: Levenberg-Marquardt with projection.

Minimises sum(r(x)^2) for x in [0, 1]^n (callers scale their bounds to the box). Each
iteration solves (J^T J + lambda diag(J^T J)) step = -J^T r (Marquardt 1963), projects
x + step onto the box, and accepts it if the cost falls (lambda / 3), else retries with
lambda x 4; it stops when an accepted step gains less than RELATIVE_DECREASE of the cost
or no step gains anything. The Jacobian is a forward difference (backward at the upper
face). Deterministic: no random starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Solution", "minimise", "std_errors"]

Residuals = Callable[[np.ndarray], np.ndarray]

# A thousandth of a parameter's range: small enough for the slope, large enough to see
# through a model's rounding (a parameter used as a whole number, e.g.).
_DIFFERENCE_STEP = 1e-3
MAX_ITERATIONS = 100
# Stop when an accepted step lowers the cost by less than this fraction of it (the RMS
# error then moves by less than half of that: below anything a person would act on).
RELATIVE_DECREASE = 1e-4


@dataclass(frozen=True)
class Solution:
    x: np.ndarray
    residuals: np.ndarray
    iterations: int
    converged: bool


def jacobian(residuals: Residuals, x: np.ndarray, r: np.ndarray) -> np.ndarray:
    columns = []
    for j in range(len(x)):
        step = _DIFFERENCE_STEP if x[j] + _DIFFERENCE_STEP <= 1.0 else -_DIFFERENCE_STEP
        probe = x.copy()
        probe[j] += step
        columns.append((residuals(probe) - r) / step)
    return np.stack(columns, axis=1)


def minimise(residuals: Residuals, x0: np.ndarray, r0: np.ndarray) -> Solution:
    """The box-constrained minimum of sum(residuals(x)^2) from ``x0`` (whose residuals are
    ``r0``). ``converged`` is False only when the iteration limit stopped it."""
    x, r = x0.copy(), r0
    if not len(x):
        return Solution(x, r, 0, True)
    cost = float(r @ r)
    damping = 1e-3
    for iteration in range(1, MAX_ITERATIONS + 1):
        jac = jacobian(residuals, x, r)
        gradient = jac.T @ r
        normal = jac.T @ jac
        scale = np.diag(np.maximum(np.diag(normal), 1e-12))
        improved = done = False
        while damping < 1e12:
            step = np.linalg.solve(normal + damping * scale, -gradient)
            trial = np.clip(x + step, 0.0, 1.0)
            if float(np.max(np.abs(trial - x))) < 1e-12:
                break  # the box stops every descent direction: a bound optimum
            r_trial = residuals(trial)
            trial_cost = float(r_trial @ r_trial)
            if trial_cost < cost:
                improved = True
                done = cost - trial_cost <= RELATIVE_DECREASE * cost
                x, r, cost = trial, r_trial, trial_cost
                damping = max(damping / 3.0, 1e-9)
                break
            damping *= 4.0
        if not improved or done:
            return Solution(x, r, iteration, True)
    return Solution(x, r, MAX_ITERATIONS, False)


def std_errors(residuals: Residuals, x: np.ndarray, r: np.ndarray) -> list[float | None]:
    """Per coordinate, sqrt of the diagonal of s^2 (J^T J)^-1 with s^2 = cost / (m - n):
    the Gauss-Newton standard error. None when m <= n or J^T J is singular."""
    dof = len(r) - len(x)
    if dof <= 0 or not len(x):
        return [None] * len(x)
    jac = jacobian(residuals, x, r)
    try:
        covariance = np.linalg.inv(jac.T @ jac) * float(r @ r) / dof
    except np.linalg.LinAlgError:
        return [None] * len(x)
    return [math.sqrt(max(float(covariance[j, j]), 0.0)) for j in range(len(x))]
