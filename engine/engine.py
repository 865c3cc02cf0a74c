"""The engine loop: ``core``'s scheduler driving a real model over paged KV tensors.

Each step is ``core.loop.StepLoop``'s, the very sequence the simulator runs (so the
simulator replaying the engine's measured step times makes the same decisions: the *one
policy, two bodies* identity); the engine supplies the executor, which runs the plan's
swap-outs, swap-ins and block copies, the forward and the sampling, and times them
(CUDA is synchronized at the step's end). With phase timing on (the default on CPU), each
step's phases are timed apart (:mod:`engine.phases`): ``EngineResult.phases``.

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
import logging
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import TypeVar

import pandas as pd
import torch
from tqdm import tqdm

from core.beam_log import BeamLog
from core.defaults import DEFAULT_BLOCK_SIZE
from core.loop import Clock, PolicyError, StepLoop, VirtualClock
from core.metrics.recorder import Recorder
from core.model_spec import ModelSpec
from core.plan import BatchShape, StepOutcome, StepPlan
from core.request import ParentRequest, Request, SequenceGroup
from core.sched.base import BaseScheduler, SchedulerConfig
from core.seeding import with_drawn_prompt_ids
from core.systems import build_scheduler, default_config, get_system
from engine.config import check_engine_support
from engine.kv_cache import PagedKVCache, resolve_kv_budget
from engine.models import build_model
from engine.phases import PhaseTimer, device_clock, phase_timing_default, step_timer
from engine.runner import ModelRunner
from engine.sampler import Sampler
from engine.weights import init_dummy_weights, load_checkpoint

MODES = ("offline", "online")
# warm_up warms GEMMs up to this many tokens a step: a kernel's first use costs the host
# about 5 ms (H200, docs/validation/h200.md), which a GEMM of more tokens than this on a
# 7B-class layer already takes (so its first step is not much distorted), and a long-context
# model's default budget (max_model_len, up to 131,072) would make thousands of large calls
WARM_GEMM_MAX_TOKENS = 8192
CLOCKS = ("virtual", "wall")

log = logging.getLogger(__name__)
WALL_WAIT_NOTE_S = 1.0  # a first arrival this late on the wall clock is said


T = TypeVar("T")


class EngineError(RuntimeError):
    """The engine cannot proceed: a bad setup, or a scheduler that broke the step loop's
    contract (stalled with work left, or planned a step no body can run; its cause is the
    :class:`~core.loop.PolicyError`)."""


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
    phases: pd.DataFrame | None = None  # engine.phases.PHASE_COLUMNS per step, if timed


class LLMEngine:
    """A model, its KV tensors and a ``core`` scheduler whose manager's blocks are the
    tensors' blocks. Exactly one of ``kv_budget_bytes`` and ``num_blocks`` sizes the cache.
    ``sched_config`` defaults to the system's own (``core.systems.default_config``: its
    version's batch limits, its chunked-prefill switch) with ``max_model_len`` = the model's
    maximum; ``watermark`` and ``enable_prefix_caching`` (None: the system's) go to the
    paged manager as in ``core.systems.build_scheduler``. ``time_phases`` times each step's phases
    (:mod:`engine.phases`; None: on CPU only, where it costs nothing). ``step_timer``
    (``wall`` or, on CPU with one torch thread, ``thread_cpu``) is what step and phase
    seconds are read from (:data:`engine.phases.STEP_TIMERS`). ``check_integrity_every >
    0`` runs the scheduler's and KV manager's invariant checks every that many steps
    (:class:`core.loop.StepLoop`)."""

    def __init__(
        self,
        model_config: ModelSpec,
        system: str = "vllm",
        kv_budget_bytes: int | None = None,
        num_blocks: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        backend: str = "torch",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        sched_config: SchedulerConfig | None = None,
        num_cpu_blocks: int = 0,
        seed: int = 0,
        weights_path: str | None = None,
        watermark: float | None = None,
        enable_prefix_caching: bool | None = None,
        time_phases: bool | None = None,
        step_timer_name: str = "wall",
        check_integrity_every: int = 0,
    ) -> None:
        if (kv_budget_bytes is None) == (num_blocks is None):
            raise EngineError("give exactly one of kv_budget_bytes and num_blocks")
        if num_blocks is None:
            budget = resolve_kv_budget(device, budget_bytes=kv_budget_bytes)
            num_blocks = PagedKVCache.num_blocks_for_budget(model_config, budget, block_size, dtype)
        max_len = model_config.max_model_len
        spec = get_system(system)  # what the caller leaves out is the system's own
        if sched_config is None:
            sched_config = default_config(system, max_len)
        watermark = spec.watermark if watermark is None else watermark
        if enable_prefix_caching is None:
            enable_prefix_caching = spec.enable_prefix_caching
        if sched_config.max_model_len > max_len:
            raise EngineError(
                f"max_model_len={sched_config.max_model_len} exceeds the model's "
                f"maximum context ({max_len})"
            )
        self.model_config = model_config
        self.system = system
        self.sched_config = sched_config
        self.watermark = watermark
        self.enable_prefix_caching = enable_prefix_caching
        self.seed = seed
        self.device = torch.device(device)
        try:
            self.step_timer = step_timer(self.device, step_timer_name)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        self.step_timer_name = step_timer_name
        self.check_integrity_every = check_integrity_every
        self.time_phases = (
            phase_timing_default(self.device) if time_phases is None else bool(time_phases)
        )
        try:
            check_engine_support(model_config)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
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

    def reset(self, clock: Clock | None = None) -> None:
        """A fresh scheduler (and manager over the same tensors), recorder and step loop;
        ``clock`` defaults to a virtual one at 0."""
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
        # by request id; a ParentRequest for a request served as requests of one sample each
        self.groups: dict[int, SequenceGroup | ParentRequest] = {}
        self.clock: Clock = VirtualClock() if clock is None else clock
        self.phase_timer = PhaseTimer(self.step_timer) if self.time_phases else None
        executor = _ModelExecutor(
            self.kv_cache, self.runner, self.sampler, self.scheduler, self.device,
            self.phase_timer, self.step_timer,
        )  # fmt: skip
        self.beam_log = executor.beam_log
        self.loop = StepLoop(
            self.scheduler, executor, self.recorder, check_every=self.check_integrity_every,
            observer=self.phase_timer,
        )  # fmt: skip

    @property
    def now(self) -> float:
        """The engine clock."""
        return self.clock.now()

    @property
    def num_steps(self) -> int:
        return self.loop.num_steps

    # -- intake -----------------------------------------------------------------------
    def with_token_ids(self, request: Request) -> Request:
        """``request`` with prompt ids (seeded random ones if it has none:
        :func:`core.seeding.with_drawn_prompt_ids`); given ones are kept as they are
        (:meth:`Request.vocabulary_problem` checks them at intake)."""
        return with_drawn_prompt_ids(request, self.model_config.vocab_size, self.seed)

    def add_request(
        self, request: Request, now: float | None = None
    ) -> SequenceGroup | ParentRequest:
        """Queue ``request`` at ``now`` (default: the engine clock). A rejected request
        (one the scheduler can never serve, or with a prompt id outside the vocabulary)
        comes back with ``reject_reason`` set and is recorded; the others go on. A system
        that serves samples as requests of their own (``vllm_v1``) queues a request of
        ``n > 1`` samples as its :class:`~core.request.ParentRequest` (``core.loop``)."""
        if request.request_id in self.groups:
            raise EngineError(f"request id {request.request_id} was already added")
        request = self.with_token_ids(request)
        at = self.now if now is None else now
        group = self.loop.add(request, at, self.model_config.vocab_size)
        self.groups[request.request_id] = group
        return group

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- one iteration ----------------------------------------------------------------
    def step(self) -> list[SequenceGroup]:
        """Run one step of ``core.loop`` at the engine clock; returns the groups that ended
        in it (finished or aborted; a ParentRequest's children one by one). Nothing runs when
        the engine is idle."""
        try:
            self.loop.step(self.clock)
        except PolicyError as e:
            raise EngineError(str(e)) from e
        return list(self.loop.ended)

    # -- whole runs -------------------------------------------------------------------
    def generate(
        self,
        requests: Iterable[Request],
        mode: str = "offline",
        clock: str = "virtual",
        progress: bool = False,
    ) -> EngineResult:
        """Serve ``requests`` to completion on a fresh scheduler and recorder."""
        return run_to_end(self.serving(requests, mode, clock, progress))

    def warm_up(self, tokens: int | None = None, output_len: int = 2) -> int:
        """Serve one throwaway batch, so that first-use costs (kernel compilation, GPU
        library initialization, the allocator's growth) fall here and not in the first
        timed step; the number of steps it took. Prompts totalling about ``tokens`` tokens
        (default: the scheduler's ``max_num_batched_tokens``, at most half the KV cache)
        in requests of at most 512 tokens (so a full token budget is several requests, and
        both multi-sequence prefill and decode run), each decoding ``output_len`` tokens,
        offline. Then one prompt of each power-of-two length below the longest, alone: the
        attention kernel is compiled per query-tile size, which the step's longest prompt
        chunk sets (``kernels.paged_attention.attention_constexprs``); uncompiled, a short
        prompt's first step stalled for 0.4 s on the H200 (``docs/validation/h200.md``).
        Then, on CUDA, :meth:`warm_gemms` (up to :data:`WARM_GEMM_MAX_TOKENS` tokens) and a
        synchronize, so the run's first step does not wait for the warm-up's queued kernels.
        Not covered: the split-KV attention variants of long-context decodes with few
        sequences (``choose_num_splits``).
        Nothing carries over: the next :meth:`generate` or :meth:`serving` resets the
        scheduler, recorder and clock, prompt ids are seeded per request, and each sampler
        draw has its own generator, so a warmed engine serves a run as a fresh one does.
        0 steps when the cache takes none of the requests (all rejected)."""
        cfg = self.sched_config
        slots = self.kv_cache.num_blocks * self.kv_cache.block_size
        total = cfg.max_num_batched_tokens if tokens is None else int(tokens)
        total = max(1, min(total, slots // 2))
        longest = max(1, min(512, cfg.max_model_len - output_len, total))
        count = -(-total // longest)
        requests = [Request(i, 0.0, max(1, total // count), output_len) for i in range(count)]
        steps = self.generate(requests, mode="offline").num_steps
        length = 1
        while length < longest:
            steps += self.generate([Request(0, 0.0, length, 1)], mode="offline").num_steps
            length *= 2
        if self.device.type == "cuda":  # the cost warm_gemms removes was measured there
            self.warm_gemms(min(cfg.max_num_batched_tokens, WARM_GEMM_MAX_TOKENS), cfg.max_num_seqs)
            torch.cuda.synchronize(self.device)  # else the run's first step waits for them
        return steps

    @torch.inference_mode()
    def warm_gemms(self, max_tokens: int, max_rows: int) -> int:
        """Call each distinct linear layer shape of the model at every token count up to
        512, then every 16th and ``max_tokens`` itself, and the LM head at every row count up to
        ``max_rows`` (at most 512); the number of calls. The GEMM library picks its kernel
        by token count, and a kernel's first use costs the host milliseconds (CUDA loads
        modules lazily): on the H200, steps at a token count new to the process took
        about 5 ms more in their linear calls (``experiments.bench.host_time``,
        ``docs/validation/h200.md``). Outputs are discarded; nothing else changes."""
        model = self.runner.model
        weight = next(model.parameters())
        shapes = {(m.in_features, m.out_features, m.bias is not None): m for m in model.modules()
                  if isinstance(m, torch.nn.Linear) and m is not model.lm_head}  # fmt: skip
        counts = [*range(1, min(max_tokens, 512) + 1), *range(528, max_tokens + 1, 16)]
        if counts[-1] != max_tokens:  # a full token budget is a common step
            counts.append(max_tokens)
        calls = 0
        for (fan_in, _, _), linear in shapes.items():
            x = torch.zeros(counts[-1], fan_in, device=weight.device, dtype=weight.dtype)
            for m in counts:
                linear(x[:m])
            calls += len(counts)
        hidden = torch.zeros(min(max_rows, 512), model.config.embed_dim,
                             device=weight.device, dtype=weight.dtype)  # fmt: skip
        for rows in range(1, hidden.shape[0] + 1):
            model.compute_logits(hidden[:rows])
        return calls + hidden.shape[0]

    def serving(
        self,
        requests: Iterable[Request],
        mode: str = "offline",
        clock: str = "virtual",
        progress: bool = False,
    ) -> Generator[None, None, EngineResult]:
        """:meth:`generate` a step at a time: yields after each step and returns the
        :class:`EngineResult` when exhausted (``StopIteration.value``). Arguments are
        checked and the engine reset at the first ``next``. Between steps the caller may
        run other work (other engines: ``experiments.bench.interleave``) but not this
        engine."""
        if mode not in MODES:
            raise EngineError(f"mode must be one of {MODES}, got {mode!r}")
        if clock not in CLOCKS:
            raise EngineError(f"clock must be one of {CLOCKS}, got {clock!r}")
        if clock == "wall" and self.step_timer_name != "wall":
            raise EngineError(
                f"clock 'wall' runs in real time; step_timer {self.step_timer_name!r} needs "
                "clock 'virtual'"
            )
        reqs = [self.with_token_ids(r) for r in requests]
        if mode == "offline":
            reqs = [dataclasses.replace(r, arrival_time=0.0) for r in reqs]
        ids = [r.request_id for r in reqs]
        if len(set(ids)) != len(ids):
            raise EngineError("request ids must be unique within one generate call")
        self.reset(WallClock() if clock == "wall" else VirtualClock())
        first = min((r.arrival_time for r in reqs), default=0.0)
        if clock == "wall" and first >= WALL_WAIT_NOTE_S:  # else a silent wait looks hung
            log.info("clock 'wall': the first request arrives at %.4g s; waiting for it in "
                     "real time", first)  # fmt: skip
        bar = tqdm(total=len(reqs), unit="req", disable=not progress, desc="serve")
        self.loop.on_done = bar.update
        try:
            for _ in self.loop.serve(reqs, self.clock, add=self.add_request):
                yield
        except PolicyError as e:
            raise EngineError(str(e)) from e
        finally:
            bar.close()
        end = self.now
        self.clock = VirtualClock(end)
        phases = None if self.phase_timer is None else self.phase_timer.frame()
        return EngineResult(self._outputs(), self.recorder, end, self.num_steps, phases)

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


def run_to_end(steps: Generator[object, None, T]) -> T:
    """Exhaust ``steps``; the value it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class _ModelExecutor:
    """Runs a plan on the KV tensors, the model and the sampler, and times it (CUDA is
    synchronized before the step's end is read; with a ``timer``, at every phase boundary,
    and the phases go to the timer)."""

    def __init__(
        self,
        kv_cache: PagedKVCache,
        runner: ModelRunner,
        sampler: Sampler,
        sched: BaseScheduler,
        device: torch.device,
        timer: PhaseTimer | None = None,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.kv_cache = kv_cache
        self.device = device
        self.runner = runner
        self.sampler = sampler
        self.manager = sched.manager
        self.timer = timer
        self.now = now
        self.mark = device_clock(device, synchronize=timer is not None, now=now)
        self.end = device_clock(device, synchronize=True, now=now)
        self.beam_log = BeamLog()  # the beam choices, for a replay (core.beam_log)

    def execute(self, plan: StepPlan, shape: BatchShape, start: float) -> StepOutcome:
        mark = self.mark
        t0 = self.now()  # the previous step ended synchronized
        self.kv_cache.swap_out(plan.swap_out)
        self.kv_cache.swap_in(plan.swap_in)
        self.kv_cache.copy_blocks(plan.copies)
        t1 = mark()
        batch = self.runner.prepare(plan, self.manager)
        t2 = mark()
        logits = self.runner.forward(batch)
        issued = self.now()
        t3 = mark()
        samples = self.sampler.sample(batch.sample_seqs, logits)
        t4 = self.end()
        if self.timer is not None:
            self.timer.executed(t1 - t0, t2 - t1, t3 - t2, t4 - t3, issued - t2)
        return StepOutcome(t4 - t0, samples.token_ids, samples.extra_samples, samples.beams)

    def at_end(self, plan: StepPlan, outcome: StepOutcome) -> None:
        if self.timer is not None:
            self.timer.output_begins()
        self.beam_log.record(outcome.beams)


class WallClock:
    """The real clock, from its creation (online runs sleep until the next arrival)."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def step_end(self, start: float, duration_s: float) -> float:
        return self.now()

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)
