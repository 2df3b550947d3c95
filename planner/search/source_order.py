"""Whether a plan's order holds when its candidates are priced alike.

A candidate's layer times come from a measured profile point (its own shape, or a
neighbour's carried over by the model) or from the shape-aware model alone. Where the model
and the measurements disagree, comparing a candidate of one kind with one of the other
compares their sources' errors as much as the configurations: with the bundled A100
profile, the model alone is about 9% fast on BPipe Table 7's step runs while the rows priced
from BPipe Table 3's measured passes are about 2% slow, and that difference is what puts
96B's t2 p16 mb1 BPipe above the paper's best, t4 p8 mb2 BPipe
(``benchmarks/paper_reproduction.py`` prints both biases).

So the plan checks the first candidate against the best-ranked candidate whose times come
from the other kind of source, both priced by the model alone. If the order turns, the plan
says so and what makes it trustworthy (a calibrated profile); it does not re-rank: measured
points win where they exist, and which side is wrong is what a calibration finds out.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.costmodel.evaluate import PlanContext, Priced, estimate, price
from planner.costmodel.timing import MEASURED_ORIGINS

__all__ = ["source_order_note"]


def _measured(priced: Priced) -> bool:
    return priced.estimate.costs.layer.origin in MEASURED_ORIGINS


def source_order_note(ctx: PlanContext, ranked: Sequence[Priced]) -> str | None:
    """The note of a plan whose first candidate (``ranked[0]``) and best-ranked candidate
    of the other kind of layer-time source would swap places if both were priced by the
    model alone (``ctx`` without its measured points); None when they would not, or when
    every candidate's times come from the same kind of source."""
    if not ranked:
        return None
    first = ranked[0]
    first_measured = _measured(first)
    found = next(
        ((rank, c) for rank, c in enumerate(ranked[1:], start=2) if _measured(c) != first_measured),
        None,
    )
    if found is None:
        return None
    rank, other = found
    # (rank, candidate) of the one priced from measured points and of the one priced by the
    # model alone; the measured one is priced again without its points.
    measured, modelled = (
        ((1, first), (rank, other)) if first_measured else ((rank, other), (1, first))
    )
    model_only = PlanContext(ctx.request, ctx.hardware, [], ctx.placements)
    config = measured[1].estimate.config
    alone = price(model_only, estimate(model_only, config)).iteration_time_s
    modelled_time = modelled[1].iteration_time_s
    # The order turns when the measured one, priced alike, lands on the other side.
    if not (alone > modelled_time if first_measured else alone < modelled_time):
        return None
    source = {True: "measured points", False: "the model alone"}
    what = (
        f"#1 ({first.estimate.config.label}) takes its layer times from "
        f"{source[first_measured]} and #{rank} ({other.estimate.config.label}) from "
        f"{source[not first_measured]}; priced by the model alone too, #{measured[0]} would "
        f"take {alone:.3f} s a step, {'more' if first_measured else 'less'} than "
        f"#{modelled[0]}'s {modelled_time:.3f} s"
    )
    calibrated = ctx.hardware.calibration is not None
    # Each remedy completes "before trusting it, ...": what to do first, then why.
    remedy = (
        "add measured runs of these configurations (stagewright measurements add) and "
        "calibrate again: the profile's calibration does not reconcile them"
        if calibrated
        else "calibrate the profile to measured runs (stagewright calibrate "
        f"--hardware {ctx.hardware.name}): it has not been calibrated"
    )
    return (
        f"{what}. Their order rests on where the model and the measurements disagree, not on "
        f"the configurations; before trusting it, {remedy}."
    )
