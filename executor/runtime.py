"""The runtime: one rank interprets its list of the schedule IR on torch.distributed.

It never re-derives a schedule: it runs the exact action list of the executor config (with
SEND/RECV made explicit by the planner's own IR pass) in order.

- F runs the stage forward under saved-tensor hooks that keep this micro-batch's saved
  activations in a ledger (so they can be counted, evicted and loaded); the last stage's
  forward is the loss, scaled by 1/m so that gradients accumulate to the batch mean.
- BW is one backward. B computes only the input gradient (``autograd.grad`` with the graph
  kept) and W only the weight gradients (``autograd.backward(inputs=parameters)``), which
  frees what B kept.
- SEND/RECV are asynchronous isend/irecv between the ranks holding neighbouring stages,
  with one tag per (kind, stage, micro-batch).
- EVICT/LOAD (BPipe) move a micro-batch's saved activations to the pair rank and back as one
  flat buffer, asynchronously: the copy overlaps the next compute action and is waited for
  before the one after it (or before the backward that needs it), as the IR says.
- STEP averages gradients over the data-parallel group (ZeRO-1: each rank updates its shard of
  the flat parameters and all-gathers them) and steps the optimizer. With 2BW a STEP produces
  a new weight version from the batch's coalesced gradient applied to the newest weights
  (W(t+1) = W(t) - lr * grad(W(t-1))); VERSION switches the weights later forwards use, while
  every micro-batch's backward uses the version its forward used (its autograd graph holds
  those tensors).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.func import functional_call

from executor.model import GPTShape, Stage, TensorParallel, build_stage, init_full_weights
from executor.split_backward import Pending, backward_input, backward_weight
from planner.launch import materialize_executor_config
from planner.schedules import Action, ActionKind, Schedule, validate, with_communication

__all__ = ["ExecConfig", "Runtime", "StepReport", "batch_for", "load_config"]

K = ActionKind
_TAG = {K.SEND_F: 0, K.RECV_F: 0, K.SEND_B: 1, K.RECV_B: 1, K.EVICT: 2, K.LOAD: 3}


@dataclass(frozen=True)
class ExecConfig:
    """The parts of an executor config (``planner.launch.executor_config``) a rank needs."""

    shape: GPTShape
    t: int
    p: int
    d: int
    micro_batch_size: int
    num_microbatches: int
    stage_layers: tuple[tuple[int, int], ...]
    coords: tuple[tuple[int, int, int], ...]  # rank -> (dp, pp, tp)
    schedule: Schedule
    optimizer: str
    distributed_optimizer: bool
    lr: float = 1e-3
    seed: int = 1234
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    notes: tuple[str, ...] = ()  # settings of the config this executor does not apply

    def rank_of(self, dp: int, pp: int, tp: int) -> int:
        return self.coords.index((dp, pp, tp))


def load_config(data: dict[str, Any]) -> ExecConfig:
    """Read and check an executor config; every problem is a ValueError saying what to fix.

    A config copied from a plan names its schedule by the generator's parameters and its
    placement by its rule; they are materialized first by the planner's own generator (the
    very IR the plan was priced with), never re-derived here."""
    try:
        data = materialize_executor_config(data)
        parallel = data["parallel"]
        t, p, d = int(parallel["t"]), int(parallel["p"]), int(parallel["d"])
        ranks = sorted(data["placement"]["ranks"], key=lambda r: r["rank"])
        coords = tuple((int(r["dp"]), int(r["pp"]), int(r["tp"])) for r in ranks)
        schedule = Schedule.from_dict(data["schedule"])
        shape = GPTShape.from_model_spec(data["model"])
        training = data.get("training", {})
        layers = tuple((int(a), int(b)) for a, b in data["stage_layers"])
        config = ExecConfig(
            shape=shape,
            t=t,
            p=p,
            d=d,
            micro_batch_size=int(data["micro_batch_size"]),
            num_microbatches=int(data["num_microbatches"]),
            stage_layers=layers,
            coords=coords,
            schedule=schedule,
            optimizer=str(training.get("optimizer", "adam")),
            distributed_optimizer=bool(training.get("distributed_optimizer", False)),
            lr=float(data.get("lr", 1e-3)),
            seed=int(data.get("seed", 1234)),
            raw=data,
            notes=_unapplied(data, t),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"executor config is missing or has a bad field: {exc}") from exc
    validate(schedule)
    if len(coords) != t * p * d or sorted(coords) != sorted(
        (a, b, c) for a in range(d) for b in range(p) for c in range(t)
    ):
        raise ValueError(f"placement must list every (dp, pp, tp) of t={t} p={p} d={d} once")
    if schedule.num_devices != p:
        raise ValueError(f"schedule has {schedule.num_devices} devices but p = {p}")
    if len(layers) != schedule.num_stages:
        raise ValueError(f"{len(layers)} stage layer ranges for {schedule.num_stages} stages")
    if schedule.num_microbatches != config.num_microbatches:
        raise ValueError("schedule and config disagree on the number of micro-batches")
    if shape.num_heads % t:
        raise ValueError(f"t = {t} does not divide the {shape.num_heads} attention heads")
    return config


def _unapplied(data: dict[str, Any], t: int) -> tuple[str, ...]:
    """Settings of an executor config this executor runs without (said, never ignored)."""
    notes = []
    if str(data.get("recompute", "none")) != "none":
        notes.append(
            f"recompute {data['recompute']!r} is not applied by this executor: it runs "
            f"without recomputation (saved activations are those of 'none')"
        )
    if data.get("training", {}).get("sequence_parallel") and t > 1:
        notes.append(
            "sequence_parallel is not applied by this executor: tensor parallelism runs without it"
        )
    return tuple(notes)


def batch_for(config: ExecConfig, step: int) -> tuple[Tensor, Tensor]:
    """The global batch of a step (all replicas, all micro-batches of every batch the
    schedule covers): deterministic tokens, so every rank and the reference agree."""
    batches = config.schedule.num_batches
    size = config.d * config.num_microbatches * config.micro_batch_size * batches
    gen = torch.Generator().manual_seed(config.seed * 7919 + step)
    tokens = torch.randint(
        0, config.shape.vocab_size, (size, config.shape.seq_length + 1), generator=gen
    )
    return tokens[:, :-1], tokens[:, 1:]


def microbatch_rows(config: ExecConfig, dp: int, mb: int) -> slice:
    """Rows of the global batch that data replica ``dp`` runs as micro-batch ``mb``
    (micro-batches numbered across the batches of a 2BW schedule)."""
    m, size = config.num_microbatches, config.micro_batch_size
    batch, local = divmod(mb, m)
    start = (batch * config.d + dp) * m * size + local * size
    return slice(start, start + size)


@dataclass
class StepReport:
    """What one rank measured in one step."""

    step: int
    wall_s: float
    busy_s: float
    peak_activation_bytes: int
    stage_microbatch_bytes: dict[int, int]
    bytes_sent: dict[int, int]
    losses: list[float]
    cpu_s: float


class _Ledger:
    """Saved activations per (stage, micro-batch), captured by saved-tensor hooks.

    Parameters are returned as they are (they are not activations); everything else is held
    here, so that the bytes alive can be counted (unique storages) and a micro-batch's
    tensors can be moved to another rank and back."""

    def __init__(self, parameter_ptrs: set[int]) -> None:
        self.parameter_ptrs = parameter_ptrs
        self.tensors: dict[tuple[int, int], list[Tensor | None]] = {}
        self.storages: dict[tuple[int, int], dict[int, int]] = {}
        self.level = 0
        self.peak = 0
        self.remote: dict[tuple[int, int], int] = {}  # bytes held for a pair rank

    def hooks(self, key: tuple[int, int]) -> Any:
        tensors = self.tensors.setdefault(key, [])
        storages = self.storages.setdefault(key, {})

        def pack(t: Tensor) -> Any:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in self.parameter_ptrs:
                return ("param", t)
            if ptr not in storages:
                storages[ptr] = storage.nbytes()
                self._add(storage.nbytes())
            tensors.append(t)
            return ("saved", key, len(tensors) - 1)

        def unpack(handle: Any) -> Tensor:
            if handle[0] == "param":
                return handle[1]  # type: ignore[no-any-return]
            _, owner, index = handle
            found = self.tensors[owner][index]
            assert found is not None, f"saved tensor {owner} used while evicted"
            return found

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def _add(self, nbytes: int) -> None:
        self.level += nbytes
        self.peak = max(self.peak, self.level)

    def bytes_of(self, key: tuple[int, int]) -> int:
        return sum(self.storages.get(key, {}).values())

    def release(self, key: tuple[int, int]) -> None:
        self.level -= self.bytes_of(key)
        self.tensors.pop(key, None)
        self.storages.pop(key, None)

    def flatten(self, key: tuple[int, int]) -> Tensor:
        return torch.cat(
            [t.detach().reshape(-1).float() for t in self.tensors[key] if t is not None]
        )

    def drop_local(self, key: tuple[int, int]) -> None:
        """After an EVICT's copy has left: the evictor no longer holds the data."""
        self.level -= self.bytes_of(key)
        self.tensors[key] = [None] * len(self.tensors[key])

    def layout(self, key: tuple[int, int]) -> list[tuple[torch.Size, torch.dtype]]:
        """Shape and dtype of each saved tensor of ``key``: what :meth:`restore` needs to
        rebuild them, without keeping the tensors (and their memory) alive."""
        return [(t.shape, t.dtype) for t in self.tensors[key] if t is not None]

    def restore(
        self, key: tuple[int, int], flat: Tensor, layout: list[tuple[torch.Size, torch.dtype]]
    ) -> None:
        out: list[Tensor | None] = []
        offset = 0
        for shape, dtype in layout:
            n = shape.numel()
            out.append(flat[offset : offset + n].view(shape).to(dtype))
            offset += n
        self.tensors[key] = out
        self._add(self.bytes_of(key))

    def hold_remote(self, key: tuple[int, int], nbytes: int) -> None:
        self.remote[key] = nbytes
        self._add(nbytes)

    def drop_remote(self, key: tuple[int, int]) -> None:
        self.level -= self.remote.pop(key, 0)


class Runtime:
    """One rank: its stages, its action list, and the state of a step."""

    def __init__(self, config: ExecConfig, rank: int, timeout_s: float = 60.0) -> None:
        self.config = config
        self.rank = rank
        self.dp, self.pp, self.tp_rank = config.coords[rank]
        self.timeout = timedelta(seconds=timeout_s)
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if (torch.cuda.is_available())
            else torch.device("cpu")
        )
        self.tp = self._groups()
        full = init_full_weights(config.shape, config.seed)
        schedule = config.schedule
        self.my_stages = schedule.stages_of(self.pp)
        self.stages: dict[int, Stage] = {}
        last = schedule.num_stages - 1
        for s in self.my_stages:
            first, end = config.stage_layers[s]
            self.stages[s] = build_stage(
                config.shape, full, first, end, embed=s == 0, head=s == last, tp=self.tp
            ).to(self.device)
        self.actions = with_communication(schedule).actions[self.pp]
        self.params = {s: dict(m.named_parameters()) for s, m in self.stages.items()}
        self.versions: dict[int, dict[int, dict[str, Tensor]]] = {
            s: {0: dict(ps)} for s, ps in self.params.items()
        }
        self.current_version = dict.fromkeys(self.stages, 0)
        self.optim_state: dict[int, dict[str, Any]] = {s: {} for s in self.stages}
        self.bytes_sent: dict[int, int] = defaultdict(int)
        self._stage_bytes: dict[int, int] = {}
        self.saved_numel: dict[int, int] = {}
        self.verify_grads: dict[int, dict[str, Tensor]] = {}
        self.keep_grads = False
        self.first_losses: list[float] = []
        self.pending: dict[tuple[int, int], Pending] = {}

    # ------------------------------------------------------------------ groups
    def _groups(self) -> TensorParallel:
        config = self.config
        tp_group = None
        self.dp_group = None
        for dp in range(config.d):
            for pp in range(config.p):
                ranks = [config.rank_of(dp, pp, tp) for tp in range(config.t)]
                group = dist.new_group(ranks, timeout=self.timeout) if config.t > 1 else None
                if self.rank in ranks:
                    tp_group = group
        for pp in range(config.p):
            for tp in range(config.t):
                ranks = [config.rank_of(dp, pp, tp) for dp in range(config.d)]
                group = dist.new_group(ranks, timeout=self.timeout) if config.d > 1 else None
                if self.rank in ranks:
                    self.dp_group = group
                    self.dp_ranks = ranks
        return TensorParallel(config.t, self.tp_rank, tp_group)

    def _tag(self, kind: ActionKind, stage: int, mb: int) -> int:
        return (mb * self.config.schedule.num_stages + stage) * 4 + _TAG[kind]

    # ------------------------------------------------------------------ one step
    def run_step(self, step: int) -> StepReport:
        """Run this rank's action list once. A 2BW schedule runs its batches without a flush;
        consecutive runs start from the newest weights (version 0 of the next run)."""
        config = self.config
        for s, versions in self.versions.items():
            if len(versions) > 1 or 0 not in versions:
                newest = versions[max(versions)]
                self.versions[s] = {0: newest}
            self.current_version[s] = 0
        inputs, targets = batch_for(config, step)
        shape = (config.micro_batch_size, config.shape.seq_length, config.shape.hidden_size)
        ptrs = {
            p.untyped_storage().data_ptr()
            for ver in self.versions.values()
            for params in ver.values()
            for p in params.values()
        }
        ledger = _Ledger(ptrs)
        outputs: dict[tuple[int, int], Tensor] = {}
        stage_in: dict[tuple[int, int], Tensor] = {}
        grad_in: dict[tuple[int, int], Tensor] = {}
        received: dict[tuple[ActionKind, int, int], tuple[Any, Tensor]] = {}
        sends: list[Any] = []
        copies: list[list[Any]] = []  # [compute actions to pass, work, on_done]
        evicted_like: dict[tuple[int, int], list[tuple[torch.Size, torch.dtype]]] = {}
        loads: dict[tuple[int, int], tuple[Any, Tensor]] = {}
        remote: dict[tuple[int, int], tuple[Any, Tensor]] = {}
        losses: list[float] = []
        busy = 0.0
        started = time.perf_counter()
        cpu_started = time.process_time()

        def settle_copies() -> None:
            keep = []
            for entry in copies:
                entry[0] -= 1
                if entry[0] <= 0:
                    entry[1].wait()
                    entry[2]()
                else:
                    keep.append(entry)
            copies[:] = keep

        for action in self.actions:
            kind, s, k = action.kind, action.stage, action.microbatch
            key = (s, k)
            if kind.is_compute:
                settle_copies()
                # Wait for this action's inputs before the clock starts: busy time is
                # compute, waiting for a peer is bubble.
                wanted = (K.RECV_F if kind is K.F else K.RECV_B, s, k)
                pending = received.get(wanted)
                if pending is not None and pending[0] is not None:
                    pending[0].wait()  # a gloo request must be waited for once only
                    received[wanted] = (None, pending[1])
                began = time.perf_counter()
                if kind is K.F:
                    self._forward(
                        action,
                        key,
                        inputs,
                        targets,
                        stage_in,
                        outputs,
                        received,
                        ledger,
                        losses,
                        shape,
                    )
                elif kind in (K.BW, K.B):
                    if key in loads:
                        work, flat = loads.pop(key)
                        work.wait()
                        ledger.restore(key, flat, evicted_like.pop(key))
                    self._backward(action, key, stage_in, outputs, grad_in, received, ledger)
                elif kind is K.W:
                    self._weight(key, outputs, ledger)
                else:
                    self._optimizer_step(action)
                busy += time.perf_counter() - began
            elif kind is K.SEND_F:
                dst = self._pair(action)
                sends.append(self._isend(outputs[key].detach(), dst, self._tag(kind, s + 1, k)))
            elif kind is K.SEND_B:
                dst = self._pair(action)
                sends.append(self._isend(grad_in.pop(key), dst, self._tag(kind, s - 1, k)))
            elif kind in (K.RECV_F, K.RECV_B):
                buf = torch.empty(shape, device=self.device)
                src = self._pair(action)
                received[(kind, s, k)] = (dist.irecv(buf, src, tag=self._tag(kind, s, k)), buf)
            elif kind is K.WEIGHT_VERSION:
                assert action.version is not None
                self.current_version[s] = action.version
            elif kind is K.EVICT:
                if config.schedule.stage_devices[s] == self.pp:
                    flat = ledger.flatten(key)
                    evicted_like[key] = ledger.layout(key)
                    work = self._isend(flat, self._pair(action), self._tag(kind, s, k))
                    copies.append([2, work, lambda key=key: ledger.drop_local(key)])
                else:
                    size = self.saved_numel[s]  # learnt at start-up (exchange_sizes)
                    buf = torch.empty(size, device=self.device)
                    remote[key] = (
                        dist.irecv(buf, self._pair(action), tag=self._tag(kind, s, k)),
                        buf,
                    )
                    ledger.hold_remote(key, size * 4)
            elif kind is K.LOAD:
                if config.schedule.stage_devices[s] == self.pp:
                    layout = evicted_like[key]
                    buf = torch.empty(sum(shape.numel() for shape, _ in layout), device=self.device)
                    loads[key] = (
                        dist.irecv(buf, self._pair(action), tag=self._tag(kind, s, k)),
                        buf,
                    )
                else:
                    work, buf = remote.pop(key)
                    work.wait()
                    back = self._isend(buf, self._pair(action), self._tag(kind, s, k))
                    copies.append([1, back, lambda key=key: ledger.drop_remote(key)])
        for work in sends:
            work.wait()
        for entry in copies:
            entry[1].wait()
            entry[2]()
        wall = time.perf_counter() - started
        return StepReport(
            step=step,
            wall_s=wall,
            busy_s=busy,
            peak_activation_bytes=ledger.peak,
            stage_microbatch_bytes=dict(self._stage_bytes),
            bytes_sent=dict(self.bytes_sent),
            losses=losses,
            cpu_s=time.process_time() - cpu_started,
        )

    # ------------------------------------------------------------------ actions
    def _forward(
        self,
        action: Action,
        key: tuple[int, int],
        inputs: Tensor,
        targets: Tensor,
        stage_in: dict[tuple[int, int], Tensor],
        outputs: dict[tuple[int, int], Tensor],
        received: dict[Any, Any],
        ledger: _Ledger,
        losses: list[float],
        shape: tuple[int, int, int],
    ) -> None:
        s, k = key
        config = self.config
        rows = microbatch_rows(config, self.dp, k)
        if s == 0:
            x = inputs[rows].clone().to(self.device)  # its own storage, as a loader gives
        else:
            found = received.pop((K.RECV_F, s, k), None)
            if found is None:  # the previous stage lives on this rank (V-shape turn)
                x = outputs[(s - 1, k)].detach()
            else:
                work, x = found
                if work is not None:
                    work.wait()
            x.requires_grad_(True)
        stage_in[key] = x
        params = self.versions[s][self.current_version[s]]
        stage = self.stages[s]
        with ledger.hooks(key):
            if stage.has_head:
                target = targets[rows].clone().to(self.device)
                loss = functional_call(stage, params, (x, target))
                losses.append(float(loss.detach()))
                out = loss / config.num_microbatches
            else:
                out = functional_call(stage, params, (x,))
        outputs[key] = out
        if s not in self._stage_bytes:
            self._stage_bytes[s] = ledger.bytes_of(key)

    def _upstream_grad(
        self,
        key: tuple[int, int],
        outputs: dict[tuple[int, int], Tensor],
        grad_in: dict[tuple[int, int], Tensor],
        received: dict[Any, Any],
    ) -> Tensor:
        s, k = key
        if self.stages[s].has_head:
            return torch.ones_like(outputs[key])
        found = received.pop((K.RECV_B, s, k), None)
        if found is None:  # the next stage is on this rank (V-shape turn)
            return grad_in.pop((s + 1, k))
        work, grad = found
        if work is not None:
            work.wait()
        return grad  # type: ignore[no-any-return]

    def _backward(
        self,
        action: Action,
        key: tuple[int, int],
        stage_in: dict[tuple[int, int], Tensor],
        outputs: dict[tuple[int, int], Tensor],
        grad_in: dict[tuple[int, int], Tensor],
        received: dict[Any, Any],
        ledger: _Ledger,
    ) -> None:
        s, k = key
        upstream = self._upstream_grad(key, outputs, grad_in, received)
        x = stage_in[key]
        if action.kind is K.BW:
            out = outputs.pop(key)
            torch.autograd.backward(out, upstream)
            if s > 0:
                grad_in[key] = x.grad.detach()  # type: ignore[union-attr]
            stage_in.pop(key)
            ledger.release(key)
            return
        # Split backward runs only in flushed schedules: one weight version per stage.
        params = [p for p in self.versions[s][self.current_version[s]].values() if p.requires_grad]
        if s > 0:
            gx, pending = backward_input(outputs[key], upstream, x, params)
            grad_in[key] = gx.detach()
        else:  # the first stage has no input gradient: W does the whole backward
            pending = Pending(outputs[key], upstream, params, fallback=True)
        self.pending[key] = pending

    def _weight(
        self,
        key: tuple[int, int],
        outputs: dict[tuple[int, int], Tensor],
        ledger: _Ledger,
    ) -> None:
        outputs.pop(key)
        backward_weight(self.pending.pop(key))
        ledger.release(key)

    # ------------------------------------------------------------------ optimizer
    def _optimizer_step(self, action: Action) -> None:
        s = action.stage
        if action.version is not None:  # 2BW
            self._step_2bw(s, action.version)
            return
        params = list(self.params[s].values())
        self._data_parallel_average(params)
        self._remember_grads(s, self.params[s])
        self._apply(s, params, params)

    def _remember_grads(self, s: int, params: dict[str, Tensor]) -> None:
        """With --verify: keep the gradients the first step applies, to compare them."""
        if self.keep_grads and s not in self.verify_grads:
            self.verify_grads[s] = {
                name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
                for name, p in params.items()
            }

    def _data_parallel_average(self, params: list[Tensor]) -> None:
        if self.config.d == 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=self.dp_group)
            p.grad /= self.config.d

    def _apply(self, s: int, targets: list[Tensor], sources: list[Tensor]) -> None:
        """targets -= update(grads of sources); ZeRO-1 shards the update over replicas."""
        config = self.config
        with torch.no_grad():
            flat_w = torch.cat([t.reshape(-1) for t in targets])
            flat_g = torch.cat(
                [
                    (src.grad if src.grad is not None else torch.zeros_like(src)).reshape(-1)
                    for src in sources
                ]
            )
            n = flat_w.numel()
            if config.distributed_optimizer and config.d > 1:
                per = -(-n // config.d)
                index = self.dp_ranks.index(self.rank)
                lo, hi = min(n, index * per), min(n, (index + 1) * per)
            else:
                lo, hi = 0, n
            update = self._update(s, flat_g[lo:hi], (lo, hi))
            new = flat_w.clone()
            new[lo:hi] -= update
            if config.distributed_optimizer and config.d > 1:
                per = -(-n // config.d)
                padded = torch.zeros(per * config.d, dtype=new.dtype)
                padded[:n] = new
                chunks = list(padded.split(per))
                dist.all_gather(chunks, chunks[index].clone(), group=self.dp_group)
                new = torch.cat(chunks)[:n]
            offset = 0
            for t in targets:
                t.copy_(new[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
            for src in sources:
                src.grad = None

    def _update(self, s: int, grad: Tensor, span: tuple[int, int]) -> Tensor:
        lr = self.config.lr
        if self.config.optimizer != "adam":
            return lr * grad
        state = self.optim_state[s]
        if "m" not in state:
            state["m"] = torch.zeros_like(grad)
            state["v"] = torch.zeros_like(grad)
            state["t"] = 0
        state["t"] += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        state["m"].mul_(b1).add_(grad, alpha=1 - b1)
        state["v"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
        m_hat = state["m"] / (1 - b1 ** state["t"])
        v_hat = state["v"] / (1 - b2 ** state["t"])
        return lr * m_hat / (v_hat.sqrt() + eps)  # type: ignore[no-any-return]

    def _step_2bw(self, s: int, new_version: int) -> None:
        """The batch that just ended used version ``used``; its coalesced gradient updates the
        newest weights into ``new_version``; versions no forward will use again are dropped."""
        versions = self.versions[s]
        batch = new_version - 1
        used = max(batch - 1, 0)
        newest = versions[max(versions)]
        sources = list(versions[used].values())
        self._data_parallel_average(sources)
        fresh = {k: v.detach().clone().requires_grad_(True) for k, v in newest.items()}
        self._apply(s, list(fresh.values()), sources)
        versions[new_version] = fresh
        # A version stays while a later batch still runs on it (batch b uses max(b - 1, 0)).
        for v in list(versions):
            if v < new_version - 1:
                del versions[v]

    # ------------------------------------------------------------------ transfers
    def _isend(self, tensor: Tensor, dst: int, tag: int) -> Any:
        tensor = tensor.contiguous()
        self.bytes_sent[dst] += tensor.numel() * tensor.element_size()
        return dist.isend(tensor, dst, tag=tag)

    def _pair(self, action: Action) -> int:
        assert action.peer is not None
        return self.config.rank_of(self.dp, action.peer, self.tp_rank)

    def exchange_sizes(self) -> None:
        """Probe one forward per owned stage to learn how many elements its saved
        activations take, and share the sizes with every rank (BPipe acceptors need them
        to post receives for evicted activations)."""
        config = self.config
        inputs, targets = batch_for(config, 0)
        mine: dict[int, int] = {}
        for s, stage in self.stages.items():
            rows = microbatch_rows(config, self.dp, 0)
            if s == 0:
                x = inputs[rows].clone().to(self.device)  # its own storage, as a loader gives
            else:
                x = torch.zeros(
                    config.micro_batch_size,
                    config.shape.seq_length,
                    config.shape.hidden_size,
                    device=self.device,
                    requires_grad=True,
                )
            saved: list[Tensor] = []
            ptrs = {p.untyped_storage().data_ptr() for p in stage.parameters()}

            def pack(t: Tensor, saved: list[Tensor] = saved, ptrs: set[int] = ptrs) -> Any:
                if t.untyped_storage().data_ptr() not in ptrs:
                    saved.append(t)
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with torch.enable_grad():
                    if stage.has_head:
                        stage(x, targets[rows].to(self.device))
                    else:
                        stage(x)
            mine[s] = sum(t.numel() for t in saved)
        everyone: list[dict[int, int] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        sizes: dict[int, int] = {}
        for entry in everyone:
            if entry:
                sizes.update(entry)
        self.saved_numel = sizes
