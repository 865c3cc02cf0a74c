"""Example KV-manager plugins (the README's): a shipped scheduler over a KV-cache manager of
one's own. ``system.plugin=tests.kv_plugin system.name=vllm_wm25`` (or ``orca_margin``, with
``system=orca_oracle``) runs it in the simulator and the engine alike."""

from __future__ import annotations

from typing import Any

from core.kv.contiguous import ContiguousKVCacheManager
from core.kv.paged import PagedKVCacheManager
from core.request import Request
from core.sched.orca import OrcaScheduler
from core.sched.vllm import VLLMScheduler
from core.systems import SystemSpec, register_system


class QuarterWatermark(PagedKVCacheManager):
    """vLLM's paged blocks, but admission leaves a quarter of the device blocks free (not
    the 1% watermark): fewer prompts run at once and the running ones grow into the rest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watermark_blocks = max(self.watermark_blocks, self.num_device_blocks // 4)


class OracleMargin(ContiguousKVCacheManager):
    """Orca (Oracle)'s reservations, each 16 slots longer than the request's true length (at
    most ``max_model_len``): the margin is internal fragmentation, 16 slots a sequence."""

    MARGIN = 16

    def reservation(self, request: Request) -> int:
        return min(request.total_len + self.MARGIN, self.max_model_len)


register_system(SystemSpec("vllm_wm25", VLLMScheduler, "paged", manager=QuarterWatermark))
register_system(
    SystemSpec("orca_margin", OrcaScheduler, "contiguous", "oracle", manager=OracleMargin)
)
