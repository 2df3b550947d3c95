"""Saved activations per (stage, micro-batch), captured with saved-tensor hooks.

Every tensor autograd saves during a forward goes through the ledger (parameters and constant
buffers pass straight through: they are not activations). That lets a rank count the bytes of
saved activations alive at any moment (unique storages: views of one storage count once), and
move one micro-batch's saved activations to another rank and back (BPipe) byte for byte: its
storages travel as one uint8 buffer and come back as new storages under the same views.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["Ledger", "StorageLayout"]

Key = tuple[int, int]  # (stage, micro-batch)


@dataclass(frozen=True)
class _View:
    storage: int  # index into the micro-batch's storages
    dtype: torch.dtype
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class StorageLayout:
    """How a micro-batch's saved tensors sit on its storages: enough to rebuild them from the
    bytes alone (the evictor keeps this, not the tensors)."""

    nbytes: tuple[int, ...]
    views: tuple[_View, ...]

    @property
    def total(self) -> int:
        return sum(self.nbytes)


class _Saved:
    __slots__ = ("ptrs", "storages", "tensors")

    def __init__(self) -> None:
        self.tensors: list[Tensor | None] = []
        self.storages: dict[int, int] = {}  # storage pointer -> bytes
        self.ptrs: list[int] = []  # storage pointer of each tensor


class Ledger:
    """Saved activations of one rank, and the bytes of them alive."""

    def __init__(self, constants: Iterable[Tensor]) -> None:
        self._constants = {t.untyped_storage().data_ptr() for t in constants}
        self._saved: dict[Key, _Saved] = {}
        self._held: dict[Key, int] = {}  # bytes held for a pair rank (BPipe acceptor)
        self.level = 0
        self.peak = 0

    def add_constants(self, tensors: Iterable[Tensor]) -> None:
        """More tensors that are not activations (a new weight version)."""
        self._constants.update(t.untyped_storage().data_ptr() for t in tensors)

    def reset_peak(self) -> None:
        self.peak = self.level

    def hooks(self, key: Key) -> AbstractContextManager[Any]:
        """Context in which a forward's saved tensors are recorded under ``key``."""
        saved = self._saved.setdefault(key, _Saved())
        constants = self._constants

        def pack(t: Tensor) -> Any:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in constants:
                return t
            if ptr not in saved.storages:
                saved.storages[ptr] = storage.nbytes()
                self._grow(storage.nbytes())
            saved.tensors.append(t)
            saved.ptrs.append(ptr)
            return len(saved.tensors) - 1

        def unpack(handle: Any) -> Tensor:
            if isinstance(handle, Tensor):
                return handle
            found: Tensor | None = saved.tensors[handle]
            if found is None:
                raise RuntimeError(
                    f"saved activations of stage/micro-batch {key} used while evicted"
                )
            return found

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def _grow(self, nbytes: int) -> None:
        self.level += nbytes
        if self.level > self.peak:
            self.peak = self.level

    def bytes_of(self, key: Key) -> int:
        found = self._saved.get(key)
        return sum(found.storages.values()) if found else 0

    def release(self, key: Key) -> None:
        """The backward that needed ``key`` is done."""
        found = self._saved.pop(key, None)
        if found is not None and found.tensors and found.tensors[0] is not None:
            self.level -= sum(found.storages.values())

    # ------------------------------------------------------------------ BPipe
    def pack_for_transfer(self, key: Key) -> tuple[Tensor, StorageLayout]:
        """The micro-batch's storages as one uint8 buffer, and how to rebuild its tensors."""
        saved = self._saved[key]
        order = list(saved.storages)
        index = {ptr: i for i, ptr in enumerate(order)}
        owners: dict[int, Tensor] = {}
        views = []
        for tensor, ptr in zip(saved.tensors, saved.ptrs, strict=True):
            assert tensor is not None, f"{key} is already evicted"
            owners.setdefault(ptr, tensor)
            views.append(
                _View(
                    index[ptr],
                    tensor.dtype,
                    int(tensor.storage_offset()),
                    tuple(tensor.shape),
                    tuple(tensor.stride()),
                )
            )
        blobs = [
            torch.empty(0, dtype=torch.uint8)
            if not saved.storages[ptr]
            else torch.empty(0, dtype=torch.uint8).set_(owners[ptr].untyped_storage())
            for ptr in order
        ]
        buffer = torch.cat(blobs) if blobs else torch.empty(0, dtype=torch.uint8)
        layout = StorageLayout(tuple(saved.storages[p] for p in order), tuple(views))
        return buffer, layout

    def drop_local(self, key: Key) -> None:
        """After an EVICT's copy has left: this rank no longer holds the data."""
        saved = self._saved[key]
        self.level -= sum(saved.storages.values())
        saved.tensors = [None] * len(saved.tensors)

    def restore(self, key: Key, buffer: Tensor, layout: StorageLayout) -> None:
        """A LOAD brought the bytes back: rebuild the tensors as views of new storages."""
        saved = self._saved[key]
        storages = []
        offset = 0
        for nbytes in layout.nbytes:
            storages.append(buffer[offset : offset + nbytes].clone().untyped_storage())
            offset += nbytes
        saved.tensors = [
            torch.empty(0, dtype=v.dtype).set_(storages[v.storage], v.offset, v.size, v.stride)
            for v in layout.views
        ]
        self._grow(layout.total)

    def hold(self, key: Key, nbytes: int) -> None:
        """An acceptor holds ``nbytes`` of a pair rank's micro-batch."""
        self._held[key] = nbytes
        self._grow(nbytes)

    def unhold(self, key: Key) -> None:
        self.level -= self._held.pop(key, 0)
