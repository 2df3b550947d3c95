"""Specs: the JSON a person sends (PlanRequest) and what the planner answers (Plan).

One set of pydantic v2 models serves the CLI, the REST API and the store; nothing else defines
these shapes. Models are frozen and reject unknown fields, so a typo is an error, not a
silently ignored setting. Messages say what to change.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from planner.schedules import (
    MEMORY_LIMIT,
    SCHEDULE_NAMES,
    Runtime,
    Semantics,
    families,
    schedule_family,
)

__all__ = [
    "DEFAULT_MICRO_BATCH_SIZES",
    "SCHEDULES",
    "Candidate",
    "CandidateConfig",
    "ClusterSpec",
    "LandscapePoint",
    "Launch",
    "ModelSpec",
    "Plan",
    "PlanRequest",
    "PlanStats",
    "Predicted",
    "Precision",
    "Recompute",
    "RecomputeSplit",
    "RefinementInfo",
    "RuntimeChoice",
    "Rejected",
    "ScheduleName",
    "ScheduleSummary",
    "SearchSpec",
    "SolverStatus",
    "StageBreakdown",
    "TrainingSpec",
    "default_schedules",
]

Precision = Literal["bf16", "fp16", "fp32"]
SolverStatus = Literal["optimal", "feasible", "timed out", "infeasible"]
Recompute = Literal["none", "selective", "full"]
TimeSource = Literal[
    "measured point", "scaled measurement", "calibrated model", "uncalibrated model"
]


def _registered(name: str) -> str:
    schedule_family(name)  # raises ScheduleConfigError (a ValueError) naming the known ones
    return name


ScheduleName = Annotated[
    str,
    AfterValidator(_registered),
    WithJsonSchema({"type": "string", "enum": list(SCHEDULE_NAMES)}),
]
"""A registered schedule's name (:mod:`planner.schedules`)."""
SCHEDULES: tuple[str, ...] = SCHEDULE_NAMES
DEFAULT_MICRO_BATCH_SIZES = (1, 2, 4, 8)  # searched when a request gives none
RuntimeChoice = Literal["any", "megatron", "torch", "stagewright"]


def default_schedules(*, allow_stale_weights: bool) -> list[str]:
    """The schedules a request that names none searches: every registered synchronous one,
    and the stale-weight ones when allowed."""
    return [
        family.name
        for family in families()
        if family.semantics == "synchronous" or allow_stale_weights
    ]


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelSpec(_Spec):
    """A decoder-only transformer: the shapes that set FLOPs, parameters and activations.

    The defaults describe GPT as Megatron-LM builds it by default (multi-head attention, a
    GeLU MLP of 4h, LayerNorm, learned positions, the output layer tied to the word
    embedding); Llama-style models set ``num_query_groups`` (grouped-query attention),
    ``activation`` swiglu, ``normalization`` rmsnorm, ``position_embedding`` rope,
    ``untie_embeddings_and_output_weights`` and ``add_bias_linear`` false."""

    name: str = Field(
        description="A label for the model, e.g. 'gpt3-96b'.", min_length=1, max_length=200
    )
    num_layers: int = Field(description="Transformer layers (L).", ge=1)
    hidden_size: int = Field(description="Hidden size (h).", ge=1)
    num_attention_heads: int = Field(description="Attention (query) heads (a).", ge=1)
    num_query_groups: int | None = Field(
        default=None,
        ge=1,
        description="Key/value heads (g) of grouped-query attention: every a / g query heads "
        "share one key and one value head. null means g = a (multi-head attention); 1 is "
        "multi-query attention. Must divide num_attention_heads.",
    )
    ffn_hidden_size: int | None = Field(
        default=None,
        description="MLP inner size (f); with swiglu the width of each of the gate and up "
        "projections. null means 4 x hidden_size for gelu and, as Megatron-LM sets it, "
        "int(8 x hidden_size / 3 / 64) x 64 for swiglu.",
        ge=1,
    )
    activation: Literal["gelu", "swiglu"] = Field(
        default="gelu",
        description="MLP: gelu (two matrices, h x f and f x h) or swiglu (a gated MLP of "
        "three: gate and up h x f, down f x h).",
    )
    normalization: Literal["layernorm", "rmsnorm"] = Field(
        default="layernorm",
        description="layernorm (scale and shift) or rmsnorm (scale only).",
    )
    position_embedding: Literal["learned", "rope"] = Field(
        default="learned",
        description="learned (a seq_length x h table added to the word embedding) or rope "
        "(rotary embeddings applied to queries and keys; no table).",
    )
    untie_embeddings_and_output_weights: bool = Field(
        default=False,
        description="The output layer has its own V x h matrix instead of reusing the word "
        "embedding.",
    )
    add_bias_linear: bool = Field(
        default=True,
        description="Biases on the linear layers (GPT has them; Llama has none).",
    )
    seq_length: int = Field(description="Tokens per sample (s).", ge=1)
    vocab_size: int = Field(description="Vocabulary size (V).", ge=1)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelSpec:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}; each head needs hidden_size / heads dimensions"
            )
        return self

    @model_validator(mode="after")
    def _groups_divide_heads(self) -> ModelSpec:
        groups = self.num_query_groups
        if groups is not None and self.num_attention_heads % groups:
            raise ValueError(
                f"num_query_groups {groups} does not divide num_attention_heads "
                f"{self.num_attention_heads}; each key/value head serves the same number of "
                f"query heads: choose a divisor of {self.num_attention_heads}, or null for "
                f"multi-head attention"
            )
        if self.activation == "swiglu" and self.ffn_hidden_size is None and self.ffn < 1:
            raise ValueError(
                f"hidden_size {self.hidden_size} is too small for the default swiglu MLP "
                f"(int(8h / 3 / 64) x 64 = 0); give ffn_hidden_size"
            )
        return self

    @property
    def ffn(self) -> int:
        """f: the MLP width (each of swiglu's gate and up projections)."""
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.activation == "swiglu":
            # Megatron-LM's default (megatron/training/arguments.py, validate_args): 2/3 of
            # 4h, so three matrices hold about as many parameters as GeLU's two, in
            # multiples of 64.
            return int((4 * self.hidden_size * 2 / 3) / 64) * 64
        return 4 * self.hidden_size

    @property
    def query_groups(self) -> int:
        """g: key/value heads (a without grouped-query attention)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """Width of the keys (and of the values): g x h / a."""
        return self.query_groups * (self.hidden_size // self.num_attention_heads)

    @property
    def gated(self) -> bool:
        """Whether the MLP is gated (swiglu: three matrices, fc1 produces 2f)."""
        return self.activation == "swiglu"


class ClusterSpec(_Spec):
    """Which GPUs and how many: ``gpu`` names a hardware profile."""

    gpu: str = Field(
        description="Hardware profile name, e.g. 'a100-sxm-80g' or 'cpu'.",
        min_length=1,
        max_length=64,
    )
    num_nodes: int = Field(description="Nodes in the cluster.", ge=1)
    gpus_per_node: int = Field(description="GPUs (devices) per node.", ge=1)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


class TrainingSpec(_Spec):
    """How the model is trained: batch, precision, optimizer and memory-saving switches."""

    global_batch_size: int = Field(description="Samples per optimizer step (B).", ge=1)
    precision: Precision = Field(default="bf16", description="Compute precision.")
    optimizer: Literal["adam", "sgd"] = Field(default="adam", description="Optimizer.")
    distributed_optimizer: bool = Field(
        default=True,
        description="Shard optimizer states over data-parallel ranks (ZeRO-1, Megatron's "
        "distributed optimizer).",
    )
    sequence_parallel: bool = Field(
        default=True, description="Megatron sequence parallelism with tensor parallelism."
    )
    flash_attention: bool = Field(
        default=False, description="Flash attention (no s x s attention activations saved)."
    )


class SearchSpec(_Spec):
    """What the search may choose from."""

    schedules: list[ScheduleName] = Field(
        default_factory=lambda: default_schedules(allow_stale_weights=False),
        description="Pipeline schedules to consider. Omitted: every registered schedule that "
        "trains like a single process (synchronous), and with allow_stale_weights also the "
        "ones that update weights from stale gradients.",
        min_length=1,
    )
    runtime: RuntimeChoice = Field(
        default="any",
        description="Who will run the plan: only candidates that runtime can run as planned "
        "are returned (megatron: Megatron-LM; torch: torch.distributed.pipelining; "
        "stagewright: the bundled executor); any: no constraint. Every candidate lists the "
        "runtimes that can run it.",
    )
    allow_stale_weights: bool = Field(
        default=False,
        description="Allow schedules that update weights from gradients of older weights "
        "(PipeDream-2BW's 1-stale update): they change the training, not only its speed, so "
        "a request opts in.",
    )
    recompute: list[Recompute] = Field(
        default_factory=lambda: list[Recompute](["none", "selective", "full"]),
        description="Activation recomputation modes to consider.",
        min_length=1,
    )
    micro_batch_sizes: list[int] | None = Field(
        default=None,
        description="Micro-batch sizes to consider; null means 1, 2, 4, 8 (those that divide "
        "the batch).",
    )
    context_parallel: list[int] | None = Field(
        default=None,
        description="Context-parallel degrees (cp) to consider: the sequence of each sample "
        "is split over cp ranks and attention runs as a ring passing key/value chunks. null "
        "means 1 without flash attention (Megatron-LM runs context parallelism only through "
        "its flash/fused attention) and, with it, also every cp > 1 that keeps t x cp inside "
        "one node.",
    )
    method: Literal["grid", "cpsat"] = Field(default="grid", description="Search method.")
    time_limit_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Budget for the CP-SAT refinement of one request (method cpsat), in "
        "seconds; each model gets at most 2 s of it.",
    )
    top_k: int = Field(default=10, description="Ranked candidates to return.", ge=1, le=1000)

    @model_validator(mode="before")
    @classmethod
    def _default_schedules(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("schedules") is None:
            stale = bool(data.get("allow_stale_weights", False))
            return {**data, "schedules": default_schedules(allow_stale_weights=stale)}
        return data

    @model_validator(mode="after")
    def _stale_only_when_allowed(self) -> SearchSpec:
        if self.allow_stale_weights:
            return self
        for name in self.schedules:
            family = schedule_family(name)
            if family.semantics != "synchronous":
                raise ValueError(
                    f"{name} ({family.title}) updates weights from stale gradients, which "
                    f"changes the training, not only its speed; set search.allow_stale_weights "
                    f"to true to search it, or leave it out of search.schedules"
                )
        return self

    @field_validator("schedules", "recompute")
    @classmethod
    def _no_duplicates(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"{value} lists an entry twice; list each once")
        return value

    @field_validator("context_parallel")
    @classmethod
    def _context_parallel_sizes(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return value
        if not value:
            raise ValueError(
                "context_parallel is empty; give at least one degree (1: none) or null"
            )
        if any(v < 1 for v in value):
            raise ValueError(f"context_parallel degrees must be positive, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"context_parallel {value} lists a degree twice")
        return sorted(value)

    @field_validator("micro_batch_sizes")
    @classmethod
    def _positive_sizes(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("micro_batch_sizes is empty; give at least one size or null")
        if any(v < 1 for v in value):
            raise ValueError(f"micro_batch_sizes must be positive, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"micro_batch_sizes {value} lists a size twice")
        return sorted(value)


class PlanRequest(_Spec):
    """A plan request: the same JSON for the CLI and REST."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    search: SearchSpec = Field(default_factory=SearchSpec)

    @model_validator(mode="after")
    def _batch_can_be_split(self) -> PlanRequest:
        sizes = self.search.micro_batch_sizes or list(DEFAULT_MICRO_BATCH_SIZES)
        batch = self.training.global_batch_size
        # Some (mb, d) with batch % (mb x d) == 0 exists exactly when some mb divides the
        # batch, since d = 1 always divides the GPU count: no loop over the GPUs (a
        # request may name billions of them, and validation must stay instant).
        self._context_parallel_can_run()
        if not any(batch % mb == 0 for mb in sizes):
            raise ValueError(
                f"global_batch_size {batch} is not divisible by micro_batch_size x "
                f"data-parallel degree for any micro-batch size in {sizes}; choose a batch "
                f"that is a multiple of one of them"
            )
        return self

    def _context_parallel_can_run(self) -> None:
        """An explicit cp > 1 needs flash attention and a sequence Megatron-LM can split."""
        wanted = [c for c in self.search.context_parallel or [] if c > 1]
        if not wanted:
            return
        if not self.training.flash_attention:
            raise ValueError(
                f"search.context_parallel {self.search.context_parallel} asks for context "
                f"parallelism, which Megatron-LM runs only with flash (or fused) attention: "
                f"set training.flash_attention to true, or search context_parallel [1]"
            )
        s = self.model.seq_length
        bad = [c for c in wanted if s % (2 * c)]
        if bad:
            raise ValueError(
                f"seq_length {s} is not a multiple of 2 x cp for cp in {bad}: context "
                f"parallelism splits each sequence into 2 x cp chunks (two per rank, to balance "
                f"the causal mask); choose degrees with s divisible by 2 x cp"
            )


class RecomputeSplit(_Spec):
    """Layers of one stage per recompute mode."""

    none: int = Field(default=0, ge=0, description="Layers that keep all activations.")
    selective: int = Field(default=0, ge=0, description="Layers recomputing attention only.")
    full: int = Field(default=0, ge=0, description="Layers recomputed whole.")

    @property
    def total(self) -> int:
        return self.none + self.selective + self.full

    def as_dict(self) -> dict[Recompute, int]:
        counts: dict[Recompute, int] = {
            "none": self.none,
            "selective": self.selective,
            "full": self.full,
        }
        return {mode: n for mode, n in counts.items() if n}


class CandidateConfig(_Spec):
    """One point of the search space, as Megatron would be launched with it."""

    t: int = Field(description="Tensor-parallel degree.", ge=1)
    p: int = Field(description="Pipeline-parallel degree (devices in a pipeline).", ge=1)
    d: int = Field(description="Data-parallel degree.", ge=1)
    cp: int = Field(
        default=1,
        ge=1,
        description="Context-parallel degree: each sample's sequence is split over cp ranks "
        "(ring attention); world size = t x cp x p x d.",
    )
    micro_batch_size: int = Field(description="Samples per micro-batch.", ge=1)
    num_microbatches: int = Field(description="Micro-batches per pipeline per step.", ge=1)
    recompute: Recompute = Field(description="Activation recomputation mode.")
    schedule: ScheduleName = Field(description="Pipeline schedule.")
    layers_per_stage: list[int] = Field(
        description="Transformer layers of each pipeline stage, in stage order (2p stages for "
        "V schedules, p x chunks for interleaved)."
    )
    recompute_per_stage: list[RecomputeSplit] | None = Field(
        default=None,
        description="Per stage, how many of its layers use each recompute mode (what CP-SAT "
        "refinement chooses); null means every layer uses ``recompute``, which otherwise "
        "names the heaviest mode used.",
    )
    memory_limit: float | None = Field(
        default=None,
        gt=0,
        description="For a schedule built for a memory limit (v-adaptive, zb-adaptive): the "
        "activation memory each device could still hold, as a fraction of 1F1B's peak, that "
        "the schedule was built for; null for the others (and for a point rejected before "
        "its limit was known).",
    )

    @model_validator(mode="after")
    def _limit_where_the_schedule_takes_one(self) -> CandidateConfig:
        takes = schedule_family(self.schedule).has_parameter(MEMORY_LIMIT.name)
        if not takes and self.memory_limit is not None:
            raise ValueError(f"{self.schedule} takes no memory limit; leave memory_limit out")
        return self

    @model_validator(mode="after")
    def _split_matches_layers(self) -> CandidateConfig:
        split = self.recompute_per_stage
        if split is None:
            return self
        if len(split) != len(self.layers_per_stage):
            raise ValueError(
                f"recompute_per_stage has {len(split)} entries for "
                f"{len(self.layers_per_stage)} stages; give one per stage"
            )
        for stage, (entry, layers) in enumerate(zip(split, self.layers_per_stage, strict=True)):
            if entry.total != layers:
                raise ValueError(
                    f"stage {stage}: recompute_per_stage counts {entry.total} layers but the "
                    f"stage has {layers}"
                )
        return self

    @property
    def weight_replicas(self) -> int:
        """Ranks holding the same weights, whose gradients are reduced together and over
        which the distributed optimizer shards: d x cp (Megatron-LM's data-parallel group
        with context parallelism)."""
        return self.d * self.cp

    @property
    def world_size(self) -> int:
        """Ranks of the candidate: t x cp x p x d."""
        return self.t * self.cp * self.p * self.d

    def stage_modes(self) -> list[dict[Recompute, int]]:
        """Per stage: layers per recompute mode (all ``recompute`` when no split is given)."""
        if self.recompute_per_stage is None:
            return [{self.recompute: n} for n in self.layers_per_stage]
        return [entry.as_dict() for entry in self.recompute_per_stage]


class Predicted(_Spec):
    """What the cost model predicts for a candidate."""

    iteration_time_s: float = Field(description="Time of one optimizer step.")
    samples_per_s: float = Field(description="Global batch / iteration time.")
    tokens_per_s: float = Field(description="samples_per_s x seq_length.")
    mfu: float = Field(description="Model FLOPs utilization (0..1), Megatron's formula.")
    bubble_fraction: float = Field(description="Pipeline bubble (simulator's definition).")
    memory_gib_per_device: list[float] = Field(description="Peak memory per pipeline device.")
    peak_memory_gib: float = Field(description="Largest of memory_gib_per_device.")
    time_source: TimeSource = Field(
        description="Where the layer times come from: a measured point of exactly this shape, "
        "a measured point carried to it by the model's ratio, or the shape-aware model with "
        "calibrated or uncalibrated parameters."
    )
    calibration_error: float | None = Field(
        description="How far that source was off on the measured runs its parameters were "
        "fitted to: the root mean square of ln(predicted / measured), 0.10 meaning about 10%. "
        "Null when unknown: an uncalibrated model, or a measured point (whose own error is "
        "the measurement's)."
    )


class StageBreakdown(_Spec):
    """Why a candidate costs what it costs, per pipeline device."""

    device: int
    stages: list[int]
    layers: int
    compute_s: float = Field(description="F + B + W time of one step on this device.")
    communication_s: float = Field(
        description="Tensor-parallel time inside compute_s, and pipeline p2p sends, per step."
    )
    bubble_s: float = Field(description="Idle time in the simulated pipeline.")
    parameters_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    allowance_gib: float
    in_flight_microbatches: float = Field(
        description="Peak saved micro-batches of this device's stages (from the simulator)."
    )


class Launch(_Spec):
    """How to launch a candidate."""

    executor_config: dict[str, Any] = Field(
        description="`stagewright run` CONFIG.json. In a plan its schedule is named by its "
        "generator's parameters and its placement by its rule (the plan's size does not grow "
        "with devices x micro-batches); `stagewright run`, `stagewright plan --emit` and the "
        "service's launch route add the actions and ranks (planner.launch.materialize_launch)."
    )
    torchrun: list[str] = Field(description="One torchrun command per node.")
    megatron_args: str | None = Field(
        description="Equivalent Megatron-LM arguments, or null where Megatron has no such schedule."
    )
    torch_pipelining_csv: str | None = Field(
        description="The schedule in torch.distributed.pipelining's compute-only CSV, or null "
        "where that runtime cannot express it. Null in a plan (it grows with devices x "
        "micro-batches): the materialized launch artefacts carry it."
    )


class RefinementInfo(_Spec):
    """What CP-SAT changed versus the uniform grid answer of the same (t, p, d, mb,
    schedule), and why it is an improvement."""

    status: SolverStatus = Field(
        description="Solver status: optimal, feasible (not proven optimal), timed out (best "
        "found within the limit), infeasible."
    )
    solve_s: float
    uniform_layers_per_stage: list[int]
    uniform_recompute: Recompute
    uniform_iteration_time_s: float | None = Field(
        description="The uniform grid configuration's simulated step time; null when it does "
        "not fit in memory."
    )
    uniform_peak_memory_gib: float
    speedup_vs_uniform: float | None = Field(
        description="uniform step time / refined step time; null when the uniform one does not "
        "fit (the refinement is what makes it fit)."
    )
    changes: list[str] = Field(description="Readable list of what changed.")


class Candidate(_Spec):
    config: CandidateConfig
    predicted: Predicted
    launch: Launch
    runtimes: list[Runtime] = Field(
        default_factory=list,
        description="Runtimes that can run this candidate as planned (schedule, layer split "
        "and recompute choices).",
    )
    runtime_limits: dict[str, str] = Field(
        default_factory=dict,
        description="For each runtime that cannot run it as planned, the reason.",
    )
    semantics: Semantics = Field(
        default="synchronous",
        description="synchronous: trains exactly like one process; stale: updates weights "
        "with gradients of older weights (PipeDream-2BW), which changes the training.",
    )
    breakdown: list[StageBreakdown] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    refinement: RefinementInfo | None = Field(
        default=None, description="Present when CP-SAT refined this candidate (method cpsat)."
    )


class Rejected(_Spec):
    config: CandidateConfig
    reason: str
    predicted: Predicted | None = None


class PlanStats(_Spec):
    evaluated: int = Field(description="Configurations considered (constraints included).")
    feasible: int = Field(description="Configurations that fit in memory.")
    search_ms: float = Field(description="Wall time of the search.")


class ScheduleSummary(_Spec):
    """The best a schedule can do for this request, so a person can see whether a
    memory-saving schedule pays off here instead of assuming it does."""

    schedule: ScheduleName
    feasible: int = Field(description="Configurations of this schedule that fit.")
    semantics: Semantics = Field(
        default="synchronous", description="The schedule's training semantics."
    )
    best_config: CandidateConfig | None
    best_iteration_time_s: float | None = Field(description="Simulated, or null if none fit.")
    speedup_vs_1f1b: float | None = Field(
        description="Best 1F1B step time / this schedule's best (> 1 is faster); null when "
        "either has no feasible configuration or 1F1B was not searched."
    )


class LandscapePoint(_Spec):
    """One configuration that fits, as the fast estimate prices it (for charts)."""

    label: str
    samples_per_s: float
    peak_memory_gib: float


class Plan(_Spec):
    id: str
    request: PlanRequest
    best: Candidate | None
    candidates: list[Candidate]
    rejected: list[Rejected]
    stats: PlanStats
    by_schedule: list[ScheduleSummary] = Field(default_factory=list)
    landscape: list[LandscapePoint] = Field(
        default_factory=list,
        description="Every configuration that fits, with its estimated throughput and peak "
        "memory (the ranked candidates are simulated; these are not).",
    )
