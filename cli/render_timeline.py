"""A candidate's simulated schedule drawn in the terminal (``stagewright plan --timeline``),
from the same timeline the dashboard's Gantt chart draws (``planner.search.timeline``)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

__all__ = ["counted", "format_candidate_timeline", "reason_kind", "reason_summary"]

# One character per kind; a V schedule's second chunk in lower case.
_SYMBOLS = {"F": "F", "B": "B", "W": "W", "BW": "X", "STEP": "S"}
_NAMES = {
    "F": "forward",
    "B": "backward (input)",
    "W": "backward (weights)",
    "BW": "backward",
    "STEP": "optimizer step",
}


def counted(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless n is 1 ("1 device", "4 devices", "1 micro-batch",
    "2 micro-batches")."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun}{'es' if noun.endswith('ch') else 's'}"


def _plan_step(timeline: dict[str, Any]) -> str:
    """The plan's step time beside the drawn span: they differ by what the drawing leaves
    out (data-parallel sync and the optimizer step; 2BW's drawing is two batches)."""
    step = timeline.get("step_time_s")
    if step is None:
        return ""
    what = "data-parallel sync and the optimizer step included"
    if timeline.get("num_batches", 1) > 1:
        what = "one batch in the steady state, " + what
    return f"; the plan's step time {step:.4g} s ({what})"


def format_candidate_timeline(timeline: dict[str, Any], width: int) -> str:
    """Rows of ``width`` columns, one per pipeline device, over the step: each column shows
    the action running at its middle ('.' idle), then a legend of the symbols drawn. A
    timeline too large to draw action by action ('summary' mode) is drawn as each device's
    busy share ('#') and idle share ('.')."""
    width = max(10, width)
    devices = timeline["devices"]
    makespan = float(timeline["makespan"])
    microbatches = timeline.get("num_microbatches")
    lines = [
        f"schedule {timeline['schedule']}: {counted(len(devices), 'device')}, "
        + (counted(microbatches, "micro-batch") if microbatches is not None else "? micro-batches")
        + (
            f" ({timeline['num_batches']} batches without a flush)"
            if timeline.get("num_batches", 1) > 1
            else ""
        ),
        f"drawn: {makespan:.4g} s, bubble {timeline['bubble_fraction']:.1%}" + _plan_step(timeline),
    ]
    if makespan <= 0:
        return "\n".join([*lines, "(empty schedule)"])
    label = max(len(f"dev {d['device']}") for d in devices) + 1
    if timeline["mode"] != "actions":
        lines.append(f"{timeline['num_actions']:,} actions: each device's busy (#) and idle (.)")
        for d in devices:
            busy = round(width * min(1.0, d["busy_s"] / makespan))
            lines.append(
                f"{'dev ' + str(d['device']):<{label}}|{'#' * busy}{'.' * (width - busy)}|"
            )
        return "\n".join(lines)
    end = f"{makespan:.4g} s"
    lines.append(f"{'':<{label}} 0 s{end:>{width - 3}}")
    present: set[tuple[str, int]] = set()
    per = makespan / width
    for d in devices:
        stages = d.get("stages") or []
        row = ["."] * width
        for kind, stage, _, start, stop in d["actions"]:
            symbol = _SYMBOLS.get(kind)
            if symbol is None:  # transfers overlap compute; the dashboard draws them
                continue
            chunk = stages.index(stage) if stage in stages and kind != "STEP" else 0
            first = max(0, int(start / per + 0.5))
            last = min(width, int(stop / per + 0.5))
            for c in range(first, last):
                row[c] = symbol.lower() if chunk else symbol
            if last > first:
                present.add((kind, chunk))
        lines.append(f"{'dev ' + str(d['device']):<{label}}|{''.join(row)}|")
    chunked = any(len(d.get("stages") or []) > 1 for d in devices)
    legend = []
    for kind, symbol in _SYMBOLS.items():
        for chunk in (0, 1):
            if (kind, chunk) in present:
                name = _NAMES[kind] + (f", chunk {chunk + 1}" if chunked and kind != "STEP" else "")
                legend.append(f"{symbol.lower() if chunk else symbol} {name}")
    legend.append(". idle")
    lines.append("legend: " + "   ".join(legend))
    return "\n".join(lines)


def reason_kind(reason: str) -> str:
    """What kind of rejection a reason is: its text before the first ':', ';' or '(', with
    numbers written as n (the dashboard groups its rejected table the same way)."""
    head = re.split(r"[:;(]", reason, maxsplit=1)[0]
    return re.sub(r"\b\d+(?:\.\d+)?\b", "n", head).strip()


def reason_summary(reasons: list[str]) -> list[tuple[str, int]]:
    """(kind, count) of every kind of rejection, the most frequent first."""
    return Counter(reason_kind(r) for r in reasons).most_common()
