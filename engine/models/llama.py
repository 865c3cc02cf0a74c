"""Llama-family decoder (Touvron et al., 2023) in plain torch over a paged KV cache.

Parameter names equal the HF ``transformers`` ``LlamaForCausalLM`` state-dict keys. Math:
RMSNorm before each sub-block, rotary position embedding in the rotate-half convention
(the first and second halves of each head form the rotated pairs), grouped-query attention,
a SwiGLU FFN ``down(silu(gate(x)) * up(x))``, no biases.
"""

from __future__ import annotations

import torch
from torch import nn

from core.model_spec import ModelSpec
from engine.attention.base import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.models.common import CausalLM, KVCache

Rope = tuple[torch.Tensor, torch.Tensor]


class RMSNorm(nn.Module):
    """``weight * x / rms(x)``; the normalisation runs in fp32, as HF's does."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> Rope:
    """cos and sin tables ``[T, head_dim]`` for ``positions``, computed in fp32."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = 1.0 / (theta ** (exponents / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate ``x`` ``[T, heads, head_dim]`` by the per-token angles in ``rope``."""
    cos, sin = rope[0][:, None, :], rope[1][:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelSpec, backend: AttentionBackend) -> None:
        super().__init__()
        hidden, d = config.hidden_size, config.head_dim
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = d
        self.scale = d**-0.5
        self.backend = backend
        self.q_proj = nn.Linear(hidden, config.num_heads * d, bias=False)
        self.k_proj = nn.Linear(hidden, config.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(hidden, config.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(config.num_heads * d, hidden, bias=False)

    def forward(
        self, x: torch.Tensor, rope: Rope, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, self.num_heads, self.head_dim), rope)
        k = apply_rope(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim), rope)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        out = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(out.reshape(t, -1))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelSpec) -> None:
        super().__init__()
        hidden, ffn = config.hidden_size, config.ffn_hidden_size
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelSpec, backend: AttentionBackend) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self, x: torch.Tensor, rope: Rope, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelSpec, backend: AttentionBackend) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, backend) for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = rope_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, rope, kv_cache, meta)
        return self.norm(x)


class LlamaCausalLM(CausalLM):
    """Llama with an LM head (see :class:`~engine.models.common.CausalLM`)."""

    family = "llama"

    def build_body(self, config: ModelSpec, backend: AttentionBackend) -> nn.Module:
        return LlamaModel(config, backend)
