"""BPipe's activation transfers: EVICT and LOAD between an evictor and its acceptor.

The evictor sends one micro-batch's saved activations (its storages, byte for byte, see
:class:`executor.ledger.Ledger`) to the acceptor and stops holding them once the send has
completed; LOAD brings them back before the backward that needs them. Both are asynchronous:
a transfer overlaps the next compute action and is waited for before the compute action after
that one (the IR's rule; BPipe Appendix B), or before the backward that needs it.

The acceptor must post a receive of the right size. Every micro-batch of a stage saves the
same bytes, so each rank measures its stages once at start-up (:func:`saved_bytes_per_stage`)
and the sizes are shared with every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from executor.comm import Comm
from executor.ledger import Ledger, StorageLayout
from planner.schedules import Action, ActionKind

__all__ = ["Transfers"]

Key = tuple[int, int]


@dataclass
class _Copy:
    fence: int  # compute actions still allowed to start before this copy must be complete
    work: Any
    done: Callable[[], None]


class Transfers:
    """One rank's EVICT/LOAD traffic within one pass over its action list."""

    def __init__(
        self,
        comm: Comm,
        ledger: Ledger,
        stage_devices: tuple[int, ...],
        device: int,
        stage_bytes: dict[int, int],
    ) -> None:
        self.comm = comm
        self.ledger = ledger
        self.stage_devices = stage_devices
        self.device = device
        self.stage_bytes = stage_bytes
        self._copies: list[_Copy] = []
        self._layouts: dict[Key, StorageLayout] = {}
        self._loads: dict[Key, tuple[Any, Tensor]] = {}
        self._held: dict[Key, tuple[Any, Tensor]] = {}

    def before_compute(self) -> None:
        """A compute action is about to start: complete the copies whose fence it reaches."""
        keep = []
        for copy in self._copies:
            copy.fence -= 1
            if copy.fence <= 0:
                copy.work.wait()
                copy.done()
            else:
                keep.append(copy)
        self._copies = keep

    def evict(self, action: Action) -> None:
        key = (action.stage, action.microbatch)
        assert action.peer is not None
        tag = self.comm.tag(ActionKind.EVICT, *key)
        if self._owns(action.stage):
            buffer, layout = self.ledger.pack_for_transfer(key)
            self._layouts[key] = layout
            work = self.comm.isend(buffer, action.peer, tag)
            self._copies.append(_Copy(2, work, lambda: self.ledger.drop_local(key)))
            return
        size = self.stage_bytes[action.stage]
        buffer = torch.empty(size, dtype=torch.uint8, device=self.comm.device())
        self._held[key] = (self.comm.irecv(buffer, action.peer, tag), buffer)
        self.ledger.hold(key, size)

    def load(self, action: Action) -> None:
        key = (action.stage, action.microbatch)
        assert action.peer is not None
        tag = self.comm.tag(ActionKind.LOAD, *key)
        if self._owns(action.stage):
            size = self._layouts[key].total
            buffer = torch.empty(size, dtype=torch.uint8, device=self.comm.device())
            self._loads[key] = (self.comm.irecv(buffer, action.peer, tag), buffer)
            return
        work, buffer = self._held.pop(key)
        work.wait()
        back = self.comm.isend(buffer, action.peer, tag)
        self._copies.append(_Copy(1, back, lambda: self.ledger.unhold(key)))

    def before_backward(self, key: Key) -> None:
        """The backward of ``key`` starts: its evicted activations must be back."""
        found = self._loads.pop(key, None)
        if found is not None:
            work, buffer = found
            work.wait()
            self.ledger.restore(key, buffer, self._layouts.pop(key))

    def finish(self) -> None:
        for copy in self._copies:
            copy.work.wait()
            copy.done()
        self._copies = []

    def _owns(self, stage: int) -> bool:
        return self.stage_devices[stage] == self.device
