"""Request-level batching, as FasterTransformer serves (vLLM paper §6.1): take up to
``max_num_seqs`` of the earliest-arrived requests — as many as the KV-cache manager can
reserve (the paper: "B as large as memory allows", with Orca (Max) memory management) —
prefill them together in one step, then decode the batch until *every* member has
finished. Nothing joins a batch in flight; a finished member stops computing but its
batch-mates keep the others waiting.

kvlab choices where the paper is silent: the batch's prompts are computed in one step
without padding (kinder to FasterTransformer than its padded kernels); the step token
budget does not limit the batch (FasterTransformer has none).
"""

from __future__ import annotations

from core.plan import HELD_BY_BATCH, HELD_BY_MAX_NUM_SEQS, PrefillChunk, StepPlan
from core.sched.base import BaseScheduler, DecodeRun


class FasterTransformerScheduler(BaseScheduler):
    name = "fastertransformer"
    kv_kinds = ("contiguous",)  # a request's whole reservation is taken at admission
    token_budget = False  # a batch of whole prompts, bounded by max_num_seqs alone

    def decode_run(self, max_steps: int) -> DecodeRun | None:
        """A batch in flight only decodes (nothing joins it), so every step up to the one
        in which a member finishes is a plain decode of the members (each one unforked
        sequence with its first token; no aborted group, no copy pending)."""
        if not self.running or self._pending_copies or self._aborted:
            return None
        run = self._lone_decodes(list(self.running), max_steps)
        if run is not None and self.waiting:
            run.queue_held_by = HELD_BY_BATCH
        return run

    def schedule(self, now: float) -> StepPlan:
        plan = self._new_plan()
        running = self.running
        if running:
            copies = self.manager.append_all(running) if self.batched_append else None
            if copies is None:
                copies = [c for group in running for c in self.manager.append(group)]
            if copies:
                plan.copies.extend(copies)
            decode = plan.decode
            for group in running:
                decode += group.live_seqs()
            if self.waiting:
                plan.queue_held_by = HELD_BY_BATCH
            return self._finish_plan(plan)
        num_seqs = 0
        while (group := self._next_admissible()) is not None:
            if num_seqs + group.sampling.num_seqs > self.config.max_num_seqs:
                break
            self.waiting.popleft()
            cached = self._admit(group, now)
            self.running.append(group)
            seq = group.seqs[0]
            plan.prefill.append(PrefillChunk(seq, cached, seq.num_tokens - cached))
            num_seqs += group.sampling.num_seqs
        if self.waiting and num_seqs + self.waiting[0].sampling.num_seqs > self.config.max_num_seqs:
            plan.queue_held_by = HELD_BY_MAX_NUM_SEQS  # else memory: the head's reservation
        return self._finish_plan(plan)
