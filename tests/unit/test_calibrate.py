"""Calibration: predictions of measured quantities, and the bounded least-squares fit
recovering parameters from synthetic runs generated with them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from planner.calibrate import fit, measured_quantities, outliers, predict, predict_quantities
from planner.errors import StagewrightError
from planner.measurements import MeasuredRun, candidate_config, fingerprint
from planner.profiles import HardwareProfile, default_store

A100 = default_store().hardware("a100-sxm-80g")
MODEL = {
    "name": "m",
    "num_layers": 8,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "seq_length": 1024,
    "vocab_size": 32000,
}


def run(measured: dict[str, Any], **config: Any) -> MeasuredRun:
    """A run of MODEL on 8 A100s (one node); ``config`` overrides t=2, p=4, d=1, mb=1."""
    cfg: dict[str, Any] = {
        "t": 2,
        "p": 4,
        "d": 1,
        "micro_batch_size": 1,
        "recompute": "none",
        "schedule": "1f1b",
    }
    cfg.update(config)
    return MeasuredRun.model_validate(
        {
            "model": MODEL,
            "cluster": {"gpu": "a100-sxm-80g", "num_nodes": 1, "gpus_per_node": 8},
            "training": {"global_batch_size": 16},
            "config": cfg,
            "measured": measured,
            "source": "synthetic",
        }
    )


CONFIGS: list[dict[str, Any]] = [
    {},
    {"t": 1, "p": 8},
    {"t": 4, "p": 2, "micro_batch_size": 2, "recompute": "selective"},
    {"t": 2, "p": 2, "d": 2, "recompute": "full", "micro_batch_size": 4},
    {"t": 1, "p": 4, "d": 2, "schedule": "v-half"},
]


def synthetic(truth: HardwareProfile, with_memory: bool) -> list[MeasuredRun]:
    """Runs whose measurements are exactly what the model predicts with ``truth``."""
    runs = []
    for config in CONFIGS:
        p = config.get("p", 4)
        probe = run({"kind": "step", "step_time_s": 1.0, "peak_memory_gib": [1.0] * p}, **config)
        got = predict_quantities(probe, truth, [])
        memory = [got[f"peak_memory_gib[{i}]"] for i in range(p)]
        measured: dict[str, Any] = {"kind": "step", "step_time_s": got["step_time_s"]}
        if with_memory:
            measured["peak_memory_gib"] = memory
        runs.append(run(measured, **config))
    passes = run(
        {"kind": "pass", "num_layers": 2, "forward_ms": 1, "backward_ms": 1, "weight_ms": 1}
    )
    times = predict_quantities(passes, truth, [])
    runs.append(
        run(
            {
                "kind": "pass",
                "num_layers": 2,
                "forward_ms": times["forward_s"] * 1e3,
                "backward_ms": times["backward_s"] * 1e3,
                "weight_ms": times["weight_s"] * 1e3,
            }
        )
    )
    return runs


# Fitted in the recovery tests; the flash-attention efficiency is in the list but no run uses
# flash attention, and the allowance is in it but (first) no run measures memory.
TIME = ["gemm_efficiency", "memory_efficiency", "collective_efficiency"]
UNUSED = ["flash_attention_efficiency", "workspace_gib", "allocator_fragmentation"]


def test_the_fit_recovers_time_parameters_and_leaves_uninformed_ones_alone():
    truth = A100.with_parameters(
        {"gemm_efficiency": 0.6, "memory_efficiency": 0.5, "collective_efficiency": 0.4}
    )
    start = A100.with_parameters({"workspace_gib": 3.0})  # not the default: must stay
    result = fit(start, synthetic(truth, with_memory=False), [], parameters=TIME + UNUSED)
    by_name = {p.parameter.name: p for p in result.parameters}
    for name, value in (
        ("gemm_efficiency", 0.6),
        ("memory_efficiency", 0.5),
        ("collective_efficiency", 0.4),
    ):
        assert by_name[name].status == "fitted"
        assert by_name[name].value == pytest.approx(value, rel=1e-5)
        assert by_name[name].std_error is not None
    for name in UNUSED:
        assert by_name[name].status == "uninformed"
        assert by_name[name].value == start.parameter(name)
    for name in ("gemm_pipeline_k", "kernel_launch_us"):
        assert by_name[name].status == "held"
    assert result.hardware.parameters == {
        "workspace_gib": 3.0,
        "gemm_efficiency": pytest.approx(0.6, rel=1e-5),
        "memory_efficiency": pytest.approx(0.5, rel=1e-5),
        "collective_efficiency": pytest.approx(0.4, rel=1e-5),
    }
    assert result.rms_log_error_before > 0.1 and result.rms_log_error < 1e-6
    assert result.num_runs == len(CONFIGS) + 1
    record = result.record("2026-01-01T00:00:00+00:00", run_ids=[1, 2])
    assert record.fitted == sorted(TIME)
    assert record.uninformed == sorted(UNUSED)


def test_measured_memory_informs_the_allowance_and_both_are_recovered():
    truth = A100.with_parameters(
        {"gemm_efficiency": 0.7, "workspace_gib": 2.5, "allocator_fragmentation": 0.12}
    )
    names = ["gemm_efficiency", "workspace_gib", "allocator_fragmentation"]
    result = fit(A100, synthetic(truth, with_memory=True), [], parameters=names)
    values = {p.parameter.name: p.value for p in result.parameters if p.status == "fitted"}
    assert values == {
        "gemm_efficiency": pytest.approx(0.7, rel=1e-5),
        "workspace_gib": pytest.approx(2.5, rel=1e-4),
        "allocator_fragmentation": pytest.approx(0.12, rel=1e-4),
    }
    again = fit(A100, synthetic(truth, with_memory=True), [], parameters=names)
    assert again.parameters == result.parameters  # deterministic


def test_only_the_named_parameters_move_and_bounds_hold():
    truth = A100.with_parameters({"gemm_efficiency": 0.7, "workspace_gib": 2.5})
    runs = synthetic(truth, with_memory=True)
    result = fit(A100, runs, [], parameters=["gemm_efficiency"])
    status = {p.parameter.name: (p.status, p.value) for p in result.parameters}
    # Held: left at the profile's value (here the declared default).
    assert status["workspace_gib"] == ("held", A100.parameter("workspace_gib"))
    assert status["allocator_fragmentation"] == ("held", A100.parameter("allocator_fragmentation"))
    assert status["gemm_efficiency"][0] == "fitted"
    # Steps faster than the device's peak allows: the efficiency stops at its bound.
    fast = [
        r.model_copy(update={"measured": r.measured.model_copy(update={"step_time_s": 1e-4})})
        for r in runs[:-1]
    ]
    bounded = fit(A100, fast, [], parameters=["gemm_efficiency"])
    assert bounded.moved == {"gemm_efficiency": 1.0}
    by_name = {p.parameter.name: p for p in bounded.parameters}
    assert by_name["gemm_efficiency"].status == "at bound"


def test_fit_errors_say_what_is_missing():
    with pytest.raises(
        StagewrightError, match="no measured runs of 'a100-sxm-80g'.*measurements add"
    ):
        fit(A100, [], [])
    with pytest.raises(StagewrightError, match="unknown cost-model parameter 'gemm'"):
        fit(A100, synthetic(A100, False), [], parameters=["gemm"])
    with pytest.raises(StagewrightError, match="cannot be predicted with profile 'cpu'"):
        predict(synthetic(A100, False)[0], default_store().hardware("cpu"), [])


def test_an_mfu_is_converted_with_megatrons_model_flops():
    """MFU = 72 B s L h^2 (1 + s/6h + V/12hL) / (T x GPUs x peak), Narayanan et al. eq. 3."""
    B, s, L, h, V = 16, 1024, 8, 1024, 32000
    flops = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    measured = run({"kind": "step", "mfu": 0.4})
    seconds = flops / (0.4 * 8 * 312e12)
    assert measured_quantities(measured, A100) == {"step_time_s": pytest.approx(seconds, rel=1e-12)}


def test_a_pass_is_predicted_as_its_layers_times_the_layer_model():
    fused = run({"kind": "pass", "num_layers": 3, "forward_ms": 5.0, "backward_ms": 9.0})
    got = predict_quantities(fused, A100, [])
    assert set(got) == {"forward_s", "backward_weight_s"}  # B + W fused: no weight_ms
    split = run(
        {"kind": "pass", "num_layers": 1, "forward_ms": 5.0, "backward_ms": 4.5, "weight_ms": 4.5}
    )
    one = predict_quantities(split, A100, [])
    assert got["forward_s"] == pytest.approx(3 * one["forward_s"], rel=1e-12)
    assert got["backward_weight_s"] == pytest.approx(
        3 * (one["backward_s"] + one["weight_s"]), rel=1e-12
    )
    assert predict(split, A100, []) == pytest.approx(sum(one.values()), rel=1e-12)


def test_a_run_of_an_adaptive_schedule_carries_its_limit_to_the_candidate():
    r = run({"kind": "step", "step_time_s": 1.0}, schedule="v-adaptive", memory_limit=0.5)
    assert candidate_config(r).memory_limit == 0.5
    assert predict(r, A100, []) > 0


def test_a_run_names_its_configuration_and_fingerprints_stably():
    r = run({"kind": "step", "step_time_s": 2.0}, t=1, p=8)
    config = candidate_config(r)
    assert (config.num_microbatches, config.layers_per_stage) == (16, [1] * 8)
    assert fingerprint(r) == fingerprint(MeasuredRun.model_validate(r.model_dump(mode="json")))
    assert fingerprint(r) != fingerprint(run({"kind": "step", "step_time_s": 2.5}, t=1, p=8))


@pytest.mark.parametrize(
    ("measured", "config", "message"),
    [
        (
            {"kind": "step", "step_time_s": 1.0},
            {"t": 2, "p": 2},
            "t*p*d = 2*2*1 = 4 but the cluster has 8",
        ),
        (
            {"kind": "step", "step_time_s": 1.0},
            {"t": 8, "p": 1, "micro_batch_size": 3},
            "not a multiple of micro_batch_size x d = 3",
        ),
        ({"kind": "step", "step_time_s": -1.0}, {}, "greater than 0"),
        (
            {"kind": "step", "mfu": 38.0},
            {},
            "38 is more than 1: the MFU is a fraction of the peak; give 0.38 for 38%",
        ),
        ({"kind": "step", "mfu": 380.0}, {}, "less than or equal to 1"),
        ({"kind": "step"}, {}, "needs step_time_s, mfu or peak_memory_gib"),
        ({"kind": "step", "peak_memory_gib": [1.0]}, {}, "give one per pipeline device (p = 4)"),
        ({"kind": "pass", "weight_ms": 1.0}, {}, "weight_ms without backward_ms"),
        (
            {"kind": "pass", "num_layers": 9, "forward_ms": 1.0},
            {},
            "more than the model's 8 layers",
        ),
        (
            {"kind": "step", "step_time_s": 1.0},
            {"layers_per_stage": [2, 2, 2, 1]},
            "adding up to the model's 8 layers",
        ),
        ({"kind": "walk"}, {}, "does not match any of the expected tags: 'step', 'pass'"),
        (
            {"kind": "step", "step_time_s": 1.0},
            {"schedule": "v-adaptive"},
            "v-adaptive is built for a memory limit: give config.memory_limit",
        ),
        (
            {"kind": "step", "step_time_s": 1.0},
            {"memory_limit": 0.5},
            "config: 1f1b takes no memory limit",
        ),
    ],
)
def test_bad_runs_are_refused_saying_what_to_change(measured, config, message):
    with pytest.raises(
        ValueError, match=message.replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")
    ):
        run(measured, **config)


def test_a_profiled_layer_is_a_pass_measurement_of_one_layer():
    from planner.measurements import run_from_layer_point
    from planner.profiles import LayerPoint
    from planner.specs import ModelSpec

    point = LayerPoint(
        gpu="a100-sxm-80g",
        precision="bf16",
        hidden_size=1024,
        num_attention_heads=16,
        ffn_hidden_size=4096,
        seq_length=512,
        micro_batch_size=2,
        t=2,
        recompute="selective",
        sequence_parallel=True,
        flash_attention=False,
        forward_ms=1.5,
        backward_ms=2.5,
        weight_ms=2.0,
        activation_bytes=None,
        includes_tp_comm=True,
        source="profiled here",
    )
    profiled = run_from_layer_point(point, ModelSpec.model_validate(MODEL))
    assert profiled.model.seq_length == 512 and profiled.cluster.num_gpus == 2
    assert (profiled.config.t, profiled.config.micro_batch_size, profiled.config.recompute) == (
        2,
        2,
        "selective",
    )
    assert measured_quantities(profiled, A100) == {
        "forward_s": pytest.approx(1.5e-3),
        "backward_s": pytest.approx(2.5e-3),
        "weight_s": pytest.approx(2.0e-3),
    }
    one = predict_quantities(profiled, A100, [])
    assert set(one) == {"forward_s", "backward_s", "weight_s"}


def test_outliers_are_errors_beyond_three_robust_deviations_or_three_noise_floors():
    # Median 0.01; deviations 0.01, 0, 0.02, 0.01, 0.49: MAD 0.01, 1.4826 x MAD = 0.0148,
    # below the 0.03 floor, so the limit is 0.09 and only the last is out.
    assert outliers(np.array([0.0, 0.01, -0.01, 0.02, 0.5])) == {4}
    assert outliers(np.array([0.0, 0.01, -0.01, 0.02, 0.09])) == set()  # 0.08 from the median
    # A wide spread: median 0.05, deviations 0.25 0.15 0.05 0.05 0.15 0.95, MAD 0.15, robust
    # deviation 0.2224, limit 0.667: only the 0.95 one.
    assert outliers(np.array([-0.2, -0.1, 0.0, 0.1, 0.2, 1.0])) == {5}
    # Judged within each kind: the step times, all far from the memory errors, are not
    # outliers, and the memory one 0.5 off is (median 0.005, limit 0.09). Pooled, the
    # spread is 1.4826 x 0.51 and nothing is.
    errors = np.array([2.0, 2.1, 1.9, 0.0, 0.01, -0.01, 0.5])
    kinds = ["step_time_s"] * 3 + ["peak_memory_gib"] * 4
    assert outliers(errors, kinds) == {6}
    assert outliers(errors) == set()


def test_runs_the_model_cannot_explain_are_left_out_and_the_rest_recovered():
    truth = A100.with_parameters({"gemm_efficiency": 0.6, "collective_efficiency": 0.5})
    runs = synthetic(truth, with_memory=False)
    # Two runs slowed by something the model does not represent (a straggler, say).
    slowed = {0: 1.5, 3: 1.35}
    for index, factor in slowed.items():
        step = runs[index].measured.step_time_s * factor
        runs[index] = runs[index].model_copy(
            update={"measured": runs[index].measured.model_copy(update={"step_time_s": step})}
        )
    names = ["gemm_efficiency", "collective_efficiency"]
    result = fit(A100, runs, [], parameters=names)
    assert result.moved == {
        "gemm_efficiency": pytest.approx(0.6, rel=1e-4),
        "collective_efficiency": pytest.approx(0.5, rel=1e-4),
    }
    out = [q for q in result.quantities if q.excluded]
    assert [(q.run, q.name) for q in out] == [(0, "step_time_s"), (3, "step_time_s")]
    for q in out:  # predicted as the truth would: the slowdown is what is left
        assert q.measured / q.predicted_after == pytest.approx(slowed[q.run], rel=1e-4)
    assert result.rms_log_error < 1e-6  # over the quantities fitted
    record = result.record("2026-01-01T00:00:00+00:00", run_ids=[10 + i for i in range(len(runs))])
    assert [(e.run_id, e.quantity) for e in record.excluded] == [
        (10, "step_time_s"),
        (13, "step_time_s"),
    ]
    # Fitting every quantity, the slowed runs drag the parameters away from the truth.
    everything = fit(A100, runs, [], parameters=names, exclude_outliers=False)
    assert not any(q.excluded for q in everything.quantities)
    assert everything.moved["gemm_efficiency"] < 0.6 * 0.95
    assert everything.rms_log_error > 0.05


def test_fewer_measured_numbers_than_informed_parameters_is_refused_saying_what_to_do():
    """Two step times and every parameter: five parameters move step times, and the fit
    pinned all five at their bounds (error 4.1 -> 3.0) and stored that as the profile."""
    truth = A100.with_parameters({"gemm_efficiency": 0.6})
    two = synthetic(truth, with_memory=False)[:2]
    with pytest.raises(StagewrightError) as caught:
        fit(A100, two, [])
    message = str(caught.value)
    assert "2 measured quantities" in message
    assert "5 parameters" in message
    for name in ("collective_efficiency", "gemm_efficiency", "kernel_launch_us"):
        assert name in message
    assert "--parameter" in message and "add runs" in message
    # Asked for fewer parameters than numbers, the same runs fit.
    one = fit(A100, two, [], parameters=["gemm_efficiency"])
    assert one.moved == {"gemm_efficiency": pytest.approx(0.6, rel=1e-4)}
    assert one.warnings == []


def test_a_parameter_the_runs_barely_determine_is_warned_about():
    """As many numbers as parameters: the fit goes through every measurement and has no
    error estimate; a standard error wider than a parameter's whole range means the runs
    do not pin it down. Both were shown as a quiet blank or number in the table."""
    truth = A100.with_parameters({"gemm_efficiency": 0.6, "memory_efficiency": 0.5})
    two = synthetic(truth, with_memory=False)[:2]
    exact = fit(A100, two, [], parameters=["gemm_efficiency", "memory_efficiency"])
    assert any("no error estimate" in w and "as many" in w for w in exact.warnings)
    runs = synthetic(truth, with_memory=False)
    good = fit(A100, runs, [], parameters=["gemm_efficiency", "memory_efficiency"])
    assert good.warnings == []
    # Four step times 3-5% off the truth, three parameters: the memory efficiency's
    # standard error came out at 2.2, more than its whole range [0.1, 1].
    noisy = [
        r.model_copy(
            update={
                "measured": r.measured.model_copy(
                    update={"step_time_s": r.measured.step_time_s * f}
                )
            }
        )
        for r, f in zip(runs[:4], [1.05, 0.95, 1.03, 0.97], strict=True)
    ]
    names = ["gemm_efficiency", "memory_efficiency", "collective_efficiency"]
    loose = fit(A100, noisy, [], parameters=names, exclude_outliers=False)
    memory = next(p for p in loose.parameters if p.parameter.name == "memory_efficiency")
    assert memory.std_error is not None and memory.std_error > 1 - 0.1
    assert [w.split(":")[0] for w in loose.warnings] == ["memory_efficiency"]
    assert "wider than its whole range [0.1, 1]" in loose.warnings[0]


def test_a_measured_number_a_hundred_times_off_its_prediction_is_named_with_its_likely_unit():
    from planner.calibrate import implausible

    step = predict_quantities(run({"kind": "step", "step_time_s": 1.0}), A100, [])["step_time_s"]
    fine = run({"kind": "step", "step_time_s": step * 50})
    assert implausible(fine, A100, predict_quantities(fine, A100, [])) == []
    slow = run({"kind": "step", "step_time_s": step * 1000})
    [(field, message)] = implausible(slow, A100, predict_quantities(slow, A100, []))
    assert field == "measured.step_time_s"
    assert "is 1000x the cost model's prediction" in message
    assert f"if it is in milliseconds, give {step:.4g}" in message
    # An MFU of 0.1% is a step 1,000 times the MFU-0.4 one's: said of the MFU, as a fraction.
    tiny = run({"kind": "step", "mfu": 0.0004})
    [(field, message)] = implausible(tiny, A100, predict_quantities(tiny, A100, []))
    assert field == "measured.mfu" and "0.45 for 45%" in message
    # Memory in MiB on the third device.
    probe = run({"kind": "step", "peak_memory_gib": [1.0] * 4})
    third = predict_quantities(probe, A100, [])["peak_memory_gib[2]"]
    memory = [third] * 4
    memory[2] = third * 1024
    mib = run({"kind": "step", "peak_memory_gib": memory})
    [(field, message)] = implausible(mib, A100, predict_quantities(mib, A100, []))
    assert field == "measured.peak_memory_gib[2]"
    assert f"if it is in MiB, give {third:.4g}" in message
