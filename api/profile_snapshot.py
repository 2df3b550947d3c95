"""A profile snapshot as plain data: the profiles of one (gpu, revision), as the planner
reads them. Kept free of the database and web stack: search processes import it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from planner.profiles import HardwareProfile, JsonProfileStore, hardware_from_dict, points_from_dict

__all__ = ["Snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """The profiles of one (gpu, revision), as plain JSON data (it crosses processes)."""

    gpu: str
    revision: int
    hardware: dict[str, Any]
    layer_points: list[dict[str, Any]]

    def profile(self) -> HardwareProfile:
        return hardware_from_dict(self.hardware)

    def store(self) -> JsonProfileStore:
        """A profile store holding exactly this snapshot (what the planner reads)."""
        store = JsonProfileStore()
        store.add_hardware(self.profile())
        store.add_points(points_from_dict({"points": self.layer_points}))
        return store

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Snapshot:
        return cls(
            gpu=str(data["gpu"]),
            revision=int(data["revision"]),
            hardware=dict(data["hardware"]),
            layer_points=list(data["layer_points"]),
        )
