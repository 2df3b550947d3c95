"""What a hardware profile must satisfy, wherever it comes from: ``POST /v1/hardware``, a
``hardware.json`` of a profile folder (``stagewright profiles load FOLDER``,
``STAGEWRIGHT_PROFILES``) or the bundled profiles. One model, so a value the service
refuses is refused from a file too, with the same message (a file's profile with zero
memory bandwidth used to load and then fail the first plan with a division by zero)."""

from __future__ import annotations

from typing import Annotated, Any, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from planner.errors import NO_NUL_PATTERN
from planner.specs import Precision

__all__ = [
    "HARDWARE_NAME_PATTERN",
    "HARDWARE_NAME_RULE",
    "ComputeSpec",
    "HardwareIn",
    "HardwareName",
    "Label",
    "LinkSpec",
    "Note",
]

HARDWARE_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
HARDWARE_NAME_RULE = (
    "hardware names are lower-case letters, digits, '.', '_' and '-' (at most 64, the "
    "first a letter or digit); GET /v1/hardware lists them"
)
HardwareName = Annotated[
    str,
    Field(
        pattern=HARDWARE_NAME_PATTERN,
        description="Hardware profile name: lower-case letters, digits, '.', '_' or '-' "
        "(at most 64), e.g. 'a100-sxm-80g'.",
    ),
]
Label = Annotated[str, Field(max_length=200, pattern=NO_NUL_PATTERN)]
Note = Annotated[str, Field(max_length=2000, pattern=NO_NUL_PATTERN)]


class _ApiModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _entries_at_most(limit: int) -> Any:
    """A validator that refuses an object of more than ``limit`` entries before any entry is
    checked: pydantic checks a dict's length only after all of its entries, so a 1 MB
    ``peak_flops`` of made-up precisions was 135,000 errors, and seconds to list them."""

    def check(value: Any) -> Any:
        if isinstance(value, dict) and len(value) > limit:
            raise PydanticCustomError(
                "too_long",
                "Dictionary should have at most {max_length} items, not {actual_length}",
                {"field_type": "Dictionary", "max_length": limit, "actual_length": len(value)},
            )
        return value

    return BeforeValidator(check)


_MAX_PARAMETERS = 256


class LinkSpec(_ApiModel):
    """One kind of link between devices."""

    kind: Label = Field(min_length=1, description="Link technology, e.g. 'nvlink3'.")
    bandwidth_gbps: float = Field(
        gt=0, le=1e6, description="GB/s (1e9 bytes/s), one direction, per device."
    )
    latency_us: float = Field(ge=0, le=1e6, description="Latency in microseconds.")


class ComputeSpec(_ApiModel):
    """A device's compute facts for the shape-aware layer model (from its datasheets)."""

    sm_count: int = Field(ge=1, le=100_000, description="Streaming multiprocessors.")
    l2_bandwidth_gbps: float | None = Field(
        default=None, gt=0, le=1e8, description="L2 read bandwidth, GB/s; null if unpublished."
    )
    gemm_tiles: list[
        tuple[Annotated[int, Field(ge=1, le=4096)], Annotated[int, Field(ge=1, le=4096)]]
    ] = Field(
        min_length=1,
        max_length=64,
        description="GEMM tile shapes [m, n] the device's libraries use, e.g. [[256, 128]].",
    )
    source: Note = Field(default="", description="Where the facts come from.")


class HardwareIn(_ApiModel):
    """A hardware profile to create or replace (POST /v1/hardware)."""

    name: HardwareName
    description: Note = Field(default="", description="What the hardware is.")
    peak_flops: Annotated[
        dict[Precision, Annotated[float, Field(gt=0, le=1e18)]],
        _entries_at_most(len(get_args(Precision))),
    ] = Field(
        min_length=1, description="Peak dense matrix FLOP/s per precision, e.g. {'bf16': 312e12}."
    )
    memory_gib: float = Field(gt=0, le=1e5, description="Device memory in GiB.")
    usable_memory_gib: float = Field(
        gt=0, le=1e5, description="Memory left for tensors after the runtime's own (GiB)."
    )
    memory_bandwidth_gbps: float = Field(gt=0, le=1e7, description="HBM bandwidth in GB/s.")
    intra_node: LinkSpec = Field(description="Link between devices of one node.")
    inter_node: LinkSpec = Field(description="Link between nodes, per device.")
    source: Note = Field(default="", description="Where the numbers come from.")
    compute: ComputeSpec | None = Field(
        default=None,
        description="SM count, L2 bandwidth and GEMM tiles for the shape-aware layer model; "
        "null prices GEMMs without tile and wave quantization.",
    )
    parameters: Annotated[
        dict[Annotated[str, Field(max_length=64)], float], _entries_at_most(_MAX_PARAMETERS)
    ] = Field(
        default_factory=dict,
        max_length=_MAX_PARAMETERS,
        description="Overrides of the cost model's free parameters, {name: value}; each name "
        "must be a registered parameter (e.g. 'gemm_efficiency') and each value within "
        "its bounds. Parameters not named keep their defaults.",
    )

    @field_validator("parameters")
    @classmethod
    def _known_parameters(cls, value: dict[str, float]) -> dict[str, float]:
        # Imported here: planner.costmodel's package imports the profiles, which import this.
        from planner.costmodel.parameters import check_parameter_values

        return check_parameter_values(value)

    @model_validator(mode="after")
    def _usable_fits(self) -> HardwareIn:
        if self.usable_memory_gib > self.memory_gib:
            raise ValueError(
                f"usable_memory_gib {self.usable_memory_gib} is more than memory_gib "
                f"{self.memory_gib}; usable memory is what is left of it"
            )
        return self
