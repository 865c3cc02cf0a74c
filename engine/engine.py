"""The engine loop: ``core``'s scheduler driving a real model over paged KV tensors.

It mirrors ``sim.driver.simulate`` step for step, so the simulator replaying the engine's
measured step times makes the same decisions (the *one policy, two bodies* identity):

1. before each schedule, every request that has arrived by ``now`` is added (rejected
   ones are recorded at once);
2. ``plan = scheduler.schedule(now)``; aborted groups are recorded; an empty plan that
   preempted something is rescheduled at once, an empty plan with nothing left to do
   waits for the next arrival;
3. the plan's swap-outs, swap-ins and block copies, the forward and the sampling run and
   are timed (``duration``; CUDA is synchronized);
4. ``scheduler.update(plan, outcome, start + duration)`` then ``recorder.record_step``
   with the memory breakdown and running count taken right after scheduling.

Clocks: ``virtual`` advances ``now`` by the measured durations and jumps to the next
arrival when idle (deterministic trace replay; arrival instants are chained exactly as
the simulator's arrival process computes them, ``t + (a - t)``); ``wall`` reads the real
clock (online runs sleep until the next arrival when idle). Offline runs put every
arrival at 0.

A request without prompt token ids gets ids drawn uniformly from the vocabulary by a
generator seeded from a hash of ``(engine seed, request id)``, so any workload the simulator runs
(``core.workload.spec.build_workload``) runs here too.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from core.metrics.recorder import Recorder
from core.plan import StepOutcome
from core.request import Request, SequenceGroup
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import build_scheduler
from engine.config import ModelConfig
from engine.kv_cache import PagedKVCache, resolve_kv_budget
from engine.models import build_model
from engine.runner import ModelRunner, sampling_seqs
from engine.sampler import Sampler, mix_seed
from engine.weights import init_dummy_weights, load_checkpoint

MODES = ("offline", "online")
CLOCKS = ("virtual", "wall")


class EngineError(RuntimeError):
    """The engine cannot proceed (bad setup, or a scheduler stalled with work left)."""


@dataclass
class RequestOutput:
    """A request's result: each sequence's generated token ids (beam search: with its
    ``cum_logprob`` score), or the reason it was rejected."""

    request_id: int
    token_ids: list[list[int]]
    scores: list[float]
    reject_reason: str | None = None


@dataclass
class EngineResult:
    outputs: dict[int, RequestOutput]
    recorder: Recorder
    end_time_s: float
    num_steps: int


class LLMEngine:
    """A model, its KV tensors and a ``core`` scheduler whose manager's blocks are the
    tensors' blocks. Exactly one of ``kv_budget_bytes`` and ``num_blocks`` sizes the cache.
    ``sched_config`` defaults to vLLM's knobs with ``max_model_len`` = the model's maximum;
    ``watermark`` and ``enable_prefix_caching`` go to the paged manager as in
    ``core.systems.build_scheduler``."""

    def __init__(
        self,
        model_config: ModelConfig,
        system: str = "vllm",
        kv_budget_bytes: int | None = None,
        num_blocks: int | None = None,
        block_size: int = 16,
        backend: str = "torch",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        sched_config: SchedulerConfig | None = None,
        num_cpu_blocks: int = 0,
        seed: int = 0,
        weights_path: str | None = None,
        watermark: float = 0.01,
        enable_prefix_caching: bool = False,
    ) -> None:
        if (kv_budget_bytes is None) == (num_blocks is None):
            raise EngineError("give exactly one of kv_budget_bytes and num_blocks")
        if num_blocks is None:
            budget = resolve_kv_budget(device, budget_bytes=kv_budget_bytes)
            num_blocks = PagedKVCache.num_blocks_for_budget(model_config, budget, block_size, dtype)
        max_len = model_config.max_position_embeddings
        if sched_config is None:
            sched_config = SchedulerConfig(
                max_model_len=max_len, max_num_batched_tokens=max(2560, max_len)
            )
        if sched_config.max_model_len > max_len:
            raise EngineError(
                f"max_model_len={sched_config.max_model_len} exceeds the model's "
                f"max_position_embeddings={max_len}"
            )
        self.model_config = model_config
        self.system = system
        self.sched_config = sched_config
        self.watermark = watermark
        self.enable_prefix_caching = enable_prefix_caching
        self.seed = seed
        self.device = torch.device(device)
        self.model = build_model(model_config, backend, dtype=dtype, device=self.device)
        if weights_path is None:
            init_dummy_weights(self.model, seed)
        else:
            load_checkpoint(self.model, weights_path)
        self.kv_cache = PagedKVCache(
            model_config, num_blocks, block_size, dtype, self.device, num_cpu_blocks
        )
        self.runner = ModelRunner(self.model, self.kv_cache, backend)
        self.sampler = Sampler(seed)
        self.reset()

    def reset(self) -> None:
        """A fresh scheduler (and manager over the same tensors), recorder and clock."""
        self.scheduler: BaseScheduler = build_scheduler(
            self.system,
            self.kv_cache.num_blocks * self.kv_cache.block_size,
            config=self.sched_config,
            block_size=self.kv_cache.block_size,
            num_cpu_slots=self.kv_cache.num_cpu_blocks * self.kv_cache.block_size,
            watermark=self.watermark,
            enable_prefix_caching=self.enable_prefix_caching,
        )
        self.recorder = Recorder()
        self.groups: dict[int, SequenceGroup] = {}
        self.now = 0.0
        self.num_steps = 0
        self._wall_origin: float | None = None

    # -- intake -----------------------------------------------------------------------
    def with_token_ids(self, request: Request) -> Request:
        """``request`` with prompt ids (seeded random ones if it has none), checked
        against the vocabulary."""
        vocab = self.model_config.vocab_size
        ids = request.prompt_token_ids
        if ids is None:
            rng = np.random.default_rng(mix_seed(self.seed, request.request_id))
            drawn = rng.integers(0, vocab, size=request.prompt_len)
            return dataclasses.replace(request, prompt_token_ids=tuple(int(t) for t in drawn))
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise EngineError(
                f"request {request.request_id}: prompt token id {bad[0]} is outside the "
                f"model's vocabulary [0, {vocab})"
            )
        return request

    def add_request(self, request: Request, now: float | None = None) -> SequenceGroup:
        """Queue ``request`` at ``now`` (default: the engine clock). A rejected request
        comes back with ``reject_reason`` set and is recorded."""
        if request.request_id in self.groups:
            raise EngineError(f"request id {request.request_id} was already added")
        group = self.scheduler.add(self.with_token_ids(request), self.now if now is None else now)
        self.groups[request.request_id] = group
        if group.reject_reason is not None:
            self.recorder.record_request(group)
        return group

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- one iteration ----------------------------------------------------------------
    def step(self) -> list[SequenceGroup]:
        """Schedule and run one step at ``self.now``; returns the groups that ended in it
        (finished or aborted). An empty plan runs nothing and returns only aborted groups
        (call again at once if it preempted; otherwise the engine is idle)."""
        sched = self.scheduler
        if self._wall_origin is not None:
            self.now = self._wall_now()
        plan = sched.schedule(self.now)
        ended = sched.pop_aborted()
        for group in ended:
            self.recorder.record_request(group)
        if plan.is_empty:
            if not plan.preempted and sched.has_unfinished():
                raise EngineError(
                    f"scheduler {sched.name} has {len(sched.waiting)} waiting, "
                    f"{len(sched.running)} running and {len(sched.swapped)} swapped "
                    "requests but scheduled nothing"
                )
            return ended
        shape = plan.shape()
        memory = sched.manager.breakdown()
        running = len(sched.running)
        start = self.now
        t0 = time.perf_counter()
        self.kv_cache.swap_out(plan.swap_out)
        self.kv_cache.swap_in(plan.swap_in)
        self.kv_cache.copy_blocks(plan.copies)
        logits = self.runner.execute(plan, sched.manager)
        samples = self.sampler.sample(sampling_seqs(plan), logits)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        duration = time.perf_counter() - t0
        self.now = start + duration if self._wall_origin is None else self._wall_now()
        outcome = StepOutcome(duration, samples.token_ids, samples.extra_samples, samples.beams)
        step = sched.step_index
        finished = sched.update(plan, outcome, self.now)
        self.recorder.record_step(step, start, duration, plan, shape, memory, running)
        for group in finished:
            self.recorder.record_request(group)
        self.num_steps += 1
        return ended + finished

    def _wall_now(self) -> float:
        assert self._wall_origin is not None
        return time.perf_counter() - self._wall_origin

    # -- whole runs -------------------------------------------------------------------
    def generate(
        self,
        requests: Iterable[Request],
        mode: str = "offline",
        clock: str = "virtual",
        progress: bool = False,
    ) -> EngineResult:
        """Serve ``requests`` to completion on a fresh scheduler and recorder."""
        if mode not in MODES:
            raise EngineError(f"mode must be one of {MODES}, got {mode!r}")
        if clock not in CLOCKS:
            raise EngineError(f"clock must be one of {CLOCKS}, got {clock!r}")
        reqs = [self.with_token_ids(r) for r in requests]
        if mode == "offline":
            reqs = [dataclasses.replace(r, arrival_time=0.0) for r in reqs]
        reqs.sort(key=lambda r: (r.arrival_time, r.request_id))
        ids = [r.request_id for r in reqs]
        if len(set(ids)) != len(ids):
            raise EngineError("request ids must be unique within one generate call")
        self.reset()
        arrivals = _chained_arrivals([r.arrival_time for r in reqs])
        if clock == "wall":
            self._wall_origin = time.perf_counter()
        bar = tqdm(total=len(reqs), unit="req", disable=not progress, desc="serve")
        i = 0
        while i < len(reqs) or self.scheduler.has_unfinished():
            now = self.now if clock == "virtual" else self._wall_now()
            while i < len(reqs) and arrivals[i] <= now:
                if self.add_request(reqs[i], arrivals[i]).reject_reason is not None:
                    bar.update(1)
                i += 1
            if not self.scheduler.has_unfinished():
                self._wait_until(arrivals[i], clock)
                continue
            bar.update(len(self.step()))
        bar.close()
        self._wall_origin = None
        return EngineResult(self._outputs(), self.recorder, self.now, self.num_steps)

    def _wait_until(self, t: float, clock: str) -> None:
        if clock == "virtual":
            self.now = t
            return
        delay = t - self._wall_now()
        if delay > 0:
            time.sleep(delay)

    def _outputs(self) -> dict[int, RequestOutput]:
        return {
            rid: RequestOutput(
                rid,
                [list(s.output_token_ids) for s in g.seqs],
                [s.cum_logprob for s in g.seqs],
                g.reject_reason,
            )
            for rid, g in self.groups.items()
        }


def _chained_arrivals(times: list[float]) -> list[float]:
    """Arrival instants as the simulator's arrival process reaches them: from ``t``, a
    timeout of ``a - t`` lands at ``t + (a - t)``, which can differ from ``a`` by an ulp."""
    out: list[float] = []
    t = 0.0
    for a in times:
        delay = a - t
        if delay > 0:
            t = t + delay
        out.append(t)
    return out
