"""The direction of Megatron-LM's Figure 16, predicted by the planner's cost model.

    python benchmarks/megatron_fig16.py

Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM"), Figure 16: per-GPU throughput of a 91-billion-parameter GPT at
(t, p) = (8, 8) on 64 A100s, for micro-batch sizes 1, 2, 4, 8 and global batches 128 and
512. Read from the figure: a peak at micro-batch 2 (about 156 TFLOP/s at batch 128 and 172
at batch 512), lower by micro-batch 8 (about 122 and 152). A larger micro-batch makes each
GEMM more efficient but leaves fewer micro-batches to fill the pipeline ((p - 1) / m of
bubble), and at batch 128 the bubble wins sooner.

The setting, as that paper runs it: 1F1B (non-interleaved), full activation recomputation,
fp16, no sequence parallelism and no distributed optimizer (both came later), sequence 2048,
vocabulary 51200. The figure does not give the 91B model's shape; taken here as hidden 10240,
80 heads (the paper's 76B shape) and 72 layers: 12 x 72 x 10240^2 + embeddings = 91.1B,
9 layers per stage. Throughput is counted as the paper counts it, recomputation included
(its eq. 3: 96 B s l h^2 (1 + s / 6h + V / 16 l h) per step).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.costmodel.evaluate import PlanContext, estimate, price, split_layers  # noqa: E402
from planner.profiles import HardwareProfile, default_store  # noqa: E402
from planner.specs import (  # noqa: E402
    CandidateConfig,
    ClusterSpec,
    ModelSpec,
    PlanRequest,
    TrainingSpec,
)

GPU = "a100-sxm-80g"
T, P, GPUS = 8, 8, 64
L, H, A, S, V = 72, 10240, 80, 2048, 51200
READ_FROM_FIGURE = {(128, 2): 156.0, (128, 8): 122.0, (512, 2): 172.0, (512, 8): 152.0}


def throughput_tflops(profile: HardwareProfile, batch: int, micro_batch: int) -> float:
    model = ModelSpec(
        name="gpt-91b", num_layers=L, hidden_size=H, num_attention_heads=A, seq_length=S,
        vocab_size=V,
    )  # fmt: skip
    request = PlanRequest(
        model=model,
        cluster=ClusterSpec(gpu=GPU, num_nodes=GPUS // 8, gpus_per_node=8),
        training=TrainingSpec(
            global_batch_size=batch,
            precision="fp16",
            distributed_optimizer=False,
            sequence_parallel=False,
        ),
    )
    layers = split_layers(L, P)
    assert layers is not None
    config = CandidateConfig(
        t=T,
        p=P,
        d=GPUS // (T * P),
        micro_batch_size=micro_batch,
        num_microbatches=batch // micro_batch,
        recompute="full",
        schedule="1f1b",
        layers_per_stage=layers,
    )
    ctx = PlanContext(request, profile, [])
    seconds = price(ctx, estimate(ctx, config)).iteration_time_s
    flops = 96 * batch * S * L * H * H * (1 + S / (6 * H) + V / (16 * L * H))
    return flops / seconds / GPUS / 1e12


def main() -> None:
    shipped = default_store().hardware(GPU)
    views = [
        ("declared defaults", replace(shipped, parameters={}, calibration=None)),
        ("as shipped", shipped),
    ]
    print(
        "| global batch | micro-batch | read from Figure 16 (TFLOP/s per GPU) | "
        + " | ".join(f"predicted, {label}" for label, _ in views)
        + " |"
    )
    print("|---|---|---|" + "---|" * len(views))
    for batch in (128, 512):
        for mb in (1, 2, 4, 8):
            read = READ_FROM_FIGURE.get((batch, mb))
            cells = " | ".join(f"{throughput_tflops(hw, batch, mb):.1f}" for _, hw in views)
            shown = f"about {read:.0f}" if read else ""
            print(f"| {batch} | {mb} | {shown} | {cells} |")


if __name__ == "__main__":
    from _no_options import parse_no_options

    parse_no_options(__doc__, "benchmarks/megatron_fig16.py")
    main()
