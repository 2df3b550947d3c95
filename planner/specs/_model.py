"""The model of a plan request: a decoder-only transformer's shapes (:class:`ModelSpec`)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from planner.errors import NO_NUL_PATTERN
from planner.specs._common import (
    Spec,
    numbers_not_booleans,
)

__all__ = ["ModelSpec"]


class ModelSpec(Spec):
    """A decoder-only transformer: the shapes that set FLOPs, parameters and activations.

    The defaults describe GPT as Megatron-LM builds it by default (multi-head attention, a
    GeLU MLP of 4h, LayerNorm, learned positions, the output layer tied to the word
    embedding); Llama-style models set ``num_query_groups`` (grouped-query attention),
    ``activation`` swiglu, ``normalization`` rmsnorm, ``position_embedding`` rope,
    ``untie_embeddings_and_output_weights`` and ``add_bias_linear`` false."""

    _numbers_not_booleans = numbers_not_booleans(
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "ffn_hidden_size",
        "seq_length",
        "vocab_size",
    )

    name: str = Field(
        description="A label for the model, e.g. 'gpt3-96b' (no NUL character).",
        min_length=1,
        max_length=200,
        pattern=NO_NUL_PATTERN,
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

    def tensor_split_problems(self, t: int, *, split_sequence: bool = False) -> dict[str, int]:
        """The sizes t tensor-parallel ranks cannot split evenly, by the field that sets
        each: Megatron's column-parallel layers split the attention heads, the key/value
        heads (``num_query_groups``) and the MLP width (``ffn_hidden_size``, the resolved
        width when it is null) over the ranks, and sequence parallelism (``split_sequence``,
        at t > 1) splits the sequence. Empty when t splits every one."""
        groups = self.query_groups
        sizes = {
            "num_attention_heads": self.num_attention_heads,
            "num_query_groups": groups if groups != self.num_attention_heads else 0,
            "ffn_hidden_size": self.ffn,
            "seq_length": self.seq_length if split_sequence and t > 1 else 0,
        }
        return {name: size for name, size in sizes.items() if size % t}

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

    def vocab_rows(self, t: int) -> int:
        """Rows of the word embedding and of the output layer on one of t tensor-parallel
        ranks: the vocabulary padded to a multiple of t (as Megatron-LM pads it; the emitted
        ``--make-vocab-size-divisible-by`` pads no further), split."""
        return -(-self.vocab_size // t)

    @property
    def gated(self) -> bool:
        """Whether the MLP is gated (swiglu: three matrices, fc1 produces 2f)."""
        return self.activation == "swiglu"
