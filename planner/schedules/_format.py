"""Readable renderings of a schedule: a grid of action strings per device (for error
messages and the CLI) and an ASCII timeline from simulated start/end times."""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedules._ir import Schedule

__all__ = ["format_grid", "format_timeline"]

_SYMBOL = {"F": "F", "B": "B", "W": "W", "BW": "b", "EVICT": "e", "LOAD": "l", "STEP": "S"}


def format_grid(schedule: Schedule, max_columns: int = 24) -> str:
    """One line per device with its first ``max_columns`` actions, like torch's
    ``_format_pipeline_order``: enough to see a schedule's shape in an error message."""
    lines = []
    for device, acts in enumerate(schedule.actions):
        shown = " ".join(f"{str(a):>6}" for a in acts[:max_columns])
        more = f" ... (+{len(acts) - max_columns})" if len(acts) > max_columns else ""
        lines.append(f"dev {device:>2}: {shown}{more}")
    return "\n".join(lines)


def format_timeline(
    schedule: Schedule,
    start: Sequence[float],
    end: Sequence[float],
    makespan: float,
    width: int = 100,
) -> str:
    """ASCII Gantt chart: one row per device, ``width`` columns for the makespan. Each column
    shows the action running in its middle: F forward, B input-grad backward, W weight-grad
    backward, b fused backward, S optimizer step, '.' idle; a digit row under each device
    marks micro-batch numbers mod 10 at the start of each forward. Transfers (e/l) are drawn
    on a second row when present."""
    if makespan <= 0:
        return "(empty schedule)"
    scale = width / makespan
    lines = [f"time 0 .. {makespan:.4g} ({makespan / width:.3g} per column)"]
    index = 0
    for device, acts in enumerate(schedule.actions):
        row = ["."] * width
        marks = [" "] * width
        copy = [" "] * width
        for a in acts:
            s, e = start[index], end[index]
            index += 1
            symbol = _SYMBOL.get(a.kind.value)
            if symbol is None or e <= s:
                continue
            first = min(width - 1, int(s * scale + 0.5))
            last = max(first, min(width, int(e * scale + 0.5)) - 1)
            target = copy if a.kind.is_transfer else row
            for c in range(first, last + 1):
                target[c] = symbol
            if a.kind.value == "F":
                marks[first] = str(a.microbatch % 10)
        lines.append(f"dev {device:>2} |{''.join(row)}|")
        lines.append(f"       |{''.join(marks)}|")
        if any(ch != " " for ch in copy):
            lines.append(f"  copy |{''.join(copy)}|")
    return "\n".join(lines)
