"""One rank of the torch.distributed.pipelining side of ``benchmarks/executor_vs_torch.py``.

Launched by that benchmark (not meant to be run by hand) as

    python -m torch.distributed.run --nproc-per-node=N --master-addr=127.0.0.1 \\
        --master-port=PORT benchmarks/_pipelining_worker.py CONFIG.json --steps S --out DIR \\
        [--count-memory]

It reads the same stagewright executor config as ``executor.worker`` and runs it the way
``executor.torch_pipelining`` does (the executor's stages, weights, batches and dropout
masks; torch's Schedule1F1B for config schedule ``1f1b``, ScheduleInterleaved1F1B for
``interleaved`` or ScheduleZBVZeroBubble for ``v-zb``; the config's optimizer after each
step), measuring what the benchmark compares. It writes
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
from torch import Tensor  # noqa: E402
from torch.distributed.pipelining import (  # noqa: E402
    Schedule1F1B,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)

from executor.inputs import read_config  # noqa: E402
from executor.optimizer import make_optimizer  # noqa: E402
from executor.torch_pipelining import build, check_config, run_step  # noqa: E402


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
    check_config(config, int(os.environ.get("WORLD_SIZE", "1")))
    dist.init_process_group("gloo")
    busy = Busy()
    if config.ir.name not in TORCH_SCHEDULES:
        raise SystemExit(f"no torch counterpart for schedule {config.ir.name!r}")
    sched, bodies, at_step = build(config, rank, TORCH_SCHEDULES[config.ir.name], busy.wrap)
    stage_ids = config.ir.stages_of(rank)
    params = [p for body in bodies for p in body.parameters()]
    optimizer = make_optimizer(config, params)  # stagewright's STEP: the config's optimizer
    counter = SavedCounter({p.untyped_storage().data_ptr() for p in params})
    steps = []
    for step in range(args.steps):
        at_step(step)
        busy.seconds = 0.0
        busy.by_kind = {}
        counter.reset_peak()
        start_level = counter.level
        started = time.perf_counter()
        cpu_started = time.process_time()
        if args.count_memory:
            with counter.hooks():
                losses = run_step(sched, config, rank, step)
        else:
            losses = run_step(sched, config, rank, step)
        began = time.perf_counter()
        optimizer.step()
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
                "losses": [float(x.detach()) for x in losses],
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"rank": rank, "stages": list(stage_ids), "steps": steps}
    (args.out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
