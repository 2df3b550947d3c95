"""Which of a plan's candidates its cost model cannot tell apart from the first.

A calibrated profile knows how far its predictions were off on the runs it was fitted to:
each candidate's ``calibration_error`` is the root mean square of ln(predicted / measured)
step time of its time source. Two candidates whose predicted step times differ by less
than that are ordered by the model's noise as much as by the configurations.

So the plan names the listed candidates predicted within the larger of the two errors of
the first, and says what settles the order: measuring them. It does not re-rank them. Where
neither candidate's error is known (an uncalibrated profile, or measured points, whose
error is the measurement's) nothing is said: there is no figure to compare with, and the
trust text of every candidate already says the error is unknown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from planner.specs import Candidate, Predicted

__all__ = ["near_tie_note", "near_ties", "within_error"]

NAMED = 5  # candidates the note names; the rest it counts


def within_error(first: Predicted, other: Predicted) -> bool:
    """Whether ``other``'s predicted step time is within the prediction error of ``first``'s:
    |ln(other / first)| below the larger of their sources' calibration errors (False when
    neither is known, or when a step time is not positive: nothing to compare)."""
    errors = [e for e in (first.calibration_error, other.calibration_error) if e is not None]
    if not errors or first.iteration_time_s <= 0 or other.iteration_time_s <= 0:
        return False
    gap = abs(math.log(other.iteration_time_s / first.iteration_time_s))
    return gap < max(errors)


def near_ties(candidates: Sequence[Candidate]) -> list[int]:
    """Positions in ``candidates`` (0-based list indices; 0, the first, is never among
    them) of those the model cannot tell apart from ``candidates[0]`` (:func:`within_error`)."""
    if not candidates:
        return []
    first = candidates[0].predicted
    return [
        index
        for index, other in enumerate(candidates[1:], start=1)
        if within_error(first, other.predicted)
    ]


def near_tie_note(candidates: Sequence[Candidate]) -> str | None:
    """The first candidate's note when others listed are within the prediction error of it
    (``candidates`` ranked, as the plan lists them); None when none is."""
    tied = near_ties(candidates)
    if not tied:
        return None
    first = candidates[0].predicted
    listed = [
        f"#{i + 1} ({candidates[i].config.label}, "
        # Ranked candidates are never faster than the first beyond rounding: no "-0.0%".
        f"{max(0.0, candidates[i].predicted.iteration_time_s / first.iteration_time_s - 1):+.1%})"
        for i in tied[:NAMED]
    ]
    if len(tied) > NAMED:
        listed.append(f"{len(tied) - NAMED} more of the listed candidates")
    errors = [
        e
        for e in (
            first.calibration_error,
            *(candidates[i].predicted.calibration_error for i in tied),
        )
        if e is not None
    ]
    largest = max(errors)
    which = "is" if len(tied) == 1 else "are"
    return (
        f"{_joined(listed)} {which} predicted within the cost model's error of this one "
        f"(rms of ln(predicted / measured) {largest:.3f} on the runs its profile was "
        "calibrated with): the model cannot order them reliably. Measure them before "
        "choosing on the prediction alone (stagewright plan --emit writes each one's launch "
        "files; stagewright measurements add stores the measured runs, and the next "
        "stagewright calibrate learns from them)."
    )


def _joined(items: Sequence[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]
