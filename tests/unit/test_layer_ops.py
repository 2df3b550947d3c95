"""One transformer layer, op by op (planner.costmodel.layer_ops), against hand computations.

The rates below have no tile model (sm_count None) and no launch cost, so every GEMM is
max(2 m n k / (peak x gemm efficiency), operand bytes / (HBM x memory efficiency)) and every
memory-bound op is bytes / (HBM x memory efficiency): the expectations are written from the
op's shape after the tensor split (Megatron-LM's GPT layer), not from the module's code."""

from __future__ import annotations

import pytest

from planner.costmodel.kernels import DeviceRates
from planner.costmodel.layer_ops import (
    CollectiveCost,
    embedding_ops,
    fused_softmax_available,
    layer_ops,
    output_ops,
    phase_seconds,
)
from planner.profiles import Link
from tests.unit.test_costmodel import model, training

PEAK, HBM, G, M = 312e12, 2039e9, 0.8, 0.75
RATES = DeviceRates(
    peak_flops=PEAK,
    hbm_bytes_per_s=HBM,
    element_bytes=2,
    gemm_efficiency=G,
    memory_efficiency=M,
    flash_efficiency=0.6,
    launch_s=0.0,
)
NVLINK = CollectiveCost(Link("nvlink3", 300, 3), 0.8)

# h 1024, 16 heads (head dim 64), f 4096, s 512, micro-batch 2, t 2 with SP, bf16:
# T = 1024 tokens, 512 per rank for norms and dropouts, 8 heads and f/t = 2048 per rank.
H, A, S, B, T_DEG = 1024, 16, 512, 2, 2
TOK, NORM, HEADS, FFN, HD = S * B, S * B // T_DEG, A // T_DEG, 4 * H // T_DEG, H // A
SCORES = B * HEADS * S * S


def gemm(m: int, n: int, k: int, batch: int = 1, out: float = 2.0) -> float:
    compute = 2.0 * m * n * k * batch / (PEAK * G)
    operands = batch * (2.0 * (m * k + k * n) + out * m * n) / (HBM * M)
    return max(compute, operands)


def mem(num_bytes: float) -> float:
    return num_bytes / (HBM * M)


RING = 1 * 3e-6 + 1 / 2 * (TOK * H * 2) / (300e9 * 0.8)  # one all-gather / reduce-scatter

FORWARD = [
    ("layer norm 1", mem(2 * 2 * NORM * H)),
    ("all-gather", RING),
    ("QKV GEMM", gemm(TOK, 3 * H // T_DEG, H)),
    ("QKV bias add", mem(2 * 2 * TOK * 3 * H // T_DEG)),  # read and write the QKV output
    ("attention scores", gemm(S, S, HD, B * HEADS)),
    ("softmax", mem(3 * SCORES)),  # fused causal kernel: half the reads, every write
    ("attention dropout", mem(5 * SCORES)),  # read 2, write 2, mask 1
    ("attention context", gemm(S, HD, S, B * HEADS)),
    ("context layout copy", mem(2 * 2 * TOK * HEADS * HD)),  # [b a, s, d] -> [s, b, a d]
    ("projection GEMM", gemm(TOK, H, H // T_DEG)),
    ("reduce-scatter", RING),
    ("bias-dropout-add 1", mem(7 * NORM * H)),  # out, residual, result, mask
    ("layer norm 2", mem(4 * NORM * H)),
    ("all-gather", RING),
    ("FC1 GEMM", gemm(TOK, FFN, H)),
    ("bias-GeLU", mem(4 * TOK * FFN)),
    ("FC2 GEMM", gemm(TOK, H, FFN)),
    ("reduce-scatter", RING),
    ("bias-dropout-add 2", mem(7 * NORM * H)),
]
CORE_BACKWARD = [
    ("context grad (probs)", gemm(S, S, HD, B * HEADS)),
    ("context grad (V)", gemm(S, HD, S, B * HEADS)),
    ("attention dropout backward", mem(5 * SCORES)),
    ("softmax backward", mem(4 * SCORES)),
    ("scores grad (Q)", gemm(S, HD, S, B * HEADS)),
    ("scores grad (K)", gemm(S, HD, S, B * HEADS)),
]
# Megatron's column-parallel backward: the layer-norm output is all-gathered again under the
# data-gradient GEMM, and the input gradient's reduce-scatter runs under the weight-gradient
# GEMM; only what outlasts the GEMM counts (nothing here: the rings take 7.4 us, the GEMMs
# 13-17 us).
FC1_DGRAD, QKV_DGRAD = gemm(TOK, H, FFN), gemm(TOK, H, 3 * H // T_DEG)
FC1_WGRAD, QKV_WGRAD = gemm(FFN, H, TOK, out=8.0), gemm(3 * H // T_DEG, H, TOK, out=8.0)
INPUT_GRADIENT = [
    ("bias-dropout-add 2 backward", mem(11 * NORM * H)),  # dropout (5) + residual add (6)
    ("all-gather", RING),
    ("FC2 data grad", gemm(TOK, FFN, H)),
    ("GeLU backward", mem(6 * TOK * FFN)),
    ("FC1 data grad", FC1_DGRAD),
    ("all-gather (exposed)", max(0.0, RING - FC1_DGRAD)),
    ("layer norm 2 backward", mem(6 * NORM * H)),
    ("bias-dropout-add 1 backward", mem(11 * NORM * H)),
    ("all-gather", RING),
    ("projection data grad", gemm(TOK, H // T_DEG, H)),
    *CORE_BACKWARD,
    ("QKV data grad", QKV_DGRAD),
    ("all-gather (exposed)", max(0.0, RING - QKV_DGRAD)),
    ("layer norm 1 backward", mem(6 * NORM * H)),
    # Each bias's output gradient summed over the tokens, with the input gradient: a
    # zero-bubble W holds only the weight GEMMs.
    ("bias grads", mem(2 * (TOK * 3 * H // T_DEG + NORM * H + TOK * FFN + NORM * H))),
]
WEIGHT_GRADIENT = [
    ("QKV weight grad", QKV_WGRAD),  # fp32 gradient buffer
    ("reduce-scatter (exposed)", max(0.0, RING - QKV_WGRAD)),
    ("projection weight grad", gemm(H, H // T_DEG, TOK, out=8.0)),
    ("FC1 weight grad", FC1_WGRAD),
    ("reduce-scatter (exposed)", max(0.0, RING - FC1_WGRAD)),
    ("FC2 weight grad", gemm(H, FFN, TOK, out=8.0)),
]


def ops_of(recompute: str = "none", **training_changes: object) -> list[tuple[str, str, float]]:
    m = model(hidden_size=H, num_attention_heads=A, seq_length=S, vocab_size=8192)
    tr = training(sequence_parallel=True, **training_changes)
    return [
        (op.phase, op.name, op.seconds)
        for op in layer_ops(RATES, m, tr, B, T_DEG, recompute, NVLINK)  # type: ignore[arg-type]
    ]


def expect(phase: str, rows: list[tuple[str, float]]) -> list[tuple[str, str, object]]:
    return [(phase, name, pytest.approx(seconds, rel=1e-12)) for name, seconds in rows]


def test_every_op_of_a_layer_without_recomputation():
    assert ops_of() == [
        *expect("F", FORWARD),
        *expect("B", INPUT_GRADIENT),
        *expect("W", WEIGHT_GRADIENT),
    ]


def test_selective_recomputation_reruns_the_attention_core_in_b():
    first = [name for name, _ in FORWARD].index("attention scores")
    core = FORWARD[first : first + 5]
    assert [name for name, _ in core] == [
        "attention scores",
        "softmax",
        "attention dropout",
        "attention context",
        "context layout copy",
    ]
    recomputed = [(f"recompute {name}", seconds) for name, seconds in core]
    assert ops_of("selective") == [
        *expect("F", FORWARD),
        *expect("B", recomputed + INPUT_GRADIENT),
        *expect("W", WEIGHT_GRADIENT),
    ]


def test_full_recomputation_reruns_the_whole_forward_with_its_collectives_in_b():
    recomputed = [(f"recompute {name}", seconds) for name, seconds in FORWARD]
    assert ops_of("full") == [
        *expect("F", FORWARD),
        *expect("B", recomputed + INPUT_GRADIENT),
        *expect("W", WEIGHT_GRADIENT),
    ]


def test_flash_attention_replaces_the_attention_core_by_one_kernel_each_way():
    got = ops_of(flash_attention=True)
    # Causal: half of 4 b a/t s^2 d FLOPs forward, half of 10 backward (FlashAttention-2).
    flash_forward = 0.5 * 4 * SCORES * HD / (PEAK * 0.6)
    flash_backward = 0.5 * 10 * SCORES * HD / (PEAK * 0.6)
    assert ("F", "flash attention", pytest.approx(flash_forward)) in got
    assert ("B", "flash attention backward", pytest.approx(flash_backward)) in got
    names = [name for _, name, _ in got]
    assert "softmax" not in names and "attention scores" not in names
    assert "context layout copy" not in names
    assert len(got) == len(ops_of()) - 4 - 5


def test_without_sequence_parallelism_the_norms_run_on_every_token_and_all_reduces_stay():
    m = model(hidden_size=H, num_attention_heads=A, seq_length=S, vocab_size=8192)
    got = {
        (op.phase, op.name): op.seconds
        for op in layer_ops(RATES, m, training(sequence_parallel=False), B, T_DEG, "none", NVLINK)
    }
    assert got[("F", "layer norm 1")] == pytest.approx(mem(4 * TOK * H))
    assert got[("F", "all-reduce")] == pytest.approx(2 * RING)
    assert ("F", "all-gather") not in got and ("F", "reduce-scatter") not in got
    collectives = [
        op
        for op in layer_ops(RATES, m, training(sequence_parallel=False), B, 2, "none", NVLINK)
        if op.kind == "collective"
    ]
    assert len(collectives) == 4  # two all-reduces each way: the same volume as with SP


def test_no_collectives_without_tensor_parallelism():
    m = model(hidden_size=H, num_attention_heads=A, seq_length=S, vocab_size=8192)
    ops = layer_ops(RATES, m, training(), B, 1, "full", NVLINK)
    assert not [op for op in ops if op.kind == "collective"]


@pytest.mark.parametrize(
    "heads, t, b, seq, precision, available",
    [
        (104, 4, 1, 2048, "bf16", False),  # GPT-3 96B at t = 4: 26 attention batches
        (104, 4, 2, 2048, "bf16", True),  # 52
        (104, 8, 2, 2048, "fp16", False),  # 26
        (104, 8, 4, 2048, "fp16", True),  # 52
        (120, 8, 2, 2048, "bf16", False),  # GPT-3 134B at t = 8: 30
        (40, 1, 1, 2048, "bf16", True),  # GPT-3 13B: 40
        (40, 1, 1, 8192, "bf16", False),  # longer than the kernel's 4096
        (40, 1, 4, 2048, "fp32", False),  # the kernel takes 16-bit input only
        (8, 1, 1, 100, "bf16", True),  # s <= 128: 8 batches per block of 128 threads
        (4, 1, 1, 100, "bf16", False),
        (4, 1, 2, 100, "bf16", True),
    ],
)
def test_megatrons_fused_softmax_rule(heads, t, b, seq, precision, available):
    m = model(hidden_size=64 * heads, num_attention_heads=heads, seq_length=seq)
    assert fused_softmax_available(m, training(precision=precision), b, t) is available


def test_the_unfused_fp32_softmax_fallback_costs_its_five_passes_each_way():
    # 12 heads over t = 2 with micro-batch 1: 6 attention batches, not a multiple of 4.
    m = model(hidden_size=768, num_attention_heads=12, seq_length=S, vocab_size=8192)
    ops = {
        (op.phase, op.name): op.seconds
        for op in layer_ops(RATES, m, training(), 1, 2, "none", NVLINK)
    }
    scores = 1 * 6 * S * S
    # cast to fp32 (2 + 4), scale (4 + 4), mask (4 + 4), softmax (4 + 4), cast back (4 + 2)
    assert ops[("F", "softmax (unfused fp32 fallback)")] == pytest.approx(mem(36 * scores))
    # backward: 6 + 12 + 8 + 8 + 6
    assert ops[("B", "softmax backward (unfused fp32 fallback)")] == pytest.approx(mem(40 * scores))


def test_the_output_layer_and_loss_on_the_last_stage():
    vocab = 8192
    m = model(hidden_size=H, num_attention_heads=A, seq_length=S, vocab_size=vocab)
    ops = [
        (op.phase, op.name, op.seconds) for op in output_ops(RATES, m, training(), B, T_DEG, NVLINK)
    ]
    logits = TOK * vocab // T_DEG
    assert ops == [
        ("F", "final layer norm", pytest.approx(mem(4 * NORM * H))),
        ("F", "all-gather", pytest.approx(RING)),
        ("F", "logits GEMM", pytest.approx(gemm(TOK, vocab // T_DEG, H))),
        ("F", "cross-entropy", pytest.approx(mem(38 * logits))),
        ("B", "cross-entropy backward", pytest.approx(mem(22 * logits))),
        ("B", "logits data grad", pytest.approx(gemm(TOK, H, vocab // T_DEG))),
        ("B", "all-gather (exposed)", 0.0),  # under the data-gradient GEMM
        ("B", "final layer norm backward", pytest.approx(mem(6 * NORM * H))),
        ("W", "logits weight grad", pytest.approx(gemm(vocab // T_DEG, H, TOK, out=8.0))),
        ("W", "reduce-scatter (exposed)", 0.0),  # under the weight-gradient GEMM
    ]


def test_the_output_layer_runs_on_the_rank_s_rows_of_the_padded_vocabulary():
    # 8,193 tokens over t = 2: Megatron-LM pads to 8,194, 4,097 rows a rank (not 4,096).
    m = model(hidden_size=H, num_attention_heads=A, seq_length=S, vocab_size=8193)
    ops = {op.name: op.seconds for op in output_ops(RATES, m, training(), B, T_DEG, NVLINK)}
    assert ops["logits GEMM"] == pytest.approx(gemm(TOK, 4097, H))
    assert ops["logits weight grad"] == pytest.approx(gemm(4097, H, TOK, out=8.0))


def test_backward_collectives_under_a_gemm_count_only_what_outlasts_it():
    # A link 100x slower than NVLink: each ring takes 3 us + 0.5 x 2 MiB / 2.4 GB/s = 440 us,
    # longer than any GEMM of the layer, so the overlapped ones show their remainder.
    slow = CollectiveCost(Link("slow", 3, 3), 0.8)
    ring = 1 * 3e-6 + 1 / 2 * (TOK * H * 2) / (3e9 * 0.8)
    m = model(hidden_size=H, num_attention_heads=A, seq_length=S, vocab_size=8192)
    got = [
        (op.phase, op.name, op.seconds)
        for op in layer_ops(RATES, m, training(), B, T_DEG, "none", slow)
        if op.kind == "collective"
    ]
    assert got == [
        ("F", "all-gather", pytest.approx(ring)),
        ("F", "reduce-scatter", pytest.approx(ring)),
        ("F", "all-gather", pytest.approx(ring)),
        ("F", "reduce-scatter", pytest.approx(ring)),
        ("B", "all-gather", pytest.approx(ring)),
        ("B", "all-gather (exposed)", pytest.approx(ring - FC1_DGRAD)),
        ("B", "all-gather", pytest.approx(ring)),
        ("B", "all-gather (exposed)", pytest.approx(ring - QKV_DGRAD)),
        ("W", "reduce-scatter (exposed)", pytest.approx(ring - QKV_WGRAD)),
        ("W", "reduce-scatter (exposed)", pytest.approx(ring - FC1_WGRAD)),
    ]
    # Without SP: no re-gather; the column-parallel side's all-reduce runs under W.
    no_sp = [
        (op.phase, op.name, op.seconds)
        for op in layer_ops(RATES, m, training(sequence_parallel=False), B, T_DEG, "none", slow)
        if op.kind == "collective"
    ]
    assert no_sp == [
        ("F", "all-reduce", pytest.approx(2 * ring)),
        ("F", "all-reduce", pytest.approx(2 * ring)),
        ("W", "all-reduce (exposed)", pytest.approx(2 * ring - QKV_WGRAD)),
        ("W", "all-reduce (exposed)", pytest.approx(2 * ring - FC1_WGRAD)),
    ]


def test_the_embedding_on_the_first_stage():
    vocab = 8192
    m = model(hidden_size=H, num_attention_heads=A, seq_length=S, vocab_size=vocab)
    ops = [
        (op.phase, op.name, op.seconds)
        for op in embedding_ops(RATES, m, training(), B, T_DEG, NVLINK)
    ]
    table = vocab // T_DEG * H
    assert ops == [
        ("F", "embedding lookup", pytest.approx(mem(4 * TOK * H))),
        ("F", "reduce-scatter", pytest.approx(RING)),
        ("F", "position add + dropout", pytest.approx(mem(11 * NORM * H))),
        ("B", "embedding dropout backward", pytest.approx(mem(5 * NORM * H))),
        ("B", "all-gather", pytest.approx(RING)),
        ("W", "embedding weight grad", pytest.approx(mem(4 * TOK * H + 8 * table))),
    ]


def test_phase_sums():
    f, b, w = phase_seconds(layer_ops(RATES, model(), training(), 1, 1, "none", NVLINK))
    assert f > 0 and b > f and w > 0


def test_the_kernels_of_a_layer_shape_are_listed_once_and_shared():
    """The layer times and the collectives inside them read one memo of the kernels."""
    from planner.costmodel.timing import _layer_ops

    m, tr = model(), training()
    first = _layer_ops(RATES, NVLINK, m, tr, 2, T_DEG, "selective", 1, None)
    assert first == layer_ops(RATES, m, tr, 2, T_DEG, "selective", NVLINK)
    assert _layer_ops(RATES, NVLINK, m, tr, 2, T_DEG, "selective", 1, None) is first
    assert _layer_ops(RATES, NVLINK, m, tr, 2, T_DEG, "full", 1, None) == layer_ops(
        RATES, m, tr, 2, T_DEG, "full", NVLINK
    )
