"""The V-shape paper's Table 5 single-pass times, predicted by the shape-aware layer model.

    python benchmarks/vshape_table5.py

Qi et al., "Pipeline Parallelism with Controllable Memory", Appendix D.2 Table 5: the F, B
(input gradient) and W (weight gradient) time of one transformer layer on A100 SXM 80G,
t = 1, no recomputation, for three models at three micro-batch sizes each. The paper uses it
to show that whether a larger micro-batch raises a pass's efficiency "depends on both the
model and the micro-batch size" (only 38.5B at micro-batch 1 is clearly slower per FLOP).

The model alone prices each pass (no measured layer point is used: the store holds these
very points), under three parameter sets:
- declared: the registry's defaults (public sources, nothing fitted to any run);
- fitted on BPipe: the time parameters fitted to BPipe's public runs only (Tables 3, 4, 7),
  so Table 5 is held out;
- fitted on all: every public A100 run stagewright ships, Table 5 included (in-sample).

MFU of a pass here: the pass's share of Megatron's model FLOPs (one third of a layer's
forward-backward, 24 b s h^2 (1 + s / 6h) per pass) over the pass time and the 312 TFLOP/s
peak, for the measured and the predicted times alike; the paper's own "FBW average MFU" row
is printed beside it (its exact definition is not stated; its level differs, its trend is
what it shows). Sequence length 1024 is inferred, as in ``profiles/layers/vshape-table5.json``.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.calibrate import fit  # noqa: E402
from planner.costmodel.flops import attention_flops, linear_flops  # noqa: E402
from planner.costmodel.timing import modelled_layer_times  # noqa: E402
from planner.measurement_files import parse_runs  # noqa: E402
from planner.profiles import HardwareProfile, default_store  # noqa: E402
from planner.specs import ModelSpec, TrainingSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPU = "a100-sxm-80g"
SEQ = 1024
# (name, hidden, heads, [(micro-batch, F ms, B ms, W ms, paper's FBW average MFU %)])
TABLE5 = [
    ("9.6B", 5120, 40, [(4, 12.96, 13.22, 9.76, 65.6), (8, 26.30, 26.66, 19.62, 64.98),
                        (12, 39.45, 39.85, 28.93, 65.36)]),
    ("21B", 6144, 48, [(2, 9.30, 9.47, 7.19, 64.68), (4, 18.11, 18.55, 14.03, 66.24),
                       (6, 26.81, 27.09, 21.82, 66.52)]),
    ("38.5B", 7168, 64, [(1, 6.72, 6.89, 5.06, 60.81), (2, 12.27, 12.84, 9.63, 65.37),
                         (3, 18.05, 18.73, 15.46, 65.2)]),
]  # fmt: skip


def profiles() -> list[tuple[str, HardwareProfile]]:
    # The bundled profile without its own parameter values: the registry's defaults.
    declared = replace(default_store().hardware(GPU), parameters={}, calibration=None)
    path = ROOT / "profiles" / "measurements" / f"{GPU}-public.json"
    runs = [parsed.run for parsed in parse_runs(path.read_text(), path.name)]
    bpipe = [r for r in runs if r.source.startswith("BPipe")]
    return [
        ("declared", declared),
        ("fitted on BPipe (Table 5 held out)", fit(declared, bpipe, []).hardware),
        ("fitted on all (in-sample)", fit(declared, runs, []).hardware),
    ]


def pass_mfu(model: ModelSpec, micro_batch: int, seconds: float) -> float:
    """One third of Megatron's forward-backward FLOPs of a layer over the pass time."""
    flops = linear_flops(model, micro_batch) + attention_flops(model, micro_batch)
    return flops / seconds / 312e12 * 100


def main() -> None:
    views = profiles()
    training = TrainingSpec(global_batch_size=96, precision="bf16", sequence_parallel=False)
    header = "| model | mb | pass | measured ms | " + " | ".join(f"{v} ms" for v, _ in views)
    print(header + " |")
    print("|---|---|---|---|" + "---|" * len(views))
    mfu_rows = []
    errors: dict[str, list[float]] = {label: [] for label, _ in views}
    for name, hidden, heads, cells in TABLE5:
        model = ModelSpec(
            name=name,
            num_layers=1,
            hidden_size=hidden,
            num_attention_heads=heads,
            seq_length=SEQ,
            vocab_size=51200,
        )
        for mb, f_ms, b_ms, w_ms, paper_mfu in cells:
            predicted = []
            for label, hw in views:
                t = modelled_layer_times(hw, model, training, mb, 1, "none")
                predicted.append((t.forward * 1e3, t.backward * 1e3, t.weight * 1e3))
                for got, want in zip(predicted[-1], (f_ms, b_ms, w_ms), strict=True):
                    errors[label].append(abs(got / want - 1))
            for index, (pass_name, measured) in enumerate(
                zip("FBW", (f_ms, b_ms, w_ms), strict=True)
            ):
                cells_text = " | ".join(f"{p[index]:.2f}" for p in predicted)
                print(f"| {name} | {mb} | {pass_name} | {measured:.2f} | {cells_text} |")
            total = (f_ms + b_ms + w_ms) / 3e3
            mfu_rows.append(
                (name, mb, paper_mfu, pass_mfu(model, mb, total),
                 [pass_mfu(model, mb, sum(p) / 3e3) for p in predicted])
            )  # fmt: skip
    print()
    print("Mean |error| of a pass time: " + ", ".join(
        f"{label} {sum(e) / len(e):.1%}" for label, e in errors.items()
    ))  # fmt: skip
    print()
    print("| model | mb | paper's FBW average MFU % | measured MFU % (this definition) | "
          + " | ".join(f"{v} MFU %" for v, _ in views) + " |")  # fmt: skip
    print("|---|---|---|---|" + "---|" * len(views))
    for name, mb, paper_mfu, measured_mfu, predicted_mfu in mfu_rows:
        cells_text = " | ".join(f"{p:.1f}" for p in predicted_mfu)
        print(f"| {name} | {mb} | {paper_mfu:.2f} | {measured_mfu:.1f} | {cells_text} |")


if __name__ == "__main__":
    from _no_options import parse_no_options

    parse_no_options(__doc__, "benchmarks/vshape_table5.py")
    main()
