"""The action interpreter: one rank runs its list of the schedule IR, in order.

It never derives a schedule: it runs the action list the planner priced (with SEND/RECV
made explicit by the planner's own IR pass, :func:`planner.schedules.with_communication`).
Each action kind has one handler; what passes between actions of one pass lives in a
:class:`_Pass`.

- F runs the stage forward on the weights of its version, under the ledger's saved-tensor
  hooks; the last stage's forward is the loss, scaled by (loss scale / m) so that gradients
  accumulate to the batch mean.
- BW is one backward. B computes the input gradient only and keeps what W needs; W computes
  the weight gradients (:mod:`executor.split_backward`). Gradients then move to the stage's
  fp32 buffer and the ledger releases the micro-batch.
- SEND/RECV are asynchronous, tagged point-to-point transfers (:mod:`executor.comm`); a compute
  action waits for its input before its clock starts, so waiting counts as bubble, not busy.
- EVICT/LOAD are BPipe's transfers (:mod:`executor.transfers`); VERSION switches the weights
  later forwards use; STEP is the stage's optimizer step (:mod:`executor.weights`). With fp16
  every stage must agree on skipping a step whose gradients overflowed, so the steps of a
  pass are applied together at its end (the schedule's flush), after one all-reduce of the
  overflow flags.

A pass may cover several batches without a flush (2BW): the rank's measurements are then cut
at its last optimizer step of each batch (see :mod:`planner.launch.report`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from executor.comm import Comm
from executor.data import MicroBatch
from executor.ledger import Ledger
from executor.model import (
    COMPUTE_DTYPE,
    GPTShape,
    Stage,
    build_stage,
    init_full_weights,
    model_options,
)
from executor.optimizer import LossScaler
from executor.split_backward import Pending, backward_input, backward_weight
from executor.transfers import Transfers
from executor.weights import StageWeights
from planner.launch import ExecutorConfig
from planner.launch.report import StepMeasure
from planner.schedules import Action, ActionKind, Schedule, with_communication

__all__ = ["RankRunner"]

K = ActionKind
Key = tuple[int, int]


@dataclass
class _Incoming:
    work: Any
    tensor: Tensor

    def get(self) -> Tensor:
        if self.work is not None:  # a gloo request must be waited for once only
            self.work.wait()
            self.work = None
        return self.tensor


@dataclass
class _Window:
    """Measurements of one step on this rank, from its start to its end."""

    step: int
    started: float = field(default_factory=time.perf_counter)
    cpu_started: float = field(default_factory=time.process_time)
    busy: float = 0.0
    losses: list[float] = field(default_factory=list)


@dataclass
class _Pass:
    """What one pass over the action list holds between actions."""

    first_step: int
    transfers: Transfers
    stage_in: dict[Key, Tensor] = field(default_factory=dict)
    outputs: dict[Key, Tensor] = field(default_factory=dict)
    grad_in: dict[Key, Tensor] = field(default_factory=dict)
    received: dict[tuple[ActionKind, int, int], _Incoming] = field(default_factory=dict)
    weights_used: dict[Key, dict[str, Tensor]] = field(default_factory=dict)
    pending: dict[Key, Pending] = field(default_factory=dict)
    sends: list[Any] = field(default_factory=list)
    deferred: list[tuple[int, int | None, bool]] = field(default_factory=list)
    measures: list[StepMeasure] = field(default_factory=list)
    window: _Window | None = None


class RankRunner:
    """One rank: its stages, their weights, and the interpreter of its action list."""

    def __init__(self, config: ExecutorConfig, comm: Comm, *, keep_grads: int) -> None:
        self.config = config
        self.comm = comm
        self.device = comm.device()
        self.shape = GPTShape.of(config.model)
        self.dtype = COMPUTE_DTYPE[config.training.precision]
        schedule = config.ir
        self.schedule = schedule
        self.my_stages = schedule.stages_of(comm.pp)
        self.last_stage = schedule.num_stages - 1
        options = model_options(config)
        full = init_full_weights(self.shape, config.seed)
        self.stages: dict[int, Stage] = {}
        self.weights: dict[int, StageWeights] = {}
        # A schedule whose optimizer steps create weight versions (2BW) keeps several.
        versioned = any(
            a.kind is K.OPTIMIZER_STEP and a.version is not None
            for _, _, a in schedule.iter_actions()
        )
        for s in self.my_stages:
            spec = config.stages[s]
            module = build_stage(
                self.shape,
                full,
                spec.first_layer,
                spec.end_layer,
                embed=s == 0,
                head=s == self.last_stage,
                tp=comm.tp,
                options=options,
                recompute=spec.layer_modes(),
            ).to(self.device)
            self.stages[s] = module
            self.weights[s] = StageWeights(
                module,
                config,
                dp_group=comm.dp_group,
                dp_ranks=comm.dp_ranks,
                rank=comm.rank,
                tp_group=comm.tp.group,
                versioned=versioned,
            )
        self.scaler = LossScaler(config)
        # --verify: each stage's gradients of its first ``keep_grads`` optimizer steps.
        self.keep_grads = keep_grads
        self.kept_grads: dict[int, list[dict[str, Tensor]]] = {}
        self.first_losses: list[float] = []
        self.stage_bytes: dict[int, int] = {}
        self.ledger = Ledger([])
        self._handlers: dict[ActionKind, Callable[[_Pass, Action], None]] = {
            K.F: self._forward,
            K.B: self._backward_input,
            K.W: self._backward_weight,
            K.BW: self._backward,
            K.OPTIMIZER_STEP: self._optimizer_step,
            K.SEND_F: self._send_forward,
            K.SEND_B: self._send_backward,
            K.RECV_F: self._receive,
            K.RECV_B: self._receive,
            K.WEIGHT_VERSION: self._switch_version,
            K.EVICT: lambda run, action: run.transfers.evict(action),
            K.LOAD: lambda run, action: run.transfers.load(action),
        }

    # ------------------------------------------------------------------ passes
    def run(self, schedule: Schedule, first_step: int) -> list[StepMeasure]:
        """Run this rank's list of ``schedule`` once (one step, or one step per batch of a
        schedule that runs several without a flush) and return each step's measurements."""
        ledger = Ledger(self._constants())
        self.ledger = ledger
        transfers = Transfers(
            self.comm, ledger, schedule.stage_devices, self.comm.pp, self.stage_bytes
        )
        run = _Pass(first_step, transfers)
        run.window = _Window(first_step)
        m = schedule.num_microbatches
        actions = with_communication(schedule).actions[self.comm.pp]
        batch_ends = _batch_ends(actions, m)
        for position, action in enumerate(actions):
            if action.kind.is_compute:
                transfers.before_compute()
                self._wait_for_input(run, action)
                began = time.perf_counter()
                self._handlers[action.kind](run, action)
                run.window.busy += time.perf_counter() - began
            else:
                self._handlers[action.kind](run, action)
            if position in batch_ends and action.microbatch // m < schedule.num_batches - 1:
                self._close_window(run, first_step + action.microbatch // m)
        for work in run.sends:
            work.wait()
        transfers.finish()
        if run.deferred:
            self._apply_deferred(run)
        self._close_window(run, first_step + schedule.num_batches - 1)
        return run.measures

    def _close_window(self, run: _Pass, step: int) -> None:
        window = run.window
        assert window is not None
        run.measures.append(
            StepMeasure(
                step=step,
                wall_s=time.perf_counter() - window.started,
                busy_s=window.busy,
                cpu_s=time.process_time() - window.cpu_started,
                peak_saved_activation_bytes=self.ledger.peak,
                bytes_sent={str(k): v for k, v in sorted(self.comm.bytes_sent.items())},
                losses=window.losses,
                loss_scale=self.scaler.scale if self.scaler.enabled else None,
            )
        )
        self.comm.bytes_sent.clear()
        self.ledger.reset_peak()
        run.window = _Window(step + 1)

    def _constants(self) -> list[Tensor]:
        """Tensors autograd may save that are not activations: weights and buffers."""
        out: list[Tensor] = []
        for s, module in self.stages.items():
            out += list(module.buffers()) + self.weights[s].all_tensors()
        return out

    def _wait_for_input(self, run: _Pass, action: Action) -> None:
        wanted = (K.RECV_F if action.kind is K.F else K.RECV_B, action.stage, action.microbatch)
        found = run.received.get(wanted)
        if found is not None:
            found.get()

    # ------------------------------------------------------------------ compute
    def _forward(self, run: _Pass, action: Action) -> None:
        s, k = action.stage, action.microbatch
        key = (s, k)
        batch = MicroBatch(self.config, self.comm.dp, run.first_step, k)
        if s == 0:
            x = batch.inputs().to(self.device)
        else:
            incoming = run.received.pop((K.RECV_F, s, k), None)
            # None: the previous stage lives on this rank (a V-shape turn).
            x = incoming.get() if incoming else run.outputs[(s - 1, k)].detach()
            x.requires_grad_(True)
        run.stage_in[key] = x
        weights = self.weights[s]
        run.weights_used[key] = weights.in_use()
        with self.ledger.hooks(key):
            if s == self.last_stage:
                loss = weights.forward(x, batch.key, batch.targets().to(self.device))
                assert run.window is not None
                run.window.losses.append(float(loss.detach()))
                out = loss * (self.scaler.scale / self.config.num_microbatches)
            else:
                out = weights.forward(x, batch.key)
        run.outputs[key] = out

    def _upstream(self, run: _Pass, key: Key) -> Tensor:
        s, k = key
        if s == self.last_stage:
            return torch.ones_like(run.outputs[key])
        incoming = run.received.pop((K.RECV_B, s, k), None)
        # None: the next stage lives on this rank (a V-shape turn).
        return incoming.get() if incoming else run.grad_in.pop((s + 1, k))

    def _backward(self, run: _Pass, action: Action) -> None:
        key = (action.stage, action.microbatch)
        run.transfers.before_backward(key)
        upstream = self._upstream(run, key)
        x = run.stage_in.pop(key)
        torch.autograd.backward(run.outputs.pop(key), upstream)
        if action.stage > 0:
            assert x.grad is not None
            run.grad_in[key] = x.grad
        self._done(run, key)

    def _backward_input(self, run: _Pass, action: Action) -> None:
        key = (action.stage, action.microbatch)
        run.transfers.before_backward(key)
        upstream = self._upstream(run, key)
        x = run.stage_in.pop(key)
        params = [w for w in run.weights_used[key].values() if w.requires_grad]
        if action.stage > 0:
            gx, pending = backward_input(run.outputs[key], upstream, x, params)
            run.grad_in[key] = gx
        else:  # the first stage has no input gradient: W does the whole backward
            pending = Pending(run.outputs[key], upstream, params, fallback=True)
        run.pending[key] = pending

    def _backward_weight(self, run: _Pass, action: Action) -> None:
        key = (action.stage, action.microbatch)
        run.outputs.pop(key)
        backward_weight(run.pending.pop(key))
        self._done(run, key)

    def _done(self, run: _Pass, key: Key) -> None:
        self.weights[key[0]].collect_gradients(run.weights_used.pop(key))
        self.ledger.release(key)

    def _optimizer_step(self, run: _Pass, action: Action) -> None:
        s = action.stage
        weights = self.weights[s]
        finite = weights.reduce_gradients(self.scaler.scale)
        kept = self.kept_grads.setdefault(s, [])
        if len(kept) < self.keep_grads:
            kept.append(weights.gradients_by_name())
        if self.scaler.enabled:
            run.deferred.append((s, action.version, finite))
            return
        weights.apply(new_version=action.version)
        self.ledger.add_constants(weights.all_tensors())

    def _apply_deferred(self, run: _Pass) -> None:
        overflow = torch.tensor([0.0 if all(finite for _, _, finite in run.deferred) else 1.0])
        dist.all_reduce(overflow, op=dist.ReduceOp.MAX)
        skip = bool(overflow.item())
        for s, version, _ in run.deferred:
            self.weights[s].apply(skip=skip, new_version=version)
            self.ledger.add_constants(self.weights[s].all_tensors())
        self.scaler.update(skip)

    # ------------------------------------------------------------------ data movement
    def _activation_shape(self) -> tuple[int, int, int]:
        seq = self.shape.seq_length
        if self.comm.tp.sequence_parallel and self.comm.tp.size > 1:
            seq //= self.comm.tp.size
        return (seq, self.config.micro_batch_size, self.shape.hidden_size)

    def _send_forward(self, run: _Pass, action: Action) -> None:
        s, k = action.stage, action.microbatch
        assert action.peer is not None
        tag = self.comm.tag(K.SEND_F, s + 1, k)
        run.sends.append(self.comm.isend(run.outputs[(s, k)].detach(), action.peer, tag))

    def _send_backward(self, run: _Pass, action: Action) -> None:
        s, k = action.stage, action.microbatch
        assert action.peer is not None
        tag = self.comm.tag(K.SEND_B, s - 1, k)
        run.sends.append(self.comm.isend(run.grad_in.pop((s, k)), action.peer, tag))

    def _receive(self, run: _Pass, action: Action) -> None:
        assert action.peer is not None
        buffer = torch.empty(self._activation_shape(), dtype=self.dtype, device=self.device)
        tag = self.comm.tag(action.kind, action.stage, action.microbatch)
        work = self.comm.irecv(buffer, action.peer, tag)
        run.received[(action.kind, action.stage, action.microbatch)] = _Incoming(work, buffer)

    def _switch_version(self, run: _Pass, action: Action) -> None:
        assert action.version is not None
        self.weights[action.stage].current = action.version

    # ------------------------------------------------------------------ start-up
    def measure_stage_bytes(self) -> None:
        """Saved bytes of one micro-batch of each stage of the run, shared with every rank
        (a BPipe acceptor posts receives of that size). One forward per owned stage on
        micro-batch 0's data, counted by a ledger of its own."""
        mine: dict[int, int] = {}
        for s, weights in self.weights.items():
            ledger = Ledger(self._constants())
            batch = MicroBatch(self.config, self.comm.dp, 0, 0)
            if s == 0:
                x = batch.inputs().to(self.device)
            else:
                x = torch.zeros(self._activation_shape(), dtype=self.dtype, device=self.device)
                x.requires_grad_(True)
            with ledger.hooks((s, 0)), torch.enable_grad():
                if s == self.last_stage:
                    weights.forward(x, batch.key, batch.targets().to(self.device))
                else:
                    weights.forward(x, batch.key)
            mine[s] = ledger.bytes_of((s, 0))
        for entry in self.comm.all_gather_object(mine):
            self.stage_bytes.update(entry)


def _batch_ends(actions: tuple[Action, ...], m: int) -> set[int]:
    """Positions of a rank's last optimizer step of each batch: where a step's measurements
    end when batches follow one another without a flush."""
    last: dict[int, int] = {}
    for position, action in enumerate(actions):
        if action.kind is K.OPTIMIZER_STEP:
            last[action.microbatch // m] = position
    return set(last.values())
