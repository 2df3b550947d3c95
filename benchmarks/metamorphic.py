"""Metamorphic and physical-sanity checks of the cost model's predictions.

    python benchmarks/metamorphic.py [--seed S] [--cases N] [--show K]

Generates random models (GPT and Llama-style), training switches and configurations, prices
each with the functions the planner prices a candidate with
(:func:`planner.costmodel.evaluate.estimate` and :func:`~planner.costmodel.evaluate.price`,
under a :class:`~planner.costmodel.evaluate.PlanContext` of the request) and checks relations
a correct model must satisfy between related inputs (a metamorphic relation: change one
input, the prediction must move one way) and formulas the papers state:

- activation memory per GPU never shrinks with the micro-batch size or the sequence length,
  falls with t under sequence parallelism (never rises without it), never rises with flash
  attention, sequence parallelism or 16-bit activations;
- activations: full <= selective <= none recomputation; step time the other way round;
- weights + gradients + optimizer states per GPU fall as t or p doubles (never rise with one
  more pipeline device), do not depend on the micro-batch size, fall with d under the
  distributed optimizer (and do not depend on d without it); the peak is the busiest
  device's sum of its parts;
- the step time of a fixed configuration grows with the global batch (more micro-batches),
  at most in proportion, affinely past the pipeline's fill (2p + 2);
- one more layer (or p more) never makes a step faster or lighter;
- a faster GPU (peak, HBM or link bandwidth) never makes a configuration slower;
- 1F1B and GPipe: bubble (p - 1) / (m + p - 1) with balanced stages and free communication,
  interleaved 1F1B (p - 1) / (v m + p - 1) (Narayanan et al. 2021 §2.2, as the BPipe and
  V-shape papers restate them), through ``price``'s simulation and its linear extension;
- in-flight micro-batches: 1F1B stage s holds min(p - s, m) (BPipe Eq. 1-2), so stage 0's
  activations are p micro-batches' (Korthikanti et al. §4.2 / Megatron); GPipe holds all m;
  interleaved device s p (v - 1) + 2 (p - s - 1) + 1 micro-batch-chunks (BPipe App. A);
- per-layer activation bytes of GPT with sequence parallelism: BPipe Appendix B Eqs. 4-5
  (Korthikanti et al.'s count, restated there);
- V-Min about 1/3 and V-Half about 1/2 of 1F1B's activation memory, within the V-shape
  paper's O(1) term (Eq. 2: (2p (delta0 + delta1) + O(1)) / 6 stage activations); with a
  uniform split every V schedule within 1F1B's plus one stage's (Table 1); a V placement's
  busiest device holds at most ceil(L / p) layers;
- BPipe: every stage holds at most ceil((p + 2) / 2) micro-batches (§3.3), never more
  memory than 1F1B where its §3.1 assumption holds, never faster than 1F1B on the same links
  (its transfers only add);
- 2BW: two weight versions, at most p in-flight micro-batches a stage (§3.1 "Memory
  footprint"), no slower than 1F1B (no flush);
- the simulated step is never below the estimate's lower bound, MFU in (0, 1);
- plans: candidates sorted by step time, every candidate's peak within the usable memory,
  the same request twice gives the same plan, and searching more (schedules, recompute
  modes, a GPU with more usable memory) never gives a slower best.

Prints each property, how many cases it was checked on and its violations (up to --show per
property). Violations of a property in ``KNOWN`` are explained exceptions (the reason is
printed); the run exits 1 when any other property is violated.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pydantic import ValidationError  # noqa: E402

from planner.costmodel.evaluate import (  # noqa: E402
    Estimate,
    PlanContext,
    Priced,
    estimate,
    num_stages,
    price,
    split_layers,
)
from planner.costmodel.memory import activation_bytes_per_layer  # noqa: E402
from planner.errors import StagewrightError  # noqa: E402
from planner.plan import plan  # noqa: E402
from planner.profiles import JsonProfileStore, Link, default_store  # noqa: E402
from planner.schedules import schedule_family  # noqa: E402
from planner.specs import CandidateConfig, PlanRequest  # noqa: E402

GIB = float(1 << 30)
REL = 1e-9  # relative slack for "never more/less": float rounding only

# Schedules priced with fixed orders (the adaptive ones are built for a memory limit and are
# checked through whole plans).
FIXED = ["1f1b", "gpipe", "interleaved", "bpipe", "v-min", "v-half", "v-zb", "1f1b-v", "2bw"]


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One configuration of one request, as plain data (``with_`` makes variants)."""

    model: tuple[tuple[str, Any], ...]
    training: tuple[tuple[str, Any], ...]
    gpu: str
    t: int
    p: int
    d: int
    mb: int
    m: int
    recompute: str
    schedule: str
    num_chunks: int | None = None
    gpus_per_node: int | None = None
    cp: int = 1

    def with_(self, **changes: Any) -> Case:
        model = dict(self.model)
        training = dict(self.training)
        for key in list(changes):
            if key.startswith("model_"):
                model[key[6:]] = changes.pop(key)
            elif key.startswith("training_"):
                training[key[9:]] = changes.pop(key)
        return replace(
            self,
            model=tuple(sorted(model.items())),
            training=tuple(sorted(training.items())),
            **changes,
        )

    def label(self) -> str:
        mo, tr = dict(self.model), dict(self.training)
        flags = [
            k
            for k in ("sequence_parallel", "flash_attention", "distributed_optimizer")
            if tr.get(k)
        ]
        llama = "swiglu" if mo.get("activation") == "swiglu" else "gpt"
        chunks = f" v={self.num_chunks}" if self.num_chunks else ""
        return (
            f"[{self.gpu} {llama} L={mo['num_layers']} h={mo['hidden_size']} "
            f"a={mo['num_attention_heads']} s={mo['seq_length']} V={mo['vocab_size']} "
            f"{tr.get('precision', 'bf16')} {'+'.join(flags) or '-'}] "
            f"t{self.t}{f' cp{self.cp}' if self.cp > 1 else ''} p{self.p} d{self.d} mb{self.mb} "
            f"m{self.m} {self.recompute} "
            f"{self.schedule}{chunks}"
        )


def request_of(case: Case) -> PlanRequest:
    world = case.t * case.cp * case.p * case.d
    per_node = case.gpus_per_node or (8 if world % 8 == 0 else world)
    return PlanRequest.model_validate(
        {
            "model": {"name": "meta", **dict(case.model)},
            "cluster": {
                "gpu": case.gpu,
                "num_nodes": max(1, world // per_node),
                "gpus_per_node": per_node,
            },
            "training": {**dict(case.training), "global_batch_size": case.mb * case.m * case.d},
        }
    )


class Pricer:
    """Prices cases with the planner's own functions; one context per request."""

    def __init__(self, store: JsonProfileStore) -> None:
        self.store = store
        self._contexts: dict[str, PlanContext] = {}
        self._priced: dict[Case, tuple[Estimate, Priced] | None] = {}
        self.skipped: Counter[str] = Counter()

    def context(self, request: PlanRequest) -> PlanContext:
        key = request.model_dump_json()
        found = self._contexts.get(key)
        if found is None:
            found = self._contexts[key] = PlanContext.from_store(request, self.store)
        return found

    def config(self, case: Case) -> CandidateConfig | None:
        family = schedule_family(case.schedule)
        if family.problem(case.p, case.m) is not None:
            return None
        stages = num_stages(case.schedule, case.p, case.num_chunks)
        layers = split_layers(dict(case.model)["num_layers"], stages)
        if layers is None:
            return None
        return CandidateConfig(
            t=case.t,
            cp=case.cp,
            p=case.p,
            d=case.d,
            micro_batch_size=case.mb,
            num_microbatches=case.m,
            recompute=case.recompute,
            schedule=case.schedule,
            layers_per_stage=layers,
            num_chunks=case.num_chunks,
        )

    def __call__(self, case: Case) -> tuple[Estimate, Priced] | None:
        """(estimate, simulated price) of ``case``, or None where it is no valid candidate."""
        if case in self._priced:
            return self._priced[case]
        result = None
        try:
            request = request_of(case)
            config = self.config(case)
            if config is not None:
                ctx = self.context(request)
                ctx.hardware.peak(request.training.precision)
                est = estimate(ctx, config)
                result = (est, price(ctx, est))
        except (ValidationError, StagewrightError, ValueError) as exc:
            self.skipped[type(exc).__name__] += 1
        self._priced[case] = result
        return result


def activations(est: Estimate) -> float:
    return max(dev.activations for dev in est.memory)


def static(est: Estimate) -> float:
    return max(dev.parameters + dev.gradients + dev.optimizer for dev in est.memory)


def random_model(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.15:  # the shapes with measured layer points (BPipe Table 3)
        h, a = rng.choice([(9984, 104), (11520, 120), (5120, 40)])
        return {
            "num_layers": rng.choice([40, 80, 96]),
            "hidden_size": h,
            "num_attention_heads": a,
            "seq_length": 2048,
            "vocab_size": 51200,
        }
    a = rng.choice([8, 12, 16, 24, 32, 40, 48, 64, 96])
    h = a * rng.choice([64, 80, 96, 128])
    model: dict[str, Any] = {
        "num_layers": rng.randint(4, 64),
        "hidden_size": h,
        "num_attention_heads": a,
        "seq_length": rng.choice([512, 1024, 2048, 4096]),
        "vocab_size": rng.choice([32000, 51200, 128256]),
    }
    if rng.random() < 0.3:
        model.update(
            num_query_groups=rng.choice([g for g in (1, 2, 4, 8) if a % g == 0]),
            activation="swiglu",
            normalization="rmsnorm",
            position_embedding="rope",
            untie_embeddings_and_output_weights=True,
            add_bias_linear=False,
        )
    return model


def random_training(rng: random.Random) -> dict[str, Any]:
    return {
        "precision": rng.choice(["bf16", "bf16", "bf16", "fp16", "fp32"]),
        "optimizer": rng.choice(["adam", "adam", "sgd"]),
        "distributed_optimizer": rng.random() < 0.6,
        "sequence_parallel": rng.random() < 0.6,
        "flash_attention": rng.random() < 0.4,
    }


def random_case(rng: random.Random) -> Case:
    model = random_model(rng)
    training = random_training(rng)
    gpu = rng.choice(["a100-sxm-80g", "a100-sxm-80g", "h100-sxm-80g", "a100-40g"])
    a = model["num_attention_heads"]
    groups = model.get("num_query_groups") or a
    t = rng.choice([x for x in (1, 2, 4, 8) if a % x == 0 and groups % x == 0])
    schedule = rng.choice(FIXED)
    chunks = rng.choice([2, 2, 4]) if schedule_family(schedule).chunks_default else None
    p = rng.choice([1, 2, 3, 4, 4, 6, 8, 8, 12, 16])
    if schedule != "1f1b" and p == 1:
        p = 2
    return Case(
        model=tuple(sorted(model.items())),
        training=tuple(sorted(training.items())),
        gpu=gpu,
        t=t,
        p=p,
        d=rng.choice([1, 1, 2, 4]),
        mb=rng.choice([1, 1, 2, 4]),
        m=rng.choice([p, 2 * p, 3 * p + 2, 4 * p, 8 * p, rng.randint(1, 64)]),
        recompute=rng.choice(["none", "selective", "full"]),
        schedule=schedule,
        num_chunks=chunks,
    )


# --------------------------------------------------------------------------- report


# Violations of these properties are explained (see the module docstring of each check and
# the report of the run that added them); they are printed but do not fail the run.
KNOWN = {
    "BPipe peak memory <= 1F1B's (acceptor stage heavier)": (
        "BPipe balances micro-batch counts (mu_opt, §3.3) assuming every stage saves the "
        "same A_0 (§3.1); an acceptor whose own micro-batch (the output layer's fp32 logits) "
        "is heavier than its evictor's ends above 1F1B's peak, as the paper's algorithm runs"
    ),
    "BPipe never faster than 1F1B (pair-adjacent placement, §3.5)": (
        "BPipe's pair-adjacent assignment puts pipeline neighbours in one node where "
        "Megatron's order for 1F1B crosses nodes: the faster hop, not the schedule"
    ),
    "plan (cpsat): the same request gives the same answer": (
        "README (CP-SAT refinement): equally good splits race between CP-SAT's parallel "
        "workers, so which comes back can differ between runs"
    ),
    "step time: full >= selective >= none (BPipe: transfers carry the saved bytes)": (
        "every BPipe evict/load moves one stage's saved activations (Appendix B, Eqs. 4-9): "
        "less recomputation means longer transfers, exposed where they outlast the forward "
        "(t = 8 puts the pair across nodes, where Appendix B says recomputation is needed)"
    ),
    "step time at k x the batch at most k x the step (BPipe: transfers carry the saved bytes)": (
        "BPipe evicts and loads in the steady phase (§3.4), which m = p barely has: with "
        "exposed transfers (pairs across nodes) the per-micro-batch cost rises from m = p "
        "to 2p, so T(2m) > 2 T(m) there"
    ),
    "V placement: the busiest device holds <= ceil(L / p) layers": (
        "split_layers spreads layers per stage and lightens stages in the order 0, n-1, 1, "
        "n-2, ...: under a V placement those pairs share a device, so the extra layers land "
        "two by two on the middle devices, up to 1.3x slower V-ZB candidates at p = 16 "
        "(a search heuristic, not fixed: a per-device split is slower where the end stages "
        "are heavy, so the grid would have to try both)"
    ),
}


@dataclass
class Report:
    counts: Counter[str] = field(default_factory=Counter)
    violations: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    order: list[str] = field(default_factory=list)

    def check(self, prop: str, ok: bool, detail: str) -> None:
        if prop not in self.counts:
            self.order.append(prop)
        self.counts[prop] += 1
        if not ok:
            self.violations[prop].append(detail)

    def print(self, show: int) -> tuple[int, int]:
        """Print every property; (violations, of which known exceptions)."""
        bad = known = 0
        for prop in self.order:
            found = self.violations.get(prop, [])
            bad += len(found)
            status = "ok" if not found else f"{len(found)} VIOLATION(S)"
            print(f"{prop}: {self.counts[prop]} cases, {status}")
            if found and prop in KNOWN:
                known += len(found)
                print(f"    known exception: {KNOWN[prop]}")
                continue
            for line in found[:show]:
                print(f"    - {line}")
            if len(found) > show:
                print(f"    ... and {len(found) - show} more")
        return bad, known


def _moved(case: Case, change: str, before: float, after: float) -> str:
    """A check's detail: the case, what changed, and the bytes before and after in GiB."""
    return f"{case.label()}: {change}: {before / GIB:.3f} -> {after / GIB:.3f} GiB"


def _le(a: float, b: float, rel: float = REL) -> bool:
    return a <= b + rel * max(abs(a), abs(b))


# --------------------------------------------------------------------------- properties


def check_case(case: Case, price_of: Pricer, report: Report) -> None:  # noqa: C901
    base = price_of(case)
    if base is None:
        return
    est, pr = base
    tr = dict(case.training)

    # Activations never shrink with the micro-batch size (same m, t, p, d).
    for bigger in (2 * case.mb,):
        other = price_of(case.with_(mb=bigger))
        if other is not None:
            a0, a1 = activations(est), activations(other[0])
            report.check(
                "activation memory non-decreasing in micro-batch size",
                _le(a0, a1),
                _moved(case, f"mb {case.mb} -> {bigger}", a0, a1),
            )
            s0, s1 = static(est), static(other[0])
            report.check(
                "weights+grads+optimizer independent of micro-batch size",
                abs(s0 - s1) <= REL * s0,
                f"{case.label()}: {s0 / GIB:.4f} vs {s1 / GIB:.4f} GiB",
            )

    # Activations never shrink with the sequence length.
    s = dict(case.model)["seq_length"]
    longer = price_of(case.with_(model_seq_length=2 * s))
    if longer is not None:
        a0, a1 = activations(est), activations(longer[0])
        report.check(
            "activation memory non-decreasing in sequence length",
            _le(a0, a1),
            _moved(case, f"s {s} -> {2 * s}", a0, a1),
        )
        t0, t1 = pr.iteration_time_s, longer[1].iteration_time_s
        report.check(
            "step time non-decreasing in sequence length",
            _le(t0, t1),
            f"{case.label()}: s {s} -> {2 * s}: {t0:.4f} -> {t1:.4f} s",
        )

    # Context parallelism (flash attention only): each rank keeps s / cp tokens, and the
    # distributed optimizer shards over d x cp.
    if tr.get("flash_attention") and case.t * 2 * case.cp <= 8 and s % (4 * case.cp) == 0:
        split = price_of(case.with_(cp=2 * case.cp))
        if split is not None:
            a0, a1 = activations(est), activations(split[0])
            report.check(
                "activation memory falls with cp (context parallelism)",
                a1 < a0,
                _moved(case, f"cp {case.cp} -> {2 * case.cp}", a0, a1),
            )
            s0, s1 = static(est), static(split[0])
            if tr.get("distributed_optimizer"):
                report.check(
                    "weights+grads+optimizer fall with cp (distributed optimizer over d x cp)",
                    s1 < s0,
                    _moved(case, f"cp {case.cp} -> {2 * case.cp}", s0, s1),
                )

    # t: falls under sequence parallelism, never rises without (same p, d, m).
    wider = price_of(case.with_(t=2 * case.t))
    if wider is not None:
        a0, a1 = activations(est), activations(wider[0])
        if tr.get("sequence_parallel"):
            report.check(
                "activation memory falls with t (sequence parallelism)",
                a1 < a0,
                _moved(case, f"t {case.t} -> {2 * case.t}", a0, a1),
            )
        else:
            report.check(
                "activation memory non-increasing with t (no sequence parallelism)",
                _le(a1, a0),
                _moved(case, f"t {case.t} -> {2 * case.t}", a0, a1),
            )

    # Recompute: memory full <= selective <= none, time the other way.
    if case.recompute == "none":
        modes = {r: price_of(case.with_(recompute=r)) for r in ("none", "selective", "full")}
        if all(v is not None for v in modes.values()):
            act = {r: activations(v[0]) for r, v in modes.items()}  # type: ignore[index]
            step = {r: v[1].iteration_time_s for r, v in modes.items()}  # type: ignore[index]
            report.check(
                "activation memory: full <= selective <= none",
                _le(act["full"], act["selective"]) and _le(act["selective"], act["none"]),
                f"{case.label()}: none {act['none'] / GIB:.3f}, selective "
                f"{act['selective'] / GIB:.3f}, full {act['full'] / GIB:.3f} GiB",
            )
            transfers = schedule_family(case.schedule).transfers
            report.check(
                "step time: full >= selective >= none"
                + (" (BPipe: transfers carry the saved bytes)" if transfers else ""),
                _le(step["none"], step["selective"]) and _le(step["selective"], step["full"]),
                f"{case.label()}: none {step['none']:.4f}, selective "
                f"{step['selective']:.4f}, full {step['full']:.4f} s",
            )

    # Static memory: falls with d under the distributed optimizer, constant without.
    more_d = price_of(case.with_(d=2 * case.d))
    if more_d is not None:
        s0, s1 = static(est), static(more_d[0])
        if tr.get("distributed_optimizer"):
            report.check(
                "weights+grads+optimizer fall with d (distributed optimizer)",
                s1 < s0,
                _moved(case, f"d {case.d} -> {2 * case.d}", s0, s1),
            )
        else:
            report.check(
                "weights+grads+optimizer independent of d (no distributed optimizer)",
                abs(s0 - s1) <= REL * s0,
                _moved(case, f"d {case.d} -> {2 * case.d}", s0, s1),
            )

    # Static memory falls as t x p doubles (same d and schedule); one more pipeline device
    # never adds any (its busiest device may keep the same ceil(L / stages) layers).
    for change in ({"t": 2 * case.t}, {"p": 2 * case.p}, {"p": case.p + 1}):
        other = price_of(case.with_(**change))
        if other is not None:
            s0, s1 = static(est), static(other[0])
            if "p" in change and change["p"] == case.p + 1:
                report.check(
                    "weights+grads+optimizer never rise with one more pipeline device",
                    _le(s1, s0),
                    _moved(case, change, s0, s1),
                )
            else:
                report.check(
                    "weights+grads+optimizer fall as t*p doubles",
                    s1 < s0,
                    _moved(case, change, s0, s1),
                )

    # Global batch: more micro-batches, longer step, affine in m past the fill.
    family = schedule_family(case.schedule)
    m = case.m
    runs = {k: price_of(case.with_(m=k * m)) for k in (1, 2, 4)}
    if all(v is not None for v in runs.values()):
        times = {k: v[1].iteration_time_s for k, v in runs.items()}  # type: ignore[index]
        report.check(
            "step time increases with global batch (fixed micro-batch)",
            times[1] < times[2] < times[4],
            f"{case.label()}: m, 2m, 4m: {times[1]:.4f}, {times[2]:.4f}, {times[4]:.4f} s",
        )
        report.check(
            "step time at k x the batch at most k x the step"
            + (" (BPipe: transfers carry the saved bytes)" if family.transfers else ""),
            _le(times[2], 2 * times[1]) and _le(times[4], 4 * times[1]),
            f"{case.label()}: m, 2m, 4m: {times[1]:.4f}, {times[2]:.4f}, {times[4]:.4f} s",
        )
        if m >= 2 * case.p + 2:  # V-Half and V-ZB settle after about 2p + 2 (evaluate.py)
            slope1 = (times[2] - times[1]) / m
            slope2 = (times[4] - times[2]) / (2 * m)
            report.check(
                "step time affine in the micro-batches past the fill (slopes within 5%)",
                abs(slope2 - slope1) <= 0.05 * max(slope1, slope2),
                f"{case.label()}: per micro-batch {slope1 * 1e3:.3f} ms "
                f"(m..2m) vs {slope2 * 1e3:.3f} ms (2m..4m)",
            )

    # One more layer: never faster, never lighter.
    layers = dict(case.model)["num_layers"]
    for extra in (1, case.p):
        deeper = price_of(case.with_(model_num_layers=layers + extra))
        if deeper is not None:
            t0, t1 = pr.iteration_time_s, deeper[1].iteration_time_s
            p0, p1 = est.peak_memory, deeper[0].peak_memory
            report.check(
                "more layers: never faster",
                _le(t0, t1),
                f"{case.label()}: +{extra} layer(s): {t0:.4f} -> {t1:.4f} s",
            )
            report.check(
                "more layers: never less peak memory",
                _le(p0, p1),
                _moved(case, f"+{extra} layer(s)", p0, p1),
            )

    # Simulation never beats the estimate's lower bound; MFU below 1.
    report.check(
        "simulated step >= the estimate's lower bound",
        _le(est.lower_bound_s, pr.iteration_time_s, 1e-6),
        f"{case.label()}: {pr.iteration_time_s:.6f} < bound {est.lower_bound_s:.6f} s",
    )
    report.check("MFU in (0, 1)", 0 < pr.mfu < 1, f"{case.label()}: MFU {pr.mfu:.3f}")

    # Schedules against 1F1B on the same configuration.
    if case.schedule != "1f1b" and family.chunks_default is None:
        ref = price_of(case.with_(schedule="1f1b"))
        if ref is not None:
            ref_est, ref_pr = ref
            if case.schedule == "bpipe":
                # §3.1-3.3 balance micro-batch counts assuming every stage saves the same
                # bytes per micro-batch (A_0): checked where each acceptor's bytes are at most
                # its evictor's, counted apart where the last stage's output layer is heavier.
                per = est.costs.activation_bytes
                uniform = all(per[case.p - 1 - s_] <= per[s_] for s_ in range(case.p // 2))
                prop = (
                    "BPipe peak memory <= 1F1B's (acceptor stages no heavier, §3.1)"
                    if uniform
                    else "BPipe peak memory <= 1F1B's (acceptor stage heavier)"
                )
                report.check(
                    prop,
                    _le(est.peak_memory, ref_est.peak_memory),
                    f"{case.label()}: {est.peak_memory / GIB:.3f} vs 1F1B "
                    f"{ref_est.peak_memory / GIB:.3f} GiB",
                )
                same_links = (
                    est.costs.p2p_s == ref_est.costs.p2p_s
                    and est.data_parallel_s == ref_est.data_parallel_s
                )
                report.check(
                    "BPipe never faster than 1F1B (transfers only add)"
                    if same_links
                    else "BPipe never faster than 1F1B (pair-adjacent placement, §3.5)",
                    _le(ref_pr.iteration_time_s, pr.iteration_time_s),
                    f"{case.label()}: {pr.iteration_time_s:.4f} vs 1F1B "
                    f"{ref_pr.iteration_time_s:.4f} s",
                )
                if case.p >= 4 and case.m >= case.p:
                    cap = math.ceil((case.p + 2) / 2)
                    held = max(est.memory[dv].in_flight for dv in range(case.p))
                    report.check(
                        "BPipe: every stage holds <= ceil((p+2)/2) micro-batches",
                        held <= cap + 1e-9,
                        f"{case.label()}: {held} > {cap}",
                    )
            if case.schedule == "2bw":
                w0 = max(dev.parameters for dev in ref_est.memory)
                w1 = max(dev.parameters for dev in est.memory)
                report.check(
                    "2BW: two weight versions (weights = 2 x 1F1B's)",
                    abs(w1 - 2 * w0) <= REL * w1,
                    f"{case.label()}: {w1 / GIB:.3f} vs 2 x {w0 / GIB:.3f} GiB",
                )
                held = max(dev.in_flight for dev in est.memory)
                report.check(
                    "2BW: at most p in-flight micro-batches a stage",
                    held <= case.p,
                    f"{case.label()}: {held} > p = {case.p}",
                )
                report.check(
                    "2BW no slower than 1F1B (no flush)",
                    _le(pr.iteration_time_s, ref_pr.iteration_time_s),
                    f"{case.label()}: {pr.iteration_time_s:.4f} vs 1F1B "
                    f"{ref_pr.iteration_time_s:.4f} s",
                )
            if case.schedule in ("v-zb", "v-min", "v-half", "1f1b-v"):
                layers = dict(case.model)["num_layers"]
                uniform = layers % (2 * case.p) == 0
                by_device = [
                    sum(est.config.layers_per_stage[s_] for s_ in st)
                    for st in _stages(case.schedule, case.p)
                ]
                report.check(
                    "V placement: the busiest device holds <= ceil(L / p) layers",
                    max(by_device) <= -(-layers // case.p),
                    f"{case.label()}: layers per device {by_device}",
                )
                # Table 1 (V-ZB M, the others less) assumes a uniform partition (§3.1).
                if uniform:
                    report.check(
                        f"{case.schedule} activation memory <= 1F1B's + one stage's"
                        " (uniform split, Table 1)",
                        _le(
                            activations(est),
                            activations(ref_est) + max(ref_est.costs.activation_bytes),
                        ),
                        f"{case.label()}: {activations(est) / GIB:.3f} vs "
                        f"1F1B {activations(ref_est) / GIB:.3f} GiB",
                    )
            if case.schedule == "gpipe":
                counts = [dev.in_flight for dev in est.memory]
                report.check(
                    "GPipe: every stage holds all m micro-batches",
                    counts == [case.m] * case.p,
                    f"{case.label()}: {counts}",
                )
                report.check(
                    "GPipe activation memory >= 1F1B's",
                    _le(activations(ref_est), activations(est)),
                    f"{case.label()}: {activations(est) / GIB:.3f} vs 1F1B "
                    f"{activations(ref_est) / GIB:.3f} GiB",
                )

    # Interleaved 1F1B: device s holds p (v - 1) + 2 (p - s - 1) + 1 micro-batch-chunks
    # before its first backward (BPipe Appendix A), all m v if there are fewer.
    if case.schedule == "interleaved" and case.num_chunks:
        v = case.num_chunks
        chunks_held = [round(dev.in_flight * v, 9) for dev in est.memory]
        want = [
            min(case.p * (v - 1) + 2 * (case.p - s_ - 1) + 1, case.m * v) for s_ in range(case.p)
        ]
        report.check(
            "interleaved: device s holds p(v-1) + 2(p-s-1) + 1 chunks (BPipe App. A)",
            chunks_held == want,
            f"{case.label()}: {chunks_held} != {want}",
        )

    # Switches that only save memory never add any: flash attention, sequence parallelism,
    # 16-bit instead of fp32 activations.
    for key, on in (
        ("flash_attention", True),
        ("sequence_parallel", True),
        ("precision", "bf16"),
    ):
        if tr.get(key) == on or (key == "sequence_parallel" and case.t == 1):
            continue
        saver = price_of(case.with_(**{f"training_{key}": on}))
        if saver is not None:
            a0, a1 = activations(est), activations(saver[0])
            report.check(
                f"activation memory never rises with {key} = {on}",
                _le(a1, a0),
                _moved(case, f"{key} -> {on}", a0, a1),
            )

    # The reported peak is the busiest device's total of its parts.
    parts = [
        dev.parameters + dev.gradients + dev.optimizer + dev.activations + dev.allowance
        for dev in est.memory
    ]
    report.check(
        "peak memory = max over devices of the sum of its parts",
        abs(max(parts) - est.peak_memory) <= 1e-9 * est.peak_memory,
        f"{case.label()}: {max(parts)} vs {est.peak_memory}",
    )

    # 1F1B: stage s holds min(p - s, m) micro-batches; stage 0's activations are that many
    # times its stage's saved bytes (plus the recompute working set).
    if case.schedule == "1f1b":
        counts = [dev.in_flight for dev in est.memory]
        want = [min(case.p - s_, case.m) for s_ in range(case.p)]
        report.check(
            "1F1B: stage s holds min(p - s, m) micro-batches (BPipe Eq. 1-2)",
            counts == want,
            f"{case.label()}: {counts} != {want}",
        )
        first = est.memory[0].activations
        expect = min(case.p, case.m) * est.costs.activation_bytes[0] + est.costs.working_bytes[0]
        report.check(
            "1F1B: first stage's activations = min(p, m) micro-batches'",
            abs(first - expect) <= 1e-9 * expect,
            f"{case.label()}: {first / GIB:.4f} vs {expect / GIB:.4f} GiB",
        )


def faster_gpu(rng: random.Random, cases: Sequence[Case], report: Report) -> None:
    """The same configurations on a renamed copy of each profile (no measured layer points
    either way) and on copies with a higher peak, HBM bandwidth, L2 bandwidth or links."""
    store = default_store()
    base_store = JsonProfileStore()
    variants: dict[str, list[str]] = {}
    for name in ("a100-sxm-80g", "h100-sxm-80g", "a100-40g"):
        hw = store.hardware(name)
        base_store.add_hardware(replace(hw, name=f"{name}~base"))
        names = []
        for what, k in (
            ("peak", 1.5),
            ("hbm", 1.5),
            ("peak+hbm", 2.0),
            ("links", 2.0),
            ("peak", 1.01),
            ("hbm", 1.01),
        ):
            faster = replace(hw, name=f"{name}~{what}x{k}")
            if "peak" in what:
                faster = replace(faster, peak_flops={p: v * k for p, v in hw.peak_flops.items()})
                if hw.compute is not None and hw.compute.l2_bandwidth_gbps is not None:
                    pass  # the L2 is a separate datasheet figure: left as it is
            if "hbm" in what:
                faster = replace(faster, memory_bandwidth_gbps=hw.memory_bandwidth_gbps * k)
            if what == "links":
                faster = replace(
                    faster,
                    intra_node=Link(
                        hw.intra_node.kind,
                        hw.intra_node.bandwidth_gbps * k,
                        hw.intra_node.latency_us,
                    ),
                    inter_node=Link(
                        hw.inter_node.kind,
                        hw.inter_node.bandwidth_gbps * k,
                        hw.inter_node.latency_us,
                    ),
                )
            base_store.add_hardware(faster)
            names.append(faster.name)
        variants[name] = names
    pricer = Pricer(base_store)
    for case in cases:
        slow = pricer(replace(case, gpu=f"{case.gpu}~base"))
        if slow is None:
            continue
        for name in variants[case.gpu]:
            fast = pricer(replace(case, gpu=name))
            if fast is None:
                continue
            t0, t1 = slow[1].iteration_time_s, fast[1].iteration_time_s
            report.check(
                "faster GPU (peak / HBM / links) never slower",
                _le(t1, t0),
                f"{case.label()} on {name}: {t0:.5f} -> {t1:.5f} s",
            )


def bubble_formulas(pricer: Pricer, cases: Sequence[Case], report: Report) -> None:
    """Balanced stages, free communication: the price's bubble fraction against the
    closed forms, through :func:`price` (simulation plus its linear extension)."""
    for case in cases:
        for schedule, chunks in (
            ("1f1b", None),
            ("gpipe", None),
            ("interleaved", 2),
            ("interleaved", 4),
        ):
            variant = case.with_(schedule=schedule, num_chunks=chunks, d=1)
            base = pricer(variant)
            if base is None:
                continue
            est, _ = base
            stages = len(est.costs.forward)
            f = sum(est.costs.forward) / stages
            b = sum(est.costs.backward) / stages
            w = sum(est.costs.weight) / stages
            costs = replace(
                est.costs,
                forward=(f,) * stages,
                backward=(b,) * stages,
                weight=(w,) * stages,
                work=(f + b + w,) * stages,
                p2p_s=0.0,
                transfer_s=0.0,
            )
            balanced = replace(
                est,
                costs=costs,
                busy_s=variant.m * (f + b + w) * stages / case.p,
                data_parallel_s=0.0,
                optimizer_s=0.0,
            )
            ctx = pricer.context(request_of(variant))
            got = price(ctx, balanced).bubble_fraction
            p, m = case.p, variant.m
            v = chunks or 1
            want = (p - 1) / (v * m + p - 1)
            report.check(
                "bubble fraction = (p-1)/(v m + p-1), balanced stages, free comm "
                "(1F1B, GPipe v=1; interleaved)",
                abs(got - want) <= 1e-6,
                f"{variant.label()} [{schedule} v={v}]: {got:.6f} != {want:.6f}",
            )


def korthikanti_layer_bytes(rng: random.Random, report: Report, n: int) -> None:
    """GPT layer (f = 4h, k = h), 16-bit, sequence parallelism, fused softmax: BPipe App. B
    Eq. 4 (none) sbh/t (34 + 5as/h) and Eq. 5 (selective) 34 sbh/t."""
    from planner.specs import ModelSpec, TrainingSpec

    for _ in range(n):
        a = rng.choice([16, 32, 40, 64, 96, 104, 120])
        h = a * rng.choice([64, 96, 128])
        s = rng.choice([512, 1024, 2048, 4096])
        t = rng.choice([x for x in (2, 4, 8) if a % x == 0])
        b = rng.choice([x for x in (1, 2, 4, 8) if (x * a // t) % 4 == 0] or [4])
        model = ModelSpec(
            name="k",
            num_layers=1,
            hidden_size=h,
            num_attention_heads=a,
            seq_length=s,
            vocab_size=51200,
        )
        training = TrainingSpec(
            global_batch_size=8, precision="bf16", sequence_parallel=True, flash_attention=False
        )
        sbh = s * b * h
        for mode, want in (("none", sbh / t * (34 + 5 * a * s / h)), ("selective", 34 * sbh / t)):
            got = activation_bytes_per_layer(model, training, b, t, mode)  # type: ignore[arg-type]
            report.check(
                "layer activation bytes = BPipe Eq. 4/5 (Korthikanti, SP, 16-bit)",
                abs(got - want) <= 1e-9 * want,
                f"h={h} a={a} s={s} b={b} t={t} {mode}: {got:.0f} != {want:.0f}",
            )


def vshape_memory(pricer: Pricer, report: Report) -> None:
    """V-Min and V-Half against 1F1B's activation memory on the same model, from the
    in-flight counts the cost model multiplies each stage's bytes by (a V stage holds half a
    1F1B stage's layers). The V-shape paper's Eq. 2 bounds a device's peak by
    (2p (d0 + d1) + O(1)) / 6 activations of a V stage, against 1F1B's 2p of them (p of a
    whole stage): ratio <= (d0 + d1) / 6 + c / (12 p), with d0 + d1 = 2 (V-Min, 1/3) or 3
    (V-Half, 1/2) (Table 1). The paper does not state the O(1) term c; 16 V-stage
    activations is allowed here (its Appendix F offsets change with p mod 3 and p mod 2)."""
    model = {
        "num_layers": 128,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "seq_length": 2048,
        "vocab_size": 51200,
    }
    training = {
        "precision": "bf16",
        "sequence_parallel": True,
        "flash_attention": True,
        "distributed_optimizer": True,
    }
    for name, share in (("v-min", 1 / 3), ("v-half", 1 / 2)):
        for p in (4, 6, 8, 9, 10, 12, 16, 24, 32, 48, 64):
            for m in (2 * p, 4 * p):
                ratio = _vratio(pricer, model, training, name, p, m)
                if ratio is None:
                    continue
                bound = share + 16 / (12 * p)
                report.check(
                    f"{name} activation memory ~ {share:.2f} of 1F1B's (V-shape Eq. 2)",
                    ratio <= bound + 1e-9,
                    f"p={p} m={m}: ratio {ratio:.3f} > {bound:.3f}",
                )
        at64 = _vratio(pricer, model, training, name, 64, 256)
        print(f"({name} / 1F1B activation ratio at p = 64: {at64:.4f}; paper: {share:.4f})")


def _stages(schedule: str, p: int) -> tuple[tuple[int, ...], ...]:
    from planner.costmodel.evaluate import stages_by_device

    return stages_by_device(schedule, p)


def _vratio(
    pricer: Pricer, model: dict[str, Any], training: dict[str, Any], name: str, p: int, m: int
) -> float | None:
    """Peak stage activations of the busiest device, in units of one 1F1B stage's
    micro-batch, V schedule over 1F1B; from the in-flight counts the cost model multiplies
    the bytes by (a V stage holds half a 1F1B stage's layers)."""
    out = []
    for sched in ("1f1b", name):
        case = Case(
            tuple(sorted(model.items())),
            tuple(sorted(training.items())),
            "a100-sxm-80g",
            1,
            p,
            1,
            1,
            m,
            "none",
            sched,
        )
        got = pricer(case)
        if got is None:
            return None
        est = got[0]
        per_stage_share = 1.0 if sched == "1f1b" else 0.5
        out.append(
            max(
                dev.in_flight * len(st)
                for dev, st in zip(est.memory, _stages(sched, p), strict=True)
            )
            * per_stage_share
        )
    return out[1] / out[0]


def plans(rng: random.Random, report: Report, n: int) -> None:
    """Whole plans: sorted by step time, every candidate within the usable memory, the same
    request twice the same answer."""
    store = default_store()
    requests = [
        json.loads(Path(f).read_text())
        for f in sorted(glob.glob(str(ROOT / "examples" / "*.json")))
    ]
    requests = [
        r for r in requests if r["cluster"]["num_nodes"] * r["cluster"]["gpus_per_node"] <= 1024
    ]
    for _ in range(n):
        model = random_model(rng)
        model["num_layers"] = rng.randint(8, 48)
        requests.append(
            {
                "model": {"name": "meta", **model},
                "cluster": {
                    "gpu": rng.choice(["a100-sxm-80g", "h100-sxm-80g", "a100-40g"]),
                    "num_nodes": rng.choice([1, 2, 4]),
                    "gpus_per_node": 8,
                },
                "training": {
                    **random_training(rng),
                    "global_batch_size": rng.choice([32, 64, 128]),
                },
                "search": {"allow_stale_weights": rng.random() < 0.5, "top_k": 10},
            }
        )
    for data in requests:
        try:
            request = PlanRequest.model_validate(data)
            first = plan(request, store)
            second = plan(PlanRequest.model_validate(data), store)
        except (ValidationError, StagewrightError):
            continue
        usable = store.hardware(request.cluster.gpu).usable_memory_gib
        # Ties to the nanosecond are broken by semantics, then memory (plan._rank_key).
        times = [round(c.predicted.iteration_time_s, 9) for c in first.candidates]
        label = f"{data['model'].get('name')} on {request.cluster.num_gpus} {request.cluster.gpu}"
        report.check(
            "plan: candidates sorted by predicted step time",
            all(a <= b for a, b in zip(times, times[1:], strict=False)),
            f"{label}: {times}",
        )
        for c in first.candidates:
            report.check(
                "plan: every candidate's peak memory within the usable memory",
                c.predicted.peak_memory_gib <= usable + 1e-9,
                f"{label}: {c.config.schedule} t{c.config.t} p{c.config.p} "
                f"{c.predicted.peak_memory_gib:.2f} > {usable} GiB",
            )
        a, b = _comparable(first), _comparable(second)
        cpsat = request.search.method == "cpsat"
        report.check(
            "plan (cpsat): the same request gives the same answer"
            if cpsat
            else "plan (grid): the same request gives the same answer",
            a == b,
            f"{label}: the two plans differ ({_first_difference(a, b)})",
        )


def wider_searches(rng: random.Random, report: Report, n: int) -> None:
    """A plan's best is the exactly simulated best of everything it searched (plan.py), so
    searching more (schedules, recompute modes) or on a GPU with more usable memory never
    makes the best slower."""
    store = default_store()
    roomy = JsonProfileStore.load()
    for name in ("a100-sxm-80g", "h100-sxm-80g", "a100-40g"):
        hw = roomy.hardware(name)
        roomy.add_hardware(
            replace(
                hw, memory_gib=hw.memory_gib * 1.25, usable_memory_gib=hw.usable_memory_gib * 1.25
            )
        )
    synchronous = [n_ for n_ in FIXED if n_ != "2bw"] + ["v-adaptive", "zb-adaptive"]
    for _ in range(n):
        model = random_model(rng)
        model["num_layers"] = rng.randint(8, 48)
        schedules = rng.sample(synchronous, rng.randint(1, 4))
        modes = rng.sample(["none", "selective", "full"], rng.randint(1, 2))
        data = {
            "model": {"name": "meta", **model},
            "cluster": {
                "gpu": rng.choice(["a100-sxm-80g", "h100-sxm-80g", "a100-40g"]),
                "num_nodes": rng.choice([1, 2]),
                "gpus_per_node": 8,
            },
            "training": {**random_training(rng), "global_batch_size": rng.choice([32, 64])},
            "search": {"schedules": schedules, "recompute": modes, "top_k": 3},
        }
        more = [x for x in synchronous if x not in schedules]
        wider = [
            (
                "more schedules",
                {
                    **data,
                    "search": {**data["search"], "schedules": schedules + rng.sample(more, 1)},
                },
                store,
            ),
            (
                "more recompute modes",
                {**data, "search": {**data["search"], "recompute": ["none", "selective", "full"]}},
                store,
            ),
            ("more usable memory", data, roomy),
        ]
        try:
            base = plan(PlanRequest.model_validate(data), store).best
        except (ValidationError, StagewrightError):
            continue
        for what, other, other_store in wider:
            try:
                best = plan(PlanRequest.model_validate(other), other_store).best
            except (ValidationError, StagewrightError):
                continue
            t0 = math.inf if base is None else base.predicted.iteration_time_s
            t1 = math.inf if best is None else best.predicted.iteration_time_s
            transfers = any(
                schedule_family(x).memory_fallback_for for x in other["search"]["schedules"]
            )
            report.check(
                f"plan: {what} never gives a slower best"
                + (
                    " (BPipe only where 1F1B runs out of memory)"
                    if transfers and what == "more schedules"
                    else ""
                ),
                _le(t1, t0),
                (
                    f"{model['num_layers']} layers h={model['hidden_size']} "
                    f"{data['search']} -> {what} {other['search']}: {t0:.4f} -> {t1:.4f} s "
                    f"({base and base.config.schedule} -> {best and best.config.schedule})"
                ),
            )


def _comparable(answer: Any) -> Any:
    """A plan's JSON without what measures the machine rather than the answer (its id, wall
    times of the search and of CP-SAT's solves)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("solve_s", "search_ms")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(answer.model_dump(mode="json", exclude={"id", "stats"}))


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a:
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{path}.{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {str(a)[:80]} vs {str(b)[:80]}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--plans", type=int, default=12)
    parser.add_argument("--show", type=int, default=8)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    report = Report()
    pricer = Pricer(default_store())
    cases = [random_case(rng) for _ in range(args.cases)]
    for case in cases:
        check_case(case, pricer, report)
    faster_gpu(rng, cases[: args.cases // 2], report)
    bubble_formulas(pricer, cases, report)
    korthikanti_layer_bytes(rng, report, 200)
    vshape_memory(pricer, report)
    plans(rng, report, args.plans)
    wider_searches(rng, report, args.plans * 2)
    bad, known = report.print(args.show)
    skipped = sum(pricer.skipped.values())
    print(
        f"\n{len(report.order)} properties, {sum(report.counts.values())} checks, "
        f"{bad} violations ({known} of them known exceptions); {args.cases} generated "
        f"configurations ({skipped} variants refused by validation); "
        f"{time.perf_counter() - started:.1f} s"
    )
    return 1 if bad > known else 0


if __name__ == "__main__":
    sys.exit(main())
