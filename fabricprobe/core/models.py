"""Model shapes and the size of the KV cache a request moves from prefill to decode.

The KV cache holds one key and one value vector per layer, per KV head, per token. With
grouped-query attention (GQA) the number of KV heads is smaller than the number of query
heads, which is what makes Llama-3.1-8B's cache four times smaller than a model with
full multi-head attention of the same width. Shapes are the published model configs
(`num_hidden_layers`, `num_key_value_heads`, `head_dim` or hidden/heads).
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class ModelShape:
    """What fixes the KV cache's size per token."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if min(self.layers, self.kv_heads, self.head_dim) < 1:
            raise ValueError(f"{self.name}: layers, kv_heads and head_dim must be positive")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype {self.dtype!r}: one of {', '.join(DTYPE_BYTES)}")

    @property
    def bytes_per_token(self) -> int:
        """K and V, every layer and KV head: 2 x layers x kv_heads x head_dim x dtype."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    def kv_bytes(self, tokens: int) -> int:
        """Bytes of KV cache for TOKENS tokens of context."""
        if tokens < 0:
            raise ValueError(f"negative token count {tokens}")
        return self.bytes_per_token * tokens


PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("Llama-3.1-8B", 32, 8, 128),
        ModelShape("Llama-3.1-70B", 80, 8, 128),
        ModelShape("Qwen2.5-7B", 28, 4, 128),
        ModelShape("Qwen2.5-72B", 80, 8, 128),
        ModelShape("Mistral-7B", 32, 8, 128),
        ModelShape("Mixtral-8x7B", 32, 8, 128),
    )
}


def model_shape(
    preset: str | None = None,
    *,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
) -> ModelShape:
    """A preset (case-insensitive) with any field overridden, or a shape given in full."""
    base: ModelShape | None = None
    if preset is not None:
        found = {k.lower(): v for k, v in PRESETS.items()}.get(preset.lower())
        if found is None:
            raise ValueError(f"unknown model {preset!r}; presets: {', '.join(PRESETS)}")
        base = found
    if base is None:
        if layers is None or kv_heads is None or head_dim is None:
            raise ValueError("give a preset or all of layers, kv_heads and head_dim")
        return ModelShape("custom", layers, kv_heads, head_dim, dtype or "bf16")
    return ModelShape(
        base.name,
        layers or base.layers,
        kv_heads or base.kv_heads,
        head_dim or base.head_dim,
        dtype or base.dtype,
    )
