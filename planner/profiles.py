"""Hardware and layer profiles, and the store interface the planner reads them through.

The planner sees profiles only through :class:`ProfileStore` (``hardware``,
``hardware_names``, ``layer_points``), implemented twice: :class:`JsonProfileStore` here,
which loads the bundled ``profiles/`` folder (``hardware.json`` and ``layers/*.json``)
and then every folder named in ``STAGEWRIGHT_PROFILES``, where ``stagewright profile``
writes the points it measures (:func:`save_point`); and the service's SQL store
(``api.store.profiles.SqlProfileStore``), which holds the same data with a revision per
hardware. :func:`default_store` is the JSON store, loaded once per process.

A :class:`HardwareProfile` is a device and its links: peak FLOP/s per precision, memory and
its bandwidth, intra- and inter-node :class:`Link`, optionally the datasheet facts the
shape-aware layer model needs (:class:`ComputeUnits`), and overrides of the cost model's free
parameters with the :class:`CalibrationRecord` of the fit that set them
(``planner.calibrate``). Every number names its source.

A *layer point* (:class:`LayerPoint`) is one measured (or published) timing of one
transformer layer of a given shape on a given device: forward, backward-for-input and
backward-for-weights milliseconds (or one fused backward), and optionally its
saved-activation bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.bundled import bundled_dir
from planner.errors import NO_NUL_RULE, StagewrightError, error_message, validation_problems
from planner.json_input import loads

if TYPE_CHECKING:
    from planner.hardware_spec import HardwareIn

__all__ = [
    "BUNDLED_PROFILES",
    "CalibrationRecord",
    "ComputeUnits",
    "HardwareProfile",
    "JsonProfileStore",
    "LayerPoint",
    "Link",
    "ProfileStore",
    "UnknownHardwareError",
    "compute_from_dict",
    "default_store",
    "extra_profile_dirs",
    "hardware_from_dict",
    "profile_from_spec",
    "hardware_to_dict",
    "point_to_dict",
    "save_point",
]

# The top-level profiles/ of a checkout, or the copy inside an installed wheel.
BUNDLED_PROFILES = bundled_dir("planner", "profiles")


class UnknownHardwareError(StagewrightError):
    """A request names a GPU that has no hardware profile."""


@dataclass(frozen=True)
class Link:
    """One kind of link: bandwidth in GB/s (one direction, per device) and latency in us."""

    kind: str
    bandwidth_gbps: float
    latency_us: float

    def seconds(self, num_bytes: float) -> float:
        return self.latency_us * 1e-6 + num_bytes / (self.bandwidth_gbps * 1e9)


class ExcludedMeasurement(BaseModel):
    """A measured quantity a fit left out as an outlier (``planner.calibrate.outliers``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    run_id: int | None = Field(description="Store id of the run (None outside a store).")
    quantity: str = Field(
        description="What the run measured: step_time_s, peak_memory_gib[device], "
        "forward_s, backward_s, backward_weight_s or weight_s."
    )
    measured: float = Field(description="The measured value (seconds or GiB).")
    predicted: float = Field(description="The fitted model's prediction of it.")


class CalibrationRecord(BaseModel):
    """How a profile's parameters were last fitted to measured runs (``planner.calibrate``).

    A fit error is the root mean square of ln(predicted / measured) over the runs' measured
    quantities: 0.10 means predictions off by about 10%."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    fitted_at: str = Field(description="When the fit ran (ISO 8601, UTC).")
    num_runs: int = Field(ge=0, description="Measured runs the fit used.")
    rms_log_error: float = Field(ge=0, description="Fit error after the fit.")
    rms_log_error_before: float = Field(
        ge=0, description="Fit error with the parameters the fit started from."
    )
    fitted: list[str] = Field(
        default_factory=list, description="Parameters the runs informed and the fit set."
    )
    uninformed: list[str] = Field(
        default_factory=list,
        description="Parameters left at their value: no run's prediction depends on them.",
    )
    run_ids: list[int] = Field(default_factory=list, description="Store ids of the runs used.")
    excluded: list[ExcludedMeasurement] = Field(
        default_factory=list,
        description="Measured quantities of those runs left out of the fit as outliers: the "
        "fitted model misses them by more than 3 robust standard deviations of its errors.",
    )
    revision: int | None = Field(
        default=None, description="The hardware revision the fit produced (None outside a store)."
    )

    @classmethod
    def from_dict(cls, data: object) -> CalibrationRecord:
        """The record of a profile JSON or a store row; StagewrightError saying what is
        wrong otherwise."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise StagewrightError(
                f"calibration record is not valid: {validation_problems(exc, 'record')}"
            ) from None


@dataclass(frozen=True)
class ComputeUnits:
    """Facts about a device's compute that the shape-aware layer model needs (from the
    vendor's datasheets and whitepapers, never fitted): streaming multiprocessors, L2 read
    bandwidth (None where unpublished: then no tile is limited by it) and the GEMM tile
    shapes its libraries use."""

    sm_count: int
    l2_bandwidth_gbps: float | None
    gemm_tiles: tuple[tuple[int, int], ...]
    source: str

    def to_dict(self) -> dict[str, object]:
        return {
            "sm_count": self.sm_count,
            "l2_bandwidth_gbps": self.l2_bandwidth_gbps,
            "gemm_tiles": [list(tile) for tile in self.gemm_tiles],
            "source": self.source,
        }


@dataclass(frozen=True)
class HardwareProfile:
    """A device and its links. ``parameters`` overrides the cost model's free parameters
    (``planner.costmodel.parameters``) for this device: names must be registered and values
    within their bounds (checked here). ``calibration`` says how they were fitted, if they
    were."""

    name: str
    description: str
    peak_flops: dict[str, float]
    memory_gib: float
    usable_memory_gib: float
    memory_bandwidth_gbps: float
    intra_node: Link
    inter_node: Link
    source: str
    compute: ComputeUnits | None = None
    parameters: Mapping[str, float] = field(default_factory=dict)
    calibration: CalibrationRecord | None = None

    def __post_init__(self) -> None:
        # Imported here: planner.costmodel's package imports this module.
        from planner.costmodel.parameters import ParameterError, check_parameter_values

        try:
            checked = check_parameter_values(self.parameters)
        except ParameterError as exc:
            raise ParameterError(f"hardware profile {self.name!r}: {exc}") from None
        object.__setattr__(self, "parameters", checked)

    def parameter(self, name: str) -> float:
        """The value of cost-model parameter ``name`` on this device: the profile's override,
        else the declared default. ParameterError for an unregistered name."""
        value = self.parameters.get(name)
        if value is not None:
            return value
        from planner.costmodel.parameters import get_parameter

        return get_parameter(name).default

    def parameter_values(self) -> dict[str, float]:
        """Every registered parameter's value on this device (overrides and defaults)."""
        from planner.costmodel.parameters import PARAMETERS

        return {name: self.parameter(name) for name in sorted(PARAMETERS)}

    def with_parameters(
        self, values: Mapping[str, float], calibration: CalibrationRecord | None = None
    ) -> HardwareProfile:
        """A copy with ``values`` overriding (on top of this profile's own overrides) and,
        if given, a new calibration record."""
        return replace(
            self,
            parameters={**self.parameters, **values},
            calibration=calibration if calibration is not None else self.calibration,
        )

    def peak(self, precision: str) -> float:
        """Peak dense FLOP/s at ``precision``; raises with the supported ones if absent."""
        value = self.peak_flops.get(precision)
        if value is None:
            raise StagewrightError(
                f"{self.name} has no {precision} matrix units; use one of "
                f"{', '.join(sorted(self.peak_flops))}"
            )
        return value


@dataclass(frozen=True)
class LayerPoint:
    """One timing of one transformer layer (per micro-batch, on one tensor-parallel rank).

    ``weight_ms`` is None when only a fused backward was measured (``backward_ms`` is then
    B + W). ``includes_tp_comm`` says whether the tensor-parallel collectives are inside the
    times (they are when measured on t ranks)."""

    gpu: str
    precision: str
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    micro_batch_size: int
    t: int
    recompute: str
    sequence_parallel: bool
    flash_attention: bool
    forward_ms: float
    backward_ms: float
    weight_ms: float | None
    activation_bytes: float | None
    includes_tp_comm: bool
    source: str
    first_stage_extra_bytes: float | None = None
    last_stage_extra_bytes: float | None = None

    def shape_key(self) -> tuple[object, ...]:
        """Everything but micro-batch size and sequence length: points with the same key can
        be interpolated between."""
        return (
            self.gpu,
            self.precision,
            self.hidden_size,
            self.num_attention_heads,
            self.ffn_hidden_size,
            self.t,
            self.recompute,
            self.sequence_parallel,
            self.flash_attention,
        )

    def row_key(self) -> tuple[object, ...]:
        """What identifies a stored point: its shape, sequence length and micro-batch size (a
        second point of the same key replaces the first)."""
        return (self.shape_key(), self.seq_length, self.micro_batch_size)

    def shape_problem(self) -> str | None:
        """Why no model has a layer of this shape, or None: the checks of a plan request's
        model (:class:`planner.specs.ModelSpec`: sizes of at least 1, hidden_size a
        multiple of the heads), in its words, and t splitting the layer as the search
        requires of every tensor-parallel degree it tries (the heads, the MLP and, with
        sequence parallelism, the sequence: ``ModelSpec.tensor_split_problems``). The
        service and the profile files refuse such a point alike."""
        # Imported here: planner.specs loads the schedule registry, which a profile file's
        # reader does not otherwise need.
        from planner.specs import ModelSpec

        try:
            model = ModelSpec(
                name="layer point",
                num_layers=1,
                vocab_size=1,
                hidden_size=self.hidden_size,
                num_attention_heads=self.num_attention_heads,
                ffn_hidden_size=self.ffn_hidden_size,
                seq_length=self.seq_length,
            )
        except ValidationError as exc:
            return "; ".join(
                ".".join(map(str, err["loc"])) + ": " + error_message(err)
                if err["loc"]
                else error_message(err)
                for err in exc.errors()
            )
        uneven = model.tensor_split_problems(self.t, split_sequence=self.sequence_parallel)
        if not uneven:
            return None
        return (
            f"t = {self.t} does not divide "
            + " or ".join(f"{name} {size}" for name, size in uneven.items())
            + ": t tensor-parallel ranks split the heads and the MLP (and, with "
            f"sequence_parallel, the sequence), so no model runs a layer of this shape at "
            f"t = {self.t}; give the t the point was measured at, or correct the sizes"
        )


class ProfileStore(Protocol):
    """What the planner needs from wherever profiles are kept."""

    def hardware(self, name: str) -> HardwareProfile:
        """The profile called ``name``; raises UnknownHardwareError listing known names."""
        ...

    def hardware_names(self) -> list[str]: ...

    def layer_points(self, gpu: str) -> Sequence[LayerPoint]:
        """Every layer point measured on ``gpu``."""
        ...


@dataclass
class JsonProfileStore:
    """Profiles from JSON files (the bundled ``profiles/`` by default) plus added points."""

    _hardware: dict[str, HardwareProfile] = field(default_factory=dict)
    _points: list[LayerPoint] = field(default_factory=list)

    @classmethod
    def load(cls, *folders: Path) -> JsonProfileStore:
        """Profiles from ``folders`` (default: the bundled ones, then each folder named in
        ``STAGEWRIGHT_PROFILES``, os.pathsep-separated, where `stagewright profile` writes).
        Each folder may hold ``hardware.json`` and ``layers/*.json``; later folders add
        points and override hardware of the same name."""
        store = cls()
        for folder in folders or (BUNDLED_PROFILES, *extra_profile_dirs()):
            hardware_file = folder / "hardware.json"
            if hardware_file.is_file():
                with _naming_the_file(hardware_file):
                    entries = _read(hardware_file)["hardware"]
                    if not isinstance(entries, list) or not all(
                        isinstance(entry, dict) for entry in entries
                    ):
                        raise ValueError("'hardware' must be a list of objects, one per GPU")
                    hardware = [hardware_from_dict(entry) for entry in entries]
                for profile in hardware:
                    store.add_hardware(profile)
            layers_dir = folder / "layers"
            if layers_dir.is_dir():
                for path in sorted(layers_dir.glob("*.json")):
                    with _naming_the_file(path):
                        points = points_from_dict(_read(path))
                    store.add_points(points)
        return store

    def add_hardware(self, profile: HardwareProfile) -> None:
        self._hardware[profile.name] = profile

    def add_points(self, points: Iterable[LayerPoint]) -> None:
        self._points.extend(points)

    def hardware(self, name: str) -> HardwareProfile:
        found = self._hardware.get(name)
        if found is None:
            raise UnknownHardwareError(
                f"unknown GPU {name!r}; known hardware profiles: {', '.join(self.hardware_names())}"
            )
        return found

    def hardware_names(self) -> list[str]:
        return sorted(self._hardware)

    def layer_points(self, gpu: str) -> Sequence[LayerPoint]:
        return [p for p in self._points if p.gpu == gpu]

    def all_layer_points(self) -> Sequence[LayerPoint]:
        """Every point of every GPU, in the order the folders gave them."""
        return list(self._points)


def _read(path: Path) -> Any:
    return loads(path.read_text(encoding="utf-8"))


@contextmanager
def _naming_the_file(path: Path) -> Iterator[None]:
    """Turn what a hand-edited profile file can get wrong (it does not parse, a key is
    missing or repeated, a value has the wrong type) into one error naming the file: the
    profile folders (``STAGEWRIGHT_PROFILES``, ``stagewright profile --out``) are files a
    person may edit, and a traceback said neither which file nor what to change."""
    try:
        yield
    except OSError as exc:
        raise StagewrightError(f"cannot read the profile file {path}: {exc.strerror}") from None
    except KeyError as exc:
        raise StagewrightError(
            f"the profile file {path} lacks the field {exc.args[0]!r}; add it (see the "
            "bundled profiles/ for the fields each entry takes)"
        ) from None
    except (ValueError, TypeError, StagewrightError) as exc:
        raise StagewrightError(f"the profile file {path} cannot be used: {exc}") from None


def hardware_from_dict(entry: dict[str, object]) -> HardwareProfile:
    """A hardware profile from one entry of a ``hardware.json`` file (or a stored row):
    its fields are checked against the same model ``POST /v1/hardware`` takes
    (:class:`planner.hardware_spec.HardwareIn`: a lower-case name, positive memory and
    bandwidths, usable memory within the memory, known parameters within their bounds, no
    unknown field), plus the ``calibration`` record a fitted profile carries.
    StagewrightError naming the profile and every invalid field otherwise."""
    # Imported here: planner.specs, which the model reads its precisions from, loads the
    # schedule registry, which a profile file's reader does not otherwise need.
    from planner.hardware_spec import HardwareIn

    if not isinstance(entry, dict):
        raise StagewrightError("a hardware entry must be an object, one per GPU")
    fields = {key: value for key, value in entry.items() if key != "calibration"}
    try:
        spec = HardwareIn.model_validate(fields)
    except ValidationError as exc:
        name = entry.get("name")
        which = f"hardware profile {name!r}" if isinstance(name, str) else "a hardware entry"
        raise StagewrightError(f"{which}: {validation_problems(exc, 'entry')}") from None
    calibration = entry.get("calibration")
    record = None if calibration is None else CalibrationRecord.from_dict(calibration)
    return profile_from_spec(spec, record)


def profile_from_spec(
    spec: HardwareIn, calibration: CalibrationRecord | None = None
) -> HardwareProfile:
    """The profile a checked hardware model (a ``POST /v1/hardware`` body, or a
    ``hardware.json`` entry read by :func:`hardware_from_dict`) describes."""
    return HardwareProfile(
        name=spec.name,
        description=spec.description,
        peak_flops={str(key): value for key, value in spec.peak_flops.items()},
        memory_gib=spec.memory_gib,
        usable_memory_gib=spec.usable_memory_gib,
        memory_bandwidth_gbps=spec.memory_bandwidth_gbps,
        intra_node=Link(
            spec.intra_node.kind, spec.intra_node.bandwidth_gbps, spec.intra_node.latency_us
        ),
        inter_node=Link(
            spec.inter_node.kind, spec.inter_node.bandwidth_gbps, spec.inter_node.latency_us
        ),
        source=spec.source,
        parameters=dict(spec.parameters),
        calibration=calibration,
        compute=None
        if spec.compute is None
        else ComputeUnits(
            sm_count=spec.compute.sm_count,
            l2_bandwidth_gbps=spec.compute.l2_bandwidth_gbps,
            gemm_tiles=tuple((m, n) for m, n in spec.compute.gemm_tiles),
            source=spec.compute.source,
        ),
    )


def hardware_to_dict(profile: HardwareProfile) -> dict[str, object]:
    """A hardware profile as one entry of a ``hardware.json`` file: what
    :func:`hardware_from_dict` reads back into an equal profile (a test checks every field
    round-trips, so a field added to the profile must be added here)."""

    def link(value: Link) -> dict[str, object]:
        return {
            "kind": value.kind,
            "bandwidth_gbps": value.bandwidth_gbps,
            "latency_us": value.latency_us,
        }

    return {
        "name": profile.name,
        "description": profile.description,
        "peak_flops": dict(profile.peak_flops),
        "memory_gib": profile.memory_gib,
        "usable_memory_gib": profile.usable_memory_gib,
        "memory_bandwidth_gbps": profile.memory_bandwidth_gbps,
        "intra_node": link(profile.intra_node),
        "inter_node": link(profile.inter_node),
        "source": profile.source,
        "parameters": dict(profile.parameters),
        "calibration": None
        if profile.calibration is None
        else profile.calibration.model_dump(mode="json"),
        "compute": None if profile.compute is None else profile.compute.to_dict(),
    }


def compute_from_dict(value: object) -> ComputeUnits | None:
    """The ``compute`` block of a hardware profile (None when absent); StagewrightError
    naming the field when it is malformed."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise StagewrightError("hardware profile 'compute' must be an object")
    try:
        tiles = tuple((int(m), int(n)) for m, n in value["gemm_tiles"])
        l2 = value.get("l2_bandwidth_gbps")
        units = ComputeUnits(
            sm_count=int(value["sm_count"]),
            l2_bandwidth_gbps=None if l2 is None else float(l2),
            gemm_tiles=tiles,
            source=str(value.get("source", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StagewrightError(
            "hardware profile 'compute' needs sm_count (a positive integer), gemm_tiles "
            f"(a list of [m, n] pairs) and optionally l2_bandwidth_gbps: {exc}"
        ) from None
    if units.sm_count < 1 or not tiles or any(m < 1 or n < 1 for m, n in tiles):
        raise StagewrightError(
            "hardware profile 'compute': sm_count and every tile size must be positive, "
            "with at least one tile"
        )
    if units.l2_bandwidth_gbps is not None and units.l2_bandwidth_gbps <= 0:
        raise StagewrightError("hardware profile 'compute': l2_bandwidth_gbps must be positive")
    return units


def points_from_dict(data: dict[str, object]) -> list[LayerPoint]:
    """A layer-profile file: shared fields at the top level, one entry per point."""
    shared = {k: v for k, v in data.items() if k not in ("points", "format", "notes")}
    points = []
    raw_points = data["points"]
    if not isinstance(raw_points, list) or not all(isinstance(r, dict) for r in raw_points):
        raise ValueError("'points' must be a list of objects, one per measured point")
    for index, raw in enumerate(raw_points):
        merged = {**shared, **raw}
        point = LayerPoint(
            gpu=str(merged["gpu"]),
            precision=str(merged.get("precision", "bf16")),
            hidden_size=int(merged["hidden_size"]),
            num_attention_heads=int(merged["num_attention_heads"]),
            ffn_hidden_size=int(merged.get("ffn_hidden_size") or 4 * int(merged["hidden_size"])),
            seq_length=int(merged["seq_length"]),
            micro_batch_size=int(merged["micro_batch_size"]),
            t=int(merged.get("t", 1)),
            recompute=str(merged.get("recompute", "none")),
            sequence_parallel=bool(merged.get("sequence_parallel", False)),
            flash_attention=bool(merged.get("flash_attention", False)),
            forward_ms=float(merged["forward_ms"]),
            backward_ms=float(merged["backward_ms"]),
            weight_ms=None if merged.get("weight_ms") is None else float(merged["weight_ms"]),
            activation_bytes=None
            if merged.get("activation_bytes") is None
            else float(merged["activation_bytes"]),
            includes_tp_comm=bool(merged.get("includes_tp_comm", True)),
            source=str(merged.get("source", "")),
            first_stage_extra_bytes=_optional(merged.get("first_stage_extra_bytes")),
            last_stage_extra_bytes=_optional(merged.get("last_stage_extra_bytes")),
        )
        # What POST /v1/profiles refuses, a file's point is refused for too.
        problem = point.shape_problem()
        if problem is None and "\x00" in point.source:
            problem = f"source: {NO_NUL_RULE}"
        if problem is not None:
            raise StagewrightError(f"point {index}: {problem}")
        points.append(point)
    return points


def _optional(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def point_to_dict(point: LayerPoint) -> dict[str, object]:
    """A layer point as one self-contained entry of a layer-profile file."""
    return {
        "gpu": point.gpu,
        "precision": point.precision,
        "hidden_size": point.hidden_size,
        "num_attention_heads": point.num_attention_heads,
        "ffn_hidden_size": point.ffn_hidden_size,
        "seq_length": point.seq_length,
        "micro_batch_size": point.micro_batch_size,
        "t": point.t,
        "recompute": point.recompute,
        "sequence_parallel": point.sequence_parallel,
        "flash_attention": point.flash_attention,
        "forward_ms": point.forward_ms,
        "backward_ms": point.backward_ms,
        "weight_ms": point.weight_ms,
        "activation_bytes": point.activation_bytes,
        "first_stage_extra_bytes": point.first_stage_extra_bytes,
        "last_stage_extra_bytes": point.last_stage_extra_bytes,
        "includes_tp_comm": point.includes_tp_comm,
        "source": point.source,
    }


def extra_profile_dirs() -> list[Path]:
    """Folders named by the STAGEWRIGHT_PROFILES environment variable."""
    value = os.environ.get("STAGEWRIGHT_PROFILES", "")
    return [Path(part) for part in value.split(os.pathsep) if part]


def save_point(point: LayerPoint, folder: Path) -> Path:
    """Add (or replace: same gpu, shape, mb, t and switches) a measured point in
    ``folder/layers/<gpu>-measured.json``; returns the file."""
    path = folder / "layers" / f"{point.gpu}-measured.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "format": "stagewright.layers/1",
        "notes": "Measured with `stagewright profile`.",
        "points": [],
    }
    if path.is_file():
        with _naming_the_file(path):
            data = _read(path)
            stored = points_from_dict(data)
    else:
        stored = []
    points = [p for p in stored if p.row_key() != point.row_key()]
    points.append(point)
    data["points"] = [point_to_dict(p) for p in points]
    path.write_text(json.dumps(data, indent=1))
    return path


_DEFAULT: JsonProfileStore | None = None


def default_store() -> JsonProfileStore:
    """The bundled profiles, loaded once per process."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = JsonProfileStore.load()
    return _DEFAULT
