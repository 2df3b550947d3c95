"""The cost model's free parameters: every number the model assumes rather than derives.

Each one is declared once here as a :class:`FreeParameter` with its default, the bounds a
fit may move it within, its unit and where the default comes from. A hardware profile may
override any of them (``"parameters": {name: value}`` in its JSON, the store, or
``POST /v1/hardware``); the cost model reads them only through
``HardwareProfile.parameter(name)``, so a calibrated profile changes the predictions without
a code change, and ``planner.calibrate`` can fit any registered parameter.

To add one: declare it at the end of this module with :func:`register` (here, not in the
module that uses it, so that a profile naming it validates whatever was imported first),
read it with ``hw.parameter(name)``, and say in ``doc`` what it stands for. Nothing else
needs to know about it: the store, the REST API and the fitter take every registered name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from planner.errors import StagewrightError

__all__ = [
    "ALLOCATOR_FRAGMENTATION",
    "PARAMETERS",
    "ROOFLINE_EFFICIENCY",
    "WORKSPACE_GIB",
    "FreeParameter",
    "ParameterError",
    "check_parameter_values",
    "get_parameter",
    "register",
]


class ParameterError(StagewrightError):
    """A parameter value a profile or a request gives is unknown or out of its bounds."""


@dataclass(frozen=True)
class FreeParameter:
    """One named, bounded number of the cost model.

    ``default`` is what every profile uses unless it overrides the parameter; a fit moves it
    only within ``[lower, upper]``. ``unit`` is for people ('fraction of peak', 'GiB');
    ``source`` says where the default comes from; ``doc`` what the number stands for."""

    name: str
    default: float
    lower: float
    upper: float
    unit: str
    source: str
    doc: str

    def __post_init__(self) -> None:
        values = (self.default, self.lower, self.upper)
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"parameter {self.name}: default and bounds must be finite")
        if not self.lower <= self.default <= self.upper or self.lower >= self.upper:
            raise ValueError(
                f"parameter {self.name}: needs lower < upper and the default within them, "
                f"got {self.lower} <= {self.default} <= {self.upper}"
            )

    def check(self, value: object) -> float:
        """``value`` as a float if it is finite and within the bounds; ParameterError
        saying the allowed range otherwise."""
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ParameterError(
                f"parameter {self.name} must be a number ({self.unit}), got {value!r}"
            ) from None
        if not math.isfinite(number) or not self.lower <= number <= self.upper:
            raise ParameterError(
                f"parameter {self.name} = {value!r} is outside its bounds: give a value from "
                f"{self.lower:g} to {self.upper:g} ({self.unit})"
            )
        return number


_REGISTRY: dict[str, FreeParameter] = {}
PARAMETERS: Mapping[str, FreeParameter] = MappingProxyType(_REGISTRY)


def register(parameter: FreeParameter) -> FreeParameter:
    """Add ``parameter`` to the registry (once per name; registering the identical
    declaration again, as a re-imported module does, is a no-op)."""
    known = _REGISTRY.get(parameter.name)
    if known is not None and known != parameter:
        raise ValueError(f"parameter {parameter.name!r} is already registered differently")
    _REGISTRY[parameter.name] = parameter
    return parameter


def get_parameter(name: str) -> FreeParameter:
    """The declaration of ``name``; ParameterError listing the known names otherwise."""
    found = _REGISTRY.get(name)
    if found is None:
        raise ParameterError(
            f"unknown cost-model parameter {name!r}; known: {', '.join(sorted(_REGISTRY))}"
        )
    return found


def check_parameter_values(values: Mapping[str, object]) -> dict[str, float]:
    """Overrides as a profile may carry them, checked: every name registered, every value
    finite and within bounds. Returns them as floats, sorted by name."""
    return {name: get_parameter(name).check(values[name]) for name in sorted(values)}


ROOFLINE_EFFICIENCY = register(
    FreeParameter(
        name="roofline_efficiency",
        default=0.606,
        lower=0.05,
        upper=1.0,
        unit="fraction of peak FLOP/s",
        source="BPipe Table 3/4, GPT-3 13B forward on A100 (t = 1, micro-batch 1, sequence "
        "2048): 5 layers x 1.374 TFLOP in 36.32 ms = 189 TFLOP/s, 60.6% of 312 TFLOP/s",
        doc="Share of the device's peak matrix FLOP/s that layer passes reach when no "
        "measured layer point of the shape exists (the roofline fallback, also used for the "
        "output layer).",
    )
)
WORKSPACE_GIB = register(
    FreeParameter(
        name="workspace_gib",
        default=1.0,
        lower=0.0,
        upper=16.0,
        unit="GiB per device",
        source="assumption: cuBLAS/cuDNN workspaces (PyTorch's cuBLAS workspace alone is up "
        "to 32 MiB per stream), NCCL and all-gather buffers, the loss's fp32 logits copy",
        doc="Transient memory on every device on top of the tensors the memory model counts.",
    )
)
ALLOCATOR_FRAGMENTATION = register(
    FreeParameter(
        name="allocator_fragmentation",
        default=0.05,
        lower=0.0,
        upper=0.5,
        unit="fraction of counted tensor bytes",
        source="assumption (Megatron's own memory estimator ignores fragmentation)",
        doc="Memory the caching allocator holds but cannot reuse, as a share of the bytes of "
        "the tensors counted (weights, gradients, optimizer states, activations).",
    )
)
