"""BPipe Table 7 (Kim et al., ICML 2023, Appendix C) as the planner sees it: the rows, the
request and configuration of each, the predicted MFU and memory checks, the out-of-memory
labels the rows imply, and Spearman's rank correlation. Shared by the paper benchmarks.

GPT-3 96B on 32 and GPT-3 134B on 48 A100-80G (8 per node), sequence 2048, vocabulary
51200, mixed precision, ZeRO-1 (distributed optimizer) and sequence parallelism. Megatron
tried recompute none, selective, full in that order and kept the first that ran, so each
row's recompute is the least that fit; rows with schedule "bpipe" ran out of memory under
Megatron's 1F1B and ran with BPipe instead.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.costmodel.allowance import MemoryLabel  # noqa: E402
from planner.costmodel.evaluate import PlanContext, estimate, price, split_layers  # noqa: E402
from planner.costmodel.memory import GIB  # noqa: E402
from planner.profiles import HardwareProfile, Link  # noqa: E402
from planner.specs import (  # noqa: E402
    CandidateConfig,
    ClusterSpec,
    ModelSpec,
    PlanRequest,
    SearchSpec,
    TrainingSpec,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TABLE = ROOT.parent / "shared" / "papers" / "bpipe_table7.json"
GPU = "a100-sxm-80g"
GPUS_PER_NODE = 8
SEQ_LENGTH = 2048
VOCAB_SIZE = 51200
RECOMPUTE_ORDER = ("none", "selective", "full")
MICRO_BATCH_SIZES = [1, 2, 4, 8]
TOP_K = 10
# BPipe Figure 3: GPT-3 13B, 8-way pipeline, micro-batch 1, no recompute.
FIGURE3_NAME, FIGURE3_LAYERS, FIGURE3_HIDDEN, FIGURE3_HEADS = "gpt3-13b", 40, 5120, 40
FIGURE3_GPUS, FIGURE3_BATCH = 8, 32
FIGURE3_IMBALANCE_GIB = 37.0

# BPipe §4.1: four 200 Gb/s HDR HCAs per 8-GPU node = 100 GB/s per node, 12.5 GB/s per GPU.
PAPER_HCAS_PER_NODE, HDR_GBPS = 4, 200 / 8

Row = dict[str, Any]


def paper_cluster(hardware: HardwareProfile) -> HardwareProfile:
    """``hardware`` with the inter-node link of the BPipe paper's cluster: the node's four
    HDR HCAs shared by its eight GPUs (the latency is the profile's)."""
    per_gpu = PAPER_HCAS_PER_NODE * HDR_GBPS / GPUS_PER_NODE
    link = Link(f"{PAPER_HCAS_PER_NODE}x hdr per node", per_gpu, hardware.inter_node.latency_us)
    return replace(hardware, inter_node=link)


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks; tied values share the average of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        shared = (start + end) / 2 + 1
        for k in range(start, end + 1):
            ranks[order[k]] = shared
        start = end + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rho: Pearson's correlation of the average ranks (NaN if undefined)."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman needs equal lengths, got {len(xs)} and {len(ys)}")
    if len(xs) < 2:
        return float("nan")
    rx, ry = average_ranks(xs), average_ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return float("nan")
    return float(cov / (vx * vy) ** 0.5)


def load_rows(path: Path) -> tuple[str, list[Row]]:
    if not path.is_file():
        sys.exit(f"error: BPipe Table 7 not found at {path} (give another with --table PATH)")
    data = json.loads(path.read_text())
    return str(data.get("source", "")), list(data["rows"])


def make_request(
    name: str,
    num_layers: int,
    hidden_size: int,
    heads: int,
    gpus: int,
    global_batch: int,
    schedules: Sequence[str],
) -> PlanRequest:
    return PlanRequest(
        model=ModelSpec(
            name=name,
            num_layers=num_layers,
            hidden_size=hidden_size,
            num_attention_heads=heads,
            seq_length=SEQ_LENGTH,
            vocab_size=VOCAB_SIZE,
        ),
        cluster=ClusterSpec(gpu=GPU, num_nodes=gpus // GPUS_PER_NODE, gpus_per_node=GPUS_PER_NODE),
        training=TrainingSpec(
            global_batch_size=global_batch,
            precision="bf16",
            optimizer="adam",
            distributed_optimizer=True,
            sequence_parallel=True,
            flash_attention=False,
        ),
        search=SearchSpec(
            schedules=list(schedules),
            recompute=list(RECOMPUTE_ORDER),
            micro_batch_sizes=MICRO_BATCH_SIZES,
            top_k=TOP_K,
        ),
    )


def request_for(row: Row, schedules: Sequence[str]) -> PlanRequest:
    return make_request(
        row["model"],
        row["num_layers"],
        row["hidden_size"],
        row["num_attention_heads"],
        row["gpus"],
        row["global_batch"],
        schedules,
    )


def config_for(row: Row, recompute: str, schedule: str) -> CandidateConfig:
    layers = split_layers(row["num_layers"], row["p"])
    if layers is None:
        raise ValueError(f"{row['num_layers']} layers cannot fill p = {row['p']} stages")
    return CandidateConfig(
        t=row["t"],
        p=row["p"],
        d=row["d"],
        micro_batch_size=row["mbs"],
        num_microbatches=row["global_batch"] // (row["mbs"] * row["d"]),
        recompute=recompute,
        schedule=schedule,
        layers_per_stage=layers,
    )


def key_of(row: Row) -> tuple[Any, ...]:
    return (row["t"], row["p"], row["d"], row["mbs"], row["recompute"], row["schedule"])


def key_of_config(config: CandidateConfig) -> tuple[Any, ...]:
    c = config
    return (c.t, c.p, c.d, c.micro_batch_size, c.recompute, c.schedule)


def yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


class Checker:
    """Predicted peak memory and MFU of table rows, one PlanContext per model."""

    def __init__(self, hardware: HardwareProfile, points: list[Any]) -> None:
        self.hardware = hardware
        self.points = points
        self.capacity = hardware.usable_memory_gib * GIB
        self._contexts: dict[str, PlanContext] = {}

    def context(self, row: Row) -> PlanContext:
        found = self._contexts.get(row["model"])
        if found is None:
            found = PlanContext(request_for(row, ["1f1b", "bpipe"]), self.hardware, self.points)
            self._contexts[row["model"]] = found
        return found

    def peak_gib(self, row: Row, recompute: str, schedule: str) -> float:
        return estimate(self.context(row), config_for(row, recompute, schedule)).peak_memory / GIB

    def fits(self, row: Row, recompute: str, schedule: str) -> bool:
        return self.peak_gib(row, recompute, schedule) * GIB <= self.capacity

    def check(self, row: Row) -> dict[str, Any]:
        schedule, recompute = row["schedule"], row["recompute"]
        ctx = self.context(row)
        priced = price(ctx, estimate(ctx, config_for(row, recompute, schedule)))
        fits = priced.estimate.peak_memory <= self.capacity  # the estimate price() made
        lighter = RECOMPUTE_ORDER[: RECOMPUTE_ORDER.index(recompute)]
        oom_lighter = None if not lighter else all(not self.fits(row, r, schedule) for r in lighter)
        oom_1f1b = None if schedule != "bpipe" else not self.fits(row, recompute, "1f1b")
        checks = [fits] + [c for c in (oom_lighter, oom_1f1b) if c is not None]
        return {
            "predicted_mfu": priced.mfu * 100,
            "peak_gib": priced.estimate.peak_memory / GIB,
            "fits": fits,
            "oom_lighter": oom_lighter,
            "oom_1f1b": oom_1f1b,
            "agrees": all(checks),
            # Where the layer's F, B, W came from: 'measured' (a profile point of exactly
            # this shape), 'scaled measurement' (a neighbouring point carried by the model's
            # ratio) or 'model' (the shape-aware model alone).
            "times_from": priced.estimate.costs.layer.origin,
        }

    def tensor_bytes(self, row: Row, recompute: str, schedule: str) -> float:
        """What the memory model counts on the worst device, without the allowance."""
        memory = estimate(self.context(row), config_for(row, recompute, schedule)).memory
        return max(d.parameters + d.gradients + d.optimizer + d.activations for d in memory)

    def labels(self, rows: Sequence[Row]) -> list[MemoryLabel]:
        """The out-of-memory labels the rows imply: each row ran at its recompute; every
        lighter recompute ran out of memory (same schedule); a BPipe row ran out of memory
        under 1F1B; and BPipe, tried wherever Megatron's 1F1B ran out of memory (§4.2), ran
        out of memory too at every recompute lighter than a 1F1B row's (else that lighter
        BPipe row would be the one listed, as Table 6 shows for t = 8, p = 4: 1F1B and BPipe
        both need layer recompute at micro-batch 4)."""
        out = []
        for row in rows:
            schedule, recompute = row["schedule"], row["recompute"]
            name = describe(key_of(row))
            out.append(MemoryLabel(self.tensor_bytes(row, recompute, schedule), True, name))
            for lighter in RECOMPUTE_ORDER[: RECOMPUTE_ORDER.index(recompute)]:
                out.append(
                    MemoryLabel(
                        self.tensor_bytes(row, lighter, schedule),
                        False,
                        f"{name}: {lighter} recompute",
                    )
                )
            if schedule == "bpipe":
                out.append(
                    MemoryLabel(
                        self.tensor_bytes(row, recompute, "1f1b"), False, f"{name}: under 1f1b"
                    )
                )
            elif row["p"] >= 2:
                for lighter in RECOMPUTE_ORDER[: RECOMPUTE_ORDER.index(recompute)]:
                    out.append(
                        MemoryLabel(
                            self.tensor_bytes(row, lighter, "bpipe"),
                            False,
                            f"{name}: bpipe with {lighter} recompute",
                        )
                    )
        return out


def describe(key: tuple[Any, ...]) -> str:
    t, p, d, mbs, recompute, schedule = key
    return f"t={t} p={p} d={d} mbs={mbs} {recompute} {schedule}"
