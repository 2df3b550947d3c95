"""Measured runs from JSON and CSV files: every problem named by row (and line) and column,
nothing taken from a file with any problem."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest

from planner.measurement_files import (
    CSV_COLUMNS,
    REQUIRED_CSV_COLUMNS,
    MeasurementFileError,
    parse_runs,
    run_to_csv_row,
)
from planner.measurements import MeasuredRun, measured_on_problem
from planner.profiles import BUNDLED_PROFILES

SHIPPED = BUNDLED_PROFILES / "measurements" / "a100-sxm-80g-public.json"


def shipped_csv() -> str:
    runs = parse_runs(SHIPPED.read_text(), SHIPPED.name)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_COLUMNS)
    writer.writeheader()
    writer.writerows(run_to_csv_row(p.run) for p in runs)
    return buffer.getvalue()


def test_the_shipped_set_reads_and_round_trips_through_csv():
    runs = parse_runs(SHIPPED.read_text(), SHIPPED.name)
    assert len(runs) == 48 and all(p.run.source for p in runs)
    back = parse_runs(shipped_csv(), "shipped.csv")
    assert [p.run for p in back] == [p.run for p in runs]
    assert back[0].where == "row 1 (line 2)" and runs[0].where == "row 1"
    kinds = [p.run.measured.kind for p in runs]
    assert (kinds.count("step"), kinds.count("pass")) == (34, 14)


def test_every_required_field_is_a_required_column():
    assert "measured.kind" in REQUIRED_CSV_COLUMNS and "source" in REQUIRED_CSV_COLUMNS
    assert "measured.step_time_s" not in REQUIRED_CSV_COLUMNS
    assert len(set(REQUIRED_CSV_COLUMNS)) == len(REQUIRED_CSV_COLUMNS)


def test_json_problems_name_their_row_and_field():
    runs = json.loads(SHIPPED.read_text())["runs"][:3]
    runs[1]["config"]["t"] = 0
    del runs[2]["measured"]["kind"]
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(json.dumps(runs), "mine.json")
    message = str(caught.value)
    assert message.startswith("mine.json: nothing stored, 2 problem(s): ")
    assert "row 2: field config.t: Input should be greater than or equal to 1" in message
    assert "row 3: field measured.kind is missing: give 'step' or 'pass'" in message


def test_a_nul_in_a_runs_text_is_refused_with_the_rule():
    runs = json.loads(SHIPPED.read_text())["runs"][:2]
    runs[0]["model"]["name"] = "gpt\x00"
    runs[1]["source"] = "\x00"
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(json.dumps(runs), "mine.json")
    message = str(caught.value)
    rule = "a NUL character (\\u0000) cannot be stored or searched for; leave it out"
    assert f"row 1: field model.name: {rule}" in message
    assert f"row 2: field source: {rule}" in message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{", "is not valid JSON (line 1, column 2"),
        ('{"rows": []}', "holds no list of runs"),
        ('{"runs": [], "extra": 1}', "unknown top-level key(s) extra"),
        ("[]", "has no runs"),
    ],
)
def test_malformed_json_files(text, needle):
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(text, "f.json")
    assert needle in str(caught.value)


@pytest.mark.parametrize("text", ["", "\n\n", " \r\n", "\ufeff"])
def test_an_empty_file_is_called_empty_and_told_what_it_needs(text):
    """An empty CSV was 'header: missing column(s) ...' listing all 18 required columns, as
    if a header were there and wrong."""
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(text, "new.csv")
    message = str(caught.value)
    assert message.startswith(
        "new.csv is empty; a measurements CSV needs a header line of column names (field "
        f"paths; these {len(REQUIRED_CSV_COLUMNS)} are required: model.name, "
    )
    assert all(column in message for column in REQUIRED_CSV_COLUMNS)
    assert "header:" not in message and "missing column" not in message
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(text, "new.json")
    assert str(caught.value) == (
        'new.json is empty; a measurements file holds a JSON list of runs or {"runs": '
        "[...]}, or is a .csv file"
    )


def test_csv_cells_rows_and_header():
    lines = shipped_csv().splitlines()
    header, first = lines[0], lines[1]
    with pytest.raises(MeasurementFileError, match=r"row 1 \(line 2\): has \d+ cells for"):
        parse_runs("\n".join([header, first + ",extra"]), "f.csv")
    with pytest.raises(MeasurementFileError, match="column.s. model.name given twice"):
        parse_runs("\n".join([header + ",model.name", first + ",x"]), "f.csv")
    row = dict(zip(CSV_COLUMNS, next(csv.reader([first])), strict=True))
    row["config.layers_per_stage"] = "[5, 5"
    bad = io.StringIO()
    writer = csv.DictWriter(bad, CSV_COLUMNS)
    writer.writeheader()
    writer.writerow(row)
    with pytest.raises(
        MeasurementFileError, match="column config.layers_per_stage: '\\[5, 5' is not"
    ):
        parse_runs(bad.getvalue(), "f.csv")


def test_many_problems_are_counted_after_the_first_twenty():
    runs = json.loads(SHIPPED.read_text())["runs"]
    for run in runs:
        run["measured"]["kind"] = "walk"
    with pytest.raises(MeasurementFileError, match=r"48 problem\(s\).*; and 28 more problem\(s\)$"):
        parse_runs(json.dumps(runs), "f.json")


def test_a_byte_order_mark_is_not_part_of_the_first_column():
    """Excel's "CSV UTF-8" starts the file with a byte-order mark: the header then read
    'missing column(s) model.name; unknown column(s) \ufeffmodel.name', and a JSON file
    'Unexpected UTF-8 BOM (decode using utf-8-sig)', which a person cannot act on."""
    csv_text = shipped_csv()
    assert [p.run for p in parse_runs("\ufeff" + csv_text, "excel.csv")] == [
        p.run for p in parse_runs(csv_text, "plain.csv")
    ]
    json_text = SHIPPED.read_text()
    assert [p.run for p in parse_runs("\ufeff" + json_text, "bom.json")] == [
        p.run for p in parse_runs(json_text, "plain.json")
    ]


@pytest.mark.parametrize("separator", [";", "\t"])
def test_a_csv_separated_by_something_else_says_so(separator):
    """A semicolon-separated export (a European Excel) listed all 18 required columns as
    missing and the whole header line as one unknown column."""
    text = "\n".join(
        separator.join(next(csv.reader([line]))) for line in shipped_csv().splitlines()[:2]
    )
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(text, "f.csv")
    message = str(caught.value)
    assert message.startswith("f.csv, header: the columns are separated by ")
    assert "not by commas; save the file as comma-separated CSV" in message
    assert "missing column" not in message


def test_a_short_csv_row_counts_its_cells():
    """A row with cells left off read as 'column measured: Field required; column source:
    Field required', as if the header lacked them; a long row already counted its cells."""
    header, first = shipped_csv().splitlines()[:2]
    short = ",".join(next(csv.reader([first]))[:-3])
    columns = len(header.split(","))
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs("\n".join([header, short]), "f.csv")
    assert f"row 1 (line 2): has {columns - 3} cells for {columns} columns" in str(caught.value)
    assert "Field required" not in str(caught.value)


def test_a_spreadsheets_empty_rows_are_not_runs():
    """A spreadsheet saved as CSV keeps the rows it formatted: ',,,,' lines, here after a
    Windows line end. Each read as six 'Field required' problems and the file was refused."""
    header, first, second = shipped_csv().splitlines()[:3]
    blank = "," * (len(CSV_COLUMNS) - 1)
    text = "\r\n".join([header, first, blank, " " + blank, second, blank, blank]) + "\r\n"
    parsed = parse_runs(text, "export.csv")
    assert [p.run for p in parsed] == [p.run for p in parse_runs(shipped_csv(), "f.csv")][:2]
    assert [p.where for p in parsed] == ["row 1 (line 2)", "row 2 (line 5)"]
    with pytest.raises(MeasurementFileError, match="export.csv has no runs"):
        parse_runs("\r\n".join([header, blank, blank]), "export.csv")


def _one_row(**cells: str) -> str:
    """The shipped CSV's header and first row with ``cells`` (column: text) replaced."""
    header, first = shipped_csv().splitlines()[:2]
    row = dict(zip(CSV_COLUMNS, next(csv.reader([first])), strict=True))
    row.update(cells)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_COLUMNS)
    writer.writeheader()
    writer.writerow(row)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("cells", "needle"),
    [
        # A spreadsheet's number formats: thousands separators, a decimal comma, a percent.
        (
            {"model.hidden_size": "9,984"},
            "column model.hidden_size: '9,984' is not a whole number; write it without "
            "thousands separators: 9984",
        ),
        (
            {"measured.mfu": "", "measured.step_time_s": "5,4"},
            "column measured.step_time_s: '5,4' is not a number; write it with a decimal "
            "point and no thousands separators",
        ),
        (
            {"measured.mfu": "38.08%"},
            "column measured.mfu: '38.08%' is not a number; give the fraction: 0.3808",
        ),
        # A percentage where the fraction goes.
        (
            {"measured.mfu": "38.08"},
            "column measured.mfu: 38.08 is more than 1: the MFU is a fraction of the peak; "
            "give 0.3808 for 38.08%",
        ),
    ],
)
def test_a_cell_that_is_not_a_number_shows_its_text_and_what_to_write(cells, needle):
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(_one_row(**cells), "sheet.csv")
    assert f"row 1 (line 2): {needle}" in str(caught.value)


def test_a_misspelt_column_or_field_suggests_the_right_one():
    header, first = shipped_csv().splitlines()[:2]
    typo = header.replace("config.micro_batch_size", "config.microbatch_size")
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs("\n".join([typo, first]), "f.csv")
    assert (
        "unknown column(s) config.microbatch_size (did you mean config.micro_batch_size?)"
        in str(caught.value)
    )
    runs = json.loads(SHIPPED.read_text())["runs"][:2]
    runs[0]["measured"] = {"kind": "step", "step_time_ms": 5600}
    runs[1]["measured"] = {"kind": "pass", "forward_s": 0.012, "backward_ms": 24}
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(json.dumps(runs), "f.json")
    message = str(caught.value)
    assert (
        "row 1: field measured.step_time_ms: unknown field (did you mean step_time_s?); a "
        "step measurement takes step_time_s, mfu, peak_memory_gib" in message
    )
    assert "row 2: field measured.forward_s: unknown field (did you mean forward_ms?)" in message


def test_a_model_given_by_name_says_to_give_its_shape():
    """'model': 'gpt3-13b' read 'Input should be a valid dictionary or instance of
    ModelSpec': nothing says a name is not looked up, nor what to give."""
    runs = json.loads(SHIPPED.read_text())["runs"][:1]
    runs[0]["model"] = "gpt3-13b"
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(json.dumps(runs), "f.json")
    message = str(caught.value)
    assert "row 1: field model: give an object, not 'gpt3-13b'" in message
    assert "a model's name alone is not looked up" in message
    assert "num_layers, hidden_size, num_attention_heads, seq_length, vocab_size" in message


@pytest.mark.parametrize(
    ("cell", "needle"),
    [
        # Pydantic's own words were all a person got: 'invalid character in year'.
        (
            "05.01.2026",
            "'05.01.2026' is not a date (invalid character in year); write it as YYYY-MM-DD, "
            "e.g. 2026-01-05",
        ),
        (
            "2026/01/05",
            "'2026/01/05' is not a date (invalid date separator, expected `-`); write it as "
            "YYYY-MM-DD",
        ),
        (
            "2026-13-05",
            "'2026-13-05' is not a date (month value is outside expected range of 1-12); "
            "write it as YYYY-MM-DD",
        ),
        # Read as Unix time, whose complaint ('should have zero time') says nothing of it.
        ("20260105", "'20260105' is not a date; write it as YYYY-MM-DD, e.g. 2026-01-05"),
    ],
)
def test_a_date_that_cannot_be_read_says_how_to_write_one(cell, needle):
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(_one_row(measured_on=cell), "sheet.csv")
    assert f"row 1 (line 2): column measured_on: {needle}" in str(caught.value)
    runs = json.loads(SHIPPED.read_text())["runs"][:2]
    runs[1]["measured_on"] = cell
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(json.dumps(runs), "f.json")
    assert f"row 2: field measured_on: {needle}" in str(caught.value)


def test_what_the_date_parser_takes_is_what_the_message_says():
    """YYYY-MM-DD is read as that day; so is the same day at midnight with a time."""
    for written in ("2026-01-05", "2026-01-05T00:00:00Z"):
        (parsed,) = parse_runs(_one_row(measured_on=written), "sheet.csv")
        assert parsed.run.measured_on == dt.date(2026, 1, 5)


def _dated(day: dt.date | None) -> MeasuredRun:
    run = parse_runs(SHIPPED.read_text(), SHIPPED.name)[0].run
    return run.model_copy(update={"measured_on": day})


@pytest.mark.parametrize(
    ("now", "latest"),
    [
        # UTC's date, and one day more: today in the time zones ahead of UTC.
        (dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC), dt.date(2026, 3, 2)),
        # Late on 1 March in UTC-10 is 2 March in UTC, so 3 March is today in UTC+14.
        (
            dt.datetime(2026, 3, 1, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-10))),
            dt.date(2026, 3, 3),
        ),
        # Early on 2 March in UTC+14 is still 1 March in UTC: 2 March, its today, is taken.
        (
            dt.datetime(2026, 3, 2, 1, 0, tzinfo=dt.timezone(dt.timedelta(hours=14))),
            dt.date(2026, 3, 2),
        ),
    ],
)
def test_a_measurement_may_be_dated_up_to_today_anywhere(now, latest):
    assert measured_on_problem(_dated(None), now) is None
    assert measured_on_problem(_dated(dt.date(2020, 1, 1)), now) is None
    assert measured_on_problem(_dated(latest), now) is None
    today = now.astimezone(dt.UTC).date()
    assert today + dt.timedelta(days=1) == latest
    assert measured_on_problem(_dated(latest + dt.timedelta(days=1)), now) == (
        f"{latest + dt.timedelta(days=1)} is after today: a measurement cannot postdate the "
        f"day it is stored (the latest date taken is {latest}, UTC's today {today} and a day "
        "for time zones ahead of UTC); give the date it was measured, as YYYY-MM-DD"
    )
