"""What a schedule built for a memory limit gained over the fixed schedules of its layout.

Each v-adaptive (or zb-adaptive) candidate of a plan carries a note: the memory limit it was
built for and how its step time compares with the best fixed schedule the request searched
for the same (t, p, d, micro-batch size, recompute), priced the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.costmodel.adaptive import built_for_a_limit
from planner.costmodel.evaluate import Estimate, Priced

__all__ = ["limit_note"]


def _layout(estimate: Estimate) -> tuple[int, int, int, int, str]:
    c = estimate.config
    return c.t, c.p, c.d, c.micro_batch_size, c.recompute


def limit_note(
    priced: Priced, feasible: list[Estimate], price_at: Callable[[int], Priced]
) -> str | None:
    """The note of a candidate built for a memory limit (None for the others): how it
    compares with the fixed schedules of ``feasible`` on its layout, ``price_at(i)`` giving
    the simulated price of ``feasible[i]``."""
    config = priced.estimate.config
    if config.memory_limit is None:
        return None
    layout = _layout(priced.estimate)
    fixed = [
        price_at(index)
        for index, e in enumerate(feasible)
        if _layout(e) == layout
        and not built_for_a_limit(e.config.schedule)
        and e.config.recompute_per_stage is None
    ]
    peak = priced.simulation.schedule.meta.get("peak_activation_fraction")
    text = (
        f"{config.schedule} built for a memory limit of {config.memory_limit:.3g} of 1F1B's "
        f"peak activation, what every device has left for activations"
        + (f" (the schedule it found peaks at {peak:.3g})" if peak is not None else "")
    )
    if not fixed:
        return text + "; no fixed schedule the request searched fits this layout"
    best = min(fixed, key=lambda p: p.iteration_time_s)
    gain = best.iteration_time_s / priced.iteration_time_s - 1
    return text + (
        f"; {priced.iteration_time_s:.4g} s per step vs {best.iteration_time_s:.4g} s for "
        f"{best.estimate.config.schedule_label}, the best fixed schedule of this layout "
        f"({gain:+.2%} throughput)"
    )
