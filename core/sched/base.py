"""The bookkeeping every scheduler shares, and what a policy writes (``schedule``).

A scheduler owns the request queues and a KV-cache manager. The driver (simulator or
engine) calls, in a loop::

    group = scheduler.add(request, now)        # at arrival; may come back rejected
    plan = scheduler.schedule(now)             # decide this step's work
    outcome = executor.run(plan)               # model or measure it
    done = scheduler.update(plan, outcome, t)  # advance sequences, free finished ones

``update`` is shared (:class:`BaseScheduler`); the policies differ in ``schedule`` only.
Timestamps are the driver's clock; ``update`` is called with the step's end time.
"""

from __future__ import annotations

import inspect
from collections import deque
from dataclasses import dataclass
from functools import cache
from types import FunctionType

from core.kv.base import AllocStatus, KVCacheError, KVCacheManager, MemoryBreakdown
from core.plan import HELD_BY_MEMORY, QUEUE_HELD_BY, BeamChoice, StepOutcome, StepPlan
from core.request import Request, Sequence, SequenceGroup, SequenceStatus


class SchedulerConfigError(ValueError):
    """An impossible scheduler configuration."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Knobs shared by the policies (defaults: vLLM v0.1's code; the paper, Kwon et al.,
    SOSP 2023, does not state them).

    - ``max_num_seqs``: most sequences in one batch (vLLM default 256); a request counts
      as the samples or beams it forks into, and one wider than this is rejected (under
      ``vllm_v1`` each sample is a request of its own, one seat each: ``core.loop``);
    - ``max_num_batched_tokens``: most tokens computed in one step (vLLM default 2560);
    - ``max_model_len``: longest prompt + output a request may have (OPT: 2048);
    - ``preemption_mode``: ``recompute`` or ``swap`` (paged only); groups with several
      live sequences are always swapped, as in vLLM v0, and fall back to recompute when the
      CPU pool cannot take them (not under ``vllm_v1``: :attr:`BaseScheduler.swap_groups`);
    - ``chunked_prefill``: paged only; mix decodes and prompt chunks under the token budget
      instead of vLLM v0.1's prompt-only / decode-only iterations.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2560
    max_model_len: int = 2048
    preemption_mode: str = "recompute"
    chunked_prefill: bool = False

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise SchedulerConfigError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len < 2:
            raise SchedulerConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_num_batched_tokens < 1:
            raise SchedulerConfigError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise SchedulerConfigError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is below "
                f"max_model_len={self.max_model_len}: a long prompt (or a recomputed "
                "sequence) could never be scheduled; raise it or enable chunked_prefill"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            # a step's decodes are scheduled whatever the budget, one token per running
            # sequence (vLLM's own SchedulerConfig refuses this pair in every mode)
            raise SchedulerConfigError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is below "
                f"max_num_seqs={self.max_num_seqs}: a step's decodes alone could exceed the "
                "token budget"
            )
        if self.preemption_mode not in ("recompute", "swap"):
            raise SchedulerConfigError(
                f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}"
            )


def stand_in_token_id(seq_id: int) -> int:
    """The id every generated token of sequence ``seq_id`` carries in a body that samples
    none (the simulator): negative, so never a vocabulary id, and one per sequence, so a
    prefix cache finds a sequence's own generated blocks (after a recompute preemption)
    and no other sequence's. The engine's real tokens can also repeat across sequences
    (greedy decoding of one prompt twice); the simulator counts no such hits. From -2 down:
    CPython hashes -1 as -2, so -1 and -2 would name the same blocks."""
    return -2 - seq_id


@dataclass(slots=True)
class DecodeRun:
    """A scheduler's promise about the coming steps (:meth:`BaseScheduler.decode_run`):
    each of the next ``len(new_blocks)`` ``schedule`` calls, with no request added in
    between, would be a plain decode of ``seqs`` (one sequence per group of ``groups``,
    in this order), one new slot each, taking ``new_blocks[j]`` new blocks at the ``j``-th
    call, and only the ``update`` of the last of them may finish groups. ``ctx_tokens``:
    the decode context tokens of the first of those steps (each later one has
    ``len(seqs)`` more); ``num_waiting``: the groups that wait (for admission) meanwhile,
    held by ``queue_held_by`` (``core.plan.HELD_BY_*``; it cannot change in the run)."""

    groups: list[SequenceGroup]
    seqs: list[Sequence]
    new_blocks: list[int]
    ctx_tokens: int
    num_waiting: int = 0
    queue_held_by: int = HELD_BY_MEMORY


class BaseScheduler:
    """Queues, admission checks and the shared ``update``. Subclasses write ``schedule``.

    Invariants (checked by ``check_integrity``): every group added is in exactly one of
    waiting / running / swapped until it finishes or is rejected; running groups hold KV
    slots for their live sequences; waiting ones hold none.
    """

    name = "base"
    # the KV-cache managers (core.systems.SystemSpec.kv) whose contract schedule relies on
    kv_kinds: tuple[str, ...] = ("paged", "contiguous")
    # whether a step's tokens stay within max_num_batched_tokens (plan_problem checks it)
    token_budget = True
    # Decode steps reserve slots with one ``manager.append_all`` call when everything fits
    # (identical results); False keeps the group-by-group reference path (tests).
    batched_append = True
    # Paged: a preempted group of several live sequences (parallel samples, beams) is
    # swapped whatever ``preemption_mode`` says, as in vLLM v0; False: it follows
    # ``preemption_mode`` (vLLM V1 has no swap; ``core.systems.SystemSpec.swap_groups``).
    swap_groups = True
    # False: a beam-search request is rejected at intake (``core.systems.SystemSpec.beam_search``)
    beam_search = True
    # "requests": the step loop serves a request of n > 1 samples as n requests of one sample
    # (``core.systems.SystemSpec.sampling_fanout``, ``core.request.ParentRequest``)
    sampling_fanout = "group"

    def __init__(self, manager: KVCacheManager, config: SchedulerConfig | None = None) -> None:
        self.manager = manager
        self.config = config or SchedulerConfig()
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.step_index = 0
        self._next_seq_id = 0
        self._pending_copies: list[tuple[int, int]] = []
        self._aborted: list[SequenceGroup] = []
        # preemptions that would have swapped and recomputed instead: the CPU pool could not
        # take the group (vLLM v0.1 aborts the run there; kvlab counts them, runs report them)
        self.swap_fallbacks = 0
        # A prefix cache hashes generated tokens too (a request preempted by recompute hits
        # its own earlier blocks), so a body that samples no tokens gives each sequence
        # stand-in ids of its own (see ``stand_in_token_id``).
        self._stand_in_ids = bool(getattr(manager, "enable_prefix_caching", False))

    # -- intake -----------------------------------------------------------------------
    def reject(self, request: Request, reason: str) -> SequenceGroup:
        """A group for ``request`` rejected for ``reason`` at intake (its prompt is unreadable,
        :meth:`core.request.Request.vocabulary_problem`), never queued, as :meth:`add`
        returns one."""
        group = SequenceGroup(request, self._new_seq_id())
        group.reject_reason = reason
        group.set_status(SequenceStatus.REJECTED)
        return group

    def add(self, request: Request, now: float) -> SequenceGroup:
        """Queue a request. A request that can never be served comes back with
        ``reject_reason`` set (and ``finish_time`` unset) instead of being queued."""
        group = SequenceGroup(request, self._new_seq_id())
        limit = self.config.max_model_len
        if request.total_len > limit:
            group.reject_reason = (
                f"prompt_len + output_len = {request.prompt_len} + {request.output_len} = "
                f"{request.total_len} exceeds max_model_len={limit}"
            )
        elif request.sampling.num_seqs > self.config.max_num_seqs:
            group.reject_reason = (
                f"needs {request.sampling.num_seqs} sequences (parallel samples or beams), "
                f"more than max_num_seqs={self.config.max_num_seqs}"
            )
        elif request.sampling.use_beam_search and not self.beam_search:
            group.reject_reason = (
                f"beam search (beam_width={request.sampling.beam_width}): {self.name} runs no "
                "beams in its engine, as vLLM V1, which searches beams on top of its engine, "
                "a request per beam per step (system=vllm runs v0's in-engine beams)"
            )
        elif self._blocks_needed(request) > self._admissible_blocks() or (
            self.manager.can_allocate(group) is AllocStatus.NEVER
        ):
            group.reject_reason = (
                f"needs more KV-cache memory than the cache admits "
                f"({self._admissible_blocks()} of its {self.manager.num_device_blocks} blocks "
                f"of {self.manager.block_size} slots, less the admission watermark) "
                f"for prompt_len={request.prompt_len}, output_len={request.output_len}, "
                f"{request.sampling.num_seqs} sequence(s)"
            )
            said = getattr(self.manager, "reservation_said", None)
            if said is not None:  # contiguous: the policy's reservation is the need
                group.reject_reason += f"; {said(request)}"
        if group.reject_reason is not None:
            group.set_status(SequenceStatus.REJECTED)
            return group
        self.waiting.append(group)
        return group

    def _admissible_blocks(self) -> int:
        """Blocks a waiting group may be given: the device's, less the admission watermark
        (a group re-admitted after a recompute preemption must fit under it again)."""
        return self.manager.num_device_blocks - getattr(self.manager, "watermark_blocks", 0)

    def _blocks_needed(self, request: Request) -> int:
        """Blocks the request occupies at its longest (paged): the full sequence, plus for
        each extra sample or beam every block but the full prompt blocks all of them share.
        A contiguous reservation is never smaller, so this never rejects what it could
        serve."""
        bs = self.manager.block_size
        full = -(-request.total_len // bs)
        private = full - request.prompt_len // bs
        return full + (request.sampling.num_seqs - 1) * private

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self, now: float) -> StepPlan:
        """Decide one step's work at ``now`` (the driver's clock): the one method a policy
        writes. It may admit waiting groups (:meth:`_admit`: the manager allocates their KV
        after ``can_allocate`` said OK), preempt running ones (recompute: their KV freed and
        the group requeued; swap: ``plan.swap_out``), swap groups back in, and reserve each
        scheduled sequence's slots for the tokens the step writes, always asking the manager
        (``can_*``) before committing. It returns the step's prefill chunks, decodes, swaps
        and block copies (:class:`core.plan.StepPlan`), a plan :meth:`plan_problem` finds
        nothing wrong with. It does not advance sequences or finish groups (:meth:`update`
        does, at the step's end). An empty plan means nothing can run now: idle when no
        group is left, else a stall (:class:`core.loop.StallError`)."""
        raise NotImplementedError

    def decode_run(self, max_steps: int) -> DecodeRun | None:
        """Up to ``max_steps`` coming steps that are plain decodes (:class:`DecodeRun`), so
        that a body that only prices steps can run them at once
        (:meth:`core.loop.StepLoop.fast_forward`); None when the next step is not one.
        The default promises nothing. A body asks :meth:`decode_run_applies` first."""
        return None

    @classmethod
    def decode_run_applies(cls) -> bool:
        """Whether this class's :meth:`decode_run` speaks for the steps it schedules: every
        method in effect other than ``__init__`` and ``add`` (which set up and queue,
        between runs) is the one in effect in the class that defines the ``decode_run``
        (none comes from a subclass of it, or from a mixin listed after it). A subclass
        that overrides ``schedule``, ``update`` or a helper they call (a policy of your own
        built on a shipped one) but not ``decode_run`` runs step by step, since the promise
        was made for its parent's steps."""
        return _decode_run_applies(cls)

    def advance_decode_run(
        self, run: DecodeRun, ends: list[float], schedule_next: bool = False
    ) -> tuple[list[MemoryBreakdown], list[SequenceGroup]]:
        """The state ``len(ends)`` steps of ``run`` leave, ``schedule`` and ``update``
        called for each (``ends``: the steps' end times), at once; with
        ``schedule_next``, also the next step of ``run`` scheduled (its plan: decodes of
        ``run.seqs``; its ``update`` is the caller's, when it ends). Returns the memory
        breakdown during each of those steps (what ``manager.breakdown()`` said after its
        ``schedule``) and the groups the last ended step finished (as ``update`` returns
        them)."""
        steps = len(ends)
        scheduled = steps + schedule_next
        manager = self.manager
        memories = manager.lockstep_breakdowns(len(run.seqs), run.new_blocks[:scheduled])
        manager.advance_lockstep(run.seqs, scheduled)
        finished: list[SequenceGroup] = []
        for seq in run.seqs:
            group = seq.group
            request = group.request
            generated = seq.num_generated + steps
            seq.num_generated = generated
            seq.num_computed = request.prompt_len + generated - 1
            group.token_times.extend(ends)
            if generated >= request.output_len:
                finished.append(group)
        if self._stand_in_ids:  # a prefix cache hashes the generated tokens too
            for seq in run.seqs:
                seq.output_token_ids.extend([stand_in_token_id(seq.seq_id)] * steps)
            manager.register_run(run.seqs, 0 if schedule_next else 1)
        self.running = run.groups
        self.step_index += steps
        if finished:
            last, step = ends[-1], self.step_index - 1
            for group in finished:
                self._finish(group, last, step)
            self._drop_finished()
        return memories, finished

    def _head_settled(self, first_chunk: int | None = None) -> bool | None:
        """What the queue's head does at the next ``schedule`` if it cannot be admitted:
        True when it waits for memory (``LATER``, which stays ``LATER`` while blocks are
        only taken), False when it would be aborted (``NEVER``: the next schedule changes
        the queue), None when it fits now and the caller's own limits decide.
        ``first_chunk``: the tokens its first chunk would compute, where the manager
        allocates by chunk (``can_allocate``'s)."""
        status = self.manager.can_allocate(self.waiting[0], first_chunk)
        if status is AllocStatus.LATER:
            return True
        if status is AllocStatus.NEVER:
            return False
        return None

    def _lone_decodes(self, groups: list[SequenceGroup], max_steps: int) -> DecodeRun | None:
        """The :class:`DecodeRun` of ``groups`` (the running ones, in the order a decode
        step takes them), if each is one unforked sequence that has its first token, up to
        the step in which the first of them finishes (at most ``max_steps``) and as far as
        the manager can grow them in lockstep; the caller checks its policy's other
        conditions (admission, preemption)."""
        seqs: list[Sequence] = []
        steps, ctx = max_steps, 0
        for group in groups:
            if len(group.seqs) != 1 or group.first_token_time is None:
                return None
            request = group.request
            sampling = request.sampling
            if sampling.n != 1 or sampling.beam_width != 1:  # update() would fork it
                return None
            seq = group.seqs[0]
            left = request.output_len - seq.num_generated
            if left < steps:
                steps = left
            ctx += request.prompt_len + seq.num_generated
            seqs.append(seq)
        if steps <= 0:
            return None
        new_blocks = self.manager.lockstep_blocks(seqs, steps)
        if new_blocks is None:
            return None
        return DecodeRun(groups, seqs, new_blocks, ctx, len(self.waiting))

    # -- helpers for subclasses -------------------------------------------------------
    def _new_seq_id(self) -> int:
        sid = self._next_seq_id
        self._next_seq_id += 1
        return sid

    def _next_admissible(self, first_chunk: int | None = None) -> SequenceGroup | None:
        """The head of the waiting queue if the KV manager can allocate it now (its first
        ``first_chunk`` tokens where the manager allocates by chunk), else None (FCFS:
        nothing behind a head that must wait is considered). Heads that can never fit any
        more are aborted on the way."""
        while self.waiting:
            group = self.waiting[0]
            status = self.manager.can_allocate(group, first_chunk)
            if status is AllocStatus.OK:
                return group
            if status is AllocStatus.LATER:
                return None
            self.waiting.popleft()
            self._abort(group, "no longer fits in the KV cache")
        return None

    def _admit(self, group: SequenceGroup, now: float, first_chunk: int | None = None) -> int:
        """Allocate KV for a waiting group (for its first ``first_chunk`` tokens where the
        manager allocates by chunk) and mark it running. Returns cached tokens, which the
        group keeps as ``cached_prompt_tokens`` at its first admission and adds to
        ``readmit_cached_tokens`` at a re-admission after a recompute preemption (where it
        finds its own blocks again, its generated tokens' too)."""
        cached = self.manager.allocate(group, first_chunk)
        for seq in group.live_seqs():
            seq.num_computed = cached
            seq.status = SequenceStatus.RUNNING
        if group.first_scheduled_time is None:
            group.first_scheduled_time = now
            group.cached_prompt_tokens = cached
        else:
            group.readmit_cached_tokens += cached
        return cached

    def _new_plan(self) -> StepPlan:
        plan = StepPlan([], [], [], [], [], [], [])  # skips seven default-factory calls
        if self._pending_copies:
            plan.copies.extend(self._pending_copies)
            self._pending_copies.clear()
        return plan

    def _finish_plan(self, plan: StepPlan) -> StepPlan:
        plan.num_waiting = len(self.waiting)
        plan.num_swapped = len(self.swapped)
        return plan

    def _abort(self, group: SequenceGroup, reason: str) -> None:
        """Fail one group without touching the others (frees what it holds)."""
        for seq in group.live_seqs():
            if seq.status is SequenceStatus.RUNNING or seq.status is SequenceStatus.SWAPPED:
                self.manager.free(seq.seq_id)
        group.reject_reason = reason
        group.set_status(SequenceStatus.REJECTED)
        self._aborted.append(group)

    def pop_aborted(self) -> list[SequenceGroup]:
        """Groups failed since the last call (the driver records them as rejected)."""
        if not self._aborted:
            return []
        out, self._aborted = self._aborted, []
        return out

    # -- the shared update ------------------------------------------------------------
    def update(self, plan: StepPlan, outcome: StepOutcome, now: float) -> list[SequenceGroup]:
        """Advance every scheduled sequence by the step's result; return groups finished
        in this step (their KV already freed). ``now`` is the step's end time."""
        step = self.step_index
        self.step_index += 1
        tokens = outcome.token_ids
        stand_in = tokens is None and self._stand_in_ids
        if stand_in:  # the prompts' ids here, the decodes' in their loop below
            tokens = {c.seq.seq_id: stand_in_token_id(c.seq.seq_id) for c in plan.prefill}
        # Keyed by the group object (identity hash): insertion order is sampling order.
        sampled: dict[SequenceGroup, None] = {}
        for chunk in plan.prefill:
            seq = chunk.seq
            seq.num_computed = chunk.end
            self.manager.note_computed(seq)
            if chunk.end >= seq.num_tokens:
                self._emit(seq, tokens)
                sampled[seq.group] = None
        if tokens is None:
            for seq in plan.decode:  # the hot loop: _emit and num_tokens inlined
                group = seq.group
                n = seq.num_generated
                seq.num_computed = group.request.prompt_len + n
                seq.num_generated = n + 1
                sampled[group] = None
        elif stand_in:
            for seq in plan.decode:  # the same with a prefix cache: _emit's stand-in id too
                group = seq.group
                n = seq.num_generated
                seq.num_computed = group.request.prompt_len + n
                seq.num_generated = n + 1
                seq.output_token_ids.append(stand_in_token_id(seq.seq_id))
                sampled[group] = None
        else:
            for seq in plan.decode:
                seq.num_computed = seq.num_tokens
                self._emit(seq, tokens)
                sampled[seq.group] = None

        beams = {id(b.group): b for b in outcome.beams} if outcome.beams else None
        finished: list[SequenceGroup] = []
        for group in sampled:
            choice = beams.get(id(group)) if beams is not None else None
            seqs = group.seqs
            request = group.request
            if choice is not None:
                self._apply_beams(group, choice, stand_in=outcome.token_ids is None)
            elif len(seqs) == 1 and (request.sampling.n > 1 or request.sampling.beam_width > 1):
                self._fork_samples(group, outcome)
            if group.first_token_time is None:
                group.first_token_time = now
                group.first_token_step = step
            group.token_times.append(now)
            if group.seqs[0].num_generated >= request.output_len:
                self._finish(group, now, step)
                finished.append(group)
        if finished:
            self._drop_finished()
        return finished

    def _emit(self, seq: Sequence, tokens: dict[int, int] | None) -> None:
        seq.num_generated += 1
        if tokens is not None:
            seq.output_token_ids.append(tokens[seq.seq_id])

    def _fork_samples(self, group: SequenceGroup, outcome: StepOutcome) -> None:
        """After the prompt's first token, split the group into ``n`` parallel samples."""
        parent = group.seqs[0]
        extra = outcome.extra_samples.get(parent.seq_id) if outcome.extra_samples else None
        for i in range(group.sampling.num_seqs - 1):
            child = self._spawn_child(parent)
            if extra is not None:
                child.output_token_ids[-1] = extra[i]
            elif child.output_token_ids:  # stand-in ids: each sample's first token its own
                child.output_token_ids[-1] = stand_in_token_id(child.seq_id)
            self._fork_copies(parent, child)

    def _fork_copies(self, parent: Sequence, child: Sequence) -> None:
        """Fork ``child``'s cache from ``parent``'s and queue the block copies for the next
        plan, unless this token was the request's last: ``update`` then frees every region of
        the request, and a copy into them would make a step of its own (contiguous managers;
        paged forks share blocks and copy nothing)."""
        copies = self.manager.fork(parent.seq_id, child.seq_id)
        if parent.num_generated < parent.group.request.output_len:
            self._pending_copies.extend(copies)

    def _spawn_child(self, parent: Sequence) -> Sequence:
        group = parent.group
        child = Sequence(self._new_seq_id(), group)
        child.num_generated = parent.num_generated
        child.num_computed = parent.num_computed
        child.output_token_ids = list(parent.output_token_ids)
        child.status = parent.status
        child.parent_seq_id = parent.seq_id
        child.cum_logprob = parent.cum_logprob
        group.seqs.append(child)
        return child

    def _apply_beams(self, group: SequenceGroup, choice: BeamChoice, stand_in: bool) -> None:
        """Make the group hold exactly the chosen beams. Each beam is ``(parent, token)``;
        the first beam of a parent reuses it, later ones fork it; unchosen parents are
        freed. Tokens in ``choice`` replace the token the step appended; with ``stand_in``
        (a body that samples no tokens, whose ``token`` is a candidate index, not a
        vocabulary id) each beam's token is its own stand-in id instead, so a prefix cache
        cannot match one beam's generated blocks to another request's prompt."""
        by_id = {s.seq_id: s for s in group.live_seqs()}
        used: set[int] = set()
        new_seqs: list[tuple[Sequence, int, float | None]] = []
        forks: list[tuple[Sequence, int, float | None]] = []
        scores = choice.scores or [None] * len(choice.beams)
        for (parent_id, token), score in zip(choice.beams, scores, strict=True):
            parent = by_id.get(parent_id)
            if parent is None:
                raise ValueError(
                    f"beam parent {parent_id} is not a live sequence of request {group.request_id}"
                )
            if parent_id in used:
                forks.append((parent, token, score))
            else:
                used.add(parent_id)
                new_seqs.append((parent, token, score))
        for seq in list(by_id.values()):  # free first: a contiguous fork reuses the region
            if seq.seq_id not in used:
                self.manager.free(seq.seq_id)
                group.seqs.remove(seq)
        for parent, token, score in forks:
            child = self._spawn_child(parent)
            self._fork_copies(parent, child)
            new_seqs.append((child, token, score))
        for seq, token, score in new_seqs:
            if seq.output_token_ids:
                seq.output_token_ids[-1] = stand_in_token_id(seq.seq_id) if stand_in else token
            if score is not None:
                seq.cum_logprob = score

    def _finish(self, group: SequenceGroup, now: float, step: int) -> None:
        for seq in group.live_seqs():
            self.manager.free(seq.seq_id)
            seq.status = SequenceStatus.FINISHED
        group.finish_time = now
        group.finish_step = step

    def _drop_finished(self) -> None:
        self.running = [g for g in self.running if g.finish_time is None]

    # -- invariants -------------------------------------------------------------------
    def plan_problem(self, plan: StepPlan) -> str | None:
        """What makes ``plan`` (just returned by :meth:`schedule`) a step no body can run
        right, or None: a sequence scheduled twice or not RUNNING; a prefill chunk that is
        empty, does not start at the sequence's computed tokens or runs past its tokens; a
        decode of a sequence that still needs prefill; fewer KV slots than the tokens the
        step writes; more sequences than ``max_num_seqs``; or, under a :attr:`token_budget`,
        more tokens than ``max_num_batched_tokens`` in a step that does not prefill exactly
        one group (a group that can never fit the budget, e.g. a recomputed wide one, may go
        over it alone, as vLLM's scheduler lets it); or a CPU block both swapped in and
        swapped out (the bodies swap out first, so the swap-in would read the block the
        swap-out wrote; no shipped policy plans both in one step); or a ``queue_held_by``
        that is not one of ``core.plan.QUEUE_HELD_BY``'s codes (the metrics split free
        memory by it). O(sequences and blocks in the plan)."""
        if plan.queue_held_by not in QUEUE_HELD_BY:
            return (f"queue_held_by {plan.queue_held_by!r} is not one of core.plan.HELD_BY_* "
                    f"({', '.join(f'{c} {n}' for c, n in QUEUE_HELD_BY.items())})")  # fmt: skip
        if plan.swap_in and plan.swap_out:
            reused = {cpu for cpu, _ in plan.swap_in} & {cpu for _, cpu in plan.swap_out}
            if reused:
                return f"CPU block(s) {sorted(reused)[:4]} both swapped in and swapped out"
        seen: set[int] = set()
        manager, config = self.manager, self.config
        work = [(c.seq, c.start, c.length) for c in plan.prefill]
        work += [(s, s.num_computed, 1) for s in plan.decode]
        for i, (seq, start, length) in enumerate(work):
            prefill = i < len(plan.prefill)
            if seq.seq_id in seen:
                return f"{seq} is scheduled twice"
            seen.add(seq.seq_id)
            if seq.status is not SequenceStatus.RUNNING:
                return f"{seq} is scheduled with status {seq.status.name}, not RUNNING"
            if prefill and not (length >= 1 and start == seq.num_computed):
                return (f"{seq}: prefill chunk [{start}, {start + length}) does not start at "
                        f"its {seq.num_computed} computed tokens or is empty")  # fmt: skip
            if prefill and start + length > seq.num_tokens:
                return f"{seq}: prefill chunk ends past its {seq.num_tokens} tokens"
            if not prefill and seq.needs_prefill:
                return f"{seq} is decoded before its prefill ({seq.num_computed} computed)"
            try:
                slots = manager.num_slots(seq.seq_id)
            except KVCacheError:
                return f"{seq} is scheduled but holds no KV"
            if slots < start + length:
                return f"{seq} writes token {start + length} into {slots} KV slots"
        if len(work) > config.max_num_seqs:
            return f"{len(work)} sequences, over max_num_seqs {config.max_num_seqs}"
        tokens = sum(w[2] for w in work)
        groups = {id(c.seq.group) for c in plan.prefill}
        if self.token_budget and tokens > config.max_num_batched_tokens and len(groups) != 1:
            return f"{tokens} tokens, over max_num_batched_tokens {config.max_num_batched_tokens}"
        return None

    def check_integrity(self) -> None:
        """Raise AssertionError if queues and sequence states disagree, a running sequence
        holds fewer KV slots than the tokens it has computed, or the manager holds KV for
        other sequences than the running and swapped ones (a leak: memory never freed)."""
        seen: set[int] = set()
        for where, groups, status in (
            ("waiting", self.waiting, SequenceStatus.WAITING),
            ("running", self.running, SequenceStatus.RUNNING),
            ("swapped", self.swapped, SequenceStatus.SWAPPED),
        ):
            for g in groups:
                assert id(g) not in seen, f"request {g.request_id} is in two queues"
                seen.add(id(g))
                assert not g.is_finished, f"finished request {g.request_id} still in {where}"
                for s in g.live_seqs():
                    assert s.status is status, f"{s} in {where} has status {s.status}"
                    if status is SequenceStatus.RUNNING:
                        slots = self.manager.num_slots(s.seq_id)
                        assert slots >= s.num_computed, (
                            f"{s} computed {s.num_computed} tokens into {slots} slots"
                        )
        live = {s.seq_id for g in (*self.running, *self.swapped) for s in g.live_seqs()}
        held = self.manager.held_seq_ids()
        assert held == live, (
            f"KV held by sequences not running or swapped: {sorted(held - live)[:5]}; "
            f"running or swapped without KV: {sorted(live - held)[:5]}"
        )
        self.manager.check_integrity()


# what a subclass may define and keep its parent's decode_run promise: dunders (__init__
# sets up), add (queues between runs: a run stops at an arrival), data attributes
_KEEPS_THE_PROMISE = frozenset({"add"})
_BEHAVIOUR = (FunctionType, classmethod, staticmethod, property)


def _changes_steps(name: str, value: object) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return isinstance(value, _BEHAVIOUR) and not dunder and name not in _KEEPS_THE_PROMISE


@cache
def _decode_run_applies(cls: type) -> bool:
    """No behaviour of ``cls`` resolves otherwise than in the class whose ``decode_run`` is
    in effect: a class below it, or a mixin after it in the MRO (``class P(VLLMScheduler,
    Mixin)``: the mixin's ``update`` is P's, yet not the promiser's), may only set up."""
    promiser = next(k for k in cls.__mro__ if "decode_run" in k.__dict__)
    promised = set(promiser.__mro__)
    return not any(
        _changes_steps(n, v) and inspect.getattr_static(promiser, n, None) is not v
        and inspect.getattr_static(cls, n) is v
        for k in cls.__mro__ if k not in promised
        for n, v in vars(k).items()
    )  # fmt: skip
