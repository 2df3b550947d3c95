"""The bubble-rate-against-memory-limit figure (V-shape paper, Figures 9 and 10) as an SVG
or PNG file, with no plotting library: the SVG is written as text, the PNG drawn on a NumPy
canvas with a 3 x 5 pixel font and encoded with zlib."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from planner.errors import StagewrightError
from planner.memory_sweep import MemorySweep

__all__ = ["sweep_png", "sweep_svg", "write_sweep"]

WIDTH, HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 64, 20, 40, 52
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
REFERENCE_COLOUR = "#7f7f7f"


def _series(sweep: MemorySweep) -> list[tuple[str, str, list[tuple[float, float]]]]:
    """(name, colour, (limit, bubble) points) of each family built for a limit."""
    return [
        (
            name,
            PALETTE[i % len(PALETTE)],
            [(p.memory_limit, b) for p in sweep.points if (b := p.bubble[name]) is not None],
        )
        for i, name in enumerate(sweep.schedules)
    ]


def _scales(
    sweep: MemorySweep,
) -> tuple[float, float, Callable[[float], float], Callable[[float], float]]:
    limits = [p.memory_limit for p in sweep.points]
    values = [sweep.reference_bubble] + [v for _, _, pts in _series(sweep) for _, v in pts]
    x_max = max(limits + [1.0])
    y_max = max(0.05, float(max(values)) * 1.1)

    def x(v: float) -> float:
        return LEFT + v / x_max * (WIDTH - LEFT - RIGHT)

    def y(v: float) -> float:
        return HEIGHT - BOTTOM - v / y_max * (HEIGHT - TOP - BOTTOM)

    return x_max, y_max, x, y


def _ticks(top: float, count: int = 5) -> list[float]:
    return [top * k / count for k in range(count + 1)]


def sweep_svg(sweep: MemorySweep) -> str:
    """The figure as an SVG document."""
    x_max, y_max, x, y = _scales(sweep)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">Bubble rate against '
        f"memory limit ({sweep.num_devices} devices, {sweep.num_microbatches} micro-batches)"
        "</text>",
    ]
    x0, y0 = x(0), y(0)
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x(x_max)}" y2="{y0}" stroke="black"/>')
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y(y_max)}" stroke="black"/>')
    for v in _ticks(x_max):
        out.append(f'<text x="{x(v):.1f}" y="{y0 + 16}" text-anchor="middle">{v:.2g}</text>')
    for v in _ticks(y_max):
        out.append(f'<text x="{x0 - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    out.append(
        f'<text x="{(x0 + x(x_max)) / 2}" y="{HEIGHT - 12}" text-anchor="middle">activation '
        f"memory limit (fraction of 1F1B's peak)</text>"
    )
    out.append(
        f'<text transform="translate(16 {(y0 + y(y_max)) / 2}) rotate(-90)" '
        f'text-anchor="middle">bubble rate</text>'
    )
    label, colour = sweep.reference, REFERENCE_COLOUR
    ref = y(sweep.reference_bubble)
    out.append(
        f'<line class="series" data-series="{label}" x1="{x0}" y1="{ref:.1f}" '
        f'x2="{x(x_max)}" y2="{ref:.1f}" stroke="{colour}" stroke-dasharray="6 4"/>'
    )
    legend = [(label, colour)]
    for label, colour, values in _series(sweep):
        pts = [(x(limit), y(v)) for limit, v in values]
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
        out.append(
            f'<polyline class="series" data-series="{label}" points="{path}" fill="none" '
            f'stroke="{colour}" stroke-width="2"/>'
        )
        out += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{colour}"/>' for px, py in pts]
        legend.append((label, colour))
    for i, (label, colour) in enumerate(legend):
        ly = TOP + 8 + 16 * i
        out.append(f'<rect x="{WIDTH - 150}" y="{ly - 8}" width="12" height="3" fill="{colour}"/>')
        out.append(f'<text x="{WIDTH - 132}" y="{ly - 3}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# 3 x 5 glyphs, rows top to bottom, bits left to right.
_FONT = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), ".": (0, 0, 0, 0, 2), "-": (0, 0, 7, 0, 0),
    " ": (0, 0, 0, 0, 0), "(": (1, 2, 2, 2, 1), ")": (4, 2, 2, 2, 4), "'": (2, 2, 0, 0, 0),
    "A": (2, 5, 7, 5, 5), "B": (6, 5, 6, 5, 6), "C": (7, 4, 4, 4, 7), "D": (6, 5, 5, 5, 6),
    "E": (7, 4, 6, 4, 7), "F": (7, 4, 6, 4, 4), "G": (7, 4, 5, 5, 7), "H": (5, 5, 7, 5, 5),
    "I": (7, 2, 2, 2, 7), "J": (1, 1, 1, 5, 7), "K": (5, 5, 6, 5, 5), "L": (4, 4, 4, 4, 7),
    "M": (5, 7, 7, 5, 5), "N": (6, 5, 5, 5, 5), "O": (7, 5, 5, 5, 7), "P": (7, 5, 7, 4, 4),
    "Q": (7, 5, 5, 7, 1), "R": (7, 5, 6, 5, 5), "S": (7, 4, 7, 1, 7), "T": (7, 2, 2, 2, 2),
    "U": (5, 5, 5, 5, 7), "V": (5, 5, 5, 5, 2), "W": (5, 5, 7, 7, 5), "X": (5, 5, 2, 5, 5),
    "Y": (5, 5, 2, 2, 2), "Z": (7, 1, 2, 4, 7), ",": (0, 0, 0, 2, 4),
}  # fmt: skip


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


class _Canvas:
    def __init__(self) -> None:
        self.pixels = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)

    def dot(self, px: float, py: float, colour: tuple[int, int, int], size: int = 1) -> None:
        cx, cy = round(px), round(py)
        self.pixels[max(cy - size + 1, 0) : cy + size, max(cx - size + 1, 0) : cx + size] = colour

    def line(
        self,
        a: tuple[float, float],
        b: tuple[float, float],
        colour: tuple[int, int, int],
        size: int = 1,
        dash: int = 0,
    ) -> None:
        steps = int(max(abs(b[0] - a[0]), abs(b[1] - a[1]))) + 1
        for k in range(steps + 1):
            if dash and (k // dash) % 2:
                continue
            f = k / steps
            self.dot(a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, colour, size)

    def text(self, px: float, py: float, text: str, scale: int = 2, anchor: str = "start") -> None:
        width = len(text) * 4 * scale
        left = round(px - (width / 2 if anchor == "middle" else width if anchor == "end" else 0))
        for i, char in enumerate(text.upper()):
            for row, bits in enumerate(_FONT.get(char, _FONT[" "])):
                for col in range(3):
                    if bits >> (2 - col) & 1:
                        x0, y0 = left + (4 * i + col) * scale, round(py) + row * scale
                        self.pixels[y0 : y0 + scale, x0 : x0 + scale] = 0

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + row.tobytes() for row in self.pixels)

        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", WIDTH, HEIGHT, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


def sweep_png(sweep: MemorySweep) -> bytes:
    """The figure as a PNG image (upper-case labels in a 3 x 5 pixel font)."""
    x_max, y_max, x, y = _scales(sweep)
    canvas = _Canvas()
    black = (0, 0, 0)
    canvas.text(
        WIDTH / 2, 12, f"BUBBLE RATE VS MEMORY LIMIT, {sweep.num_devices} DEVICES", anchor="middle"
    )
    canvas.line((x(0), y(0)), (x(x_max), y(0)), black)
    canvas.line((x(0), y(0)), (x(0), y(y_max)), black)
    for v in _ticks(x_max):
        canvas.text(x(v), y(0) + 8, f"{v:.2g}", anchor="middle")
    for v in _ticks(y_max):
        canvas.text(x(0) - 6, y(v) - 5, f"{v:.2f}", anchor="end")
    canvas.text((x(0) + x(x_max)) / 2, HEIGHT - 22, "MEMORY LIMIT (X 1F1B PEAK)", anchor="middle")
    label, colour = sweep.reference, REFERENCE_COLOUR
    ref = y(sweep.reference_bubble)
    canvas.line((x(0), ref), (x(x_max), ref), _rgb(colour), dash=6)
    legend = [(label, colour)]
    for label, colour, values in _series(sweep):
        pts = [(x(limit), y(v)) for limit, v in values]
        for a, b in zip(pts, pts[1:], strict=False):
            canvas.line(a, b, _rgb(colour), size=2)
        for point in pts:
            canvas.dot(*point, _rgb(colour), size=3)
        legend.append((label, colour))
    for i, (label, colour) in enumerate(legend):
        ly = TOP + 16 * i
        canvas.line((WIDTH - 170, ly + 5), (WIDTH - 156, ly + 5), _rgb(colour), size=2)
        canvas.text(WIDTH - 150, ly, label)
    return canvas.png()


def write_sweep(sweep: MemorySweep, path: str) -> None:
    """Write the figure to ``path``: SVG or PNG by its extension."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise StagewrightError(f"--plot {path}: name an .svg or a .png file")
    try:
        if suffix == ".svg":
            target.write_text(sweep_svg(sweep), encoding="utf-8")
        else:
            target.write_bytes(sweep_png(sweep))
    except OSError as exc:
        raise StagewrightError(f"cannot write {path}: {exc.strerror}") from exc
