"""Measured runs from files: JSON or CSV, every problem reported with its row.

JSON: a list of runs, or ``{"runs": [...]}`` (optionally with ``format`` and ``notes``, as
the bundled ``profiles/measurements/*.json``); each run is a :class:`MeasuredRun`.

CSV: one run per row, one column per field named by its path in the JSON, e.g.
``model.hidden_size``, ``config.t``, ``measured.kind``, ``measured.step_time_s``. An empty
cell leaves the field at its default. List fields (``measured.peak_memory_gib``,
``config.layers_per_stage``) take ``;``-separated numbers; a cell that starts with ``[`` or
``{`` is read as JSON (``config.recompute_per_stage``). A missing required column or an
unknown one is an error about the header, before any row is read.

A file is taken whole or not at all: :func:`parse_runs` raises
:class:`MeasurementFileError` listing every bad row (``row N``: the N-th run, counting from
1; for CSV also its line) and column, and the caller stores nothing.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from planner.errors import StagewrightError, error_message
from planner.json_input import loads
from planner.measurements import (
    MeasuredRun,
    PassMeasurement,
    RunConfig,
    StepMeasurement,
)
from planner.specs import ClusterSpec, ModelSpec, TrainingSpec

__all__ = [
    "CSV_COLUMNS",
    "REQUIRED_CSV_COLUMNS",
    "MeasurementFileError",
    "ParsedRun",
    "describe_problems",
    "list_problems",
    "parse_runs",
    "run_to_csv_row",
]

_SECTIONS: dict[str, tuple[type[BaseModel], ...]] = {
    "model": (ModelSpec,),
    "cluster": (ClusterSpec,),
    "training": (TrainingSpec,),
    "config": (RunConfig,),
    "measured": (StepMeasurement, PassMeasurement),
}
_TOP_LEVEL = ("source", "measured_on")
_LIST_COLUMNS = {"measured.peak_memory_gib", "config.layers_per_stage"}
_MAX_LISTED = 20  # problems listed in one message; the rest are counted


def _columns() -> tuple[list[str], list[str]]:
    every: list[str] = []
    required: list[str] = []
    for section, models in _SECTIONS.items():
        for model in models:
            for name, info in model.model_fields.items():
                column = f"{section}.{name}"
                if column not in every:
                    every.append(column)
                # measured.kind has a default per class, but which class is the question.
                required_here = info.is_required() or column == "measured.kind"
                if required_here and column not in required:
                    required.append(column)
    for name in _TOP_LEVEL:
        every.append(name)
        if MeasuredRun.model_fields[name].is_required():
            required.append(name)
    return every, required


CSV_COLUMNS, REQUIRED_CSV_COLUMNS = _columns()

# What a file needs, said of an empty one.
_CSV_NEEDS = (
    "a measurements CSV needs a header line of column names (field paths; these "
    f"{len(REQUIRED_CSV_COLUMNS)} are required: {', '.join(REQUIRED_CSV_COLUMNS)}) and then "
    "one line per run; `stagewright measurements list --csv` writes a file of this form"
)
_JSON_NEEDS = 'a measurements file holds a JSON list of runs or {"runs": [...]}, or is a .csv file'


class MeasurementFileError(StagewrightError):
    """A measurements file that cannot be stored; the message lists every problem.
    ``problems`` are those of its runs one by one, each naming its row and field, when it
    has such problems (empty for a problem of the whole file: not JSON, a bad header,
    empty)."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


@dataclass(frozen=True)
class ParsedRun:
    """A run and where it was: ``where`` is 'row 3' (JSON), 'row 3 (line 4)' (CSV) or
    'runs[2]' (a request body); ``field_word`` what its fields are called there ('column'
    in CSV, else 'field')."""

    where: str
    run: MeasuredRun
    field_word: str = "field"

    def problem(self, field: str, message: str) -> str:
        """A problem of this run's ``field``, for an error message."""
        return f"{self.where}: {self.field_word} {field}: {message}"


def parse_runs(text: str, name: str) -> list[ParsedRun]:
    """Every run of a file called ``name`` (.csv is CSV, anything else JSON), or
    MeasurementFileError naming each bad row and column; an empty file (nothing but
    white space) is refused as such, saying what the file needs."""
    # A byte-order mark (Excel's "CSV UTF-8", Windows editors) is not content: in a CSV it
    # made the first column an unknown one and a required one missing at once.
    text = text.removeprefix("\ufeff")
    is_csv = name.lower().endswith(".csv")
    if not text.strip():  # said as such: the header check would list every column missing
        raise MeasurementFileError(f"{name} is empty; {_CSV_NEEDS if is_csv else _JSON_NEEDS}")
    if is_csv:
        return _validated(_csv_rows(text, name), name, "column")
    try:
        data = loads(text)
    except json.JSONDecodeError as exc:
        raise MeasurementFileError(
            f"{name} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            'give a JSON list of runs, {"runs": [...]}, or a .csv file'
        ) from None
    except StagewrightError as exc:  # a key given twice, or nested too deep
        raise MeasurementFileError(f"{name}: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        extra = sorted(set(data) - {"runs", "format", "notes"})
        if extra:
            raise MeasurementFileError(
                f"{name}: unknown top-level key(s) {', '.join(extra)}; a measurements file has "
                "'runs' (and optionally 'format' and 'notes')"
            )
        data = data["runs"]
    if not isinstance(data, list):
        raise MeasurementFileError(
            f'{name} holds no list of runs; give a JSON list of runs or {{"runs": [...]}}'
        )
    return _validated(((f"row {i}", raw) for i, raw in enumerate(data, start=1)), name, "field")


def _csv_rows(text: str, name: str) -> Iterable[tuple[str, Any]]:
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in reader.fieldnames or []]
    if len(header) == 1:
        separator = next((s for s in (";", "\t", "|") if s in header[0]), None)
        if separator is not None:  # every column would be missing and one unknown
            shown = "tab" if separator == "\t" else repr(separator)
            raise MeasurementFileError(
                f"{name}, header: the columns are separated by {shown}, not by commas; "
                "save the file as comma-separated CSV (a list inside one cell keeps ';')"
            )
    missing = [c for c in REQUIRED_CSV_COLUMNS if c not in header]
    unknown = [c for c in header if c not in CSV_COLUMNS]
    repeated = sorted({c for c in header if header.count(c) > 1})
    problems = []
    if missing:
        problems.append(f"missing column(s) {', '.join(missing)}")
    if unknown:
        problems.append(
            f"unknown column(s) {', '.join(_suggested(c, CSV_COLUMNS) for c in unknown)} "
            "(columns are field paths such as config.t or measured.step_time_s; a column of "
            "notes goes in source)"
        )
    if repeated:
        problems.append(f"column(s) {', '.join(repeated)} given twice")
    if problems:
        raise MeasurementFileError(f"{name}, header: " + "; ".join(problems))
    # A spreadsheet saved as CSV keeps the rows it formatted as ',,,,' lines: no run in them.
    filled = (row for row in reader if any((cell or "").strip() for cell in _cells(row)))
    for number, row in enumerate(filled, start=1):
        where = f"row {number} (line {reader.line_num})"
        if None in row:
            yield (
                where,
                _CellError(f"has {len(header) + len(row[None])} cells for {len(header)} columns"),
            )
            continue
        if None in row.values():  # a short row: csv fills the missing cells with None
            given = sum(value is not None for value in row.values())
            yield where, _CellError(f"has {given} cells for {len(header)} columns")
            continue
        nested: dict[str, Any] = {}
        try:
            for column, cell in zip(header, row.values(), strict=True):
                _put(nested, column, _cell(column, cell))
        except _CellError as exc:
            yield where, exc
            continue
        yield where, nested


def _cells(row: dict[str | None, Any]) -> Iterable[str | None]:
    """Every cell of a DictReader row, those past the header (under None) too."""
    for key, value in row.items():
        yield from (value if key is None else [value])


class _CellError(ValueError):
    """A CSV cell (or row) that cannot be read; carried to the error list, not raised."""


def _cell(column: str, cell: str | None) -> Any:
    text = (cell or "").strip()
    if not text:
        return None
    if text[0] in "[{":
        try:
            return loads(text)
        except json.JSONDecodeError as exc:
            raise _CellError(f"column {column}: {text!r} is not valid JSON ({exc.msg})") from None
        except StagewrightError as exc:  # a key given twice, or nested too deep
            raise _CellError(f"column {column}: {exc}") from None
    if column in _LIST_COLUMNS:
        return [part.strip() for part in text.split(";")]
    return text


def _put(nested: dict[str, Any], column: str, value: Any) -> None:
    if value is None:
        return
    *sections, leaf = column.split(".")
    target = nested
    for section in sections:
        target = target.setdefault(section, {})
    target[leaf] = value


def _validated(rows: Iterable[tuple[str, Any]], name: str, field_word: str) -> list[ParsedRun]:
    runs: list[ParsedRun] = []
    problems: list[str] = []
    for where, raw in rows:
        if isinstance(raw, _CellError):
            problems.append(f"{where}: {raw}")
            continue
        try:
            runs.append(ParsedRun(where, MeasuredRun.model_validate(raw), field_word))
        except ValidationError as exc:
            problems.extend(f"{where}: {problem}" for problem in _problems(exc, field_word))
    if problems:
        raise MeasurementFileError(describe_problems(name, problems), problems)
    if not runs:
        raise MeasurementFileError(f"{name} has no runs")
    return runs


def describe_problems(name: str, problems: Sequence[str]) -> str:
    """One message for the problems of ``name`` (a file, a request), of which nothing is
    stored: '``name``: nothing stored, ' and :func:`list_problems`."""
    return f"{name}: nothing stored, {list_problems(problems)}"


def list_problems(problems: Sequence[str]) -> str:
    """Many problems in one line: how many, the first few listed, the rest counted."""
    shown = problems[:_MAX_LISTED]
    more = len(problems) - len(shown)
    tail = f"; and {more} more problem(s)" if more else ""
    return f"{len(problems)} problem(s): " + "; ".join(shown) + tail


def _problems(exc: ValidationError, field_word: str) -> list[str]:
    out = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        models = _SECTIONS.get(loc[0], ()) if loc else ()
        if loc[:1] == ["measured"] and loc[1:2] in (["step"], ["pass"]):
            models = (StepMeasurement,) if loc[1] == "step" else (PassMeasurement,)
            loc = loc[:1] + loc[2:]  # the union's tag is not a field
        if err["type"] == "union_tag_not_found":
            out.append(f"{field_word} measured.kind is missing: give 'step' or 'pass'")
            continue
        message = _message(err, loc, models)
        out.append(f"{field_word} {'.'.join(loc)}: {message}" if loc else message)
    return out


def _message(err: Any, loc: list[str], models: tuple[type[BaseModel], ...]) -> str:
    """Pydantic's message, with what to write instead where pydantic's says only what is
    wrong: a spreadsheet's number formats, a misspelt field, a section given as a name."""
    kind, given = err["type"], err.get("input")
    if kind in ("int_parsing", "float_parsing") and isinstance(given, str):
        what = "a whole number" if kind == "int_parsing" else "a number"
        text = given.strip()
        if text.endswith("%"):
            percent = _float(text[:-1])
            if percent is not None:
                return f"{given!r} is not {what}; give the fraction: {percent / 100:g}"
        if _THOUSANDS.fullmatch(text):
            plain = re.sub(r"[,_ ]", "", text)
            return f"{given!r} is not {what}; write it without thousands separators: {plain}"
        if kind == "int_parsing":
            return f"{given!r} is not {what}"
        return f"{given!r} is not {what}; write it with a decimal point and no thousands separators"
    if kind == "extra_forbidden" and len(loc) == 2 and models:
        fields = [name for name in models[0].model_fields if name != "kind"]
        close = difflib.get_close_matches(loc[1], fields, n=1)
        guess = f" (did you mean {close[0]}?)" if close else ""
        section = (
            "a step measurement"
            if models[0] is StepMeasurement
            else ("a pass measurement" if models[0] is PassMeasurement else loc[0])
        )
        return f"unknown field{guess}; {section} takes {', '.join(fields)}"
    if kind in ("model_type", "model_attributes_type", "dict_type") and len(loc) == 1 and models:
        fields = [n for n, f in models[0].model_fields.items() if f.is_required()]
        name = " (a model's name alone is not looked up)" if loc[0] == "model" else ""
        return f"give an object, not {given!r}{name}, with at least {', '.join(fields)}"
    return error_message(err)


# 9,984 or 1 024 or 51_200: groups of three digits, as a spreadsheet formats whole numbers.
_THOUSANDS = re.compile(r"\d{1,3}(?:[,_ ]\d{3})+")


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _suggested(column: str, known: list[str]) -> str:
    """``column``, with the known column it is most likely a misspelling of."""
    close = difflib.get_close_matches(column, known, n=1)
    return f"{column} (did you mean {close[0]}?)" if close else column


def run_to_csv_row(run: MeasuredRun) -> dict[str, str]:
    """``run`` as one CSV row (the inverse of reading one)."""
    data = run.model_dump(mode="json")
    row = {}
    for column in CSV_COLUMNS:
        value: Any = data
        for part in column.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            row[column] = ""
        elif column in _LIST_COLUMNS:
            row[column] = ";".join(str(v) for v in value)
        elif isinstance(value, list | dict):
            row[column] = json.dumps(value)
        else:
            row[column] = str(value).lower() if isinstance(value, bool) else str(value)
    return row
