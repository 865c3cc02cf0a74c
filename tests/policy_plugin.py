"""An example policy plugin (the README's): vLLM's paged scheduler with its admission queue
ordered by prompt length, shortest first. ``system.plugin=tests.policy_plugin
system.name=vllm_spf`` runs it in the simulator and the engine alike."""

from __future__ import annotations

from core.request import Request, SequenceGroup
from core.sched.vllm import VLLMScheduler
from core.systems import SystemSpec, register_system


class ShortestPromptFirst(VLLMScheduler):
    """A new request waits behind every preempted request and every waiting one whose prompt
    is no longer than its own (first come, first served among equals); the rest is vLLM's."""

    name = "vllm_spf"

    def add(self, request: Request, now: float) -> SequenceGroup:
        group = super().add(request, now)
        if group.reject_reason is None:
            self.waiting.pop()  # queued last by the shared intake: move it to its place
            place = next(
                (i for i, g in enumerate(self.waiting)
                 if g.num_preemptions == 0 and g.request.prompt_len > request.prompt_len),
                len(self.waiting),
            )  # fmt: skip
            self.waiting.insert(place, group)
        return group


register_system(SystemSpec("vllm_spf", ShortestPromptFirst, "paged"))
