"""One rank of the torch.distributed.pipelining side of ``benchmarks/executor_vs_torch.py``.

Launched by that benchmark (not meant to be run by hand) as

    python -m torch.distributed.run --nproc-per-node=N --master-addr=127.0.0.1 \\
        --master-port=PORT benchmarks/_pipelining_worker.py CONFIG.json --steps S --out DIR \\
        [--count-memory]

It reads the same stagewright executor config as ``executor.worker`` (model, stage -> layers,
stage -> rank, micro-batches, seed, learning rate), builds the same stages with the same full
weights from ``executor.model``, and runs torch's Schedule1F1B (config schedule ``1f1b``) or
ScheduleZBVZeroBubble (config schedule ``v-zb``) on the same batches (``executor.runtime.
batch_for``), followed by the same plain SGD update stagewright's STEP applies. It writes
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
from executor.runtime import ExecConfig, batch_for, load_config  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.distributed.pipelining import (  # noqa: E402
    PipelineStage,
    Schedule1F1B,
    ScheduleZBVZeroBubble,
)

from executor.model import Stage, build_stage, init_full_weights  # noqa: E402


class LastStage(nn.Module):
    """Our last Stage up to the logits (torch's schedule applies the loss itself); it reuses
    the Stage's parameters, it does not copy them."""

    def __init__(self, stage: Stage) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x: Tensor) -> Tensor:
        s = self.stage
        if s.has_embedding:
            x = F.embedding(x, s.tok) + s.pos[: x.shape[1]]
        for block in s.blocks:
            x = block(x)
        return F.linear(s.ln_f(x), s.out_w)


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


def build(config: ExecConfig, rank: int, busy: Busy) -> tuple[Any, list[nn.Module]]:
    schedule_ir = config.schedule
    world = dist.get_world_size()
    n = schedule_ir.num_stages
    mine = schedule_ir.stages_of(rank)
    if schedule_ir.name == "1f1b":
        assert n == world and mine == (rank,), "1F1B: one stage per rank"
    elif schedule_ir.name == "v-zb":
        assert n == 2 * world and mine == (rank, 2 * world - 1 - rank), "ZBV: V placement"
    else:
        raise SystemExit(f"no torch counterpart for schedule {schedule_ir.name!r}")
    full = init_full_weights(config.shape, config.seed)
    device = torch.device("cpu")
    modules: list[nn.Module] = []
    stages = []
    for s in mine:
        first, end = config.stage_layers[s]
        stage = build_stage(config.shape, full, first, end, embed=s == 0, head=s == n - 1)
        module: nn.Module = LastStage(stage) if s == n - 1 else stage
        modules.append(module)
        pipe = PipelineStage(module, s, n, device)
        pipe.forward_one_chunk = busy.wrap("F", pipe.forward_one_chunk)  # type: ignore[method-assign]
        pipe.backward_one_chunk = busy.wrap("B", pipe.backward_one_chunk)  # type: ignore[method-assign]
        pipe.backward_weight_one_chunk = busy.wrap(  # type: ignore[method-assign]
            "W", pipe.backward_weight_one_chunk
        )
        pipe.scale_grads = busy.wrap("scale", pipe.scale_grads)  # type: ignore[method-assign]
        stages.append(pipe)
    vocab = config.shape.vocab_size

    def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
        # The mean cross-entropy of the micro-batch, as our last Stage returns it;
        # scale_grads=True divides the gradients by m, as stagewright's loss / m does.
        return F.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))

    m = config.num_microbatches
    timed_loss = busy.wrap("loss", loss_fn)
    if schedule_ir.name == "1f1b":
        sched: Any = Schedule1F1B(stages[0], m, loss_fn=timed_loss, scale_grads=True)
    else:
        sched = ScheduleZBVZeroBubble(stages, m, loss_fn=timed_loss, scale_grads=True)
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
    config = load_config(json.loads(args.config.read_text()))
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    if world != config.p or config.t != 1 or config.d != 1:
        raise SystemExit(f"needs t = d = 1 and p = {world} ranks")
    busy = Busy()
    sched, modules = build(config, rank, busy)
    n = config.schedule.num_stages
    stage_ids = config.schedule.stages_of(rank)
    has_first, has_last = 0 in stage_ids, n - 1 in stage_ids
    params = [p for module in modules for p in module.parameters()]
    counter = SavedCounter({p.untyped_storage().data_ptr() for p in params})
    steps = []
    for step in range(args.steps):
        inputs, targets = batch_for(config, step)
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
        with torch.no_grad():  # stagewright's STEP: plain SGD, w -= lr * grad
            for p in params:
                if p.grad is not None:
                    p -= config.lr * p.grad
                p.grad = None
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
