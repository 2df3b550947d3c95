"""Profile folders a person may edit (``STAGEWRIGHT_PROFILES``, ``stagewright profile
--out``): what a hand-edited file can get wrong is one error naming the file and what is
wrong, not a traceback (a KeyError or a JSONDecodeError said neither)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from planner.errors import StagewrightError
from planner.profiles import BUNDLED_PROFILES, JsonProfileStore, save_point

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("hardware.json", '{"hardware": [{"name": "x",}]}', "Expecting property name"),
        ("hardware.json", '{"hardware": [{"name": "x"}]}', "lacks the field 'peak_flops'"),
        ("hardware.json", '{"hardware": {"name": "x"}}', "'hardware' must be a list of objects"),
        (
            "hardware.json",
            '{"hardware": [{"name": "x", "peak_flops": "fast"}]}',
            "peak_flops must be an object",
        ),
        ("layers/a.json", '{"points": [{"gpu": "cpu"}]}', "lacks the field 'hidden_size'"),
        ("layers/a.json", '{"points": 5}', "'points' must be a list of objects"),
        (
            "layers/a.json",
            '{"points": [{"gpu": "cpu", "gpu": "x"}]}',
            "points.0: gpu is given twice; keep one",
        ),
    ],
)
def test_a_broken_profile_file_is_named_with_what_is_wrong(tmp_path, name, text, message):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    with pytest.raises(StagewrightError) as refused:
        JsonProfileStore.load(tmp_path)
    assert str(refused.value).startswith(f"the profile file {path} ")
    assert message in str(refused.value)


def test_plan_with_a_broken_profile_folder_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "hardware.json").write_text('{"hardware": [{"name": "x"}]}')
    monkeypatch.setenv("STAGEWRIGHT_PROFILES", str(tmp_path))
    monkeypatch.setattr("planner.profiles._DEFAULT", None)  # loaded once per process
    code = main(["plan", str(REPO / "examples" / "tiny-cpu.json")])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == (
        f"stagewright plan: error: the profile file {tmp_path / 'hardware.json'} lacks the "
        "field 'peak_flops'; add it (see the bundled profiles/ for the fields each entry "
        "takes)\n"
    )


def test_saving_a_point_into_a_broken_file_names_it_and_keeps_it(tmp_path):
    """``stagewright profile`` adds its point to the folder's file: a file it cannot read is
    left as it is (its points are someone's measurements)."""
    point = JsonProfileStore.load(BUNDLED_PROFILES).layer_points("a100-sxm-80g")[0]
    path = tmp_path / "layers" / "a100-sxm-80g-measured.json"  # where save_point writes it
    path.parent.mkdir()
    broken = '{"points": [{"gpu": "a100-sxm-80g",}]}'
    path.write_text(broken)
    with pytest.raises(StagewrightError, match="cannot be used: Expecting property name"):
        save_point(point, tmp_path)
    assert path.read_text() == broken
    path.write_text(json.dumps({"points": []}))  # a readable one takes the point
    assert save_point(point, tmp_path) == path
    assert JsonProfileStore.load(tmp_path).layer_points("a100-sxm-80g") == [point]
