"""Paged continuous batching, as vLLM (SOSP 2023, §4.5; v0.1 scheduler) does it.

Each ``schedule`` call, in this order:

1. If nothing is swapped out, admit waiting groups first-come-first-served while the KV
   manager can allocate their prompt, the step's token budget and the sequence cap allow.
   If any was admitted, the step is *prompt-only* (vLLM v0.1 never mixed prompts with
   decodes). The queue stops at the first group that does not fit (no skipping ahead).
2. Otherwise, a decode step: every running group (oldest first) gets a slot for its next
   token. When the cache is out of blocks the *latest-arrived* running group is preempted
   (all-or-nothing) — by recomputation (its KV freed, the group goes back to the front of
   the waiting queue) or by swapping its blocks to the CPU pool. A group the CPU pool
   cannot take is recomputed instead (vLLM v0.1 aborts the whole run: "Aborted due to the
   lack of CPU swap space"), and counted in ``swap_fallbacks`` (a run's
   ``num_swap_fallbacks``). A swap run with no pool at all is refused by the run's config
   check.
3. If nothing was preempted in this step, swapped groups come back (oldest first) while
   their blocks fit. Swapped groups block admissions (step 1) until all are back.

With ``chunked_prefill`` the step instead mixes every running decode with prompt chunks
that fill the remaining token budget (later vLLM versions; off by default).
"""

from __future__ import annotations

from operator import attrgetter

from core.kv.paged import PagedKVCacheManager
from core.plan import (
    HELD_BY_MAX_NUM_SEQS,
    HELD_BY_MEMORY,
    HELD_BY_TOKEN_BUDGET,
    PrefillChunk,
    StepPlan,
)
from core.request import Sequence, SequenceGroup, SequenceStatus
from core.sched.base import BaseScheduler, DecodeRun, SchedulerConfig


class VLLMScheduler(BaseScheduler):
    name = "vllm"
    kv_kinds = ("paged",)  # it grows blocks step by step and notes each scheduled chunk

    def schedule(self, now: float) -> StepPlan:
        plan = self._new_plan()
        if self.config.chunked_prefill:
            self._schedule_mixed(plan, now)
        elif self.swapped or not self._admit_prompts(plan, now):
            self._schedule_decodes(plan)  # prompt-only steps admit while nothing is swapped
        if self.waiting or self.swapped:  # else nothing waits: HELD_BY_MEMORY, the default
            used = len(plan.decode) + sum(c.length for c in plan.prefill)
            preempted = bool(plan.preempted or plan.preempted_by_swap)
            plan.queue_held_by = self._queue_held_by(bool(plan.prefill), used, preempted)
        return self._finish_plan(plan)

    def _queue_held_by(self, prompt_step: bool, tokens_used: int, preempted: bool) -> int:
        """What holds the queue's head after a step that used ``tokens_used`` of the token
        budget (``core.plan.HELD_BY_*``), limits first: ``max_num_seqs`` if the running
        sequences leave it no room; the token budget if the step's left it none (with
        chunked prefill: no chunk for it; without: a prompt step with less left than its
        tokens); else memory (a swap-in, an allocation, or after a preemption)."""
        head = self.swapped[0] if self.swapped else self.waiting[0] if self.waiting else None
        if head is None:
            return HELD_BY_MEMORY
        running = sum(g.request.sampling.num_seqs for g in self.running)
        if running + head.request.sampling.num_seqs > self.config.max_num_seqs:
            return HELD_BY_MAX_NUM_SEQS
        if self.swapped or preempted:
            return HELD_BY_MEMORY
        left = self.config.max_num_batched_tokens - tokens_used
        seqs = head.live_seqs()
        if self.config.chunked_prefill:
            if left <= 0 or _lockstep_share(len(seqs), left, self.config) == 0:
                return HELD_BY_TOKEN_BUDGET
        elif prompt_step and sum(s.num_tokens for s in seqs) > left:
            return HELD_BY_TOKEN_BUDGET
        return HELD_BY_MEMORY

    def decode_run(self, max_steps: int) -> DecodeRun | None:
        """Plain decode steps (no swapped or aborted group, no copy pending, no admission:
        see :meth:`_admits_nothing`; every running group one unforked sequence with its
        first token, and with chunked prefill none with a prompt left to compute) up to
        the step in which the first group finishes, as long as the paged manager's free
        blocks cover the steps' new blocks (no preemption). With chunked prefill and a
        request waiting, also only while the steps' new blocks evict none of the queue
        head's prefix-cache hits (a chunk's need counts them: see :meth:`_admits_nothing`)."""
        chunked = self.config.chunked_prefill
        if (
            self.swapped
            or not self.running
            or self._pending_copies
            or self._aborted
            or not isinstance(self.manager, PagedKVCacheManager)
        ):
            return None
        budget = None
        if chunked:
            # what _schedule_mixed leaves for admissions after one decode per sequence
            budget = self.config.max_num_batched_tokens - sum(len(g.seqs) for g in self.running)
        if self.waiting and not self._admits_nothing(budget):
            return None
        run = self._lone_decodes(sorted(self.running, key=_arrival), max_steps)
        if run is None:
            return None
        if chunked:  # no prompt chunk to schedule (Sequence.needs_prefill, inlined)
            for seq in run.seqs:
                n = seq.num_generated
                if n == 0 or seq.num_computed < seq.group.request.prompt_len + n - 1:
                    return None
        free, taken = self.manager.num_free_blocks(), 0
        # not only defensive: tests/test_fast_forward.py has a run that diverges without it
        if chunked and self.waiting and budget > 0:
            free = self.manager.takes_sparing_hits(self.waiting[0], free)
        for j, n in enumerate(run.new_blocks):
            taken += n
            if taken > free:
                del run.new_blocks[j:]
                break
        run.queue_held_by = self._queue_held_by(False, len(run.seqs), False)
        return run if run.new_blocks else None

    def _admits_nothing(self, budget: int | None = None) -> bool:
        """Whether :meth:`_admit_prompts` would admit and abort nothing now, and so at
        every later call while the running groups stay and free blocks only shrink: the
        queue's head must wait for memory (``LATER`` stays ``LATER`` as blocks are
        taken), or fits but would exceed ``max_num_seqs``. ``budget`` (chunked prefill):
        the tokens a step's decodes leave: with none left no admission is tried; else the
        head's first chunk is that long (never a share of 0 per sequence: the budget, at
        least ``max_num_seqs`` less the running sequences, covers the head's whenever it
        passes the seat check). A block taken from the free list or by evicting a block
        that is no hit lowers the free count and leaves the need. Evicting one of the head's
        prefix-cache hits also drops every hit after it in its chain, and where the manager
        allocates by chunk the chunk's new blocks stay as many (while it ends short of the
        head's last block) but its need no longer counts the dropped evictable hits as
        blocks to take: one block taken can lower the need by several (a chain whose middle
        block was released first, as recompute preemptions of a request that recomputed a
        duplicate block leave it), so ``LATER`` stays ``LATER`` only while no hit is
        evicted (:meth:`decode_run` stops there; without per-chunk allocation, as ``vllm``
        with chunked prefill, a dropped hit is a block to allocate, the need does not fall,
        and the cap only shortens runs)."""
        if budget is not None and budget <= 0:
            return True
        settled = self._head_settled(budget)
        if settled is not None:
            return settled
        width = self.waiting[0].request.sampling.num_seqs
        running = sum(g.request.sampling.num_seqs for g in self.running)
        return running + width > self.config.max_num_seqs

    # -- step kinds -----------------------------------------------------------------
    def _admit_prompts(self, plan: StepPlan, now: float, budget: int | None = None) -> bool:
        """Admit FCFS into ``plan.prefill``; True if anything was admitted."""
        if not self.waiting:
            return False
        budget = self.config.max_num_batched_tokens if budget is None else budget
        num_seqs = -1  # counted once a head can be allocated (often it cannot)
        admitted = False
        chunked = self.config.chunked_prefill
        # the first chunk's tokens, where the manager allocates by chunk (>= 1: with no
        # budget left the loop stops below, after the head's NEVER check)
        while (group := self._next_admissible(max(budget, 1) if chunked else None)) is not None:
            if num_seqs < 0:
                num_seqs = sum(g.request.sampling.num_seqs for g in self.running)
            seqs = group.live_seqs()
            width = group.request.sampling.num_seqs  # what the group forks into
            need = sum(s.num_tokens for s in seqs)
            # A recomputed multi-sequence group can need more than a whole step's budget;
            # without chunking it then goes alone and whole (over budget) rather than block
            # the queue forever; with chunking it continues in later steps.
            if not chunked and need > budget and admitted:
                break
            if num_seqs + width > self.config.max_num_seqs or budget <= 0:
                break
            if chunked and _lockstep_share(len(seqs), budget, self.config) == 0:
                break
            self.waiting.popleft()
            cached = self._admit(group, now, max(budget, 1) if chunked else None)
            self.running.append(group)
            num_seqs += width
            if chunked:
                budget = self._lockstep_chunks(plan, seqs, budget)
            else:
                for seq in seqs:
                    self._add_chunk(plan, seq, cached, seq.num_tokens - cached)
                    budget -= seq.num_tokens - cached
            admitted = True
        return admitted

    def _lockstep_chunks(self, plan: StepPlan, seqs: list[Sequence], budget: int) -> int:
        """Append one group's prefill chunks of :func:`_lockstep_share` tokens (fewer where
        a prompt ends sooner); returns the budget left."""
        share = _lockstep_share(len(seqs), budget, self.config)
        if share == 0:
            return budget
        for seq in seqs:
            length = _chunk_length(seq, share)
            self._add_chunk(plan, seq, seq.num_computed, length)
            budget -= length
        return budget

    def _add_chunk(self, plan: StepPlan, seq: Sequence, start: int, length: int) -> None:
        plan.prefill.append(PrefillChunk(seq, start, length))
        self.manager.note_scheduled(seq, start + length)

    def _schedule_decodes(self, plan: StepPlan) -> None:
        self._reserve_decode_slots(plan)
        if not plan.preempted and not plan.preempted_by_swap:
            self._swap_in(plan)
        for group in self.running:
            plan.decode.extend(group.live_seqs())

    def _schedule_mixed(self, plan: StepPlan, now: float) -> None:
        """Chunked prefill: every decode first, then the running groups' partial prompts
        (in arrival order), then admissions, within the step's token budget."""
        self._reserve_decode_slots(plan, decode_only=True)
        if not plan.preempted and not plan.preempted_by_swap:
            self._swap_in(plan)
        budget = self.config.max_num_batched_tokens
        prefilling: list[list[Sequence]] = []
        for group in self.running:
            seqs = []
            for seq in group.live_seqs():
                if seq.needs_prefill:
                    seqs.append(seq)
                else:
                    plan.decode.append(seq)
                    budget -= 1
            if seqs:
                prefilling.append(seqs)
        while prefilling and budget > 0:
            seqs = prefilling.pop(0)
            if not self._blocks_for_chunk(plan, seqs, budget, prefilling):
                break  # it gave way itself: it was the last admitted
            budget = self._lockstep_chunks(plan, seqs, budget)
        if not self.swapped and not plan.preempted and budget > 0:
            self._admit_prompts(plan, now, budget)

    def _blocks_for_chunk(
        self, plan: StepPlan, seqs: list[Sequence], budget: int, later: list[list[Sequence]]
    ) -> bool:
        """Where the manager allocates a prompt chunk by chunk (vLLM V1), the blocks of this
        group's next chunk. While they are short, the last admitted running group gives way,
        as vLLM V1 preempts the last of its running requests: one still prefilling after it
        (``later``'s last), else this one (and False). A group still prefilling was admitted
        after every decoding one: a step admits only with budget left after the chunks of
        those before, so a decoding group admitted later finds this one's prefill done."""
        manager = self.manager
        if not getattr(manager, "allocate_per_chunk", False) or len(seqs) != 1:
            return True
        seq = seqs[0]
        share = _lockstep_share(1, budget, self.config)
        end = seq.num_computed + _chunk_length(seq, share)
        while not manager.can_grow_prefill(seq, end):
            victim = later.pop()[0].group if later else seq.group
            self._preempt(victim, plan)
            self.running.remove(victim)
            if victim is seq.group:
                return False
        manager.grow_prefill(seq, end)
        return True

    # -- memory -----------------------------------------------------------------------
    def _reserve_decode_slots(self, plan: StepPlan, decode_only: bool = False) -> None:
        """Give each running group a slot per live sequence, preempting latest-first."""
        queue = sorted(self.running, key=_arrival)
        if self.batched_append:
            if decode_only:
                growing = [g for g in queue if not any(s.needs_prefill for s in g.live_seqs())]
            else:
                growing = queue
            copies = self.manager.append_all(growing)
            if copies is not None:  # everything fits: no preemption this step
                plan.copies.extend(copies)
                self.running = queue
                return
        kept: list[SequenceGroup] = []
        while queue:
            group = queue.pop(0)
            if decode_only and any(s.needs_prefill for s in group.live_seqs()):
                kept.append(group)
                continue
            while (copies := self.manager.try_append(group)) is None:
                if not queue and not kept:
                    self._abort(group, _TOO_BIG.format(blocks=self.manager.num_device_blocks))
                    break
                victim = queue.pop() if queue else group
                self._preempt(victim, plan)
                if victim is group:
                    break
            else:
                plan.copies.extend(copies)
                kept.append(group)
        self.running = kept

    def _preempt(self, group: SequenceGroup, plan: StepPlan) -> None:
        group.num_preemptions += 1
        multi = len(group.live_seqs()) > 1
        want_swap = self.config.preemption_mode == "swap" or (multi and self.swap_groups)
        if want_swap and self.manager.can_swap_out(group):
            plan.swap_out.extend(self.manager.swap_out(group))
            group.set_status(SequenceStatus.SWAPPED)
            self.swapped.append(group)
            self.swapped.sort(key=_arrival)
            plan.preempted_by_swap.append(group)
            return
        self.swap_fallbacks += want_swap
        for seq in group.live_seqs():
            self.manager.free(seq.seq_id)
            seq.num_computed = 0
            seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(group)
        plan.preempted.append(group)

    def _swap_in(self, plan: StepPlan) -> None:
        if not self.swapped:
            return
        num_seqs = sum(g.request.sampling.num_seqs for g in self.running)
        while self.swapped:
            group = self.swapped[0]
            width = group.request.sampling.num_seqs
            if num_seqs + width > self.config.max_num_seqs:
                break
            if not self.manager.can_swap_in(group):
                if self.running:
                    break
                self.swapped.pop(0)  # alone on an empty device and still too big
                self._abort(group, _TOO_BIG.format(blocks=self.manager.num_device_blocks))
                continue
            self.swapped.pop(0)
            plan.swap_in.extend(self.manager.swap_in(group))
            group.set_status(SequenceStatus.RUNNING)
            plan.copies.extend(self.manager.append(group))
            self.running.append(group)
            num_seqs += width


def _lockstep_share(num_seqs: int, budget: int, config: SchedulerConfig) -> int:
    """Tokens each of a group's ``num_seqs`` prefilling sequences may compute this step: an
    equal share of ``budget``, so that the group's sequences (in step, as gang scheduling
    keeps them) reach their last token and sample in the same step. 0 (wait for a fuller
    budget) when the share rounds to 0, except for a group wider than the whole step budget,
    which gets 1 token each (over budget) rather than never run."""
    share = budget // num_seqs
    if share == 0 and num_seqs > config.max_num_batched_tokens:
        return 1
    return share


def _chunk_length(seq: Sequence, share: int) -> int:
    """The tokens of ``seq``'s prompt a step computes given ``share`` of its budget."""
    return min(seq.num_tokens - seq.num_computed, share)


_TOO_BIG = "outgrew the KV cache: alone on the device it needs more than all {blocks} blocks"


_arrival = attrgetter("fcfs_key")  # FCFS order: (arrival time, request id)
