"""The rest of a plan request: the cluster, the training setup, what the search may choose
from, and the request that holds them with the rules that tie them together."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from planner.schedules import (
    NUM_CHUNKS,
    families,
    schedule_family,
)
from planner.specs._common import (
    DEFAULT_MICRO_BATCH_SIZES,
    STORED,
    Precision,
    Recompute,
    RuntimeChoice,
    ScheduleName,
    Spec,
    default_schedules,
    numbers_not_booleans,
)
from planner.specs._model import ModelSpec

__all__ = ["DEFAULT_NUM_CHUNKS", "ClusterSpec", "PlanRequest", "SearchSpec", "TrainingSpec"]

assert NUM_CHUNKS.default is not None
DEFAULT_NUM_CHUNKS: tuple[int, ...] = (int(NUM_CHUNKS.default),)
"""The chunks per device searched when a request names none: the families' default (2)."""


def _chunked_families() -> list[str]:
    return [f.name for f in families() if f.chunks_default is not None]


class ClusterSpec(Spec):
    """Which GPUs and how many: ``gpu`` names a hardware profile."""

    _numbers_not_booleans = numbers_not_booleans("num_nodes", "gpus_per_node")

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


class TrainingSpec(Spec):
    """How the model is trained: batch, precision, optimizer and memory-saving switches."""

    _numbers_not_booleans = numbers_not_booleans("global_batch_size")

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


class SearchSpec(Spec):
    """What the search may choose from."""

    _numbers_not_booleans = numbers_not_booleans(
        "micro_batch_sizes", "context_parallel", "num_chunks", "time_limit_s", "top_k"
    )

    schedules: list[ScheduleName] = Field(
        default_factory=lambda: default_schedules(allow_stale_weights=False),
        fail_fast=True,
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
        fail_fast=True,
        description="Activation recomputation modes to consider.",
        min_length=1,
    )
    micro_batch_sizes: list[int] | None = Field(
        default=None,
        fail_fast=True,
        description="Micro-batch sizes to consider; null means 1, 2, 4, 8 (those that divide "
        "the batch).",
    )
    context_parallel: list[int] | None = Field(
        default=None,
        fail_fast=True,
        description="Context-parallel degrees (cp) to consider: the sequence of each sample "
        "is split over cp ranks and attention runs as a ring passing key/value chunks. null "
        "means 1 without flash attention (Megatron-LM runs context parallelism only through "
        "its flash/fused attention) and, with it, also every cp > 1 that keeps t x cp inside "
        "one node.",
    )
    num_chunks: list[int] = Field(
        default_factory=lambda: list(DEFAULT_NUM_CHUNKS),
        min_length=1,
        fail_fast=True,
        description="Chunks (stages) per device, v, searched for the schedules whose devices "
        "hold several (interleaved, bpipe-interleaved): every v listed whose p x v stages "
        "each get a layer (the end stages may hold only the embedding or the output layer) "
        "is planned, v = 4 meaning Megatron-LM's --num-layers-per-virtual-pipeline-stage of "
        "layers / (4p). Each at least 2 (one chunk is 1f1b); naming it without searching "
        "such a schedule is an error.",
    )
    method: Literal["grid", "cpsat"] = Field(default="grid", description="Search method.")
    time_limit_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Budget for the CP-SAT refinement of one request (method cpsat), in "
        "seconds; each model gets at most 2 s of it. The grid runs no CP-SAT: with method "
        "grid a value other than the default is refused.",
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

    @model_validator(mode="after")
    def _time_limit_only_for_cpsat(self, info: ValidationInfo) -> SearchSpec:
        """time_limit_s is the CP-SAT refinement's budget; the grid runs no CP-SAT and
        ignored it. Its default is let through (a request the service echoes spells it
        out), and so is a plan stored before this check (``STORED``)."""
        if self.method == "cpsat" or "time_limit_s" not in self.model_fields_set:
            return self
        if self.time_limit_s == type(self).model_fields["time_limit_s"].default:
            return self
        if info.context and info.context.get(STORED):
            return self
        raise ValueError(
            f"time_limit_s {self.time_limit_s:g} is the time budget of the CP-SAT "
            f"refinement, which method {self.method} does not run; set search.method to "
            f"cpsat to refine the best candidates with it, or leave time_limit_s out"
        )

    @model_validator(mode="after")
    def _chunks_only_for_chunked_schedules(self) -> SearchSpec:
        if "num_chunks" not in self.model_fields_set:
            return self
        chunked = _chunked_families()
        if not any(name in chunked for name in self.schedules):
            raise ValueError(
                f"search.num_chunks {self.num_chunks} applies only to schedules with several "
                f"stages per device ({', '.join(chunked)}), and search.schedules "
                f"{self.schedules} has none; add one of them or leave num_chunks out"
            )
        return self

    @field_validator("num_chunks")
    @classmethod
    def _chunk_counts(cls, value: list[int]) -> list[int]:
        small = [v for v in value if v < 2]
        if small:
            raise ValueError(
                f"num_chunks {value}: every entry must be at least 2 chunks per device "
                f"(one chunk a device is plain 1F1B: search schedule 1f1b for that)"
            )
        if len(set(value)) != len(value):
            raise ValueError(f"num_chunks {value} lists a chunk count twice; list each once")
        return sorted(value)

    # Written without a return annotation: pydantic would take one as the serialized
    # schema and lose the fields' own.
    @model_serializer(mode="wrap")
    def _omit_default_chunks(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        """The JSON without num_chunks when it is the default: requests (and the plans that
        echo them) written before the field stay byte-identical."""
        out = handler(self)
        if tuple(self.num_chunks) == DEFAULT_NUM_CHUNKS:
            out.pop("num_chunks", None)
        return out

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


class PlanRequest(Spec):
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
