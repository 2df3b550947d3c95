"""Pass that makes point-to-point communication explicit.

Generators emit compute actions only; the stage order implies who sends what to whom. An
executor that posts its own sends and receives wants them spelled out, in the format of
torch.distributed.pipelining's "compute_comms" action lists: ``SEND_F`` right after the
forward that produces the output, ``RECV_F`` right before the forward that consumes it, and
the same for gradients (``SEND_B`` after a B/BW, ``RECV_B`` before the B/BW of the previous
stage). Stages on the same device (the V-shape turn) exchange nothing.
"""

from __future__ import annotations

from dataclasses import replace

from planner.schedules._ir import Action, ActionKind, Schedule

__all__ = ["with_communication"]

K = ActionKind


def with_communication(schedule: Schedule) -> Schedule:
    """Return ``schedule`` with SEND/RECV actions inserted (idempotent on compute lists)."""
    devices = schedule.stage_devices
    last = schedule.num_stages - 1
    rows = []
    for device, acts in enumerate(schedule.actions):
        row: list[Action] = []
        for a in acts:
            if a.kind.is_p2p:
                continue
            s, k, chunk = a.stage, a.microbatch, a.chunk
            if a.kind is K.F and s > 0 and devices[s - 1] != device:
                row.append(Action(K.RECV_F, s, k, chunk, peer=devices[s - 1]))
            if a.kind in (K.B, K.BW) and s < last and devices[s + 1] != device:
                row.append(Action(K.RECV_B, s, k, chunk, peer=devices[s + 1]))
            row.append(a)
            if a.kind is K.F and s < last and devices[s + 1] != device:
                row.append(Action(K.SEND_F, s, k, chunk, peer=devices[s + 1]))
            if a.kind in (K.B, K.BW) and s > 0 and devices[s - 1] != device:
                row.append(Action(K.SEND_B, s, k, chunk, peer=devices[s - 1]))
        rows.append(tuple(row))
    return replace(schedule, actions=tuple(rows))
