"""One rank of the torch.distributed.pipelining side of ``benchmarks/executor_vs_torch.py``.

Launched by that benchmark (not meant to be run by hand) as

    python -m torch.distributed.run --nproc-per-node=N --master-addr=127.0.0.1 \\
        --master-port=PORT benchmarks/_pipelining_worker.py CONFIG.json --steps S --out DIR \\
        [--count-memory]

It reads the same stagewright executor config as ``executor.worker`` (model, stage -> layers,
stage -> rank, micro-batches, seed, learning rate), builds the same stages with the same full
weights from ``executor.model`` (the benchmark's configs have no dropout, so the stages need
no per-micro-batch dropout key), and runs torch's Schedule1F1B (config schedule ``1f1b``),
ScheduleInterleaved1F1B (``interleaved``) or ScheduleZBVZeroBubble (``v-zb``) on the same
batches (``executor.data.global_batch``), followed by the same update stagewright's STEP
applies (torch.optim SGD with the config's momentum). It writes
DIR/rank{r}.json with per-step ``wall_s``, ``busy_s`` (time inside stage forward / backward /
weight-backward, the loss and the gradient scaling), ``cpu_s`` (process CPU time), the losses,
and with ``--count-memory`` ``peak_activation_bytes``: the peak of unique non-parameter
storages saved for backward and still alive, counted with saved-tensor hooks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.distributed.pipelining import (  # noqa: E402
    PipelineStage,
    Schedule1F1B,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)

from executor.data import global_batch  # noqa: E402
from executor.dropout import DropoutKey  # noqa: E402
from executor.inputs import read_config  # noqa: E402
from executor.model import GPTShape, Stage, build_stage, init_full_weights, model_options  # noqa: E402
from planner.launch import ExecutorConfig  # noqa: E402

_NO_DROPOUT = DropoutKey(0, 0, 0)  # the benchmark's configs have dropout 0: the key is unused


class Body(nn.Module):
    """One of our stages without the loss, for torch's PipelineStage (it calls the module
    with the activation only); it reuses the Stage's parameters."""

    def __init__(self, stage: Stage) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x: Tensor) -> Tensor:
        s = self.stage
        if s.has_embedding:
            tokens = x.t()
            x = F.embedding(tokens, s.tok) + s.pos[: tokens.shape[0]].unsqueeze(1)
        for block in s.blocks:
            x = block(x, _NO_DROPOUT)
        if not s.has_head:
            return x
        normed = F.layer_norm(x, (s.shape.hidden_size,), s.ln_f_w, s.ln_f_b)
        return F.linear(normed, s.out_w)


class _Holder:
    """What the pack hook returns for a saved activation; its death means autograd let go."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor


class SavedCounter:
    """Bytes of unique non-parameter storages saved for backward and still alive."""

    def __init__(self, parameter_ptrs: set[int]) -> None:
        self.parameter_ptrs = parameter_ptrs
        self.alive: dict[int, list[int]] = {}  # storage ptr -> [holders alive, bytes]
        self.level = 0
        self.peak = 0

    def reset_peak(self) -> None:
        self.peak = self.level

    def pack(self, t: Tensor) -> Any:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.parameter_ptrs or storage.nbytes() == 0:
            return t
        entry = self.alive.get(ptr)
        if entry is None:
            entry = self.alive[ptr] = [0, storage.nbytes()]
            self.level += entry[1]
            self.peak = max(self.peak, self.level)
        entry[0] += 1
        # Detached: the holder must not reference t's grad_fn. A tensor saved by the node
        # that produced it would otherwise form a cycle (node -> holder -> tensor -> node)
        # that keeps the node alive for good once a retained graph is not walked again.
        holder = _Holder(t.detach())
        weakref.finalize(holder, self._drop, ptr)
        return holder

    @staticmethod
    def unpack(handle: Any) -> Tensor:
        return handle.tensor if isinstance(handle, _Holder) else handle  # type: ignore[no-any-return]

    def _drop(self, ptr: int) -> None:
        entry = self.alive[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.level -= entry[1]
            del self.alive[ptr]

    def hooks(self) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class Busy:
    """Sums the time spent inside wrapped compute calls."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.by_kind: dict[str, float] = {}

    def wrap(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - began
                self.seconds += spent
                self.by_kind[kind] = self.by_kind.get(kind, 0.0) + spent

        return timed


TORCH_SCHEDULES = {
    "1f1b": Schedule1F1B,
    "interleaved": ScheduleInterleaved1F1B,
    "v-zb": ScheduleZBVZeroBubble,
}


def build(config: ExecutorConfig, rank: int, busy: Busy) -> tuple[Any, list[nn.Module]]:
    schedule_ir = config.ir
    n = schedule_ir.num_stages
    mine = schedule_ir.stages_of(rank)
    if schedule_ir.name not in TORCH_SCHEDULES:
        raise SystemExit(f"no torch counterpart for schedule {schedule_ir.name!r}")
    if config.dropout:
        raise SystemExit("the torch side runs without dropout: give a config with dropout 0")
    shape = GPTShape.of(config.model)
    full = init_full_weights(shape, config.seed)
    options = model_options(config)
    device = torch.device("cpu")
    modules: list[nn.Module] = []
    stages = []
    for s in mine:
        spec = config.stages[s]
        stage = build_stage(
            shape,
            full,
            spec.first_layer,
            spec.end_layer,
            embed=s == 0,
            head=s == n - 1,
            options=options,
            recompute=spec.layer_modes(),
        )
        module: nn.Module = Body(stage)
        modules.append(module)
        pipe = PipelineStage(module, s, n, device)
        pipe.forward_one_chunk = busy.wrap("F", pipe.forward_one_chunk)  # type: ignore[method-assign]
        pipe.backward_one_chunk = busy.wrap("B", pipe.backward_one_chunk)  # type: ignore[method-assign]
        pipe.backward_weight_one_chunk = busy.wrap(  # type: ignore[method-assign]
            "W", pipe.backward_weight_one_chunk
        )
        pipe.scale_grads = busy.wrap("scale", pipe.scale_grads)  # type: ignore[method-assign]
        stages.append(pipe)
    vocab = config.model.vocab_size

    def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
        # The mean cross-entropy of the micro-batch, as our last Stage returns it (logits
        # are (sequence, batch, vocabulary), targets (batch, sequence)); scale_grads=True
        # divides the gradients by m, as stagewright's loss / m does.
        return F.cross_entropy(logits.float().reshape(-1, vocab), target.t().reshape(-1))

    m = config.num_microbatches
    timed_loss = busy.wrap("loss", loss_fn)
    kind = TORCH_SCHEDULES[schedule_ir.name]
    chosen = stages[0] if kind is Schedule1F1B else stages
    sched: Any = kind(chosen, m, loss_fn=timed_loss, scale_grads=True)
    return sched, modules


def main() -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/_pipelining_worker.py")
    parser.add_argument("config", type=Path)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count-memory", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    config = read_config(args.config)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    if world != config.parallel.p or config.parallel.t != 1 or config.parallel.d != 1:
        raise SystemExit(f"needs t = d = 1 and p = {world} ranks")
    busy = Busy()
    sched, modules = build(config, rank, busy)
    n = config.ir.num_stages
    stage_ids = config.ir.stages_of(rank)
    has_first, has_last = 0 in stage_ids, n - 1 in stage_ids
    params = [p for module in modules for p in module.parameters()]
    optimizer = torch.optim.SGD(
        params, lr=config.optimizer.lr, momentum=config.optimizer.sgd_momentum, foreach=False
    )
    counter = SavedCounter({p.untyped_storage().data_ptr() for p in params})
    steps = []
    for step in range(args.steps):
        inputs, targets = global_batch(config, step)
        call_args = (inputs,) if has_first else ()
        losses: list[Tensor] = []
        call_kwargs: dict[str, Any] = {"return_outputs": False}
        if has_last:
            call_kwargs |= {"target": targets, "losses": losses}
        busy.seconds = 0.0
        busy.by_kind = {}
        counter.reset_peak()
        start_level = counter.level
        started = time.perf_counter()
        cpu_started = time.process_time()
        if args.count_memory:
            with counter.hooks():
                sched.step(*call_args, **call_kwargs)
        else:
            sched.step(*call_args, **call_kwargs)
        began = time.perf_counter()
        optimizer.step()  # stagewright's STEP: the config's optimizer (SGD with momentum)
        optimizer.zero_grad(set_to_none=True)
        busy.seconds += time.perf_counter() - began
        busy.by_kind["step"] = time.perf_counter() - began
        steps.append(
            {
                "step": step,
                "wall_s": time.perf_counter() - started,
                "cpu_s": time.process_time() - cpu_started,
                "busy_s": busy.seconds,
                "busy_by_kind": dict(busy.by_kind),
                "peak_activation_bytes": counter.peak if args.count_memory else None,
                "start_activation_bytes": start_level if args.count_memory else None,
                "losses": [float(x) for x in losses],
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"rank": rank, "stages": list(stage_ids), "steps": steps}
    (args.out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
