"""Llama-style models (grouped-query attention, SwiGLU, RMSNorm, RoPE, untied embeddings,
no linear biases) and context parallelism, against independent expectations.

Sources of the expectations:
- published sizes: Llama 3 8B, 70B and 405B (Grattafiori et al. 2024, "The Llama 3 Herd of
  Models", Table 3 for layers, width, FFN width, heads and key/value heads; the models'
  config.json on the Hugging Face Hub for the vocabulary of 128,256) and their stated
  parameter counts, 8.03B, 70.6B and 405B;
- activation bytes: Korthikanti et al. 2022, §4.1, each saved tensor listed by hand below for
  a layer with k = g h / a wide keys and values and a three-matrix MLP;
- Megatron-LM argument names: megatron/training/arguments.py at MEGATRON_COMMIT.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.costmodel import PlanContext
from planner.costmodel.device import collective_cost, device_rates
from planner.costmodel.flops import layer_pass_flops, linear_flops
from planner.costmodel.kernels import gemm_seconds
from planner.costmodel.layer_ops import embedding_ops, layer_ops
from planner.costmodel.memory import (
    activation_bytes_per_layer,
    layer_parameters,
    model_parameters,
    output_parameters,
)
from planner.costmodel.stages import placement_for
from planner.launch.runtimes import executor_problem
from planner.placement import context_groups_within_nodes
from planner.plan import plan
from planner.profiles import Link, default_store
from planner.specs import CandidateConfig, ModelSpec, PlanRequest
from tests.unit.helpers import model_spec, training

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

LLAMA = {
    "num_query_groups": 8,
    "activation": "swiglu",
    "normalization": "rmsnorm",
    "position_embedding": "rope",
    "untie_embeddings_and_output_weights": True,
    "add_bias_linear": False,
}


def example(name: str) -> PlanRequest:
    return PlanRequest.model_validate_json((EXAMPLES / name).read_text())


MODEL_DEFAULTS: dict[str, object] = {
    "name": "m",
    "num_layers": 4,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "seq_length": 1024,
    "vocab_size": 32000,
}


def model(**changes: object) -> ModelSpec:
    return model_spec(MODEL_DEFAULTS, **changes)


# ------------------------------------------------------------------ parameters and sizes


@pytest.mark.parametrize(
    "name, published",
    [
        ("llama3-8b-8xh100.json", 8.03e9),
        ("llama3-70b-64xh100.json", 70.6e9),
        ("llama3-405b-16384xh100.json", 405e9),
    ],
)
def test_example_models_have_their_published_parameter_counts(name, published):
    m = example(name).model
    assert m.num_query_groups == 8 and m.vocab_size == 128256 and m.seq_length == 8192
    assert model_parameters(m) == pytest.approx(published, rel=0.01)


def test_llama_layer_parameters_by_hand():
    h, a, g, f = 4096, 32, 8, 14336  # Llama 3 8B
    m = model(hidden_size=h, num_attention_heads=a, ffn_hidden_size=f, **LLAMA)
    k = g * h // a  # 1024: each of K and V
    q, kv, proj = h * h, 2 * h * k, h * h
    gate_up_down = 3 * h * f
    rms = 2 * h  # two RMSNorm scales, no shift, no biases anywhere
    assert layer_parameters(m) == q + kv + proj + gate_up_down + rms == 218_112_000


def test_untied_output_layer_is_held_even_by_a_single_stage():
    tied = model()
    untied = model(untie_embeddings_and_output_weights=True)
    vh = 32000 * 1024
    assert output_parameters(tied, 1) == 2 * 1024  # the embedding serves; final LayerNorm
    assert output_parameters(untied, 1) == vh + 2 * 1024
    assert output_parameters(tied, 4) == output_parameters(untied, 4) == vh + 2 * 1024
    assert model_parameters(untied) - model_parameters(tied) == vh


def test_rope_has_no_position_table_and_rmsnorm_no_shift():
    learned, rope = model(), model(position_embedding="rope")
    assert model_parameters(learned) - model_parameters(rope) == 1024 * 1024  # s x h
    assert layer_parameters(model()) - layer_parameters(model(normalization="rmsnorm")) == 2 * 1024


def test_swiglu_default_width_is_megatrons():
    # megatron/training/arguments.py: int((4 * h * 2 / 3) / 64) * 64
    assert model(hidden_size=4096, num_attention_heads=32, activation="swiglu").ffn == 10880
    assert model(hidden_size=1024, activation="gelu").ffn == 4096


# ------------------------------------------------------------------ activation memory


def _hand_activation_bytes(s, b, h, a, k, f, t, *, sp, scores=True, gated=True):
    """Korthikanti et al.'s saved tensors of one layer, listed one by one (16-bit)."""
    replicated = {  # unsplit by tensor parallelism (split with sequence parallelism)
        "norm 1 input": 2 * s * b * h,
        "QKV input": 2 * s * b * h,
        "attention output dropout mask": s * b * h,
        "norm 2 input": 2 * s * b * h,
        "fc1 input": 2 * s * b * h,
        "MLP output dropout mask": s * b * h,
    }
    split = {  # divided by t
        "Q": 2 * s * b * h,
        "K": 2 * s * b * k,
        "V": 2 * s * b * k,
        "projection input": 2 * s * b * h,
        "fc1 output (gate and up)" if gated else "GeLU input": (4 if gated else 2) * s * b * f,
        "fc2 input": 2 * s * b * f,
    }
    if scores:
        split["softmax output"] = 2 * a * s * s * b
        split["softmax dropout mask"] = a * s * s * b
        split["softmax dropout output"] = 2 * a * s * s * b
    if sp:
        return (sum(replicated.values()) + sum(split.values())) / t
    return sum(replicated.values()) + sum(split.values()) / t


@pytest.mark.parametrize("t, sp", [(1, False), (2, False), (4, False), (2, True), (4, True)])
def test_gqa_swiglu_activation_bytes_match_the_hand_count(t, sp):
    s, b, h, a, g, f = 1024, 2, 1024, 16, 4, 2816
    m = model(hidden_size=h, num_attention_heads=a, num_query_groups=g, ffn_hidden_size=f)
    m = m.model_copy(update={"activation": "swiglu"})
    tr = training(sequence_parallel=sp)
    k = g * h // a
    got = activation_bytes_per_layer(m, tr, b, t, "none")
    assert got == pytest.approx(_hand_activation_bytes(s, b, h, a, k, f, t, sp=sp))
    # Selective recomputation drops exactly the three score tensors.
    selective = activation_bytes_per_layer(m, tr, b, t, "selective")
    assert selective == pytest.approx(
        _hand_activation_bytes(s, b, h, a, k, f, t, sp=sp, scores=False)
    )


def test_gqa_and_swiglu_each_move_the_count_the_way_the_tensors_do():
    s, b, h, t = 1024, 1, 1024, 1
    tr = training(flash_attention=True)
    mha = activation_bytes_per_layer(model(), tr, b, t, "none")
    gqa = activation_bytes_per_layer(model(num_query_groups=4), tr, b, t, "none")
    assert mha - gqa == pytest.approx(4 * s * b * (h - h // 4))  # K and V, 2 bytes each
    gelu = activation_bytes_per_layer(model(ffn_hidden_size=2048), tr, b, t, "none")
    swiglu = activation_bytes_per_layer(
        model(ffn_hidden_size=2048, activation="swiglu"), tr, b, t, "none"
    )
    assert swiglu - gelu == pytest.approx(2 * s * b * 2048)  # the second fc1 half


def test_gpt_keeps_korthikanti_table_2():
    s, b, h, a, t = 1024, 2, 1024, 16, 2
    m, tr = model(), training(sequence_parallel=False)
    sbh = s * b * h
    expected = sbh * (10 + 24 / t + 5 * a * s / (h * t))
    assert activation_bytes_per_layer(m, tr, b, t, "none") == expected


def test_context_parallelism_divides_every_activation_by_cp():
    m = model(seq_length=8192, **LLAMA)
    tr = training(flash_attention=True)
    for mode in ("none", "selective", "full"):
        one = activation_bytes_per_layer(m, tr, 1, 2, mode)
        assert activation_bytes_per_layer(m, tr, 1, 2, mode, cp=4) == pytest.approx(one / 4)


# ------------------------------------------------------------------ FLOPs and per-op times


def test_linear_flops_of_a_gqa_swiglu_layer():
    b, s, h, a, g, f = 2, 1024, 1024, 16, 4, 2816
    m = model(num_query_groups=g, ffn_hidden_size=f, activation="swiglu")
    k = g * h // a
    per_token = h * h + 2 * h * k + h * h + 3 * h * f  # Q, K and V, projection, three MLP
    assert linear_flops(m, b) == 2 * b * s * per_token
    forward, _, weight = layer_pass_flops(m, b, "none", cp=2)
    assert forward == pytest.approx((2 * b * s * per_token + 4 * b * s * s * h) / 2)
    assert weight == pytest.approx(2 * b * s * per_token / 2)


def _ops(m, t=2, cp=1, ring=None, **train):
    hw = default_store().hardware("h100-sxm-80g")
    tr = training(**train)
    rates = device_rates(hw, "bf16")
    ops = layer_ops(rates, m, tr, 1, t, "none", collective_cost(hw), cp, ring)
    return {(op.phase, op.name): op.seconds for op in ops}, rates


def test_gqa_narrows_only_the_qkv_gemm_and_swiglu_widens_fc1():
    h, f, t = 4096, 14336, 2
    base = model(hidden_size=h, num_attention_heads=32, ffn_hidden_size=f, seq_length=2048)
    gqa = base.model_copy(update={"num_query_groups": 8})
    swiglu = base.model_copy(update={"activation": "swiglu"})
    mha_ops, rates = _ops(base, t, flash_attention=True)
    gqa_ops, _ = _ops(gqa, t, flash_attention=True)
    glu_ops, _ = _ops(swiglu, t, flash_attention=True)
    tokens = 2048
    assert gqa_ops[("F", "QKV GEMM")] == gemm_seconds(rates, tokens, (h + 2 * 1024) // t, h)
    assert gqa_ops[("F", "QKV GEMM")] < mha_ops[("F", "QKV GEMM")]
    assert gqa_ops[("F", "flash attention")] == mha_ops[("F", "flash attention")]
    assert glu_ops[("F", "FC1 GEMM")] == gemm_seconds(rates, tokens, 2 * f // t, h)
    assert glu_ops[("W", "FC1 weight grad")] == gemm_seconds(
        rates, 2 * f // t, h, tokens, output_bytes=8.0
    )
    assert glu_ops[("F", "FC2 GEMM")] == mha_ops[("F", "FC2 GEMM")]
    assert ("F", "SwiGLU") in glu_ops and ("F", "bias-GeLU") not in glu_ops


def test_rope_and_no_bias_change_the_ops_they_touch():
    m = model(position_embedding="rope", add_bias_linear=False)
    ops, _ = _ops(m, flash_attention=True)
    assert ("F", "rotary embedding") in ops and ("B", "rotary embedding backward") in ops
    assert ("B", "bias grads") not in ops and ("F", "QKV bias add") not in ops
    gpt, _ = _ops(model(), flash_attention=True)
    assert ("F", "rotary embedding") not in gpt and ("B", "bias grads") in gpt
    assert ("F", "QKV bias add") in gpt
    hw = default_store().hardware("h100-sxm-80g")
    names = [
        op.name
        for op in embedding_ops(device_rates(hw, "bf16"), m, training(), 1, 1, collective_cost(hw))
    ]
    assert "position add + dropout" not in names and "embedding dropout" in names


def test_ring_attention_is_priced_only_where_it_outlasts_the_attention():
    m = model(seq_length=8192, num_query_groups=4)
    fast = Link("nvlink", 450, 3)
    slow = Link("slow", 0.05, 5)  # 50 MB/s: the transfer cannot hide
    t, cp = 2, 4
    ops, _ = _ops(m, t, cp, fast, flash_attention=True)
    assert ("F", "ring attention K/V exposed") not in ops  # hidden behind the attention
    ops, _ = _ops(m, t, cp, slow, flash_attention=True)
    k = 4 * 1024 // 16
    step_bytes = 2 * (8192 // cp) * 1 * (k // t) * 2  # K and V chunk of this rank
    attention = ops[("F", "flash attention")]
    expected = (cp - 1) * max(0.0, slow.seconds(step_bytes) - attention / cp)
    assert ops[("F", "ring attention K/V exposed")] == pytest.approx(expected)
    backward = ops[("B", "flash attention backward")]
    expected_b = (cp - 1) * max(0.0, slow.seconds(2 * step_bytes) - backward / cp)
    assert ops[("B", "ring attention K/V backward exposed")] == pytest.approx(expected_b)


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"num_query_groups": 5}, ["num_query_groups 5", "divide", "num_attention_heads 16"]),
        ({"num_query_groups": 0}, ["greater than or equal to 1"]),
        ({"activation": "relu"}, ["gelu", "swiglu"]),
        ({"hidden_size": 16, "num_attention_heads": 1, "activation": "swiglu"}, ["ffn_hidden"]),
    ],
)
def test_model_fields_refuse_what_cannot_be_built(changes, words):
    with pytest.raises(ValueError) as err:
        model(**changes)
    for word in words:
        assert word in str(err.value)


def _request(**search: object) -> dict[str, object]:
    return {
        "model": {
            "name": "llama-mini",
            "num_layers": 8,
            "hidden_size": 1024,
            "num_attention_heads": 16,
            "seq_length": 4096,
            "vocab_size": 32000,
            **LLAMA,
            "num_query_groups": 2,
        },
        "cluster": {"gpu": "h100-sxm-80g", "num_nodes": 2, "gpus_per_node": 8},
        "training": {"global_batch_size": 16, "flash_attention": True},
        "search": {"schedules": ["1f1b", "interleaved", "v-half"], "top_k": 200, **search},
    }


def test_context_parallel_requests_say_what_to_change():
    data = _request(context_parallel=[1, 2])
    data["training"] = {"global_batch_size": 16, "flash_attention": False}
    with pytest.raises(ValueError, match="set training.flash_attention to true"):
        PlanRequest.model_validate(data)
    with pytest.raises(ValueError, match=r"multiple of 2 x cp for cp in \[3\]"):
        PlanRequest.model_validate(_request(context_parallel=[1, 3]))
    with pytest.raises(ValueError, match="lists a degree twice"):
        PlanRequest.model_validate(_request(context_parallel=[2, 2]))


@pytest.mark.parametrize(
    ("model", "training", "said"),
    [
        ({}, {"precision": "fp32"}, "takes only bf16 or fp16"),
        # 4,092 wide over 6 heads: 682 a head, past flash attention's 256.
        ({"hidden_size": 4092, "num_attention_heads": 6}, {}, "this model's is 682"),
        # 1,020 over 10 heads: 102 a head, not a multiple of 8.
        ({"hidden_size": 1020, "num_attention_heads": 10, "num_query_groups": 2}, {}, "is 102"),
    ],
)
def test_megatron_runs_flash_attention_only_where_its_kernel_can(model, training, said):
    """`--attention-backend flash` was emitted for fp32 and for heads of any width, which
    Transformer Engine's FlashAttention refuses (bf16/fp16, head dimension <= 256 and a
    multiple of 8): Megatron-LM is no runtime of those; the executor and torch still are."""
    from planner.launch.runtimes import runtime_limits

    data = _request()
    data["model"] = {**data["model"], **model}  # type: ignore[dict-item]
    data["training"] = {**data["training"], **training}  # type: ignore[dict-item]
    request = PlanRequest.model_validate(data)
    config = CandidateConfig(
        t=1, p=2, d=8, micro_batch_size=1, num_microbatches=2, recompute="none",
        schedule="1f1b", layers_per_stage=[4, 4],
    )  # fmt: skip
    limits = runtime_limits(request, config)
    assert said in limits["megatron"] and "flash_attention to false" in limits["megatron"]
    assert "torch" not in limits
    fine = runtime_limits(PlanRequest.model_validate(_request()), config)  # bf16, 64 a head
    assert "megatron" not in fine


# ------------------------------------------------------------------ the search


@pytest.fixture(scope="module")
def mini_plan():
    return plan(PlanRequest.model_validate(_request()))


def test_search_keeps_t_dividing_the_key_value_heads_and_fills_the_cluster(mini_plan):
    configs = [c.config for c in mini_plan.candidates] + [r.config for r in mini_plan.rejected]
    assert {c.t for c in configs} == {1, 2}  # 2 key/value heads: t = 4 or 8 cannot split them
    assert all(c.t * c.cp * c.p * c.d == 16 for c in configs)
    # Flash attention on: every cp keeping t x cp inside the 8-GPU node is searched.
    assert {(c.t, c.cp) for c in configs} == {
        (1, 1),
        (1, 2),
        (1, 4),
        (1, 8),
        (2, 1),
        (2, 2),
        (2, 4),
    }


def test_only_megatron_runs_context_parallel_candidates(mini_plan):
    with_cp = [c for c in mini_plan.candidates if c.config.cp > 1]
    assert with_cp, "the search found no context-parallel candidate to check"
    for candidate in with_cp:
        assert candidate.runtimes == ["megatron"]
        for runtime in ("stagewright", "torch"):
            assert "context parallelism" in candidate.runtime_limits[runtime]
        args = (candidate.launch.megatron_args or "").split()
        assert args[args.index("--context-parallel-size") + 1] == str(candidate.config.cp)
        assert candidate.launch.torchrun[0].count("--nproc-per-node=8") == 1
    # A schedule Megatron-LM lacks is rejected with cp > 1, saying why.
    vhalf = [
        r
        for r in mini_plan.rejected
        if r.config.cp > 1 and r.config.schedule == "v-half" and r.config.p in (2, 4)
    ]
    assert vhalf and all("no runtime can run it" in r.reason for r in vhalf)


def test_a_runtime_without_context_parallelism_gets_none():
    found = plan(PlanRequest.model_validate(_request(runtime="torch")))
    assert found.candidates and all(c.config.cp == 1 for c in found.candidates)


def test_context_parallel_placement_keeps_t_x_cp_in_a_node():
    assert context_groups_within_nodes(2, 4, 8) and not context_groups_within_nodes(4, 4, 8)
    config = CandidateConfig(
        t=2,
        cp=4,
        p=2,
        d=1,
        micro_batch_size=1,
        num_microbatches=8,
        recompute="none",
        schedule="1f1b",
        layers_per_stage=[4, 4],
    )
    placement = placement_for(config, 8)
    assert placement.world_size == 16
    # The first pipeline stage's 8 (tensor x context) ranks are node 0's 8 GPUs.
    assert {placement.node_of(placement.rank_of(0, 0, r)) for r in range(8)} == {0}
    ctx = PlanContext.from_store(PlanRequest.model_validate(_request()), default_store())
    hw = ctx.hardware
    assert ctx.ring_link(2, 4) == hw.intra_node and ctx.ring_link(2, 8) == hw.inter_node


# ------------------------------------------------------------------ launch


def test_megatron_arguments_name_the_architecture():
    found = plan(example("llama3-8b-8xh100.json"))
    assert found.best is not None
    args = (found.best.launch.megatron_args or "").split()
    for flag, value in [
        ("--num-query-groups", "8"),
        ("--normalization", "RMSNorm"),
        ("--position-embedding-type", "rope"),
        ("--ffn-hidden-size", "14336"),
        ("--vocab-size", "128256"),
    ]:
        assert args[args.index(flag) + 1] == value
    for switch in (
        "--group-query-attention",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
    ):
        assert switch in args
    gpt = json.loads((EXAMPLES / "gpt3-13b-8xa100.json").read_text())
    gpt_best = plan(PlanRequest.model_validate(gpt)).best
    assert gpt_best is not None
    gpt_args = gpt_best.launch.megatron_args or ""
    assert "--swiglu" not in gpt_args and "--num-query-groups" not in gpt_args


def test_the_executor_refuses_a_llama_layer_it_does_not_build():
    problem = executor_problem(model(**LLAMA), training(), 1, "1f1b")
    assert problem is not None and "swiglu" in problem and "grouped-query" in problem
    assert executor_problem(model(), training(), 1, "1f1b") is None


def test_the_405b_example_is_answered():
    found = plan(example("llama3-405b-16384xh100.json"))
    # The request asks for what Megatron-LM runs (search.runtime "megatron").
    assert found.best is not None and "megatron" in found.best.runtimes
    assert found.best.config.world_size == 16384


def test_the_regression_check_records_cp_only_when_used():
    from cli.regress import _summary

    forced = plan(PlanRequest.model_validate(_request(context_parallel=[2])))
    summary = _summary(forced)
    assert summary is not None and summary["config"]["cp"] == 2
    gpt = plan(PlanRequest.model_validate(json.loads((EXAMPLES / "tiny-cpu.json").read_text())))
    plain = _summary(gpt)
    assert plain is not None and "cp" not in plain["config"]


def _stage_parameters(model_fields: dict[str, object], t: int, layers: list[int]) -> list[float]:
    """Per-rank parameters of each 1F1B stage that ``stage_costs`` prices."""
    from planner.costmodel import stage_costs

    p = len(layers)
    r = PlanRequest.model_validate(
        {
            "model": {"name": "m", **model_fields},
            "cluster": {"gpu": "a100-sxm-80g", "num_nodes": 1, "gpus_per_node": t * p},
            "training": {"global_batch_size": 8},
            "search": {"schedules": ["1f1b"]},
        }
    )
    config = CandidateConfig(
        t=t,
        p=p,
        d=1,
        micro_batch_size=1,
        num_microbatches=8,
        recompute="none",
        schedule="1f1b",
        layers_per_stage=layers,
    )
    return list(stage_costs(PlanContext.from_store(r, default_store()), config).parameters)


def test_a_tensor_parallel_rank_holds_the_replicated_parameters_whole():
    # Megatron-LM splits the column-parallel weights and biases (QKV, fc1), the row-parallel
    # weights (projection, fc2) and the vocabulary (word embedding, output layer) over t; it
    # replicates the layer norms, the row-parallel biases (added after the all-reduce), the
    # position table (a torch.nn.Embedding) and the final norm. GPT, h 256, t 4, 2 x 4 layers:
    h, s, v, t = 256, 128, 1024, 4
    gpt = {"num_layers": 8, "hidden_size": h, "num_attention_heads": 8}
    split = 12 * h * h + (3 * h + 4 * h)  # QKV, proj, fc1, fc2; QKV and fc1 biases
    replicated = 4 * h + 2 * h  # two LayerNorms (scale, shift); proj and fc2 biases
    layer = split / t + replicated  # 198,592
    first = 4 * layer + v * h / t + s * h  # word embedding split, positions whole
    last = 4 * layer + v * h / t + 2 * h  # the tied output copy split, final LayerNorm whole
    assert [first, last] == [892_672, 860_416]
    assert _stage_parameters({**gpt, "seq_length": s, "vocab_size": v}, t, [4, 4]) == [first, last]


def test_a_tensor_parallel_rank_holds_its_share_of_the_padded_vocabulary():
    # Llama-style, t 2: K and V 64 wide (2 groups), SwiGLU of 512, RMSNorm, no biases, rope,
    # untied; a vocabulary of 1,001 that t does not divide, which Megatron-LM pads to 1,002
    # (the emitted --make-vocab-size-divisible-by 1 pads to a multiple of t): 501 rows a rank.
    h, k, f, t = 256, 64, 512, 2
    llama = {
        **LLAMA,
        "num_query_groups": 2,
        "num_layers": 2,
        "hidden_size": h,
        "num_attention_heads": 8,
        "ffn_hidden_size": f,
        "seq_length": 128,
        "vocab_size": 1001,
    }
    layer = (2 * h * h + 2 * h * k + 3 * h * f) / t + 2 * h  # RMSNorm scales replicated
    rows = 501
    assert _stage_parameters(llama, t, [1, 1]) == [
        layer + rows * h,  # no position table
        layer + rows * h + h,  # the untied output layer's rows and the final RMSNorm
    ]
