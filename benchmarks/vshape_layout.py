"""The V-shape paper's own layout, planned: each model on its GPUs as one pipeline.

    python benchmarks/vshape_layout.py

Qi et al., "Pipeline Parallelism with Controllable Memory", §4.1 and Table 2: 9.6B, 21B,
38.5B and 98.5B models on 16, 24, 32 and 40 A100-80G, each GPU a pipeline device (t = 1,
d = 1), "we deduct one transformer layer from both the initial and final pipeline stage to
compensate for the embedding and output layer": the models have 2 x GPUs - 2 layers, so
under a V schedule every stage holds one layer and the two end stages (both on device 0)
hold only the embedding and the output layer. §4.2 (Figure 6, same micro-batch size)
states what the measurements show, in words: V-ZB has the highest throughput; V-Min and
V-Half cut activation memory to about 1/3 and 1/2 of 1F1B's while the others use about as
much as 1F1B; V-Min's throughput is comparable to 1F1B's, but falls behind it with more
micro-batches. Table 4's numbers are not in this copy of the paper.

This plans each model at that layout with the planner's cost model (bundled a100-sxm-80g
profile, nothing fitted to these runs) and prints, per schedule, the predicted MFU, bubble
and activation memory (the most any device holds, as the paper's "activation memory" is the
peak minus the memory at the start of an iteration). Sequence 1024 (inferred from Table 5,
as in ``profiles/layers/vshape-table5.json``) and micro-batch sizes from Table 5; how many
micro-batches the paper ran is not stated, so two counts are planned: 1.5 and 3 per device.
Nor is whether §4.2 used flash attention (§4.4 adds it); without it by default, with
``--flash-attention``. zb-adaptive is built for the memory each device has left, as the
planner builds it (ZB-1P and ZB-2P are its memory limits 1 and 2).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.plan import plan  # noqa: E402
from planner.specs import Candidate, CandidateConfig, PlanRequest  # noqa: E402

# Table 2: (name, layers, heads, hidden, GPUs); micro-batch: Table 5's smallest for the model
# (98.5B is not in Table 5: 1).
MODELS = [
    ("9.6B", 30, 40, 5120, 16, 4),
    ("21B", 46, 48, 6144, 24, 2),
    ("38.5B", 62, 64, 7168, 32, 1),
    ("98.5B", 78, 80, 10240, 40, 1),
]
SCHEDULES = ["1f1b", "interleaved", "zb-adaptive", "v-min", "v-half", "v-zb"]
PER_DEVICE = (1.5, 3)


@dataclass(frozen=True)
class Row:
    schedule: str
    mfu: float | None  # None: does not fit (reason in ``why``)
    bubble: float = 0.0
    activations_gib: float = 0.0
    layers_per_stage: tuple[int, ...] = ()
    why: str = ""


def request(
    layers: int, heads: int, hidden: int, gpus: int, mb: int, m: int, flash: bool = False
) -> PlanRequest:
    return PlanRequest.model_validate(
        {
            "model": {"name": "vshape", "num_layers": layers, "hidden_size": hidden,
                      "num_attention_heads": heads, "seq_length": 1024, "vocab_size": 51200},
            "cluster": {"gpu": "a100-sxm-80g", "num_nodes": gpus // 8, "gpus_per_node": 8},
            "training": {"global_batch_size": m * mb, "precision": "bf16",
                         "distributed_optimizer": True, "flash_attention": flash},
            "search": {"schedules": SCHEDULES, "recompute": ["none"], "context_parallel": [1],
                       "micro_batch_sizes": [mb], "method": "grid", "top_k": 1000},
        }
    )  # fmt: skip


def rows_at_the_papers_layout(req: PlanRequest) -> list[Row]:
    """Each schedule's candidate at t = 1, p = GPUs, or why it has none."""
    gpus = req.cluster.num_nodes * req.cluster.gpus_per_node
    planned = plan(req)

    def at_layout(config: CandidateConfig) -> bool:
        return (config.t, config.p) == (1, gpus)

    found: dict[str, Candidate] = {
        c.config.schedule: c for c in planned.candidates if at_layout(c.config)
    }
    refused = {r.config.schedule: r.reason for r in planned.rejected if at_layout(r.config)}
    rows = []
    for schedule in SCHEDULES:
        candidate = found.get(schedule)
        if candidate is None:
            rows.append(Row(schedule, None, why=refused.get(schedule, "not planned")))
            continue
        rows.append(
            Row(
                schedule,
                candidate.predicted.mfu,
                candidate.predicted.bubble_fraction,
                max(device.activations_gib for device in candidate.breakdown),
                tuple(candidate.config.layers_per_stage),
            )
        )
    return rows


def claims(rows: list[Row], fewer: list[Row] | None) -> list[str]:
    """§4.2's statements, checked on the planned rows (``fewer``: the same model with fewer
    micro-batches, for V-Min against 1F1B)."""
    by = {r.schedule: r for r in rows if r.mfu is not None}
    mfu = {r.schedule: r.mfu for r in rows if r.mfu is not None}
    out = []
    if mfu:
        best = max(mfu, key=lambda name: mfu[name])
        out.append(f"highest MFU: {best} ({'as' if best == 'v-zb' else 'not as'} the paper)")
    base = by.get("1f1b")
    if base is not None:
        for name, paper in (("v-min", "1/3"), ("v-half", "1/2")):
            if name in by:
                ratio = by[name].activations_gib / base.activations_gib
                out.append(f"{name} activations {ratio:.2f} of 1F1B's (paper: about {paper})")
        if "v-min" in mfu and fewer is not None:
            before = {r.schedule: r.mfu for r in fewer if r.mfu is not None}
            if "v-min" in before and "1f1b" in before:
                gap_then = before["v-min"] - before["1f1b"]
                gap_now = mfu["v-min"] - mfu["1f1b"]
                out.append(
                    f"v-min - 1f1b MFU: {gap_then * 100:+.1f} points with fewer micro-batches, "
                    f"{gap_now * 100:+.1f} with more (paper: comparable, then behind)"
                )
    else:
        out.append("1F1B does not fit at this layout: no ratio to it")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flash-attention", action="store_true", help="plan with flash attention")
    flash = parser.parse_args().flash_attention
    for name, layers, heads, hidden, gpus, mb in MODELS:
        fewer: list[Row] | None = None
        for per_device in PER_DEVICE:
            m = int(gpus * per_device)
            req = request(layers, heads, hidden, gpus, mb, m, flash)
            rows = rows_at_the_papers_layout(req)
            print(
                f"\n### {name}: {layers} layers on {gpus} GPUs (t 1, p {gpus}), micro-batch "
                f"{mb}, {m} micro-batches{', flash attention' if flash else ''}\n"
            )
            print("| schedule | MFU % | bubble % | activations GiB (max device) |")
            print("|---|---|---|---|")
            for r in rows:
                if r.mfu is None:
                    print(f"| {r.schedule} | - | - | {r.why} |")
                else:
                    print(
                        f"| {r.schedule} | {r.mfu * 100:.1f} | {r.bubble * 100:.0f} | "
                        f"{r.activations_gib:.1f} |"
                    )
            print()
            for line in claims(rows, fewer):
                print(f"- {line}")
            fewer = rows


if __name__ == "__main__":
    main()
