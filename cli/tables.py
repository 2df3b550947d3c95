"""Terminal tables that fit the width without cutting a value short.

A table squeezed into a narrow terminal by rich ellipsizes every cell ("bpi…", "29.…"), the
answer included. Here a value is never cut: each column is as wide as its longest value
(a header may wrap at its spaces), and when the columns do not fit, the least important
ones are left out, and the caller says which (``print_fitted`` does both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["Cell", "Column", "fitted_table", "print_fitted"]

# A value: plain text, or a rich Text carrying its style (measured by its plain text).
Cell = str | Text

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


def _needed(column: Column, values: Sequence[Cell], whole_header: bool) -> int:
    words = [column.header] if whole_header else column.header.split()
    header = max((len(word) for word in words), default=0)
    longest = max((len(v) for v in values), default=0)
    if column.wraps:
        return max(header, min(longest, WRAPPED_MIN))
    return max(header, longest)


def fitted_table(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    width: int,
    drop_order: Sequence[str] = (),
) -> tuple[Table, list[str]]:
    """A table of ``rows`` (one value per column) within ``width`` characters in which no
    value is cut short: headers on one line if that fits, else a word a line; when the
    whole values still do not fit, the columns named in ``drop_order`` are left out, first
    to last, until they do (or none is left to drop: rich then wraps). Returns the table
    and the headers left out, in ``drop_order``'s order."""
    kept = list(range(len(columns)))
    dropped: list[str] = []

    def widths(whole_header: bool) -> list[int]:
        return [_needed(c, [row[i] for row in rows], whole_header) for i, c in enumerate(columns)]

    def total(needed: list[int]) -> int:
        return sum(needed[i] + _PADDING for i in kept) + _RULE * (len(kept) + 1)

    needed = widths(whole_header=True)
    if total(needed) > width:
        needed = widths(whole_header=False)
    for header in drop_order:
        if total(needed) <= width:
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
            # A header longer than its column goes on one line a word (rich would cut it).
            header = column.header
            if len(header) > needed[i]:
                header = header.replace(" ", "\n")
            table.add_column(header, justify=column.justify, no_wrap=True, min_width=needed[i])
    for row in rows:
        table.add_row(*(row[i] for i in kept))
    return table, dropped


def print_fitted(
    console: Console,
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    drop_order: Sequence[str] = (),
) -> list[str]:
    """Print ``fitted_table`` within the console's width and say which columns were left
    out (and how to see them); returns their headers, in ``drop_order``'s order."""
    table, dropped = fitted_table(title, columns, rows, console.width, drop_order)
    console.print(table)
    if dropped:
        console.print(
            f"  ({', '.join(dropped)} left out to fit {console.width} columns: a wider "
            "terminal, COLUMNS=200 or --json shows them)",
            highlight=False,
            soft_wrap=True,
        )
    return dropped
