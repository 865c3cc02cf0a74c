"""Iteration-level scheduling, as Orca (Yu et al., OSDI 2022) does it and the vLLM paper
reimplements it (§6.1): first-come-first-served; requests join and leave the batch at
every iteration; a request is admitted only when the KV-cache manager can reserve its
whole contiguous region (``max`` / ``pow2`` / ``oracle`` policy, chosen by the manager);
prompts and decodes run in the same iteration (Orca's selective batching).

Where the paper is silent, kvlab chooses (and the config can change): the step's token
budget ``max_num_batched_tokens`` and the sequence cap ``max_num_seqs`` are the same as
vLLM's, so the batch limits do not differ. The iteration rule does, as between the systems
the paper compares: vLLM v0.1's prompt-only steps against Orca's mixed ones (where steps
are compute-bound, that difference, not memory, can decide a comparison; ``system=vllm
system.chunked_prefill=true`` mixes them on vLLM's side).

Reservation covers the whole output, so a running request never runs out of memory and
is never preempted.
"""

from __future__ import annotations

from core.kv.base import KVCacheError
from core.plan import (
    HELD_BY_MAX_NUM_SEQS,
    HELD_BY_MEMORY,
    HELD_BY_TOKEN_BUDGET,
    PrefillChunk,
    StepPlan,
)
from core.sched.base import BaseScheduler, DecodeRun


class OrcaScheduler(BaseScheduler):
    name = "orca"
    kv_kinds = ("contiguous",)  # a request's whole reservation is taken at admission

    def decode_run(self, max_steps: int) -> DecodeRun | None:
        """Plain decode steps of the running groups, in their order (no aborted group, no
        copy pending, no admission: see :meth:`_admits_nothing`; every group one unforked
        sequence with its first token), up to the step in which the first one finishes.
        Reservations are whole, so nothing else can change."""
        if (
            not self.running
            or self._pending_copies
            or self._aborted
            or (self.waiting and not self._admits_nothing())
        ):
            return None
        run = self._lone_decodes(list(self.running), max_steps)
        if run is not None:
            num_seqs = len(run.seqs)
            run.queue_held_by = self._queue_held_by(
                num_seqs, self.config.max_num_batched_tokens - num_seqs
            )
        return run

    def _admits_nothing(self) -> bool:
        """Whether ``schedule`` would admit and abort nothing now, and so at every later
        call while the running groups stay (decodes allocate and free nothing, so the
        head's allocation status and the step's budget stay): the head waits for memory,
        or fits but exceeds the token budget or ``max_num_seqs``."""
        settled = self._head_settled()
        if settled is not None:
            return settled
        num_seqs = sum(len(g.live_seqs()) for g in self.running)
        budget = self.config.max_num_batched_tokens - num_seqs
        return self._queue_held_by(num_seqs, budget) != HELD_BY_MEMORY

    def schedule(self, now: float) -> StepPlan:
        plan = self._new_plan()
        budget = self.config.max_num_batched_tokens
        num_seqs = 0
        copies = self.manager.append_all(self.running) if self.batched_append else None
        if copies is None:
            copies = []
            for group in self.running:
                if not self.manager.can_append(group):
                    # a plugin's reservation short of the output: the loop names the
                    # manager's misuse in one line, as it does FasterTransformer's append
                    raise KVCacheError(
                        f"request {group.request_id} outgrew its reservation; the contiguous "
                        "manager's reservation policy is inconsistent with output_len"
                    )
                copies.extend(self.manager.append(group))
        plan.copies.extend(copies)
        for group in self.running:
            seqs = group.live_seqs()
            plan.decode.extend(seqs)
            budget -= len(seqs)
            num_seqs += len(seqs)
        while (group := self._next_admissible()) is not None:
            need = group.seqs[0].num_tokens
            if need > budget or num_seqs + group.sampling.num_seqs > self.config.max_num_seqs:
                break
            self.waiting.popleft()
            cached = self._admit(group, now)
            self.running.append(group)
            plan.prefill.append(PrefillChunk(group.seqs[0], cached, need - cached))
            budget -= need - cached
            num_seqs += group.sampling.num_seqs
        plan.queue_held_by = self._queue_held_by(num_seqs, budget)
        return self._finish_plan(plan)

    def _queue_held_by(self, num_seqs: int, budget: int) -> int:
        """What holds the queue's head in a step of ``num_seqs`` sequences with ``budget``
        tokens left (``core.plan.HELD_BY_*``), limits first, as :meth:`schedule` checks
        them: ``max_num_seqs``, then the token budget, else memory (its reservation)."""
        if not self.waiting:
            return HELD_BY_MEMORY
        head = self.waiting[0]
        if num_seqs + head.sampling.num_seqs > self.config.max_num_seqs:
            return HELD_BY_MAX_NUM_SEQS
        if head.seqs[0].num_tokens > budget:
            return HELD_BY_TOKEN_BUDGET
        return HELD_BY_MEMORY
