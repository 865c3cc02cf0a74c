"""The batch layout every attention backend (torch reference, Triton) consumes.

A step's tokens are flattened into one varlen batch of ``T`` query tokens from ``S``
sequences. Sequence ``i`` contributes ``query_lens[i]`` new tokens (a prefill chunk, or 1
for decode), stored at ``q[query_start_loc[i] : query_start_loc[i + 1]]``. After this
step's K/V is written, sequence ``i`` has ``context_lens[i]`` tokens in the cache; so its
query token ``j`` sits at absolute position ``context_lens[i] - query_lens[i] + j`` and
attends causally to cached keys ``0 .. that position`` (inclusive). This one layout covers
prefill, prefill over a cached prefix, decode and mixed batches.

KV cache per layer: ``k_cache`` and ``v_cache`` of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``. Logical token ``t`` of sequence ``i``
lives in block ``block_tables[i, t // block_size]`` at offset ``t % block_size``.
``slot_mapping[k] = block * block_size + offset`` says where new token ``k`` is written;
``-1`` marks a padding token that must be skipped. ``block_tables`` rows are padded with 0
beyond the sequence's blocks; backends never read past ``context_lens[i]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor  # int32 [S + 1]
    context_lens: torch.Tensor  # int32 [S]
    block_tables: torch.Tensor  # int32 [S, max_blocks_per_seq]
    slot_mapping: torch.Tensor  # int64 [T]
    max_query_len: int
    max_context_len: int

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])

    @property
    def query_lens(self) -> torch.Tensor:
        return self.query_start_loc[1:] - self.query_start_loc[:-1]
