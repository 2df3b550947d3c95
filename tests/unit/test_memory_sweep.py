"""The bubble-rate-against-memory-limit figure: its numbers, and the SVG and PNG files
``stagewright simulate --plot`` writes."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ElementTree
import zlib

import numpy as np
import pytest

from cli.main import main
from planner.errors import ScheduleConfigError
from planner.memory_sweep import memory_sweep
from planner.schedules import PassTimes, generate
from planner.simulate import Durations, simulate

TIMES = PassTimes(12.96, 13.22, 9.76)  # Table 5, 9.6B, micro-batch 4: one V stage


@pytest.fixture(scope="module")
def sweep():
    return memory_sweep(4, 8, TIMES)


def test_each_point_is_the_schedule_built_for_that_limit(sweep):
    assert sweep.schedules == ["v-adaptive", "zb-adaptive"] and sweep.reference == "1f1b"
    doubled = PassTimes(2 * 12.96, 2 * 13.22, 2 * 9.76)  # one stage a device: two V stages
    for point in sweep.points[::5]:
        for name, times in (("v-adaptive", TIMES), ("zb-adaptive", doubled)):
            try:
                schedule = generate(name, 4, 8, memory_limit=point.memory_limit, times=times)
            except ValueError:
                assert point.bubble[name] is None
                continue
            result = simulate(schedule, Durations(times.forward, times.backward, times.weight))
            assert point.bubble[name] == pytest.approx(result.bubble_fraction)
            assert point.peak[name] == pytest.approx(max(result.peak_activation))
            assert point.peak[name] <= point.memory_limit + 1e-9
    reference = simulate(generate("1f1b", 4, 8), Durations(*(2 * t for t in (12.96, 13.22, 9.76))))
    assert sweep.reference_bubble == pytest.approx(reference.bubble_fraction)


def test_plot_writes_an_svg_with_every_series(tmp_path, capsys):
    path = tmp_path / "sweep.svg"
    code = main(
        [
            "simulate",
            "--schedule",
            "1f1b",
            "--devices",
            "4",
            "--microbatches",
            "8",
            "--f",
            "12.96",
            "--b",
            "13.22",
            "--w",
            "9.76",
            "--json",
            "--plot",
            str(path),
        ]
    )
    assert code == 0 and "wrote" in capsys.readouterr().err
    root = ElementTree.fromstring(path.read_text())
    series = [n.get("data-series") for n in root.iter() if n.get("class") == "series"]
    assert sorted(series) == ["1f1b", "v-adaptive", "zb-adaptive"]


def test_plot_writes_a_png(tmp_path, capsys):
    path = tmp_path / "sweep.png"
    assert (
        main(
            [
                "simulate",
                "--schedule",
                "v-zb",
                "--devices",
                "4",
                "--microbatches",
                "8",
                "--f",
                "1",
                "--b",
                "1",
                "--w",
                "1",
                "--plot",
                str(path),
            ]
        )
        == 0
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    # Decode the image: RGB rows with filter byte 0, and the series colours drawn.
    idat = data.index(b"IDAT")
    length = struct.unpack(">I", data[idat - 4 : idat])[0]
    raw = zlib.decompress(data[idat + 4 : idat + 4 + length])
    rows = np.frombuffer(raw, np.uint8).reshape(height, 1 + 3 * width)
    assert (rows[:, 0] == 0).all()
    pixels = rows[:, 1:].reshape(height, width, 3)
    for colour in ((0x1F, 0x77, 0xB4), (0xD6, 0x27, 0x28)):
        assert (pixels == colour).all(axis=2).sum() > 50


def test_plot_refuses_other_formats(tmp_path, capsys):
    code = main(
        [
            "simulate",
            "--schedule",
            "1f1b",
            "--devices",
            "4",
            "--microbatches",
            "8",
            "--f",
            "1",
            "--b",
            "1",
            "--plot",
            str(tmp_path / "x.jpg"),
        ]
    )
    assert code == 2 and "name an .svg or a .png file" in capsys.readouterr().err


def test_times_of_the_wrong_length_are_refused_before_any_search(monkeypatch):
    """A family's refusal in the sweep means "no schedule within this limit": a list of
    times that fits no V pipeline must not reach the searches and be read that way."""
    import planner.memory_sweep

    def must_not_generate(*args, **kwargs):
        raise AssertionError("a schedule was generated")

    monkeypatch.setattr(planner.memory_sweep, "generate", must_not_generate)
    with pytest.raises(ScheduleConfigError, match="forward times: got 3 values for 8 stages"):
        memory_sweep(4, 8, PassTimes((1.0, 2.0, 3.0), 1.0, 0.5))
