"""OPT decoder (Zhang et al., 2022) in plain torch over a paged KV cache.

Parameter names equal the HF ``transformers`` ``OPTForCausalLM`` state-dict keys, so an HF
state dict loads as is. Math follows OPT: learned positions looked up at ``position + 2``
(OPT's table reserves two leading rows), LayerNorm before (or, if
``do_layer_norm_before`` is false, after) each sub-block, a ReLU FFN, biases everywhere,
and optional ``project_in``/``project_out`` when ``word_embed_proj_dim`` differs from the
hidden size (OPT-350m).
"""

from __future__ import annotations

import torch
from torch import nn

from core.model_spec import ModelSpec
from engine.attention.base import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.models.common import CausalLM, KVCache

POSITION_OFFSET = 2


class OPTAttention(nn.Module):
    def __init__(self, config: ModelSpec, backend: AttentionBackend) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        self.backend = backend
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        shape = (x.shape[0], self.num_heads, self.head_dim)
        q = self.q_proj(x).view(shape)
        k = self.k_proj(x).view(shape)
        v = self.v_proj(x).view(shape)
        out = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.out_proj(out.reshape(x.shape[0], -1))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config: ModelSpec, backend: AttentionBackend) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.pre_norm = config.do_layer_norm_before
        self.self_attn = OPTAttention(config, backend)
        self.self_attn_layer_norm = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, config.ffn_hidden_size)
        self.fc2 = nn.Linear(config.ffn_hidden_size, hidden)
        self.final_layer_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        h = self.self_attn_layer_norm(x) if self.pre_norm else x
        x = x + self.self_attn(h, kv_cache, meta)
        if not self.pre_norm:
            x = self.self_attn_layer_norm(x)
        h = self.final_layer_norm(x) if self.pre_norm else x
        x = x + self.fc2(torch.relu(self.fc1(h)))
        if not self.pre_norm:
            x = self.final_layer_norm(x)
        return x


class OPTDecoder(nn.Module):
    def __init__(self, config: ModelSpec, backend: AttentionBackend) -> None:
        super().__init__()
        hidden, embed = config.hidden_size, config.embed_dim
        self.max_positions = config.max_model_len
        self.embed_tokens = nn.Embedding(config.vocab_size, embed)
        self.embed_positions = nn.Embedding(config.max_model_len + POSITION_OFFSET, hidden)
        self.project_in = nn.Linear(embed, hidden, bias=False) if embed != hidden else None
        self.project_out = nn.Linear(hidden, embed, bias=False) if embed != hidden else None
        self.layers = nn.ModuleList(
            OPTDecoderLayer(config, backend) for _ in range(config.num_layers)
        )
        # HF OPT drops the final LayerNorm in post-LN models.
        self.final_layer_norm = (
            nn.LayerNorm(hidden, eps=config.layer_norm_eps) if config.do_layer_norm_before else None
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.project_in is not None:
            x = self.project_in(x)
        x = x + self.embed_positions(positions + POSITION_OFFSET)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, kv_cache, meta)
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return x


class _OPTBody(nn.Module):
    """Holds ``decoder`` so parameter names read ``model.decoder.*`` as in HF."""

    def __init__(self, config: ModelSpec, backend: AttentionBackend) -> None:
        super().__init__()
        self.decoder = OPTDecoder(config, backend)


class OPTCausalLM(CausalLM):
    """OPT with an LM head (see :class:`~engine.models.common.CausalLM`)."""

    family = "opt"

    def build_body(self, config: ModelSpec, backend: AttentionBackend) -> nn.Module:
        return _OPTBody(config, backend)

    def decoder(self) -> nn.Module:
        return self.model.decoder
