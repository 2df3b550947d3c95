"""The BPipe paper's evaluation, predicted by the planner, before and after calibration.

    python benchmarks/paper_reproduction.py                  # everything (about a minute)
    python benchmarks/paper_reproduction.py --table PATH     # another copy of Table 7

Kim et al., "BPipe: Memory-Balanced Pipeline Parallelism for Training Large Language
Models" (ICML 2023), Appendix C Table 7: GPT-3 96B on 32 and GPT-3 134B on 48 A100-80G
(see ``_bpipe_table7.py`` for the setting and the out-of-memory labels the rows imply).

Five views of the same table:
- as shipped: the bundled A100 profile (the declared defaults: public sources for the time
  parameters, the allowance fitted to all of Table 7's labels) with the paper's cluster's
  InfiniBand (four HCAs per node, ``_bpipe_table7.paper_cluster``), as every view;
- calibrated on all: the time parameters fitted (``planner.calibrate.fit``, as
  ``stagewright calibrate`` fits: measurements the fit misses far more than the rest of
  their kind left out) to every public A100 run stagewright ships (BPipe Tables 3, 4 and 7,
  V-shape Table 5), the allowance to all labels; and the same by least squares on every
  measured quantity (``--keep-outliers``);
- calibrated on BPipe's runs: the same fit on BPipe Tables 3, 4 and 7 only (``stagewright
  calibrate --source BPipe``), the runs of the cluster Table 7 ran on; in-sample for the
  Table 7 rows, like "calibrated on all";
- fitted on 96B, checked on 134B (and the reverse): parameters and allowance fitted on one
  model's runs and labels only, judged on the other model, whose measured layer point is
  also left out, with outliers left out and on every quantity. These say how the fit
  generalizes, not only how well it fits.

For each: Spearman's rank correlation of predicted and measured MFU, the mean |MFU error| in
points, the share of memory labels the model agrees with, and whether the planner's fastest
configuration (within the paper's search space: layers divide evenly over the stages) is
the paper's fastest row, with BPipe and without. Then, for the views fitted on all models,
the median predicted / measured MFU of the rows by where their layer times came from (a
measured point, a point scaled by the model, the model alone); every row under the calibrated
view, with the as-shipped prediction and that source beside it; and the per-stage memory of
GPT-3 13B on 8 stages next to Figure 3's 37 GiB imbalance.

The table is read from ``shared/papers/bpipe_table7.json`` next to the repository (the
directory above it), or from ``--table``; the runs from ``profiles/measurements/``.
Disagreements are printed as they come out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bpipe_table7 import (  # noqa: E402
    DEFAULT_TABLE,
    FIGURE3_BATCH,
    FIGURE3_GPUS,
    FIGURE3_HEADS,
    FIGURE3_HIDDEN,
    FIGURE3_IMBALANCE_GIB,
    FIGURE3_LAYERS,
    FIGURE3_NAME,
    GPU,
    ROOT,
    Checker,
    Row,
    load_rows,
    make_request,
    paper_cluster,
    yes_no,
)
from _calibration_views import (  # noqa: E402
    Scores,
    View,
    calibrated_view,
    model_of_run,
    score,
)

from planner.costmodel.evaluate import PlanContext, estimate, split_layers  # noqa: E402
from planner.costmodel.memory import GIB  # noqa: E402
from planner.costmodel.parameters import PARAMETERS  # noqa: E402
from planner.measurement_files import parse_runs  # noqa: E402
from planner.measurements import MeasuredRun  # noqa: E402
from planner.profiles import LayerPoint, default_store  # noqa: E402
from planner.specs import CandidateConfig  # noqa: E402


def row_table(
    rows: list[Row],
    results: list[dict[str, Any]],
    shipped: list[dict[str, Any]],
    capacity_gib: float,
) -> str:
    """Every row under a calibrated view (``results``), with the as-shipped prediction and
    where each row's layer times came from beside it: a row priced from a measured point
    does not carry the model's bias, so mixed sources show here first."""
    lines = [
        "| model | config | t | p | d | mbs | recompute | schedule | measured MFU % "
        f"| predicted MFU % | as shipped | predicted peak GiB (of {capacity_gib:.1f}) "
        "| fits at listed recompute | OOM at less recompute | OOM under 1f1b | agrees "
        "| layer times from |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, res, as_shipped in zip(rows, results, shipped, strict=True):
        lines.append(
            f"| {row['model']} | {row['config_id']} | {row['t']} | {row['p']} | {row['d']} "
            f"| {row['mbs']} | {row['recompute']} | {row['schedule']} | {row['mfu']:.2f} "
            f"| {res['predicted_mfu']:.2f} | {as_shipped['predicted_mfu']:.2f} "
            f"| {res['peak_gib']:.1f} | {yes_no(res['fits'])} "
            f"| {yes_no(res['oom_lighter'])} | {yes_no(res['oom_1f1b'])} "
            f"| {yes_no(res['agrees'])} | {res['times_from']} |"
        )
    return "\n".join(lines)


def bias_by_source(
    views: list[View], rows: list[Row], results_of: dict[str, list[dict[str, Any]]]
) -> str:
    """For each view, the median of predicted / measured MFU over the rows whose layer times
    came from each source (``results_of[view.label]``: the view's results of ``rows``):
    where the model is biased and the measured points are not, the planner's order between
    the two kinds of rows carries the bias."""
    lines = [
        "| view | layer times from | rows | median predicted / measured MFU |",
        "|---|---|---|---|",
    ]
    for view in views:
        results = results_of[view.label]
        by_source: dict[str, list[float]] = {}
        for row, res in zip(rows, results, strict=True):
            ratio = res["predicted_mfu"] / row["mfu"]
            by_source.setdefault(res["times_from"], []).append(ratio)
        for source, ratios in sorted(by_source.items()):
            lines.append(
                f"| {view.label} | {source} | {len(ratios)} | {statistics.median(ratios):.3f} |"
            )
    return "\n".join(lines)


def figure3_table(checker: Checker) -> str:
    request = make_request(
        FIGURE3_NAME,
        FIGURE3_LAYERS,
        FIGURE3_HIDDEN,
        FIGURE3_HEADS,
        FIGURE3_GPUS,
        FIGURE3_BATCH,
        ["1f1b"],
    )
    ctx = PlanContext(request, checker.hardware, checker.points)
    p = FIGURE3_GPUS
    layers = split_layers(FIGURE3_LAYERS, p)
    assert layers is not None
    config = CandidateConfig(
        t=1,
        p=p,
        d=1,
        micro_batch_size=1,
        num_microbatches=FIGURE3_BATCH,
        recompute="none",
        schedule="1f1b",
        layers_per_stage=layers,
    )
    memory = [dev.total / GIB for dev in estimate(ctx, config).memory]
    lines = [
        "| stage | " + " | ".join(str(i) for i in range(p)) + " | stage 0 - stage 7 |",
        "|---|" + "---|" * (p + 1),
        "| predicted GiB | "
        + " | ".join(f"{g:.1f}" for g in memory)
        + f" | {memory[0] - memory[-1]:.1f} |",
        "| measured (Figure 3) | " + " | " * (p - 1) + f" | {FIGURE3_IMBALANCE_GIB:.0f} |",
    ]
    return "\n".join(lines)


def held_out_points(points: list[LayerPoint], rows: list[Row], model: str) -> list[LayerPoint]:
    """The layer points without those of ``model``'s shape (its measured Table 3 point)."""
    hidden = {r["hidden_size"] for r in rows if r["model"] == model}
    return [p for p in points if p.hidden_size not in hidden]


def summary_table(lines_in: list[tuple[str, str, str, Scores]]) -> str:
    lines = [
        "| view | parameters fitted on | judged on | Spearman | mean abs. MFU error (points) "
        "| memory labels agreeing | planner's best = paper's best, with BPipe "
        "| ... without BPipe |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for view, fitted, judged, sc in lines_in:
        share = sc.labels_agreed / sc.labels_total
        lines.append(
            f"| {view} | {fitted} | {judged} | {sc.spearman:.3f} | {sc.mean_abs_mfu_error:.2f} "
            f"| {sc.labels_agreed} / {sc.labels_total} ({share:.0%}) "
            f"| {best_text(sc.best_any)} | {best_text(sc.best_1f1b)} |"
        )
    return "\n".join(lines)


def best_text(best: tuple[bool, str] | None) -> str:
    return "n/a (two models)" if best is None else f"{yes_no(best[0])} ({best[1]})"


def parameter_table(views: list[View]) -> str:
    names = sorted(PARAMETERS)
    lines = [
        "| parameter | " + " | ".join(v.label for v in views) + " |",
        "|---|" + "---|" * len(views),
    ]
    for name in names:
        cells = [f"{v.hardware.parameter(name):.4g}" for v in views]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def allowance_lines(views: list[View]) -> str:
    out = []
    for v in views:
        if v.allowance is None:
            continue
        a = v.allowance
        out.append(
            f"- {v.label}: workspace {a.workspace_gib:.2f} GiB, fragmentation "
            f"{a.fragmentation:.3f}; {a.agreed} of {a.total} labels of its own rows agree "
            f"(margin {a.margin_gib:.2f} GiB)"
        )
        out += [
            f"  - disagrees: {x.label} ({x.tensor_bytes / GIB:.1f} GiB counted, "
            f"{'ran' if x.fits else 'out of memory'})"
            for x in a.disagreeing
        ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Predict the BPipe paper's Table 7 and Figure 3 with the planner, before "
        "and after calibration."
    )
    parser.add_argument(
        "--table",
        type=Path,
        default=DEFAULT_TABLE,
        help="BPipe Table 7 as JSON (default: shared/papers/bpipe_table7.json beside the repo)",
    )
    args = parser.parse_args(argv)
    source, rows = load_rows(args.table)
    store = default_store()
    shipped = paper_cluster(store.hardware(GPU))
    points = list(store.layer_points(GPU))
    runs = public_runs()
    models = list(dict.fromkeys(row["model"] for row in rows))

    views = [View("as shipped", shipped, points, "")]
    views.append(calibrated_view("calibrated on all", shipped, runs, points, rows))
    views.append(
        calibrated_view(
            "calibrated on all, least squares on every quantity",
            shipped,
            runs,
            points,
            rows,
            exclude_outliers=False,
        )
    )
    # What `stagewright calibrate --source BPipe` fits: the runs of the cluster Table 7 ran
    # on (Tables 3, 4 and 7), without the V-shape paper's pass times from another cluster.
    views.append(
        calibrated_view(
            "calibrated on BPipe's runs",
            shipped,
            [r for r in runs if "BPipe" in r.source],
            points,
            rows,
        )
    )
    all_model_views = len(views)
    held_out: list[tuple[str, View]] = []
    for exclude in (True, False):
        for fit_model, check_model in (models, models[::-1]):
            label = f"fitted on {fit_model}" + ("" if exclude else ", every quantity")
            model_runs = [r for r in runs if model_of_run(r) == fit_model]
            model_rows = [r for r in rows if r["model"] == fit_model]
            view = calibrated_view(label, shipped, model_runs, points, model_rows, exclude)
            view.points = held_out_points(points, rows, check_model)
            held_out.append((check_model, view))
            views.append(view)

    print(f"Source: {source}\n")
    print(
        f"Hardware profile {GPU} on the paper's cluster (inter-node "
        f"{shipped.inter_node.bandwidth_gbps:g} GB/s per GPU): "
        f"{shipped.usable_memory_gib:.1f} GiB usable per GPU.\n"
    )
    print("## Summary\n")
    lines: list[tuple[str, str, str, Scores]] = []
    results_of: dict[str, list[dict[str, Any]]] = {}  # each all-model view's results, all rows
    for view in views[:all_model_views]:
        fitted = view.fitted_on or "(declared defaults)"
        for name in [*models, "all"]:
            chosen = [r for r in rows if name in ("all", r["model"])]
            judged = "all rows" if name == "all" else name
            scores, results = score(view, chosen, name != "all")
            if name == "all":
                results_of[view.label] = results
            lines.append((view.label, fitted, judged, scores))
    for check_model, view in held_out:
        chosen = [r for r in rows if r["model"] == check_model]
        judged = f"{check_model} (held out)"
        lines.append((view.label, view.fitted_on, judged, score(view, chosen)[0]))
    print(summary_table(lines))
    print()
    print("## Fitted parameters\n")
    print(parameter_table(views))
    print()
    print("## Memory allowance fitted to the out-of-memory labels\n")
    print(allowance_lines(views))
    print()
    print("## Prediction bias by where the layer times came from\n")
    print(bias_by_source(views[:all_model_views], rows, results_of))
    print()
    calibrated = views[1]
    print(f"## Every row, {calibrated.label}\n")
    print(
        row_table(
            rows,
            results_of[calibrated.label],
            results_of[views[0].label],
            shipped.usable_memory_gib,
        )
    )
    print()
    print(
        f"## Stage memory imbalance, GPT-3 13B, t=1 p={FIGURE3_GPUS} d=1 mbs=1, no recompute, "
        f"1f1b, B={FIGURE3_BATCH} (as shipped)\n"
    )
    print(figure3_table(Checker(shipped, points)))


def public_runs() -> list[MeasuredRun]:
    path = ROOT / "profiles" / "measurements" / f"{GPU}-public.json"
    return [parsed.run for parsed in parse_runs(path.read_text(), path.name)]


if __name__ == "__main__":
    main()
