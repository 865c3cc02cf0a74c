"""Iteration-level scheduling, as Orca (Yu et al., OSDI 2022) does it and the vLLM paper
reimplements it (§6.1): first-come-first-served; requests join and leave the batch at
every iteration; a request is admitted only when the KV-cache manager can reserve its
whole contiguous region (``max`` / ``pow2`` / ``oracle`` policy, chosen by the manager);
prompts and decodes run in the same iteration (Orca's selective batching).

Where the paper is silent, kvlab chooses (and the config can change): the step's token
budget ``max_num_batched_tokens`` and the sequence cap ``max_num_seqs`` are the same as
vLLM's, so the comparison isolates memory management.

Reservation covers the whole output, so a running request never runs out of memory and
is never preempted.
"""

from __future__ import annotations

from core.plan import PrefillChunk, StepPlan
from core.sched.base import BaseScheduler


class OrcaScheduler(BaseScheduler):
    name = "orca"

    def schedule(self, now: float) -> StepPlan:
        plan = self._new_plan()
        budget = self.config.max_num_batched_tokens
        num_seqs = 0
        copies = self.manager.append_all(self.running) if self.batched_append else None
        if copies is None:
            copies = []
            for group in self.running:
                if not self.manager.can_append(group):
                    raise RuntimeError(
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
        return self._finish_plan(plan)
