"""Turning a ``StepPlan`` into one model forward over the paged KV tensors.

The batch is the plan's prefill chunks, then its decode sequences, flattened into the
varlen layout of ``engine.attention.metadata``. Block tables come from the KV-cache
manager (``manager.block_table(seq_id)``): the manager's block ids index the tensors
directly, for paged and contiguous managers alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch

from core.kv.base import KVCacheManager
from core.plan import StepPlan
from core.request import Sequence
from engine.attention.metadata import AttentionMetadata
from engine.kv_cache import PagedKVCache
from engine.models import CausalLM


@dataclass
class BatchInputs:
    """Host-built inputs of one forward. ``sample_rows`` index the flat token batch."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor
    sample_seqs: list[Sequence]


def build_inputs(plan: StepPlan, manager: KVCacheManager, device: torch.device) -> BatchInputs:
    """Token ids, positions and attention metadata for ``plan`` (see module doc)."""
    bs = manager.block_size
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    ctx_lens: list[int] = []
    tables: list[list[int]] = []
    sample_rows: list[int] = []
    spans = [(c.seq, c.start, c.end, c.samples) for c in plan.prefill]
    spans += [(s, s.num_tokens - 1, s.num_tokens, True) for s in plan.decode]
    for seq, start, end, samples in spans:
        tokens = seq.token_ids()
        if end > len(tokens) or start < 0 or start >= end:
            raise ValueError(f"{seq}: cannot compute tokens [{start}, {end})")
        table = manager.block_table(seq.seq_id)
        if -(-end // bs) > len(table):
            raise ValueError(f"{seq}: {len(table)} blocks cannot hold {end} tokens")
        ids.extend(tokens[start:end])
        positions.extend(range(start, end))
        slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
        starts.append(len(ids))
        ctx_lens.append(end)
        tables.append(table)
        if samples:
            sample_rows.append(len(ids) - 1)
    width = max((len(t) for t in tables), default=0)
    padded = [t + [0] * (width - len(t)) for t in tables]
    query_lens = [b - a for a, b in pairwise(starts)]

    def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    meta = AttentionMetadata(
        query_start_loc=tensor(starts, torch.int32),
        context_lens=tensor(ctx_lens, torch.int32),
        block_tables=tensor(padded, torch.int32).reshape(len(tables), width),
        slot_mapping=tensor(slots, torch.int64),
        max_query_len=max(query_lens, default=0),
        max_context_len=max(ctx_lens, default=0),
    )
    return BatchInputs(
        input_ids=tensor(ids, torch.int64),
        positions=tensor(positions, torch.int64),
        meta=meta,
        sample_rows=tensor(sample_rows, torch.int64),
        sample_seqs=plan.sampling_seqs(),
    )


class ModelRunner:
    """Runs a model's forward for a plan on ``kv_cache``'s tensors. ``backend`` is the name
    of the attention backend the model was built with (the model holds the backend object;
    the runner only reports it)."""

    def __init__(self, model: CausalLM, kv_cache: PagedKVCache, backend: str = "torch") -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.backend = backend
        self.device = kv_cache.device

    def execute(self, plan: StepPlan, manager: KVCacheManager) -> torch.Tensor:
        """fp32 logits ``[num_sampling_rows, vocab]`` for the sequences that sample, in the
        order of :meth:`core.plan.StepPlan.sampling_seqs`; writes every computed token's K/V to
        the cache.
        :meth:`prepare` then :meth:`forward` (the engine calls them apart to time them)."""
        return self.forward(self.prepare(plan, manager))

    def prepare(self, plan: StepPlan, manager: KVCacheManager) -> BatchInputs:
        """The forward's inputs for ``plan`` (:func:`build_inputs` on the runner's device)."""
        if manager.block_size != self.kv_cache.block_size:
            raise ValueError(
                f"manager block_size {manager.block_size} != KV cache block_size "
                f"{self.kv_cache.block_size}"
            )
        return build_inputs(plan, manager, self.device)

    @torch.inference_mode()
    def forward(self, batch: BatchInputs) -> torch.Tensor:
        """The model on ``batch``: fp32 logits of its sampled rows (see :meth:`execute`)."""
        vocab = self.model.config.vocab_size
        if batch.input_ids.numel() == 0:
            return torch.empty((0, vocab), dtype=torch.float32, device=self.device)
        hidden = self.model(batch.input_ids, batch.positions, self.kv_cache.kv_caches, batch.meta)
        return self.model.compute_logits(hidden[batch.sample_rows]).float()
