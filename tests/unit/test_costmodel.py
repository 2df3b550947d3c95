"""The cost model against hand-worked numbers from the papers' formulas.

Sources of the expectations (each test writes the arithmetic out):
- parameters: Megatron-LM's GPT layer, 12h^2 + 13h for f = 4h (Narayanan et al. 2021 §5.1);
- bytes per parameter: Megatron's mixed-precision Adam (2 + 4 + 12), distributed optimizer;
- activations: Korthikanti et al. 2022, Table 2 and §4.3;
- FLOPs: Narayanan et al. 2021, eq. 3 (72 B s L h^2 (1 + s/6h + V/12hL));
- profile points: BPipe Tables 3/4 (GPT-3 13B) and the V-shape paper's Table 5.
"""

from __future__ import annotations

import math

import pytest

from planner.costmodel import PlanContext, estimate, split_layers
from planner.costmodel.device import collective_cost, device_rates
from planner.costmodel.flops import layer_pass_flops, model_flops_per_step
from planner.costmodel.layer_ops import layer_ops, phase_seconds
from planner.costmodel.memory import (
    activation_bytes_per_layer,
    bytes_per_parameter,
    embedding_parameters,
    layer_parameters,
    output_activation_bytes,
    recompute_working_bytes,
)
from planner.costmodel.timing import layer_times, modelled_layer_times, time_provenance
from planner.profiles import CalibrationRecord, HardwareProfile, LayerPoint, default_store
from planner.specs import CandidateConfig, ModelSpec, PlanRequest, Recompute, RecomputeSplit
from tests.unit.helpers import model_spec, training

GIB = 2**30


MODEL_DEFAULTS: dict[str, object] = {
    "name": "m",
    "num_layers": 40,
    "hidden_size": 5120,
    "num_attention_heads": 40,
    "seq_length": 2048,
    "vocab_size": 51200,
}


def model(**changes: object) -> ModelSpec:
    return model_spec(MODEL_DEFAULTS, **changes)


# ----------------------------------------------------------------------------- parameters


@pytest.mark.parametrize("h", [256, 5120, 9984, 12288])
def test_layer_parameters_are_12h2_plus_13h_for_f_4h(h):
    assert layer_parameters(model(hidden_size=h, num_attention_heads=8)) == 12 * h * h + 13 * h


def test_layer_parameters_general_ffn():
    h, f = 1024, 3000
    m = model(hidden_size=h, num_attention_heads=8, ffn_hidden_size=f)
    attention = 4 * h * h + 4 * h  # QKV and projection, weights and biases
    mlp = 2 * h * f + f + h  # two matmuls and their biases
    norms = 4 * h  # two layer norms, scale and shift
    assert layer_parameters(m) == attention + mlp + norms


def test_embedding_parameters_are_words_and_positions():
    m = model(hidden_size=512, num_attention_heads=8, seq_length=1024, vocab_size=50257)
    assert embedding_parameters(m) == 50257 * 512 + 1024 * 512


@pytest.mark.parametrize(
    "changes, d, expected",
    [
        ({"precision": "bf16", "optimizer": "adam", "distributed_optimizer": False}, 1, (2, 4, 12)),
        ({"precision": "fp16", "optimizer": "adam", "distributed_optimizer": False}, 8, (2, 4, 12)),
        ({"precision": "bf16", "optimizer": "adam", "distributed_optimizer": True}, 4, (2, 4, 3)),
        ({"precision": "bf16", "optimizer": "adam", "distributed_optimizer": True}, 1, (2, 4, 12)),
        ({"precision": "fp32", "optimizer": "adam", "distributed_optimizer": False}, 1, (4, 4, 8)),
        ({"precision": "bf16", "optimizer": "sgd", "distributed_optimizer": False}, 1, (2, 4, 8)),
        ({"precision": "fp32", "optimizer": "sgd", "distributed_optimizer": False}, 1, (4, 4, 4)),
        ({"precision": "bf16", "optimizer": "sgd", "distributed_optimizer": True}, 2, (2, 4, 4)),
    ],
)
def test_bytes_per_parameter(changes, d, expected):
    assert bytes_per_parameter(training(**changes), d) == pytest.approx(expected)


# ----------------------------------------------------------------------------- activations

S, B, H, A, V = 2048, 2, 5120, 40, 51200


def korthikanti(recompute: str, t: int, sp: bool, flash: bool = False) -> float:
    """Table 2 of Korthikanti et al. 2022, written out (16-bit activations). Where Megatron
    cannot use its fused softmax (b a/t attention batches not a multiple of 4, here t = 8),
    its fp32 fallback keeps the softmax output in fp32: 2 more bytes per score, 7as/h."""
    s, b, h, a = S, B, H, A
    sbh = s * b * h
    fused = (b * a // t) % 4 == 0
    scores = 0.0 if flash else (5 if fused else 7) * a * s / h
    if recompute == "none":
        return sbh / t * (34 + scores) if sp else sbh * (10 + 24 / t + scores / t)
    if recompute == "selective":
        return 34 * sbh / t if sp else sbh * (10 + 24 / t)
    return 2 * sbh / t if sp else 2 * sbh


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activation_bytes_follow_korthikanti_table_2(recompute, sp, t):
    got = activation_bytes_per_layer(model(), training(sequence_parallel=sp), B, t, recompute)
    # Sequence parallelism needs tensor parallelism: with t = 1 both rows agree anyway.
    assert got == pytest.approx(korthikanti(recompute, t, sp and t > 1), rel=1e-12)


def test_the_table_2_rows_written_as_numbers():
    sbh = S * B * H
    five_as_h = 5 * A * S / H  # 80 for GPT-3 13B at s = 2048
    assert five_as_h == 80
    none_sp = activation_bytes_per_layer(model(), training(sequence_parallel=True), B, 4, "none")
    assert none_sp == pytest.approx(sbh / 4 * (34 + 80))
    none_1 = activation_bytes_per_layer(model(), training(sequence_parallel=False), B, 1, "none")
    assert none_1 == pytest.approx(sbh * 114)  # sbh (34 + 5as/h)
    sel_4 = activation_bytes_per_layer(
        model(), training(sequence_parallel=False), B, 4, "selective"
    )
    assert sel_4 == pytest.approx(sbh * 16)  # sbh (10 + 24/4)
    full_sp = activation_bytes_per_layer(model(), training(sequence_parallel=True), B, 8, "full")
    assert full_sp == pytest.approx(2 * sbh / 8)


@pytest.mark.parametrize("t", [1, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_flash_attention_removes_the_scores_term(sp, t):
    got = activation_bytes_per_layer(
        model(), training(sequence_parallel=sp, flash_attention=True), B, t, "none"
    )
    assert got == pytest.approx(korthikanti("none", t, sp and t > 1, flash=True))
    # ... which is exactly what selective recomputation saves.
    selective = activation_bytes_per_layer(
        model(), training(sequence_parallel=sp), B, t, "selective"
    )
    assert got == pytest.approx(selective)


@pytest.mark.parametrize(
    "recompute, masks",
    [
        # t = 2 with sequence parallelism: every term splits over the two ranks. The masks
        # are the attention and MLP output dropouts' (sbh each) and the softmax's (as^2b).
        ("none", (2 * S * B * H + A * S * S * B) / 2),
        ("selective", 2 * S * B * H / 2),  # the scores (and their mask) are recomputed
        ("full", 0.0),  # only the layer's input is kept
    ],
)
def test_fp32_doubles_every_stored_tensor_but_the_one_byte_dropout_masks(recompute, masks):
    sixteen = activation_bytes_per_layer(model(), training(precision="bf16"), B, 2, recompute)
    thirty_two = activation_bytes_per_layer(model(), training(precision="fp32"), B, 2, recompute)
    assert thirty_two == pytest.approx(2 * sixteen - masks)


@pytest.mark.parametrize("t", [2, 8])
def test_output_layer_activations_are_korthikantis_with_sequence_parallelism(t):
    """Korthikanti et al. §4.3: 4sbh/t (1 + V/h) in 16-bit activations with sequence
    parallelism, plus the int64 target ids and their 1-byte outside-the-slice flags (9sb),
    which the paper leaves out."""
    sbh = S * B * H
    got = output_activation_bytes(model(), training(sequence_parallel=True), B, t)
    assert got == pytest.approx(4 * sbh / t * (1 + V / H) + 9 * S * B)


@pytest.mark.parametrize(
    "t, precision, expected",
    [
        # One rank: norm input and output-layer input (2 bytes x sbh each), the fp32 softmax
        # (4sbV), the target ids (8sb).
        (1, "bf16", 2 * 2 * S * B * H + 4 * S * B * V + 8 * S * B),
        # Without sequence parallelism both inputs are whole on every tensor rank; only the
        # softmax splits with the vocabulary. Plus 1 byte per token: outside this slice?
        (8, "bf16", 2 * 2 * S * B * H + 4 * S * B * V / 8 + 9 * S * B),
        # fp32 doubles the two inputs; the softmax was fp32 already.
        (1, "fp32", 2 * 4 * S * B * H + 4 * S * B * V + 8 * S * B),
        (8, "fp32", 2 * 4 * S * B * H + 4 * S * B * V / 8 + 9 * S * B),
    ],
)
def test_output_layer_activations_without_sequence_parallelism(t, precision, expected):
    tr = training(sequence_parallel=False, precision=precision)
    assert output_activation_bytes(model(), tr, B, t) == pytest.approx(expected)


def test_output_layer_activations_count_the_rank_s_rows_of_the_padded_vocabulary():
    # GPT-2's 50,257 tokens over t = 8: Megatron-LM pads to 50,264, 6,283 rows a rank, and
    # the fp32 softmax over them is 4sb x 6,283 bytes (not 4sb x 50,257 / 8 = 6,282.125).
    tr = training(sequence_parallel=True)
    expected = 2 * 2 * S * B * H / 8 + 4 * S * B * 6283 + 9 * S * B
    assert output_activation_bytes(model(vocab_size=50257), tr, B, 8) == expected


@pytest.mark.parametrize("sp", [False, True])
def test_recompute_working_bytes(sp):
    t = 4
    tr = training(sequence_parallel=sp)
    assert recompute_working_bytes(model(), tr, B, t, "none") == 0
    # Full: one layer's activations as if nothing were recomputed, less its input: Megatron's
    # CheckpointFunction re-runs the layer on a detached view of the input it saved (no
    # copy), so the first norm's input in Table 2's count is the checkpoint the stored bytes
    # already hold (2sbh, 2sbh/t with sequence parallelism).
    full = recompute_working_bytes(model(), tr, B, t, "full")
    assert full == pytest.approx(korthikanti("none", t, sp) - korthikanti("full", t, sp))
    # Selective: the attention scores it recomputes, 5as/h x sbh (/t).
    sbh = S * B * H
    selective = recompute_working_bytes(model(), tr, B, t, "selective")
    assert selective == pytest.approx(5 * A * S / H * sbh / t)


@pytest.mark.parametrize("t", [1, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_full_recompute_of_one_layer_needs_no_more_than_keeping_it(sp, t):
    """A device holding one micro-batch of one layer: with full recomputation it keeps the
    layer's input (2sbh, /t with sequence parallelism) and, during the backward, the
    recomputed layer, whose input is that same tensor; at the peak it holds exactly what the
    layer keeps without recomputation, Table 2's sbh (10 + 24/t + 5as/(ht)) (34/t + 5as/(ht)
    with sequence parallelism), never more."""
    sp = sp and t > 1
    tr = training(sequence_parallel=sp)
    stored = activation_bytes_per_layer(model(), tr, B, t, "full")
    working = recompute_working_bytes(model(), tr, B, t, "full")
    sbh, scores = S * B * H, 5 * A * S / H
    kept = sbh / t * (34 + scores) if sp else sbh * (10 + 24 / t + scores / t)
    assert stored + working == pytest.approx(kept, rel=1e-12)


def test_selective_recompute_has_no_working_set_with_flash_attention():
    tr = training(flash_attention=True)
    assert recompute_working_bytes(model(), tr, B, 2, "selective") == pytest.approx(0.0)


# ----------------------------------------------------------------------------- FLOPs


@pytest.mark.parametrize("f", [None, 3000])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_layer_pass_flops(recompute, f):
    b, s, h = 3, 1024, 1024
    ffn = f or 4 * h
    m = model(hidden_size=h, num_attention_heads=16, seq_length=s, ffn_hidden_size=f)
    lin = 2 * b * s * (4 * h * h + 2 * h * ffn)
    att = 4 * b * s * s * h
    forward, backward, weight = layer_pass_flops(m, b, recompute)
    extra = {"none": 0, "selective": att, "full": lin + att}[recompute]
    assert forward == pytest.approx(lin + att)
    assert backward == pytest.approx(lin + 2 * att + extra)
    assert weight == pytest.approx(lin)


def test_forward_backward_weight_without_recompute_is_three_forwards():
    m = model(hidden_size=2048, num_attention_heads=16, seq_length=4096)
    forward, backward, weight = layer_pass_flops(m, 2, "none")
    assert forward + backward + weight == pytest.approx(3 * forward)
    h, s = 2048, 4096
    assert forward == pytest.approx(24 * 2 * s * h * h + 4 * 2 * s * s * h)


@pytest.mark.parametrize(
    "L, h, a, s, V, batch",
    [
        (40, 5120, 40, 2048, 51200, 32),  # GPT-3 13B
        (80, 9984, 104, 2048, 51200, 128),  # BPipe's 96B
        (96, 12288, 96, 2048, 51200, 1536),  # GPT-3 175B
    ],
)
def test_model_flops_follow_narayanan_eq_3(L, h, a, s, V, batch):
    m = model(num_layers=L, hidden_size=h, num_attention_heads=a, seq_length=s, vocab_size=V)
    expected = 72 * batch * s * L * h**2 * (1 + s / (6 * h) + V / (12 * h * L))
    assert model_flops_per_step(m, batch) == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------- layer split


def test_split_layers_even():
    assert split_layers(80, 16) == [5] * 16
    assert split_layers(40, 8) == [5] * 8


def test_split_layers_uneven_lightens_first_and_last():
    counts = split_layers(84, 16)
    assert counts is not None
    assert sum(counts) == 84
    assert max(counts) - min(counts) <= 1
    assert counts[0] == counts[-1] == min(counts) == 5  # 84 = 16 x 5 + 4
    assert counts.count(6) == 4


def test_split_layers_v_shape_paper_layout():
    # V-shape paper §4.1: 30 layers over 32 stages, first and last stage hold no layer.
    assert split_layers(30, 32) == [0] + [1] * 30 + [0]


def test_split_layers_allows_empty_end_stages_only():
    # Stages 0 and 2 only run the embedding and the output layer.
    assert split_layers(1, 3) == [0, 1, 0]
    assert split_layers(1, 2) == [0, 1]


@pytest.mark.parametrize("layers, stages", [(5, 12), (5, 8), (2, 5), (1, 4)])
def test_split_layers_refuses_an_empty_middle_stage(layers, stages):
    assert split_layers(layers, stages) is None


# ----------------------------------------------------------------------------- timing


def _a100() -> tuple[HardwareProfile, list[LayerPoint]]:
    store = default_store()
    hw = store.hardware("a100-sxm-80g")
    return hw, list(store.layer_points(hw.name))


def _model_times(hw: HardwareProfile, m: ModelSpec, mb: int, recompute: Recompute = "none"):
    got = modelled_layer_times(hw, m, training(precision="bf16"), mb, 1, recompute)
    return got.forward, got.backward, got.weight


@pytest.mark.parametrize("gpu", ["cpu", "a100-sxm-80g", "h100-sxm-80g"])
def test_without_a_measured_point_the_shape_aware_model_prices_the_layer(gpu):
    store = default_store()
    hw = store.hardware(gpu)
    m = model(hidden_size=256, num_attention_heads=8, seq_length=128, vocab_size=1024)
    tr = training(precision="bf16", sequence_parallel=True)
    for recompute in ("none", "selective", "full"):
        got = layer_times(list(store.layer_points(gpu)), hw, m, tr, 2, 2, recompute)
        ops = layer_ops(device_rates(hw, "bf16"), m, tr, 2, 2, recompute, collective_cost(hw))
        assert (got.forward, got.backward, got.weight) == pytest.approx(phase_seconds(ops))
        assert got.origin == "model"


@pytest.mark.parametrize(
    "recompute, forward_ms_5_layers, backward_ms_5_layers",
    [
        ("none", 36.32, 74.12),  # BPipe Table 4
        ("selective", 36.32, 83.57),  # BPipe Tables 3 and 4 (attention recompute)
        ("full", 36.32, 110.33),  # BPipe Table 4 (layer recompute)
    ],
)
def test_the_bpipe_13b_point_is_used_verbatim(recompute, forward_ms_5_layers, backward_ms_5_layers):
    hw, points = _a100()
    m = model()  # GPT-3 13B
    got = layer_times(points, hw, m, training(precision="bf16"), 1, 1, recompute)
    fused = backward_ms_5_layers / 5 / 1e3  # 5 layers per stage (40 layers / 8 stages)
    # The point has one fused backward: split into B and W as the model splits this shape.
    _, model_b, model_w = _model_times(hw, m, 1, recompute)
    assert got.forward == pytest.approx(forward_ms_5_layers / 5 / 1e3, rel=1e-9)
    assert got.backward == pytest.approx(fused * model_b / (model_b + model_w), rel=1e-9)
    assert got.backward + got.weight == pytest.approx(fused, rel=1e-9)
    assert got.origin == "measured"


VSHAPE_9_6B = {  # V-shape paper Table 5, 9.6B (h 5120, 40 heads), ms per pass
    4: (12.96, 13.22, 9.76),
    8: (26.30, 26.66, 19.62),
    12: (39.45, 39.85, 28.93),
}


def _vshape_model() -> ModelSpec:
    return model(num_layers=30, seq_length=1024)


@pytest.mark.parametrize("mb, lo, hi", [(6, 4, 8), (10, 8, 12)])
def test_interpolation_between_vshape_table_5_points_scaled_by_the_model(mb, lo, hi):
    hw, points = _a100()
    m = _vshape_model()
    got = layer_times(points, hw, m, training(precision="bf16"), mb, 1, "none")
    share = (mb - lo) / (hi - lo)
    want = _model_times(hw, m, mb)
    # Each bracketing point carried to mb by the model's ratio, then mixed linearly.
    from_lo = [
        x / 1e3 * w / h
        for x, w, h in zip(VSHAPE_9_6B[lo], want, _model_times(hw, m, lo), strict=True)
    ]
    from_hi = [
        x / 1e3 * w / h
        for x, w, h in zip(VSHAPE_9_6B[hi], want, _model_times(hw, m, hi), strict=True)
    ]
    expected = [x + (y - x) * share for x, y in zip(from_lo, from_hi, strict=True)]
    assert [got.forward, got.backward, got.weight] == pytest.approx(expected, rel=1e-9)
    assert got.origin == "scaled measurement"


def test_a_neighbour_point_is_scaled_by_the_models_ratio():
    hw, points = _a100()
    m = _vshape_model()
    # mb 14 is outside the table (4, 8, 12) and within 2x of the FLOPs of mb 12.
    got = layer_times(points, hw, m, training(precision="bf16"), 14, 1, "none")
    want, have = _model_times(hw, m, 14), _model_times(hw, m, 12)
    expected = [x / 1e3 * w / h for x, w, h in zip(VSHAPE_9_6B[12], want, have, strict=True)]
    assert [got.forward, got.backward, got.weight] == pytest.approx(expected, rel=1e-9)
    assert "scaled by the model" in got.source


@pytest.mark.parametrize("mb", [4, 12])
def test_a_vshape_point_at_the_ends_is_used_verbatim(mb):
    hw, points = _a100()
    got = layer_times(points, hw, _vshape_model(), training(precision="bf16"), mb, 1, "none")
    expected = [v / 1e3 for v in VSHAPE_9_6B[mb]]
    assert [got.forward, got.backward, got.weight] == pytest.approx(expected, rel=1e-9)


def test_a_vshape_point_between_two_others_is_used_verbatim():
    hw, points = _a100()
    got = layer_times(points, hw, _vshape_model(), training(precision="bf16"), 8, 1, "none")
    expected = [v / 1e3 for v in VSHAPE_9_6B[8]]
    assert [got.forward, got.backward, got.weight] == pytest.approx(expected, rel=1e-9)


# ----------------------------------------------------------------------------- memory per device

L13, H13, A13, S13, V13 = 40, 5120, 40, 2048, 51200


def gpt3_13b_request(**training_changes: object) -> PlanRequest:
    tr: dict[str, object] = {
        "global_batch_size": 32,
        "precision": "bf16",
        "optimizer": "adam",
        "distributed_optimizer": True,
        "sequence_parallel": True,
    }
    tr.update(training_changes)
    return PlanRequest.model_validate(
        {
            "model": {
                "name": "gpt3-13b",
                "num_layers": L13,
                "hidden_size": H13,
                "num_attention_heads": A13,
                "seq_length": S13,
                "vocab_size": V13,
            },
            "cluster": {"gpu": "a100-sxm-80g", "num_nodes": 1, "gpus_per_node": 8},
            "training": tr,
        }
    )


def context(request: PlanRequest) -> PlanContext:
    store = default_store()
    hw = store.hardware(request.cluster.gpu)
    return PlanContext(request, hw, list(store.layer_points(hw.name)))


def config_13b(schedule: str, layers: list[int], **changes: object) -> CandidateConfig:
    fields: dict[str, object] = {
        "t": 1,
        "p": 8,
        "d": 1,
        "micro_batch_size": 1,
        "num_microbatches": 32,
        "recompute": "none",
        "schedule": schedule,
        "layers_per_stage": layers,
    }
    fields.update(changes)
    return CandidateConfig.model_validate(fields)


SBH_13B = S13 * 1 * H13
LAYER_ACT_13B = SBH_13B * (34 + 5 * A13 * S13 / H13)  # sbh (34 + 5as/h), t = 1, mb = 1
LAYER_PARAMS_13B = 12 * H13 * H13 + 13 * H13
# Stage 0's embedding keeps the token ids (int64, 8sb) and its dropout mask (1 byte, sbh).
EMBEDDING_ACT_13B = 8 * S13 * 1 + SBH_13B


def allowance(tensors: float) -> float:
    """The declared allowance: 2.62 GiB of workspace and no fragmentation share (fitted to
    BPipe Table 7's out-of-memory labels, planner/costmodel/parameters.py)."""
    return 2.62 * GIB + 0.0 * tensors


def test_gpt3_13b_1f1b_memory_by_hand():
    est = estimate(context(gpt3_13b_request()), config_13b("1f1b", [5] * 8))
    memory = est.memory
    assert len(memory) == 8

    # Stage 0: 1F1B's first stage holds p = 8 micro-batches of its 5 layers.
    first = memory[0]
    assert first.in_flight == pytest.approx(8)
    act0 = 8 * (5 * LAYER_ACT_13B + EMBEDDING_ACT_13B)
    assert first.activations == pytest.approx(act0, rel=1e-12)
    params0 = 5 * LAYER_PARAMS_13B + V13 * H13 + S13 * H13  # + word and position embeddings
    assert first.parameters == pytest.approx(2 * params0, rel=1e-12)
    assert first.gradients == pytest.approx(4 * params0, rel=1e-12)
    assert first.optimizer == pytest.approx(12 * params0, rel=1e-12)  # d = 1: nothing sharded
    tensors0 = 18 * params0 + act0
    assert first.allowance == pytest.approx(allowance(tensors0), rel=1e-12)
    assert first.total == pytest.approx(tensors0 + allowance(tensors0), rel=1e-12)

    # Stage 7: one micro-batch in flight, plus the output layer's 4sbh (1 + V/h) (t = 1) and
    # the target ids (int64, 8sb).
    last = memory[7]
    assert last.in_flight == pytest.approx(1)
    act7 = 1 * (5 * LAYER_ACT_13B + 4 * SBH_13B * (1 + V13 / H13) + 8 * S13)
    assert last.activations == pytest.approx(act7, rel=1e-12)
    params7 = 5 * LAYER_PARAMS_13B + V13 * H13 + 2 * H13  # tied output layer + final norm
    assert last.parameters == pytest.approx(2 * params7, rel=1e-12)

    # Middle stages: p - s micro-batches of 5 layers.
    for s in range(1, 7):
        assert memory[s].in_flight == pytest.approx(8 - s)
        assert memory[s].activations == pytest.approx((8 - s) * 5 * LAYER_ACT_13B, rel=1e-12)
        assert memory[s].parameters == pytest.approx(2 * 5 * LAYER_PARAMS_13B, rel=1e-12)
    assert est.peak_memory == pytest.approx(max(m.total for m in memory))


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_a_stage_of_only_the_embedding_keeps_only_the_embeddings_activations(recompute):
    """A first stage without a layer saves the embedding's tensors for its 8 micro-batches in
    flight and recomputes nothing, so it needs no recompute working set; said with or without
    a per-stage split, the same layout costs the same."""
    layers = [0, 6, 6, 6, 6, 6, 6, 4]
    uniform = config_13b("1f1b", layers, recompute=recompute)
    split = config_13b(
        "1f1b",
        layers,
        recompute=recompute,
        recompute_per_stage=[RecomputeSplit(**{recompute: n}) for n in layers],
    )
    ctx = context(gpt3_13b_request())
    first = estimate(ctx, uniform).memory[0]
    assert first.in_flight == pytest.approx(8)
    assert first.activations == pytest.approx(8 * EMBEDDING_ACT_13B, rel=1e-12)
    assert list(estimate(ctx, split).memory) == list(estimate(ctx, uniform).memory)


def test_a_tensor_parallel_embedding_keeps_which_tokens_fall_outside_its_rows():
    """With t > 1 each rank looks up only the tokens of its vocabulary rows and zeroes the
    rest (Megatron-LM's VocabParallelEmbedding, the executor's too): beside the ids (8 bytes)
    it keeps one byte per token saying which fell outside, for the backward. With sequence
    parallelism the dropout mask after it is the rank's 1/t share (sbh/t)."""
    from planner.costmodel.memory import embedding_activation_bytes

    request = gpt3_13b_request()
    s, h = 2048, 5120
    one = embedding_activation_bytes(request.model, request.training, 2, 1)
    four = embedding_activation_bytes(request.model, request.training, 2, 4)
    assert one == 8 * s * 2 + s * 2 * h
    assert four == 8 * s * 2 + s * 2 + s * 2 * h / 4


def test_device_memories_make_each_devices_record_from_its_columns():
    from planner.costmodel import DeviceMemories, DeviceMemory

    held, active, flight = [1e9, 3e9, 2e9], [5e9, 0.0, 7.5e9], [4.0, 0.0, 2.5]
    memory = DeviceMemories(held, active, flight, (2.0, 4.0, 12.0), 2.5 * GIB, 0.1)
    by_hand = [
        DeviceMemory(h * 2.0, h * 4.0, h * 12.0, a, 2.5 * GIB + 0.1 * (h * 18.0 + a), f)
        for h, a, f in zip(held, active, flight, strict=True)
    ]
    assert len(memory) == 3
    assert list(memory) == by_hand
    assert [memory[d] for d in range(3)] == by_hand
    assert memory[-1] == by_hand[-1] and memory[1:] == by_hand[1:]
    assert memory.totals == tuple(m.total for m in by_hand)  # exactly: the same additions
    assert memory == DeviceMemories(held, active, flight, (2.0, 4.0, 12.0), 2.5 * GIB, 0.1)
    assert memory != DeviceMemories(held, active, flight, (2.0, 4.0, 12.0), 2.5 * GIB, 0.2)
    with pytest.raises(IndexError):
        memory[3]


def test_an_estimates_peak_is_its_largest_device_total():
    from dataclasses import replace

    from planner.costmodel import DeviceMemories

    est = estimate(context(gpt3_13b_request()), config_13b("v-half", split_layers(L13, 16) or []))
    totals = [m.total for m in est.memory]
    assert est.device_totals == tuple(totals)
    assert est.peak_memory == max(totals)
    held = [m.parameters / 2 for m in est.memory]  # bf16 weights: 2 bytes a parameter
    halved = DeviceMemories(
        held, [m.activations / 2 for m in est.memory], [1.0] * 8, (2.0, 4.0, 2.0), 0.0, 0.0
    )
    smaller = replace(est, memory=halved)
    assert smaller.peak_memory == max(m.total for m in halved) < est.peak_memory


def test_a_stages_work_is_its_forward_backward_and_weight():
    from planner.costmodel import stage_costs

    ctx = context(gpt3_13b_request())
    for config in (
        config_13b("1f1b", [5] * 8),
        config_13b("v-zb", split_layers(L13, 16) or [], recompute="selective"),
    ):
        costs = stage_costs(ctx, config)
        assert costs.work == tuple(
            f + b + w for f, b, w in zip(costs.forward, costs.backward, costs.weight, strict=True)
        )


def test_candidates_with_the_same_stages_share_their_immutable_rows():
    from planner.costmodel import stage_costs

    ctx = context(gpt3_13b_request())
    one = stage_costs(ctx, config_13b("1f1b", [5] * 8))
    other = stage_costs(ctx, config_13b("gpipe", [5] * 8))
    assert one.forward is other.forward and one.activation_bytes is other.activation_bytes
    assert isinstance(one.forward, tuple) and isinstance(one.work, tuple)
    fewer = stage_costs(ctx, config_13b("1f1b", [10] * 4, p=4))
    assert fewer.forward is not one.forward and len(fewer.forward) == 4


def test_distributed_optimizer_shards_optimizer_states_over_d():
    ctx = context(gpt3_13b_request())
    cfg = config_13b("1f1b", [10] * 4, p=4, d=2, num_microbatches=16)
    memory = estimate(ctx, cfg).memory
    params1 = 10 * LAYER_PARAMS_13B
    assert memory[1].optimizer == pytest.approx(12 / 2 * params1, rel=1e-12)
    assert memory[1].gradients == pytest.approx(4 * params1, rel=1e-12)


def test_full_recompute_stores_layer_inputs_and_one_working_layer():
    ctx = context(gpt3_13b_request())
    memory = estimate(ctx, config_13b("1f1b", [5] * 8, recompute="full")).memory
    # 8 micro-batches x 5 layers x 2sbh, plus one layer's activations while it recomputes,
    # less that layer's input: it is one of the 8 x 5 checkpoints (re-run as a view of it).
    expected = 8 * (5 * 2 * SBH_13B + EMBEDDING_ACT_13B) + LAYER_ACT_13B - 2 * SBH_13B
    assert memory[0].activations == pytest.approx(expected, rel=1e-12)


def test_2bw_keeps_a_second_copy_of_the_weights():
    ctx = context(gpt3_13b_request())
    memory = estimate(ctx, config_13b("2bw", [5] * 8)).memory
    assert memory[3].parameters == pytest.approx(2 * 2 * 5 * LAYER_PARAMS_13B, rel=1e-12)


def test_a_single_stage_holds_the_tied_embedding_once():
    ctx = context(gpt3_13b_request())
    cfg = config_13b("1f1b", [40], p=1, d=8, num_microbatches=4)
    memory = estimate(ctx, cfg).memory
    params = 40 * LAYER_PARAMS_13B + V13 * H13 + S13 * H13 + 2 * H13
    assert memory[0].parameters == pytest.approx(2 * params, rel=1e-12)


def test_bpipe_caps_stage_0_at_mu_opt():
    p = 8
    mu_opt = math.ceil((p + 2) / 2)  # BPipe §3: ceil((p + 2) / 2) = 5
    assert mu_opt == 5
    memory = estimate(context(gpt3_13b_request()), config_13b("bpipe", [5] * 8)).memory
    assert memory[0].in_flight == pytest.approx(mu_opt)
    expected = mu_opt * (5 * LAYER_ACT_13B + EMBEDDING_ACT_13B)
    assert memory[0].activations == pytest.approx(expected, rel=1e-12)
    assert all(m.in_flight <= mu_opt + 1e-9 for m in memory)


def test_v_half_holds_less_than_1f1b_stage_0_on_every_device():
    ctx = context(gpt3_13b_request())
    one_f_one_b = estimate(ctx, config_13b("1f1b", [5] * 8)).memory[0]
    # 40 layers over 16 V stages: the 4 outermost stages at each end get 2, the middle 3.
    layers = [2] * 4 + [3] * 8 + [2] * 4
    assert split_layers(40, 16) == layers
    memory = estimate(ctx, config_13b("v-half", layers)).memory
    assert len(memory) == 8
    for device in memory:
        assert device.in_flight < one_f_one_b.in_flight
        assert device.activations < one_f_one_b.activations


def test_time_provenance_names_the_source_and_its_fit_error():
    hw, points = _a100()
    measured = layer_times(points, hw, model(), training(precision="bf16"), 1, 1, "none")
    scaled = layer_times(points, hw, _vshape_model(), training(precision="bf16"), 6, 1, "none")
    other = model(hidden_size=4096, num_attention_heads=32)
    modelled = layer_times(points, hw, other, training(precision="bf16"), 3, 1, "none")
    assert (measured.origin, scaled.origin, modelled.origin) == (
        "measured",
        "scaled measurement",
        "model",
    )
    assert time_provenance(measured, hw) == ("measured point", None)
    assert time_provenance(modelled, hw) == ("uncalibrated model", None)
    record = CalibrationRecord(
        fitted_at="2026-11-24T00:00:00Z", num_runs=3, rms_log_error=0.08, rms_log_error_before=0.2
    )
    calibrated = hw.with_parameters({}, record)
    assert time_provenance(modelled, calibrated) == ("calibrated model", 0.08)
    assert time_provenance(scaled, calibrated) == ("scaled measurement", 0.08)
    assert time_provenance(measured, calibrated) == ("measured point", None)
