"""The BPipe paper's evaluation, predicted by the planner.

    python benchmarks/paper_reproduction.py                  # all tables (well under a minute)
    python benchmarks/paper_reproduction.py --table PATH     # another copy of Table 7

Kim et al., "BPipe: Memory-Balanced Pipeline Parallelism for Training Large Language
Models" (ICML 2023), Appendix C Table 7: GPT-3 96B on 32 and GPT-3 134B on 48 A100-80G
(8 per node), sequence 2048, vocabulary 51200, mixed precision, ZeRO-1 (distributed
optimizer) and sequence parallelism. Megatron tried recompute none, selective, full in that
order and kept the first that ran, so each row's recompute is the least that fit; rows with
schedule "bpipe" ran out of memory under Megatron's 1F1B and ran with BPipe instead.

For every measured row this prints the predicted MFU next to the measured one and checks the
memory model against what the row implies: the row fits at its recompute, every lighter
recompute runs out of memory (same schedule), and for BPipe rows the same configuration
runs out of memory under 1F1B. Then the Spearman rank correlation of predicted and measured
MFU, the planner's own best configuration with and without BPipe next to the paper's best
rows, and the predicted per-stage memory of GPT-3 13B on 8 pipeline stages next to the
37 GiB imbalance of the paper's Figure 3.

The table is read from ``shared/papers/bpipe_table7.json`` next to the repository (the
directory above it), or from ``--table``. Nothing in the planner is tuned to these numbers;
disagreements are printed as they come out.
"""

from __future__ import annotations

import argparse
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
    TOP_K,
    Checker,
    Row,
    key_of,
    key_of_config,
    load_rows,
    make_request,
    request_for,
    spearman,
    yes_no,
)

from planner.costmodel.evaluate import PlanContext, estimate, split_layers  # noqa: E402
from planner.costmodel.memory import GIB  # noqa: E402
from planner.profiles import default_store  # noqa: E402
from planner.search import plan  # noqa: E402
from planner.specs import CandidateConfig  # noqa: E402


def row_table(rows: list[Row], results: list[dict[str, Any]], capacity_gib: float) -> str:
    lines = [
        "| model | config | t | p | d | mbs | recompute | schedule | measured MFU % "
        f"| predicted MFU % | predicted peak GiB (of {capacity_gib:.1f}) "
        "| fits at listed recompute | OOM at less recompute | OOM under 1f1b | agrees |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, res in zip(rows, results, strict=True):
        lines.append(
            f"| {row['model']} | {row['config_id']} | {row['t']} | {row['p']} | {row['d']} "
            f"| {row['mbs']} | {row['recompute']} | {row['schedule']} | {row['mfu']:.2f} "
            f"| {res['predicted_mfu']:.2f} | {res['peak_gib']:.1f} | {yes_no(res['fits'])} "
            f"| {yes_no(res['oom_lighter'])} | {yes_no(res['oom_1f1b'])} "
            f"| {yes_no(res['agrees'])} |"
        )
    return "\n".join(lines)


def counts_table(groups: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| model | fits at listed recompute | OOM at less recompute | OOM under 1f1b (bpipe rows) "
        "| all checks |",
        "|---|---|---|---|---|",
    ]
    for name, results in groups.items():
        cells = []
        for key in ("fits", "oom_lighter", "oom_1f1b", "agrees"):
            applicable = [r[key] for r in results if r[key] is not None]
            cells.append(f"{sum(applicable)} / {len(applicable)}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spearman_table(rows: list[Row], results: list[dict[str, Any]], models: list[str]) -> str:
    lines = ["| rows | n | Spearman rho (predicted vs measured MFU) |", "|---|---|---|"]
    for name in [*models, "all"]:
        pairs = [
            (res["predicted_mfu"], row["mfu"])
            for row, res in zip(rows, results, strict=True)
            if name in ("all", row["model"])
        ]
        rho = spearman([p for p, _ in pairs], [m for _, m in pairs])
        lines.append(f"| {name} | {len(pairs)} | {rho:.3f} |")
    return "\n".join(lines)


def best_table(model_rows: list[Row], checker: Checker) -> str:
    """The planner's best with and without BPipe next to the paper's best rows."""
    first = model_rows[0]
    paper_best = max(model_rows, key=lambda r: r["mfu"])
    paper_1f1b = max((r for r in model_rows if r["schedule"] == "1f1b"), key=lambda r: r["mfu"])
    lines = [
        "| | t | p | d | mbs | recompute | schedule | MFU % | paper's row in planner's "
        f"top-{TOP_K} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    plans = {}
    for label, schedules in (("1f1b + bpipe", ["1f1b", "bpipe"]), ("1f1b only", ["1f1b"])):
        result = plan(request_for(first, schedules))
        plans[label] = result
        if result.best is None:
            lines.append(f"| planner best, {label} | no feasible candidate | | | | | | | |")
            continue
        c, mfu = result.best.config, result.best.predicted.mfu * 100
        lines.append(
            f"| planner best, {label} (predicted) | {c.t} | {c.p} | {c.d} "
            f"| {c.micro_batch_size} | {c.recompute} | {c.schedule} | {mfu:.2f} | |"
        )
    for label, row, plan_label in (
        ("paper best, any schedule (measured)", paper_best, "1f1b + bpipe"),
        ("paper best, 1f1b (measured)", paper_1f1b, "1f1b only"),
    ):
        keys = [key_of_config(c.config) for c in plans[plan_label].candidates]
        rank = keys.index(key_of(row)) + 1 if key_of(row) in keys else None
        where = f"yes, rank {rank} of {plan_label}" if rank else f"no ({plan_label})"
        lines.append(
            f"| {label} | {row['t']} | {row['p']} | {row['d']} | {row['mbs']} "
            f"| {row['recompute']} | {row['schedule']} | {row['mfu']:.2f} | {where} |"
        )
    for label, row in (("paper best, any schedule", paper_best), ("paper best, 1f1b", paper_1f1b)):
        predicted = checker.check(row)["predicted_mfu"]
        lines.append(
            f"| {label}: planner's prediction for it | {row['t']} | {row['p']} | {row['d']} "
            f"| {row['mbs']} | {row['recompute']} | {row['schedule']} | {predicted:.2f} | |"
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Predict the BPipe paper's Table 7 and Figure 3 with the planner."
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
    hardware = store.hardware(GPU)
    checker = Checker(hardware, list(store.layer_points(hardware.name)))
    models = list(dict.fromkeys(row["model"] for row in rows))
    results = [checker.check(row) for row in rows]

    print(f"Source: {source}\n")
    print(
        f"Hardware profile {GPU}: {hardware.usable_memory_gib:.1f} GiB usable per GPU; "
        "MFU in percent.\n"
    )
    print("## Per row: predicted MFU and memory checks\n")
    for name in models:
        picked = [(r, res) for r, res in zip(rows, results, strict=True) if r["model"] == name]
        first = picked[0][0]
        print(f"### {name} ({first['gpus']} GPUs, global batch {first['global_batch']})\n")
        print(
            row_table(
                [r for r, _ in picked], [res for _, res in picked], hardware.usable_memory_gib
            )
        )
        print()

    print("## Checks that agree\n")
    groups = {
        name: [res for r, res in zip(rows, results, strict=True) if r["model"] == name]
        for name in models
    }
    groups["all"] = results
    print(counts_table(groups))
    print()

    print("## Rank correlation\n")
    print(spearman_table(rows, results, models))
    print()

    print("## Planner's best vs the paper's best\n")
    for name in models:
        model_rows = [r for r in rows if r["model"] == name]
        first = model_rows[0]
        print(f"### {name} ({first['gpus']} GPUs, global batch {first['global_batch']})\n")
        print(best_table(model_rows, checker))
        print()

    print(
        f"## Stage memory imbalance, GPT-3 13B, t=1 p={FIGURE3_GPUS} d=1 mbs=1, no recompute, "
        f"1f1b, B={FIGURE3_BATCH}\n"
    )
    print(figure3_table(checker))


if __name__ == "__main__":
    main()
