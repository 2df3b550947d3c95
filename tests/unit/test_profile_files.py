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
        (
            "hardware.json",
            '{"hardware": [{"name": "x"}]}',
            "cannot be used: hardware profile 'x': peak_flops: Field required; memory_gib: "
            "Field required",
        ),
        ("hardware.json", '{"hardware": {"name": "x"}}', "'hardware' must be a list of objects"),
        (
            "hardware.json",
            '{"hardware": [{"name": "x", "peak_flops": "fast"}]}',
            "hardware profile 'x': peak_flops: Input should be a valid dictionary",
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


_POINT = {"gpu": "cpu", "precision": "fp32", "hidden_size": 512, "num_attention_heads": 8}
_POINT |= {"seq_length": 128, "micro_batch_size": 2, "forward_ms": 3.0, "backward_ms": 4.0}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"t": 3, "num_attention_heads": 16, "hidden_size": 1024}, "point 1: t = 3 does not"),
        (
            {"num_attention_heads": 7, "hidden_size": 1024},
            "point 1: hidden_size 1024 is not divisible by num_attention_heads 7",
        ),
        ({"hidden_size": 0}, "point 1: hidden_size: Input should be greater than or equal to 1"),
        ({"source": "a\x00b"}, "point 1: source: a NUL character (\\u0000) cannot be stored"),
    ],
)
def test_a_layer_point_no_model_can_have_is_refused_as_the_service_refuses_it(
    tmp_path, changes, message
):
    """POST /v1/profiles refuses such a point; a profile folder's layers/*.json (read by
    `stagewright profiles load`, STAGEWRIGHT_PROFILES and the bundled profiles) took it."""
    path = tmp_path / "layers" / "mine.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"points": [_POINT, _POINT | {"micro_batch_size": 4} | changes]}))
    with pytest.raises(StagewrightError) as refused:
        JsonProfileStore.load(tmp_path)
    assert str(refused.value).startswith(f"the profile file {path} cannot be used: {message}")


def test_profiles_load_refuses_a_layer_point_no_model_can_have(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    folder = tmp_path / "mine"
    (folder / "layers").mkdir(parents=True)
    bad = _POINT | {"t": 3, "num_attention_heads": 16, "hidden_size": 1024}
    (folder / "layers" / "a.json").write_text(json.dumps({"points": [bad]}))
    assert main(["profiles", "load", str(folder), "--database-url", url]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "point 0: t = 3 does not divide num_attention_heads 16" in err
    (folder / "layers" / "a.json").write_text(json.dumps({"points": [_POINT]}))
    assert main(["profiles", "load", str(folder), "--database-url", url]) == 0
    out, _ = capsys.readouterr()
    assert f"your profiles ({folder}): 1 created, 0 updated, 0 unchanged" in out


def test_plan_with_a_broken_profile_folder_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "hardware.json").write_text('{"hardware": [{"name": "x"}]}')
    monkeypatch.setenv("STAGEWRIGHT_PROFILES", str(tmp_path))
    monkeypatch.setattr("planner.profiles._DEFAULT", None)  # loaded once per process
    code = main(["plan", str(REPO / "examples" / "tiny-cpu.json")])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.startswith(
        f"stagewright plan: error: the profile file {tmp_path / 'hardware.json'} cannot be "
        "used: hardware profile 'x': peak_flops: Field required; memory_gib: Field required;"
    )
    assert err.count("\n") == 1 and err.endswith("\n")


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


def _a100_entry(**changes: object) -> dict[str, object]:
    """The bundled A100 entry of hardware.json, renamed and changed as given."""
    entries = json.loads((BUNDLED_PROFILES / "hardware.json").read_text())["hardware"]
    (entry,) = [e for e in entries if e["name"] == "a100-sxm-80g"]
    return {**entry, "name": "my-gpu", **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"memory_gib": -5}, "memory_gib: Input should be greater than 0"),
        (
            {"usable_memory_gib": 200},
            "usable_memory_gib 200.0 is more than memory_gib 80.0; usable memory is what is "
            "left of it",
        ),
        ({"name": "My GPU"}, "name: String should match pattern"),
        ({"paramters": {}}, "paramters: Extra inputs are not permitted"),
        ({"memory_bandwidth_gbps": 0}, "memory_bandwidth_gbps: Input should be greater than 0"),
        ({"peak_flops": {}}, "peak_flops: Dictionary should have at least 1 item"),
        ({"peak_flops": {"int8": 1e15}}, "peak_flops.int8.[key]: Input should be 'bf16'"),
        (
            {"intra_node": {"kind": "nvlink", "bandwidth_gbps": -1, "latency_us": 1}},
            "intra_node.bandwidth_gbps",
        ),
    ],
)
def test_a_folders_hardware_is_checked_as_the_service_checks_it(tmp_path, changes, message):
    """What POST /v1/hardware refuses a profile folder's hardware.json refuses too, naming
    the file, the profile and the field (a zero bandwidth used to load and then fail the
    first plan with a division by zero; a misspelt key was ignored)."""
    (tmp_path / "hardware.json").write_text(json.dumps({"hardware": [_a100_entry(**changes)]}))
    with pytest.raises(StagewrightError) as refused:
        JsonProfileStore.load(tmp_path)
    text = str(refused.value)
    assert text.startswith(f"the profile file {tmp_path / 'hardware.json'} cannot be used: ")
    assert message in text


def test_a_folders_valid_hardware_loads_as_written(tmp_path):
    entry = _a100_entry(usable_memory_gib=70.0, parameters={"gemm_efficiency": 0.7})
    (tmp_path / "hardware.json").write_text(json.dumps({"hardware": [entry]}))
    loaded = JsonProfileStore.load(tmp_path).hardware("my-gpu")
    assert loaded.usable_memory_gib == 70.0
    assert loaded.parameter("gemm_efficiency") == 0.7
    assert loaded.memory_bandwidth_gbps == entry["memory_bandwidth_gbps"]
    assert loaded.compute is not None and loaded.compute.sm_count == entry["compute"]["sm_count"]  # type: ignore[index]


def test_profiles_load_refuses_a_bad_folder_and_stores_nothing(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "hardware.json").write_text(
        json.dumps({"hardware": [_a100_entry(memory_bandwidth_gbps=0)]})
    )
    assert main(["profiles", "load", str(folder), "--database-url", url]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "hardware profile 'my-gpu': memory_bandwidth_gbps: Input should be greater than 0" in err
    # Nothing of the folder was stored: fixed, its profile is created, not updated.
    (folder / "hardware.json").write_text(json.dumps({"hardware": [_a100_entry()]}))
    assert main(["profiles", "load", str(folder), "--database-url", url]) == 0
    out, _ = capsys.readouterr()
    assert f"your profiles ({folder}): 1 created, 0 updated, 0 unchanged" in out
