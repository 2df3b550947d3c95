"""Fitting the memory allowance to out-of-memory labels (planner.costmodel.allowance)."""

from __future__ import annotations

import random

import pytest

from planner.costmodel.allowance import MemoryLabel, fit_allowance

GIB = float(2**30)


def label(gib: float, fits: bool) -> MemoryLabel:
    return MemoryLabel(gib * GIB, fits, f"{gib} GiB {'ran' if fits else 'OOM'}")


def test_two_labels_by_hand():
    # Capacity 78 GiB. A run of 70 GiB tensors fitted, one of 75 GiB did not. With no
    # fragmentation the workspace lies in (78 - 75, 78 - 70] = (3, 8]: the middle is 5.5,
    # 2.5 GiB from either boundary. A fragmentation f widens the gap in workspace to
    # 5 (1 + f) but not in tensor GiB: the margin is the same, and the least f is taken.
    fit = fit_allowance([label(70, True), label(75, False)], 78 * GIB)
    assert fit.fragmentation == 0.0
    assert fit.workspace_gib == pytest.approx(5.5)
    assert fit.margin_gib == pytest.approx(2.5)
    assert (fit.agreed, fit.total, fit.disagreeing) == (2, 2, ())


def test_the_workspace_stays_within_its_bounds():
    # One run of 70 GiB fitted in 78: any workspace up to 8 GiB agrees; the farthest from
    # that boundary within the bounds is none at all, 8 GiB away.
    bounds = {"workspace_gib": (0.0, 4.0), "fragmentation": (0.0, 0.0)}
    fit = fit_allowance([label(70, True)], 78 * GIB, **bounds)
    assert fit.workspace_gib == 0.0 and fit.margin_gib == pytest.approx(8.0)
    # One of 80 GiB did not fit: every workspace from -2 GiB up agrees; the bound 4 is the
    # farthest from -2.
    oom_only = fit_allowance([label(80, False)], 78 * GIB, **bounds)
    assert oom_only.workspace_gib == 4.0 and oom_only.margin_gib == pytest.approx(6.0)


def test_contradicting_labels_are_reported_not_hidden():
    # A 77 GiB run fitted but a 76 GiB one did not: no allowance agrees with both.
    labels = [label(60, True), label(77, True), label(76, False), label(90, False)]
    fit = fit_allowance(labels, 78 * GIB)
    assert fit.agreed == 3 and fit.total == 4
    assert len(fit.disagreeing) == 1


def test_labels_made_with_a_known_allowance_are_all_reproduced():
    rng = random.Random(7)
    workspace, fragmentation, capacity = 2.0, 0.04, 78.0
    labels = []
    for _ in range(200):
        tensors = rng.uniform(55, 85)
        labels.append(label(tensors, tensors * (1 + fragmentation) + workspace <= capacity))
    fit = fit_allowance(labels, capacity * GIB)
    assert fit.agreed == 200 and fit.disagreeing == ()
    # The labels only see the need near capacity: there the fitted allowance matches.
    near = 74.0
    assert near * fit.fragmentation + fit.workspace_gib == pytest.approx(
        near * fragmentation + workspace, abs=0.3
    )


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one label"):
        fit_allowance([], 78 * GIB)
    with pytest.raises(ValueError, match="lower bound"):
        fit_allowance([label(1, True)], 78 * GIB, workspace_gib=(2.0, 1.0))
