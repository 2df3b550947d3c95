"""Measure one layer on the local device: F, B and W times and saved-activation bytes.

``stagewright profile`` times one transformer layer of the given shape (this rank's shard of
it for tensor parallelism t: heads / t heads and ffn / t MLP columns, without the
collectives, which the planner prices from the links) at a micro-batch size, plus the bytes
the embedding saves on the first stage and the head and loss on the last, and stores the
point where the planner reads profiles. Times are medians of several runs after warm-up.

On CPU a rank runs one thread on a core of its own (torchrun starts each rank with
``OMP_NUM_THREADS=1``), so the layer is timed the same way: with one thread, and in CPU
seconds of that thread, which is the time the pass takes on a core of its own even while other
processes share the machine (wall time there would count their turns too, and a second
thread spinning on a busy core inflated a 0.1 ms pass to 250 ms).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import Tensor

from executor.dropout import DropoutKey
from executor.model import (
    COMPUTE_DTYPE,
    GPTShape,
    ModelOptions,
    Stage,
    build_stage,
    init_full_weights,
)
from executor.split_backward import backward_input, backward_weight
from executor.tensor_parallel import TensorParallel
from planner.costmodel.layer_ops import fused_softmax_available
from planner.profiles import LayerPoint
from planner.specs import ModelSpec, Precision, Recompute, TrainingSpec

__all__ = ["PROFILED_HARDWARE", "device_problem", "profile_layer", "saved_bytes"]

PROFILED_HARDWARE = "cpu"
"""The hardware profile of the device this profiler times on: the CPU, one thread (the
name ``stagewright run --record`` files a CPU run under too)."""


def device_problem(gpu: str) -> str | None:
    """Why a point timed here must not be filed under the hardware profile ``gpu``, or None.
    The layer is timed on this machine's CPU, whatever GPU it has: filed under a GPU's
    profile, CPU times would re-rank that GPU's plans."""
    if gpu == PROFILED_HARDWARE:
        return None
    if torch.cuda.is_available():
        here = (
            f"this profiler times the layer on the CPU (one thread), not on this machine's "
            f"GPU ({torch.cuda.get_device_name(0)})"
        )
    else:
        here = "there is no GPU here: the layer would be timed on the CPU (one thread)"
    return (
        f"--gpu {gpu}: {here}, and filed under {gpu} those CPU times would re-rank its plans; "
        f"profile with --gpu {PROFILED_HARDWARE}, or store a GPU's measured runs with "
        "stagewright measurements add"
    )


def saved_bytes(run: Callable[[], Any], parameters: Sequence[Tensor]) -> tuple[int, Any]:
    """Run ``run`` under saved-tensor hooks; bytes of the unique non-parameter storages it
    saves for backward (what the executor's ledger counts), and its result."""
    params = {p.untyped_storage().data_ptr() for p in parameters}
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = run()
    return sum(storages.values()), result


def _stage(
    shape: GPTShape,
    full: dict[str, Tensor],
    layers: int,
    *,
    embed: bool,
    head: bool,
    t: int,
    options: ModelOptions,
    recompute: Recompute = "none",
) -> Stage:
    return build_stage(
        shape,
        full,
        0,
        layers,
        embed=embed,
        head=head,
        tp=TensorParallel(t, 0, None),
        options=options,
        recompute=[recompute] * layers,
    )


def profile_layer(
    model: ModelSpec,
    micro_batch: int,
    t: int = 1,
    *,
    gpu: str = "cpu",
    repeats: int = 5,
    warmup: int = 2,
    precision: Precision = "fp32",
    recompute: Recompute = "none",
    dropout: float = 0.1,
) -> LayerPoint:
    """Time F, B (the input gradient, as the executor's split runs it) and W (the rest of one
    fused backward, so that B + W is the backward of a schedule without the split) of one
    layer and count its saved bytes, and the first/last stage extras, in ``precision`` with
    ``recompute`` on the local device (the executor's model, dropout included)."""
    with _one_thread():
        return _profile(model, micro_batch, t, gpu, repeats, warmup, precision, recompute, dropout)


@contextmanager
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _weight_s(whole: list[float], backward: list[float], split_weight: list[float]) -> float:
    """W as the rest of a fused backward; for a layer so small that timing noise leaves no
    rest, the split's own W."""
    rest = statistics.median(whole) - statistics.median(backward)
    return rest if rest > 0 else statistics.median(split_weight)


def _profile(
    model: ModelSpec,
    micro_batch: int,
    t: int,
    gpu: str,
    repeats: int,
    warmup: int,
    precision: Precision,
    recompute: Recompute,
    dropout: float,
) -> LayerPoint:
    torch.manual_seed(0)
    shape = GPTShape.of(model)
    one = GPTShape(
        shape.vocab_size,
        shape.seq_length,
        shape.hidden_size,
        shape.num_heads,
        shape.ffn_hidden_size,
        1,
    )
    full = init_full_weights(one)
    dtype = COMPUTE_DTYPE[precision]
    # The executor's softmax choice for this shape (see executor.model.model_options).
    training = TrainingSpec(global_batch_size=micro_batch, precision=precision)
    fused = fused_softmax_available(model, training, micro_batch, t)
    options = ModelOptions(dtype, dropout, softmax_in_fp32=precision != "fp32" and not fused)
    layer = _stage(one, full, 1, embed=False, head=False, t=t, options=options, recompute=recompute)
    params = list(layer.parameters())
    size = (shape.seq_length, micro_batch, shape.hidden_size)
    key = DropoutKey(0, 0, 0)
    forward: list[float] = []
    backward: list[float] = []
    whole: list[float] = []  # one fused backward
    split_weight: list[float] = []
    layer_bytes = 0
    for i in range(warmup + repeats):
        x = torch.randn(size, dtype=dtype, requires_grad=True)
        grad = torch.randn(size, dtype=dtype)
        started = time.thread_time()
        layer_bytes, out = saved_bytes(partial(layer, x, key), [*params, *layer.buffers()])
        mid = time.thread_time()
        # B as the executor's split runs it (executor.split_backward: the input gradient,
        # recording what W needs), then W as the rest of one fused backward, so that B + W
        # is what a schedule without the split runs. (Timing W as a second walk of the
        # whole graph for the weights, as this did before, priced it at a whole backward:
        # a step came out about 1.4x what the run measured.)
        _, pending = backward_input(out, grad, x, list(params))
        after_b = time.thread_time()
        backward_weight(pending)
        after_w = time.thread_time()
        out = layer(x, key)
        before_fused = time.thread_time()
        torch.autograd.backward(out, grad, inputs=[x, *params])
        done = time.thread_time()
        for p in params:
            p.grad = None
        if i >= warmup:
            forward.append(mid - started)
            backward.append(after_b - mid)
            whole.append(done - before_fused)
            split_weight.append(after_w - after_b)
    embed = _stage(one, full, 0, embed=True, head=False, t=t, options=options)
    tokens = torch.randint(0, shape.vocab_size, (micro_batch, shape.seq_length))
    first_extra, _ = saved_bytes(lambda: embed(tokens, key), list(embed.parameters()))
    head = _stage(one, full, 0, embed=False, head=True, t=t, options=options)
    hidden = torch.randn(size, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, shape.vocab_size, (micro_batch, shape.seq_length))
    last_extra, _ = saved_bytes(lambda: head(hidden, key, targets), list(head.parameters()))
    return LayerPoint(
        gpu=gpu,
        precision=precision,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_heads,
        ffn_hidden_size=shape.ffn_hidden_size,
        seq_length=shape.seq_length,
        micro_batch_size=micro_batch,
        t=t,
        recompute=recompute,
        sequence_parallel=False,
        flash_attention=False,
        forward_ms=statistics.median(forward) * 1e3,
        backward_ms=statistics.median(backward) * 1e3,
        weight_ms=_weight_s(whole, backward, split_weight) * 1e3,
        activation_bytes=float(layer_bytes),
        includes_tp_comm=t == 1,
        source=f"stagewright profile on {gpu} (median of {repeats}, one thread, CPU time, "
        f"torch {torch.__version__})",
        first_stage_extra_bytes=float(first_extra),
        last_stage_extra_bytes=float(last_extra),
    )
