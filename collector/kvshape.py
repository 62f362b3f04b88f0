"""The KV bytes a request moves, from its served model's shape, where no span says.

A collector setting names each served model's shape: a preset of `probe workload`
(fabricprobe/core/models.py, the published configs) or layers, KV heads, head
dimension and dtype given in full, and the engine's KV block size in tokens. The bytes
are K and V for every layer and KV head of the prompt's tokens, rounded up to whole
blocks: an engine moves whole blocks (vLLM's CPU backend: 128 tokens a block; on GPUs:
16 by default).

    kv_models = { "meta-llama/Llama-3.1-8B-Instruct" = "Llama-3.1-8B,block=16",
                  "*" = "layers=4,kv_heads=2,head_dim=64,dtype=fp32,block=128" }

"*" is the shape of a request whose span names no model, or a model not listed: vLLM
0.32's `llm_request` carries no model name (gen_ai.response.model is not set), so a fleet
of vLLM engines serving one model names it "*".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fabricprobe.core.models import DTYPE_BYTES, ModelShape, model_shape

ANY_MODEL = "*"
DEFAULT_BLOCK = 16  # vLLM's default block size on GPUs
MAX_BLOCK = 1 << 16
MAX_DIM = 1 << 20  # layers, heads or head dimension beyond this are not a model
MAX_SPEC = 256
MAX_MODELS = 1024
MAX_TOKENS = 1 << 24  # a prompt longer than this is not a measurement


@dataclass(frozen=True)
class KvShape:
    """A served model's KV bytes per token and the engine's block size."""

    shape: ModelShape
    block_tokens: int = DEFAULT_BLOCK

    def request_bytes(self, prompt_tokens: int) -> int:
        """Bytes of KV for PROMPT_TOKENS tokens, rounded up to whole blocks."""
        if not 0 <= prompt_tokens <= MAX_TOKENS:
            raise ValueError(f"prompt tokens {prompt_tokens} out of 0..{MAX_TOKENS}")
        blocks = math.ceil(prompt_tokens / self.block_tokens)
        return self.shape.kv_bytes(blocks * self.block_tokens)


def _int_field(key: str, value: str, hi: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{key}={value[:20]!r}: not a whole number") from None
    if not 1 <= n <= hi:
        raise ValueError(f"{key}={n}: out of 1..{hi}")
    return n


def parse_kv_shape(spec: str) -> KvShape:
    """`PRESET[,key=value...]` or `layers=L,kv_heads=H,head_dim=D[,dtype=T][,block=B]`;
    ValueError says what is wrong."""
    if not spec or len(spec) > MAX_SPEC:
        raise ValueError(f"a shape is 1..{MAX_SPEC} characters")
    preset: str | None = None
    fields: dict[str, str] = {}
    for i, part in enumerate(p.strip() for p in spec.split(",")):
        if "=" not in part:
            if i or not part:
                raise ValueError(f"{part[:40]!r}: expected key=value (a preset comes first)")
            preset = part
            continue
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in ("layers", "kv_heads", "head_dim", "dtype", "block"):
            raise ValueError(f"{key[:40]!r}: one of layers, kv_heads, head_dim, dtype, block")
        if key in fields:
            raise ValueError(f"{key} given twice")
        fields[key] = value.strip()
    dtype = fields.get("dtype")
    if dtype is not None and dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype[:20]!r}: one of {', '.join(DTYPE_BYTES)}")
    dims = {
        k: _int_field(k, fields[k], MAX_DIM)
        for k in ("layers", "kv_heads", "head_dim")
        if k in fields
    }
    block = _int_field("block", fields["block"], MAX_BLOCK) if "block" in fields else DEFAULT_BLOCK
    shape = model_shape(preset, dtype=dtype, **dims)
    return KvShape(shape, block)


def parse_kv_models(raw: Mapping[str, str]) -> dict[str, KvShape]:
    """The kv_models setting: served model name -> KvShape; ValueError names the model."""
    if len(raw) > MAX_MODELS:
        raise ValueError(f"kv_models: at most {MAX_MODELS} models")
    out: dict[str, KvShape] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not isinstance(spec, str) or not name:
            raise ValueError("kv_models: model names map to shapes (text)")
        try:
            out[name] = parse_kv_shape(spec)
        except ValueError as e:
            raise ValueError(f"kv_models[{name[:60]!r}]: {e}") from None
    return out


def model_bytes(
    requests: Iterable[tuple[str, str, int | None]], shapes: Mapping[str, KvShape]
) -> dict[str, float]:
    """Request id -> KV bytes its model's shape gives for its prompt, for each of
    REQUESTS (id, served model, prompt tokens) whose model has a shape (its own, else
    ANY_MODEL's) and whose prompt tokens are known."""
    out: dict[str, float] = {}
    if not shapes:
        return out
    for rid, model, tokens in requests:
        shape = shapes.get(model) or shapes.get(ANY_MODEL)
        if shape is None or tokens is None or not 0 < tokens <= MAX_TOKENS:
            continue
        out[rid] = float(shape.request_bytes(tokens))
    return out
