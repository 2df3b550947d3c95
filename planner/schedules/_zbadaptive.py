"""zb-adaptive: zero bubble's automatic scheduler under a memory limit (Qi et al., "Zero
Bubble Pipeline Parallelism", ICLR 2024, §3.1), one stage per device; at a limit of 1 it is
ZB-1P, at 2 ZB-2P, the baselines of the V-shape paper's Tables 3, 4 and 6 and Figure 10.

The heuristic, as the paper describes it and its authors implement it (``auto_schedule.py``
in sail-sg/zero-bubble-pipeline-parallelism), with the ILP refinement left out as the
authors' code leaves it out:

- warm-up: stage j runs as many forwards as fit in memory before the first backward reaches
  it, without delaying that backward (or, in a variant, while they end before it arrives);
  later stages never run more warm-up forwards than earlier ones;
- steady state: one F and one B per stage per micro-batch, in that order. W passes fill the
  gaps: a W goes in whenever it fits before the next input arrives, a shorter gap is
  filled too when it would not raise the largest bubble any stage has accumulated, and Ws
  are issued whenever the next pass would exceed the memory limit;
- variants: whether a bubble may stay before the first B, whether B is given priority when
  a stage runs ahead of the next one, and whether a short gap is filled greedily. All eight
  are built and the one with the shortest span wins; remaining Ws run at the end.

Memory is counted the way the simulator and the executor count it: a forward saves one
stage activation, its W frees it (B keeps what W needs). The limit is a fraction of 1F1B's
peak, p stage activations; below 1/p not even one forward fits.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import product
from typing import Any

import numpy as np

from planner.errors import ScheduleConfigError
from planner.schedules._basic import require
from planner.schedules._ir import KIND_CODE, ActionKind, Columns, Schedule
from planner.schedules._registry import MEMORY_LIMIT, PassTimes, ScheduleFamily, register

__all__ = ["smallest_zb_limit", "zb_adaptive"]

F, B, W = 0, 1, 2
_KIND = (ActionKind.F, ActionKind.B, ActionKind.W)
_MEMORY = (1.0, 0.0, -1.0)  # stage activations: F saves one, B keeps it, W frees it


class _OutOfMemory(Exception):
    """A variant cannot keep the next pass within the limit."""


class _Heuristic:
    """One run of the greedy scheduler for one combination of the three switches."""

    def __init__(
        self,
        cost: tuple[list[float], list[float], list[float]],
        comm: float,
        num_microbatches: int,
        limit: float,
    ) -> None:
        self.cost = cost
        self.comm = comm
        self.n = num_microbatches
        self.p = len(cost[F])
        self.limit = limit
        p, n = self.p, num_microbatches
        self.count = [[0] * p for _ in range(3)]  # passes put per kind and stage
        self.memory = [0.0] * p
        self.free = [0.0] * p  # when each stage's last pass ends
        self.finish = [[[0.0] * n for _ in range(p)] for _ in range(3)]
        self.bubble = [0.0] * p  # idle time since each stage's first forward
        self.orders: list[list[tuple[int, int]]] = [[] for _ in range(p)]

    def put(self, stage: int, kind: int) -> None:
        index = self.count[kind][stage]
        duration = self.cost[kind][stage]
        end = self.free[stage] + duration
        no_bubble = end
        if kind == F and stage > 0:
            end = max(end, self.finish[F][stage - 1][index] + self.comm + duration)
        if kind == B and stage < self.p - 1:
            end = max(end, self.finish[B][stage + 1][index] + self.comm + duration)
        if self.count[F][stage] > 0:
            self.bubble[stage] += end - no_bubble
        self.free[stage] = end
        self.finish[kind][stage][index] = end
        self.memory[stage] += _MEMORY[kind]
        self.count[kind][stage] += 1
        self.orders[stage].append((kind, index))

    def _make_room(self, stage: int, kind: int) -> None:
        """Issue Ws until the next pass of ``kind`` fits in the limit."""
        while self.memory[stage] + _MEMORY[kind] > self.limit + 1e-9:
            if self.count[W][stage] >= self.count[B][stage]:
                raise _OutOfMemory
            self.put(stage, W)

    def _fill_before(self, stage: int, arrival: float, greedy: bool) -> None:
        """Ws into the gap before an input arriving at ``arrival``: every W that ends by
        then, and one more if the gap would otherwise raise the largest bubble."""
        count, cost = self.count, self.cost
        while count[W][stage] < count[B][stage] and self.free[stage] + cost[W][stage] <= arrival:
            self.put(stage, W)
        if count[W][stage] < count[B][stage] and self.free[stage] < arrival:
            if arrival - self.free[stage] <= max(self.bubble) - self.bubble[stage]:
                if greedy:
                    self.put(stage, W)
            else:
                self.put(stage, W)

    def run(self, bubble_before_first_b: bool, prioritize_b: bool, greedy: bool) -> float:
        p, n, comm = self.p, self.n, self.comm
        cost, count = self.cost, self.count
        f, b, w = count
        for i in range(n):
            if i == 0:
                self._warm_up(bubble_before_first_b)
                continue
            required = [0] * p
            for j in range(p):
                if f[j] >= n:
                    continue
                if j + 1 < p and f[j] >= f[j + 1] + 2 and prioritize_b:
                    next_done = self.free[j + 1] + cost[F][j + 1] + cost[B][j + 1] + comm
                    if self.free[j] >= next_done:
                        continue
                    extra, freed = 0.0, self.memory[j] + _MEMORY[F]
                    pending = w[j]
                    while freed > self.limit + 1e-9 and pending < b[j]:
                        extra += cost[W][j]
                        freed += _MEMORY[W]
                        pending += 1
                    if self.free[j] + cost[F][j] + extra <= next_done:
                        required[j] = 1
                        continue
                    if next_done - self.free[j] <= max(self.bubble) - self.bubble[j]:
                        continue
                required[j] = 1
            for j in range(p - 2, -1, -1):
                required[j] = min(required[j], required[j + 1])
            for j in range(p):
                if not required[j]:
                    continue
                self._make_room(j, F)
                if j > 0:
                    self._fill_before(j, self.finish[F][j - 1][f[j]] + comm, greedy)
                self.put(j, F)
            for j in range(p - 1, -1, -1):
                self._make_room(j, B)
                if j + 1 < p:
                    self._fill_before(j, self.finish[B][j + 1][i] + comm, greedy)
                if j == 0 and f[j] == n:
                    while w[j] < b[j]:
                        self.put(j, W)
                self.put(j, B)
        for j in range(p):
            while w[j] < n:
                self.put(j, W)
        return max(self.finish[W][j][n - 1] - self.finish[F][j][0] + cost[F][j] for j in range(p))

    def _warm_up(self, bubble_before_first_b: bool) -> None:
        """Micro-batch 0's forwards, the warm-up forwards that fit, then its backwards."""
        p, n, comm = self.p, self.n, self.comm
        cost, f = self.cost, self.count[F]
        for j in range(p):
            self.put(j, F)
        required = [0] * p
        arrival = self.finish[F][p - 1][0] + cost[B][p - 1]  # B reaches stage p - 2 after
        for j in range(p - 2, -1, -1):
            memory, busy = self.memory[j], self.free[j]
            while f[j] + required[j] < n and memory + _MEMORY[F] <= self.limit + 1e-9:
                if bubble_before_first_b:
                    if busy + cost[F][j] > arrival + comm:
                        break
                elif busy >= arrival + comm:
                    break
                memory += _MEMORY[F]
                busy += cost[F][j]
                required[j] += 1
            arrival = max(busy, arrival + comm) + cost[B][j]
        # A later stage runs fewer warm-up forwards than the one before it, or as many when
        # both run all n. (The authors' code tests that this stage runs all n, which with
        # stages of unequal time lets a fast stage run forwards its predecessor has not.)
        for j in range(1, p):
            while (
                required[j] > 0
                and required[j] >= required[j - 1]
                and f[j - 1] + required[j - 1] < n
            ):
                required[j] -= 1
        for j in range(p):
            for _ in range(required[j]):
                self.put(j, F)
        for j in range(p - 1, -1, -1):
            self.put(j, B)


def smallest_zb_limit(num_devices: int) -> float:
    """One forward's activation per device: the least any schedule needs (1/p of 1F1B's)."""
    return 1.0 / num_devices


def zb_adaptive(
    num_devices: int,
    num_microbatches: int,
    memory_limit: float,
    times: PassTimes,
    variant: int | None = None,
) -> Schedule:
    """The zb-adaptive schedule for p devices (one stage each), m micro-batches and
    ``memory_limit`` (a fraction of 1F1B's peak activation), scheduled under ``times``:
    the best of the eight variants, or only ``variant`` (a rebuild of a chosen one)."""
    p, m = num_devices, num_microbatches
    require(p >= 1, f"zb-adaptive: the number of devices must be at least 1, got {p}")
    require(m >= 1, f"zb-adaptive: the number of micro-batches must be at least 1, got {m}")
    smallest = smallest_zb_limit(p)
    if memory_limit < smallest - 1e-12:
        raise ScheduleConfigError(
            f"zb-adaptive: on {p} devices no schedule keeps its activations within "
            f"{memory_limit:g} of 1F1B's peak (one forward of a stage needs 1/{p}); the "
            f"smallest feasible memory_limit is {smallest:.4g}"
        )
    cost = times.per_stage(p)
    limit = memory_limit * p
    best: tuple[float, int, _Heuristic] | None = None
    for rank, switches in enumerate(product((True, False), repeat=3)):
        if variant is not None and rank != variant:
            continue
        heuristic = _Heuristic(cost, times.comm, m, limit)
        try:
            span = heuristic.run(*switches)
        except _OutOfMemory:
            continue
        if best is None or span < best[0]:
            best = (span, rank, heuristic)
    if best is None:
        raise ScheduleConfigError(
            f"zb-adaptive: the scheduler found no order within {memory_limit:g} of 1F1B's "
            f"peak on {p} devices with {m} micro-batches; raise memory_limit"
        )
    chosen = best[2]
    columns = _columns(chosen.orders, m)
    peak = max(_peak(order) for order in chosen.orders)
    meta = {
        "memory_limit": memory_limit,
        "peak_stage_activations": peak,
        "peak_activation_fraction": peak / p,
        "heuristic_span": best[0],
        "choice": {
            "memory_limit": memory_limit,
            "variant": best[1],
            "pass_times": {"forward": cost[F], "backward": cost[B], "weight": cost[W]},
            "comm": times.comm,
        },
    }
    return Schedule.from_columns(
        "zb-adaptive", p, m, tuple(range(p)), columns, split_backward=True, meta=meta
    )


_KIND_CODE = np.array([KIND_CODE[kind] for kind in _KIND], dtype=np.int64)


def _columns(orders: list[list[tuple[int, int]]], m: int) -> Columns:
    """The schedule's columns: each stage's passes (kind, micro-batch), then its step."""
    sizes = [len(order) + 1 for order in orders]
    kind = np.full(sum(sizes), KIND_CODE[ActionKind.OPTIMIZER_STEP], np.int64)
    microbatch = np.full(sum(sizes), m - 1, np.int64)
    offsets = np.zeros(len(orders) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    for stage, order in enumerate(orders):
        if order:
            kinds, indices = zip(*order, strict=True)
            first, last = offsets[stage], offsets[stage + 1] - 1
            kind[first:last] = _KIND_CODE[np.array(kinds, dtype=np.int64)]
            microbatch[first:last] = indices
    device = np.repeat(np.arange(len(orders), dtype=np.int64), sizes)
    missing = np.full(len(kind), -1, np.int64)
    return Columns(
        device=device,
        kind=kind,
        stage=device,
        microbatch=microbatch,
        chunk=np.zeros(len(kind), np.int64),
        peer=missing,
        version=missing.copy(),
        offsets=offsets,
    )


def _peak(order: list[tuple[int, int]]) -> int:
    """The most stage activations the order holds at once (F saves one, W frees it)."""
    if not order:
        return 0
    level = np.cumsum(np.array(_MEMORY)[[kind for kind, _ in order]])
    return max(0, int(level.max()))


def _build(p: int, m: int, params: Mapping[str, float], times: PassTimes) -> Schedule:
    return zb_adaptive(p, m, float(params[MEMORY_LIMIT.name]), times)


def _rebuild(choice: Mapping[str, Any], num_devices: int, num_microbatches: int) -> Schedule:
    """The variant chosen, with the same limit and pass times, for ``num_microbatches``."""
    times = choice["pass_times"]
    return zb_adaptive(
        num_devices,
        num_microbatches,
        float(choice["memory_limit"]),
        PassTimes(
            tuple(times["forward"]),
            tuple(times["backward"]),
            tuple(times["weight"]),
            float(choice["comm"]),
        ),
        variant=choice.get("variant"),
    )


def _idle_at_limit(limit: float) -> float:
    """Ranking estimate of the idle time relative to 1F1B's: ZB-1P (limit 1) about ZB-H1's
    (p - 1)(F + B - W), a third of 1F1B's with equal passes, ZB-2P (limit 2) about zero
    (Qi et al. 2023, §3); below 1 the warm-up cannot fill and 1F1B's bubble returns."""
    if limit >= 2.0:
        return 1 / 6
    if limit >= 1.0:
        return 1 / 3 + (1 / 6 - 1 / 3) * (limit - 1.0)
    return 1.0


register(
    ScheduleFamily(
        name="zb-adaptive",
        listing=91,
        title="Zero bubble adaptive (ZB-1P at 1, ZB-2P at 2)",
        citation='Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1',
        build=_build,
        parameters=(MEMORY_LIMIT,),
        split_backward=True,
        runtimes=frozenset({"stagewright", "torch"}),
        idle_vs_1f1b=1 / 6,
        memory_rule="at most the memory limit (a fraction of 1F1B's peak) on every device",
        uses_pass_times=True,
        rebuild=_rebuild,
        smallest_memory_limit=lambda p, _: smallest_zb_limit(p),
        search_work=lambda p, m: 8 * 3 * p * m,  # eight greedy variants of 3 passes a cell
        # A stage never holds more than all m micro-batches.
        largest_memory_limit=lambda p, m: m / p,
        idle_at_limit=_idle_at_limit,
        single_device_as="1f1b",
    )
)
