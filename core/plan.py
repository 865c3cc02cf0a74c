"""Step plans (scheduler -> executor) and step outcomes (executor -> scheduler).

A :class:`StepPlan` names everything an executor needs for one engine iteration: the
prefill chunks and decode sequences to compute (their block tables come from the KV-cache
manager, ``manager.block_table(seq_id)``), the block swaps and copies to perform before
computing, and what was preempted. :class:`BatchShape` condenses the plan into the
numbers a cost model needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.request import Sequence, SequenceGroup


@dataclass(slots=True)
class PrefillChunk:
    """Compute K/V for tokens ``[start, start + length)`` of ``seq`` (``start`` tokens are
    already cached). If the chunk reaches ``seq.num_tokens`` the step samples a token."""

    seq: Sequence
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def samples(self) -> bool:
        return self.end >= self.seq.num_tokens


@dataclass(frozen=True, slots=True)
class BatchShape:
    """The work of one step, as a cost model sees it.

    - ``prefill_tokens``: new tokens computed by prefill chunks;
    - ``prefill_attn_pairs``: causal (query, key) pairs of those chunks,
      sum over chunks of ``length * start + length * (length + 1) / 2``;
    - ``prefill_kv_read_tokens``: cached tokens the chunks attend to, sum of ``start``;
    - ``decode_seqs``: sequences decoding one token each;
    - ``decode_ctx_tokens``: sum of their context lengths (K/V read per layer);
    - ``swap_in_blocks`` / ``swap_out_blocks`` / ``copy_blocks``: block moves.
    """

    prefill_tokens: int = 0
    prefill_seqs: int = 0
    prefill_attn_pairs: int = 0
    prefill_kv_read_tokens: int = 0
    decode_seqs: int = 0
    decode_ctx_tokens: int = 0
    swap_in_blocks: int = 0
    swap_out_blocks: int = 0
    copy_blocks: int = 0

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs

    @property
    def is_empty(self) -> bool:
        return (
            self.num_tokens == 0
            and self.swap_in_blocks == 0
            and self.swap_out_blocks == 0
            and self.copy_blocks == 0
        )


def _shape_factory() -> Callable[..., BatchShape]:
    """``BatchShape(*fields)`` that writes the slots directly: the same (frozen) object
    for half the cost of the generated frozen ``__init__``; ``shape()`` runs every step."""
    new = object.__new__
    s0, s1, s2, s3, s4, s5, s6, s7, s8 = (
        getattr(BatchShape, n).__set__ for n in BatchShape.__slots__
    )

    def make(
        v0: int, v1: int, v2: int, v3: int, v4: int, v5: int, v6: int, v7: int, v8: int
    ) -> BatchShape:
        obj = new(BatchShape)
        s0(obj, v0)
        s1(obj, v1)
        s2(obj, v2)
        s3(obj, v3)
        s4(obj, v4)
        s5(obj, v5)
        s6(obj, v6)
        s7(obj, v7)
        s8(obj, v8)
        return obj

    return make


new_shape = _shape_factory()


# What holds the queue's head (the first swapped group, else the first waiting one) after a
# step's plan, limits first: a scheduler limit that would hold it with any amount of free
# memory, else memory. StepPlan.queue_held_by and steps.csv's column carry the code.
HELD_BY_MEMORY = 0  # also: nothing waits (num_waiting and num_swapped are 0)
HELD_BY_MAX_NUM_SEQS = 1
HELD_BY_TOKEN_BUDGET = 2  # max_num_batched_tokens
HELD_BY_BATCH = 3  # a request-level batch in flight (FasterTransformer)
HELD_BY_POLICY = 4  # a limit of a policy plugin's own (e.g. admissions per step)
QUEUE_HELD_BY = {
    HELD_BY_MEMORY: "memory",
    HELD_BY_MAX_NUM_SEQS: "max_num_seqs",
    HELD_BY_TOKEN_BUDGET: "max_num_batched_tokens",
    HELD_BY_BATCH: "the batch in flight",
    HELD_BY_POLICY: "the policy's own limit",
}
# each limit's name in a metric key (``kv_free_at_<name>_pct``)
HELD_BY_KEY = {
    HELD_BY_MAX_NUM_SEQS: "max_num_seqs",
    HELD_BY_TOKEN_BUDGET: "token_budget",
    HELD_BY_BATCH: "batch_in_flight",
    HELD_BY_POLICY: "policy_limit",
}


@dataclass(slots=True)
class StepPlan:
    """One iteration's work. Executors perform ``swap_out``, ``swap_in`` and ``copies``
    (in that order) before computing ``prefill`` and ``decode``."""

    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu, device)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, cpu)
    copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) device blocks
    preempted: list[SequenceGroup] = field(default_factory=list)
    preempted_by_swap: list[SequenceGroup] = field(default_factory=list)
    num_waiting: int = 0  # groups still queued for admission after this plan
    num_swapped: int = 0
    queue_held_by: int = HELD_BY_MEMORY  # what holds the queue's head (HELD_BY_*)

    def shape(self) -> BatchShape:
        p_tokens = p_pairs = p_read = 0
        for c in self.prefill:
            n, start = c.length, c.start
            p_tokens += n
            p_pairs += n * start + n * (n + 1) // 2
            p_read += start
        d_ctx = 0
        for s in self.decode:  # Sequence.num_tokens, inlined (the hot loop)
            d_ctx += s.group.request.prompt_len + s.num_generated
        return new_shape(
            p_tokens,
            len(self.prefill),
            p_pairs,
            p_read,
            len(self.decode),
            d_ctx,
            len(self.swap_in),
            len(self.swap_out),
            len(self.copies),
        )

    @property
    def is_empty(self) -> bool:
        return not (self.prefill or self.decode or self.swap_in or self.swap_out or self.copies)

    def scheduled_seqs(self) -> list[Sequence]:
        return [c.seq for c in self.prefill] + self.decode

    def sampling_seqs(self) -> list[Sequence]:
        """Sequences that sample a token this step, in the engine's row order: prefill
        chunks that reach ``seq.num_tokens`` first (plan order), then every decode."""
        return [c.seq for c in self.prefill if c.samples] + self.decode


@dataclass(slots=True)
class BeamChoice:
    """Beam search result for one group at one step: each new beam is ``(parent_seq_id,
    token_id)``; the scheduler forks/frees sequences so the group holds these beams.
    ``scores`` (optional, one per beam) become the beams' ``cum_logprob``."""

    group: SequenceGroup
    beams: list[tuple[int, int]]
    scores: list[float] | None = None


@dataclass(slots=True)
class StepOutcome:
    """What the executor reports back.

    ``duration_s`` is the step's time (modelled or measured). ``token_ids`` maps seq_id to
    the sampled token for every sequence that sampled (engine); ``None`` means the executor
    does not produce token ids (simulator): every sampling sequence advances one token.
    ``extra_samples`` maps the seq_id of a prompt that just finished prefill in a group
    with ``n > 1`` to the first tokens of its other ``n - 1`` samples (engine).
    ``beams`` carries beam-search reselection for beam groups (engine or a seeded model).
    """

    duration_s: float
    token_ids: dict[int, int] | None = None
    extra_samples: dict[int, list[int]] | None = None
    beams: list[BeamChoice] = field(default_factory=list)
