"""Terminal tables that fit the width without cutting a value short.

A table squeezed into a narrow terminal by rich ellipsizes every cell ("bpi…", "29.…"), the
answer included. Here a value is never cut: each column is as wide as its longest value
(a header may wrap at its spaces), and when the columns do not fit, the least important
ones are left out, and the caller says which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.table import Table

__all__ = ["Column", "fitted_table"]

WRAPPED_MIN = 24  # a column of long text (a reason) keeps at least this much, wrapping
_PADDING = 2  # rich's default: one space either side of a cell
_RULE = 1  # one line between columns, and one at each edge


@dataclass(frozen=True)
class Column:
    """A column: its header, alignment, and whether its values are long text that wraps
    within whatever width the other columns leave (a reason), rather than numbers or
    names that must stay whole."""

    header: str
    justify: Literal["left", "right"] = "right"
    wraps: bool = False


def _needed(column: Column, values: Sequence[str]) -> int:
    header = max((len(word) for word in column.header.split()), default=0)
    longest = max((len(v) for v in values), default=0)
    if column.wraps:
        return max(header, min(longest, WRAPPED_MIN))
    return max(header, longest)


def fitted_table(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    width: int,
    drop_order: Sequence[str] = (),
) -> tuple[Table, list[str]]:
    """A table of ``rows`` (one string per column) within ``width`` characters in which no
    value is cut short; when the whole values do not fit, the columns named in
    ``drop_order`` are left out, first to last, until they do (or none is left to drop:
    rich then wraps). Returns the table and the headers left out, in ``drop_order``'s
    order."""
    needed = [_needed(c, [row[i] for row in rows]) for i, c in enumerate(columns)]
    kept = list(range(len(columns)))
    dropped: list[str] = []

    def total() -> int:
        return sum(needed[i] + _PADDING for i in kept) + _RULE * (len(kept) + 1)

    for header in drop_order:
        if total() <= width:
            break
        index = next((i for i in kept if columns[i].header == header), None)
        if index is not None:
            kept.remove(index)
            dropped.append(header)
    table = Table(title=title)
    for i in kept:
        column = columns[i]
        if column.wraps:
            table.add_column(column.header, justify=column.justify, overflow="fold")
        else:
            # A header longer than its values goes on one line a word (rich would cut it).
            header = column.header
            if len(header) > needed[i]:
                header = header.replace(" ", "\n")
            table.add_column(header, justify=column.justify, no_wrap=True, min_width=needed[i])
    for row in rows:
        table.add_row(*(row[i] for i in kept))
    return table, dropped
