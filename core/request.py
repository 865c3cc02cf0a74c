"""Requests, sampling parameters, sequences and sequence groups.

A :class:`Request` is what a workload produces: an arrival time, a prompt (its length,
and token ids when the engine needs them), the output length to generate (EOS is
ignored, as in the vLLM paper and its benchmarks) and :class:`SamplingParams`.

When a request is added to a scheduler it becomes a :class:`SequenceGroup`. The group
starts with one :class:`Sequence` (the prompt). After the prompt's prefill produces
the first token, a group with ``n > 1`` parallel samples or ``beam_width > 1`` beams is
forked into that many sequences, which share the prompt's KV blocks (paged) or get their
own reserved regions (contiguous). All sequences of a group are gang-scheduled.

A system that serves samples as requests of their own (``core.systems.SystemSpec.
sampling_fanout`` ``"requests"``: vLLM V1's ``ParentRequest``) instead turns a request of
``n > 1`` samples into a :class:`ParentRequest` of ``n`` groups of one sample each
(:func:`child_request`), admitted, preempted and finished independently; they share the
prompt's KV blocks only through the prefix cache.

Token accounting of a sequence (``num_tokens = prompt_len + num_generated``):

- ``num_computed`` tokens have their K/V in the cache;
- a sequence *needs prefill* while ``num_computed < num_tokens - 1`` or before its
  first token (prompt not fully computed); a prefill chunk that reaches ``num_tokens``
  samples the next token;
- a *decode* step computes the one token whose K/V is missing (the last sampled one)
  and samples the next.
"""

from __future__ import annotations

import enum
import math
import numbers
import operator
from dataclasses import dataclass, field, replace


class RequestError(ValueError):
    """A request (or a trace row that would make one) is malformed or cannot be served.
    ``key``: the workload key at fault, when one is (a config error then names it)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"


# Temperatures below this sample greedily: dividing logits by less overflows to inf (NaN
# probabilities). vLLM draws the same line (``_SAMPLING_EPS = 1e-5``, vllm/sampling_params.py).
GREEDY_BELOW = 1e-5
# vLLM's default temperature (vllm/sampling_params.py, SamplingParams.temperature = 1.0),
# the one a request of n > 1 samples that names none samples at
SAMPLED_TEMPERATURE = 1.0


def _whole(value: object) -> bool:
    """Whether ``value`` is an integer (a Python or NumPy int; not a bool, not a float)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How a request samples. ``n`` parallel samples or beam search of ``beam_width``.

    ``temperature`` below :data:`GREEDY_BELOW` (0 included) means greedy. ``None`` (the
    default) is greedy for one sample and :data:`SAMPLED_TEMPERATURE` (vLLM's default) for
    ``n > 1``: greedy samples would all be the same sequence, and vLLM refuses an explicit
    greedy ``n > 1`` (``best_of`` must be 1 when greedy), as this does. The default is
    resolved when the params are built: ``dataclasses.replace`` keeps it (pass
    ``temperature=None`` to resolve it again for another ``n``). ``seed`` makes
    random sampling reproducible. Beam search takes none of temperature, top-p or top-k
    (refused, as vLLM refuses them).
    """

    n: int = 1
    beam_width: int = 1
    temperature: float | None = None  # a float once built (None resolved as above)
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("n", "beam_width"):
            if not _whole(getattr(self, name)):
                raise RequestError(
                    f"SamplingParams.{name} must be a whole number, got {getattr(self, name)!r}"
                )
        if self.temperature is None:
            default = SAMPLED_TEMPERATURE if self.n > 1 else 0.0
            object.__setattr__(self, "temperature", default)
        if self.n < 1:
            raise RequestError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.beam_width < 1:
            raise RequestError(f"SamplingParams.beam_width must be >= 1, got {self.beam_width}")
        if self.n > 1 and self.beam_width > 1:
            raise RequestError(
                "use either n > 1 (parallel sampling) or beam_width > 1, not both", key="beam_width"
            )
        assert self.temperature is not None
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise RequestError(f"temperature must be finite and >= 0, got {self.temperature}")
        if self.n > 1 and self.greedy:
            raise RequestError(
                f"n={self.n} parallel samples with greedy sampling (temperature "
                f"{self.temperature:g}) would all be the same sequence; vLLM refuses it too "
                "(best_of must be 1 when greedy): set a temperature > 0",
                key="temperature",
            )
        if not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise RequestError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.beam_width > 1 and not (self.greedy and self.top_p == 1 and self.top_k == -1):
            # vLLM refuses them too (SamplingParams._verify_beam_search); ignored, they would
            # read as if they shaped the beams
            raise RequestError(
                "beam search scores every token by its log-probability: temperature must be 0, "
                f"top_p 1 and top_k -1, got {self.temperature}, {self.top_p}, {self.top_k}",
                key="temperature",  # the one of the three a workload config sets
            )

    @property
    def greedy(self) -> bool:
        """Whether a sample is the most likely token (a temperature below
        :data:`GREEDY_BELOW`)."""
        return self.temperature < GREEDY_BELOW

    @property
    def num_seqs(self) -> int:
        """Sequences the group holds once forked (parallel samples or beams)."""
        return max(self.n, self.beam_width)

    @property
    def use_beam_search(self) -> bool:
        return self.beam_width > 1


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request. Lengths are in tokens; ``arrival_time`` in seconds."""

    request_id: int
    arrival_time: float
    prompt_len: int
    output_len: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("prompt_len", "output_len"):
            if not _whole(getattr(self, name)):
                raise RequestError(
                    f"request {self.request_id}: {name} must be a whole number, "
                    f"got {getattr(self, name)!r}"
                )
        if not math.isfinite(self.arrival_time) or self.arrival_time < 0:
            raise RequestError(
                f"request {self.request_id}: arrival_time must be finite and >= 0, "
                f"got {self.arrival_time}"
            )
        if self.prompt_len < 1:
            raise RequestError(
                f"request {self.request_id}: prompt_len must be >= 1, got {self.prompt_len}"
            )
        if self.output_len < 1:
            raise RequestError(
                f"request {self.request_id}: output_len must be >= 1, got {self.output_len}"
            )
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_len:
            raise RequestError(
                f"request {self.request_id}: {len(self.prompt_token_ids)} prompt token ids "
                f"but prompt_len={self.prompt_len}"
            )

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len

    def vocabulary_problem(self, vocab_size: int | None) -> str | None:
        """Why a model of ``vocab_size`` tokens cannot read this prompt (an id that is not a
        whole number, or outside ``[0, vocab_size)``), or None; None too when either is
        unknown. Both bodies reject such a request at intake, as vLLM's input validation does,
        and serve the others."""
        if vocab_size is None or self.prompt_token_ids is None:
            return None
        for token in self.prompt_token_ids:
            try:
                token_id = operator.index(token)
            except TypeError:
                return f"prompt token id {token!r} is not a whole number"
            if not 0 <= token_id < vocab_size:
                return (
                    f"prompt token id {token_id} is outside the model's vocabulary "
                    f"[0, {vocab_size})"
                )
        return None


class Sequence:
    """One token stream of a group. ``seq_id`` is unique within a scheduler."""

    __slots__ = (
        "cum_logprob",
        "group",
        "num_computed",
        "num_generated",
        "output_token_ids",
        "parent_seq_id",
        "seq_id",
        "status",
    )

    def __init__(self, seq_id: int, group: SequenceGroup) -> None:
        self.seq_id = seq_id
        self.group = group
        self.num_generated = 0
        self.num_computed = 0
        self.output_token_ids: list[int] = []
        self.status = SequenceStatus.WAITING
        self.parent_seq_id: int | None = None
        self.cum_logprob = 0.0  # beam search score (engine)

    @property
    def prompt_len(self) -> int:
        return self.group.request.prompt_len

    @property
    def num_tokens(self) -> int:
        return self.group.request.prompt_len + self.num_generated

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def needs_prefill(self) -> bool:
        """True until every token except the last sampled one has its K/V cached."""
        if self.num_generated == 0:
            return True
        return self.num_computed < self.num_tokens - 1

    def token_ids(self) -> list[int]:
        """Prompt plus generated token ids (engine only; needs prompt_token_ids)."""
        prompt = self.group.request.prompt_token_ids
        if prompt is None:
            raise RequestError(f"request {self.group.request_id} has no prompt token ids")
        return [*prompt, *self.output_token_ids]

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, req={self.group.request_id}, "
            f"tokens={self.num_tokens}, computed={self.num_computed}, {self.status.value})"
        )


class SequenceGroup:
    """A request being served: its sequences plus the timestamps the recorder needs.

    Times are in seconds on the driver's clock; step indices count engine steps from 0.
    """

    __slots__ = (
        "cached_prompt_tokens",
        "fcfs_key",
        "finish_step",
        "finish_time",
        "first_scheduled_time",
        "first_token_step",
        "first_token_time",
        "num_preemptions",
        "parent",
        "readmit_cached_tokens",
        "reject_reason",
        "request",
        "sample_index",
        "seqs",
        "token_times",
    )

    def __init__(self, request: Request, first_seq_id: int) -> None:
        self.request = request
        # First-come-first-served order (arrival, then id); the request is frozen. A child of
        # a ParentRequest adds its sample index (ParentRequest.adopt).
        self.fcfs_key: tuple[float, int] | tuple[float, int, int] = (
            request.arrival_time,
            request.request_id,
        )
        # the ParentRequest this group is sample ``sample_index`` of (None: a request's own)
        self.parent: ParentRequest | None = None
        self.sample_index = 0
        self.seqs: list[Sequence] = [Sequence(first_seq_id, self)]
        self.first_scheduled_time: float | None = None
        # prompt tokens the prefix cache held at the group's first admission (None before)
        self.cached_prompt_tokens: int | None = None
        # tokens (prompt and generated) the prefix cache held at the group's re-admissions
        # after recompute preemptions, summed over them (0 before any)
        self.readmit_cached_tokens = 0
        self.first_token_time: float | None = None
        self.first_token_step: int | None = None
        self.finish_time: float | None = None
        self.finish_step: int | None = None
        self.num_preemptions = 0
        self.reject_reason: str | None = None
        self.token_times: list[float] = []

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def arrival_time(self) -> float:
        return self.request.arrival_time

    @property
    def sampling(self) -> SamplingParams:
        return self.request.sampling

    def live_seqs(self) -> list[Sequence]:
        """Sequences not finished (what the group still computes). All sequences of a
        group finish together (beam search drops pruned beams from ``seqs``), so this is
        ``seqs`` until the group ends. The list is the group's own: do not mutate it."""
        if self.finish_time is None and self.reject_reason is None:
            return self.seqs
        return [s for s in self.seqs if s.status is not SequenceStatus.FINISHED]

    @property
    def is_finished(self) -> bool:
        return self.finish_time is not None or self.reject_reason is not None

    @property
    def num_generated(self) -> int:
        """Tokens generated per sequence (all sequences of a group advance together)."""
        return self.seqs[0].num_generated

    def set_status(self, status: SequenceStatus) -> None:
        for seq in self.seqs:
            if seq.status is not SequenceStatus.FINISHED:
                seq.status = status

    def token_streams(self) -> list[list[float]]:
        """The token timestamp lists whose gaps are inter-token latencies: the group's one
        (its sequences advance together)."""
        return [self.token_times]

    def __repr__(self) -> str:
        return f"SequenceGroup(req={self.request_id}, seqs={self.seqs})"


def child_request(request: Request, index: int) -> Request:
    """Sample ``index`` of ``request`` as a request of one sample, as vLLM V1's
    ``ParentRequest`` makes its child requests (recalled from vllm/v1/engine/
    parallel_sampling.py: ``n = 1``, and ``seed + index`` where the parent names a seed). The
    id, arrival, prompt (and its token ids) and other sampling parameters are the parent's;
    the temperature the parent resolved for ``n > 1`` is kept. A child without a seed is told
    apart by its group's ``sample_index`` (the engine's sampler adds it to the request's
    drawn seed, as it does for sample ``index`` of a forked group)."""
    sampling = request.sampling
    seed = None if sampling.seed is None else sampling.seed + index
    return replace(request, sampling=replace(sampling, n=1, seed=seed))


class ParentRequest:
    """A request of ``n > 1`` samples served as ``n`` requests of one sample each (vLLM V1).
    ``children`` are their groups, by sample index. It reads as one request wherever a
    finished request is reported (``core.metrics.recorder.Recorder.record_request``, the
    engine's outputs), with vLLM V1's meaning for a parent's output (complete when its last
    child finishes):

    - ``first_token_time`` / ``first_token_step``: the earliest child's first token (what a
      streaming client sees first; vLLM's own TTFT histogram observes each child);
    - ``finish_time`` / ``finish_step``: the last child's finish;
    - ``first_scheduled_time``: the earliest child's admission; ``cached_prompt_tokens``:
      that child's prefix hits, what the cache held of the prompt when the request was first
      admitted (its siblings' hits on each other's blocks are the sharing, counted in the
      steps' physical and logical blocks, not here);
    - ``num_preemptions``, ``readmit_cached_tokens``: summed over the children;
    - the time per output token (:meth:`tpot_s`): the children's mean, each child's from its
      own first token to its finish (vLLM V1 observes each child's), not from the earliest
      first token to the last finish, which would count a later child's wait for a seat;
    - ``reject_reason``: the first child's that has one, saying that it is each sample's (a
      rejected request is rejected whole at intake: its children are the same request, so a
      child's "1 sequence(s)" is each of the ``n``).
    """

    __slots__ = ("children", "num_ended", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.children: list[SequenceGroup] = []
        self.num_ended = 0

    def adopt(self, group: SequenceGroup) -> None:
        """Make ``group`` (the next child, made from :func:`child_request`) one of ours."""
        index = len(self.children)
        group.parent, group.sample_index = self, index
        group.fcfs_key = (group.request.arrival_time, group.request.request_id, index)
        self.children.append(group)

    def child_ended(self) -> bool:
        """Count one child as done (finished, aborted or rejected); whether all are."""
        self.num_ended += 1
        return self.num_ended == len(self.children)

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def seqs(self) -> list[Sequence]:
        """The children's sequences, by sample index."""
        return [seq for child in self.children for seq in child.seqs]

    @property
    def reject_reason(self) -> str | None:
        why = next((c.reject_reason for c in self.children if c.reject_reason), None)
        if why is None:
            return None
        n = self.request.sampling.n
        return f"each of its n={n} samples, served as a request of one sample (vLLM V1): {why}"

    @property
    def is_finished(self) -> bool:
        return all(c.is_finished for c in self.children)

    def _first_admitted(self) -> SequenceGroup | None:
        admitted = [c for c in self.children if c.first_scheduled_time is not None]
        return min(admitted, key=lambda c: (c.first_scheduled_time, c.sample_index), default=None)

    @property
    def first_scheduled_time(self) -> float | None:
        first = self._first_admitted()
        return None if first is None else first.first_scheduled_time

    @property
    def cached_prompt_tokens(self) -> int | None:
        first = self._first_admitted()
        return None if first is None else first.cached_prompt_tokens

    @property
    def first_token_time(self) -> float | None:
        return min((c.first_token_time for c in self.children if c.first_token_time is not None),
                   default=None)  # fmt: skip

    @property
    def first_token_step(self) -> int | None:
        return min((c.first_token_step for c in self.children if c.first_token_step is not None),
                   default=None)  # fmt: skip

    @property
    def finish_time(self) -> float | None:
        times = [c.finish_time for c in self.children]
        return None if None in times else max(t for t in times if t is not None)

    @property
    def finish_step(self) -> int | None:
        steps = [c.finish_step for c in self.children]
        return None if None in steps else max(s for s in steps if s is not None)

    @property
    def num_preemptions(self) -> int:
        return sum(c.num_preemptions for c in self.children)

    @property
    def readmit_cached_tokens(self) -> int:
        return sum(c.readmit_cached_tokens for c in self.children)

    def tpot_s(self) -> float | None:
        """The children's mean time per output token once all finished (s); None for one
        output token. Each child's is computed as a group's row is (from the arrival)."""
        r = self.request
        if r.output_len < 2:
            return None
        per_child = []
        for c in self.children:
            assert c.finish_time is not None and c.first_token_time is not None
            ttft = c.first_token_time - r.arrival_time
            per_child.append((c.finish_time - r.arrival_time - ttft) / (r.output_len - 1))
        return sum(per_child) / len(per_child)

    def token_streams(self) -> list[list[float]]:
        """Each child's token timestamps: inter-token gaps are taken within a child."""
        return [c.token_times for c in self.children]

    def __repr__(self) -> str:
        return f"ParentRequest(req={self.request_id}, children={self.children})"
