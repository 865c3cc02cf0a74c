"""What holds the queue's head (``StepPlan.queue_held_by``, ``core.plan.HELD_BY_*``): cases a
mutation audit of the code that decides it (core/sched/vllm.py, orca.py,
fastertransformer.py, the decode runs and core/loop.py's fast-forward rows) found no test
pinned down. Each test fails under such a mutant: a limit check off by one, a sequence
count that ignores a group's width, the waiting head taken before the swapped one, the
preemption or swap exemption dropped, a decode step judged against the prompt budget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.kv.base import AllocStatus
from core.plan import (
    HELD_BY_BATCH,
    HELD_BY_MAX_NUM_SEQS,
    HELD_BY_MEMORY,
    HELD_BY_TOKEN_BUDGET,
    StepOutcome,
    StepPlan,
)
from core.request import Request, SamplingParams
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import build_scheduler
from sim.driver import simulate

M, S, B = HELD_BY_MEMORY, HELD_BY_MAX_NUM_SEQS, HELD_BY_TOKEN_BUDGET


@dataclass(frozen=True)
class Step:
    """One plan's code and what it was decided on (the queues after ``schedule``)."""

    held_by: int
    waiting: int
    swapped: int
    preempted: bool
    left: int  # the token budget the plan leaves
    head_seqs: int  # the live sequences of the first waiting group (0: none waits)


def _make(system: str, slots: int, config: SchedulerConfig, cpu: int = 0) -> BaseScheduler:
    return build_scheduler(system, slots, config=config, block_size=4, num_cpu_slots=cpu,
                           watermark=0.0 if system.startswith("vllm") else None)  # fmt: skip


Seen = Callable[[BaseScheduler, StepPlan, bool, bool], None]


def _serve(s: BaseScheduler, requests: list[Request], see: Seen) -> None:
    """Serve ``requests`` (arrival times in steps of 1 s) one ``schedule`` / ``update`` at a
    time; ``see(scheduler, plan, swapped_before, running_before)`` after each ``schedule``
    (whether a group was swapped out, or running, when it began). Every plan is one
    ``plan_problem`` finds nothing wrong with."""
    now, i = 0.0, 0
    while True:
        while i < len(requests) and requests[i].arrival_time <= now:
            s.add(requests[i], now)
            i += 1
        if not s.has_unfinished():
            if i == len(requests):
                return
            now = requests[i].arrival_time
            continue
        swapped_before, running_before = bool(s.swapped), bool(s.running)
        plan = s.schedule(now)
        assert s.plan_problem(plan) is None
        s.pop_aborted()
        see(s, plan, swapped_before, running_before)
        s.update(plan, StepOutcome(1.0), now + 1.0)
        now += 1.0
        assert s.step_index < 1000


def _steps(
    system: str, slots: int, config: SchedulerConfig, requests: list[Request], cpu: int = 0
) -> list[Step]:
    """Each plan's :class:`Step` as :func:`_serve` serves ``requests``."""
    out: list[Step] = []

    def see(s: BaseScheduler, plan: StepPlan, _swapped: bool, _running: bool) -> None:
        used = len(plan.decode) + sum(c.length for c in plan.prefill)
        head = len(s.waiting[0].live_seqs()) if s.waiting else 0
        preempted = bool(plan.preempted or plan.preempted_by_swap)
        out.append(Step(plan.queue_held_by, plan.num_waiting, plan.num_swapped, preempted,
                        config.max_num_batched_tokens - used, head))  # fmt: skip

    _serve(_make(system, slots, config, cpu), requests, see)
    return out


def _codes(steps: list[Step]) -> list[int]:
    return [x.held_by for x in steps]


class _Flat:
    def step_time(self, shape: object) -> float:
        return 1.0

    def describe(self) -> str:
        return "1 s a step"


def _same_with_fast_forward(
    system: str, slots: int, config: SchedulerConfig, requests: list[Request], cpu: int = 0
) -> pd.DataFrame:
    """steps.csv with fast-forward, after checking it equals the step-by-step one."""

    def make() -> BaseScheduler:
        return _make(system, slots, config, cpu)

    fast = simulate(requests, make, _Flat(), fast_forward=True).recorder.steps_frame()
    slow = simulate(requests, make, _Flat(), fast_forward=False).recorder.steps_frame()
    pd.testing.assert_frame_equal(fast, slow, check_exact=True)
    return fast


def _cfg(**knobs: object) -> SchedulerConfig:
    return SchedulerConfig(**{"max_num_batched_tokens": 64, "max_model_len": 64, **knobs})


TWO = SamplingParams(n=2)

# (system, slots, config, requests, the codes step by step)
HAND_CASES = {
    # 8 blocks of 4 slots: the second 20-token prompt needs 5 with 3 free; one seat is left
    # for it (1 running + 1 = max_num_seqs 2: the limit is not exceeded)
    "vllm, the head fills max_num_seqs exactly, memory short": (
        "vllm", 32, _cfg(max_num_seqs=2), [Request(0, 0, 20, 4), Request(1, 0, 20, 4)],
        [M] * 8,
    ),
    # a request of two samples needs two seats; one is left
    "vllm, a two-sample head, one seat left": (
        "vllm", 4096, _cfg(max_num_seqs=2), [Request(0, 0, 8, 3), Request(1, 0, 8, 3, TWO)],
        [S, S, S, M, M, M],
    ),
    # a running group of two samples takes both seats
    "vllm, a running two-sample group fills the seats": (
        "vllm", 4096, _cfg(max_num_seqs=2), [Request(0, 0, 8, 3, TWO), Request(1, 0, 8, 3)],
        [S, S, S, M, M, M],
    ),
    "orca, the head fills max_num_seqs exactly, memory short": (
        "orca_oracle", 48, _cfg(max_num_seqs=2), [Request(0, 0, 20, 4), Request(1, 0, 20, 4)],
        [M, M, M, M, M, M, M, M],
    ),
    "orca, a two-sample head, one seat left": (
        "orca_oracle", 4096, _cfg(max_num_seqs=2),
        [Request(0, 0, 8, 3), Request(1, 0, 8, 3, TWO)], [S, S, S, M, M, M],
    ),
    # 64 - 32 = 32 tokens left: exactly the head's prompt, whose reservation does not fit
    "orca, the head's prompt is exactly the budget left, memory short": (
        "orca_oracle", 64, _cfg(max_num_seqs=4), [Request(0, 0, 32, 8), Request(1, 0, 32, 4)],
        [M] * 8 + [M] * 4,
    ),
    # two decodes leave 62 tokens: a 63-token prompt (arriving at step 1) waits on the
    # budget, with memory to spare, until request 0's last token
    "orca, the head's prompt one token over the budget the decodes leave": (
        "orca_oracle", 4096, _cfg(max_num_seqs=8),
        [Request(0, 0, 10, 5), Request(1, 0, 10, 9), Request(2, 1, 63, 1)],
        [M] + [B] * 4 + [M] * 4,
    ),
    "fastertransformer, the head fills max_num_seqs exactly, memory short": (
        "fastertransformer", 64, _cfg(max_num_seqs=2),
        [Request(0, 0, 8, 3), Request(1, 0, 8, 3)], [M, HELD_BY_BATCH, HELD_BY_BATCH, M, M, M],
    ),
    "fastertransformer, a two-sample head, one seat left": (
        "fastertransformer", 4096, _cfg(max_num_seqs=2),
        [Request(0, 0, 8, 3), Request(1, 0, 8, 3, TWO)],
        [S, HELD_BY_BATCH, HELD_BY_BATCH, M, M, M],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("system", "slots", "config", "requests", "codes"),
                         HAND_CASES.values(), ids=list(HAND_CASES))  # fmt: skip
def test_the_limit_that_holds_the_head_in_hand_sized_cases(
    system: str, slots: int, config: SchedulerConfig, requests: list[Request], codes: list[int]
) -> None:
    assert _codes(_steps(system, slots, config, requests)) == codes
    frame = _same_with_fast_forward(system, slots, config, requests)
    assert frame["queue_held_by"].tolist() == codes


def test_vllm_a_prompt_exactly_the_budget_left_waits_on_memory() -> None:
    # 15 blocks: request 0 takes 8, request 1's 32-token prompt needs 8 and exactly the 32
    # tokens the first prompt step leaves: memory holds it, not the budget
    steps = _steps("vllm", 60, _cfg(max_num_seqs=4), [Request(0, 0, 32, 8), Request(1, 0, 32, 4)])
    assert steps[0].left == 32 and steps[0].waiting == 1
    assert set(_codes(steps)) == {M}


def test_vllm_a_decode_step_leaves_the_head_to_memory_whatever_the_prompt_budget() -> None:
    # a 63-token prompt over the 64 - 2 tokens two decodes leave, and over the free memory:
    # the prompt step that admitted the two is held by the budget (limits first); each
    # decode step by memory (the next admission tries the head alone, whatever its length)
    requests = [Request(0, 0, 4, 6), Request(1, 0, 4, 6), Request(2, 0, 63, 1)]
    steps = _steps("vllm", 64, _cfg(max_num_seqs=4), requests)
    assert _codes(steps) == [B, M, M, M, M, M, M]
    assert steps[1].left == 62
    frame = _same_with_fast_forward("vllm", 64, _cfg(max_num_seqs=4), requests)
    assert frame["queue_held_by"].tolist() == _codes(steps)


def test_vllm_the_swapped_head_is_held_not_the_waiting_one() -> None:
    # request 2 is swapped out at step 2 and the two-sample request 3 waits behind it: the
    # head is the swapped group (its swap-in waits on memory; admissions wait on it), not
    # request 3, which would find 2 running + 2 over max_num_seqs 3
    requests = [Request(i, 0, 7, 12) for i in range(3)] + [Request(3, 0, 4, 2, TWO)]
    config = _cfg(max_num_seqs=3, preemption_mode="swap")
    steps = _steps("vllm", 32, config, requests, cpu=64)
    swapped = [x for x in steps if x.swapped]
    assert any(x.waiting and x.head_seqs == 1 for x in swapped)
    assert {x.held_by for x in swapped} == {M}
    assert _codes(steps)[:3] == [S, S, M]


# Chunked prefill, shrunk from random runs. A group of several samples preempted by
# recompute comes back as that many sequences, which share a step's budget equally.
CHUNKED = _cfg(max_num_seqs=8, max_num_batched_tokens=8, chunked_prefill=True)


def _sampled(*rows: tuple[int, int, int]) -> list[Request]:
    return [Request(i, 0, p, o, SamplingParams(n=n)) for i, (p, o, n) in enumerate(rows)]


def test_chunked_a_head_whose_sequences_cannot_share_the_budget_left_waits_on_it() -> None:
    # vllm_v1 (no swap): a recomputed group of 3 or 2 sequences at the head with 1 or 2
    # tokens left gets a share of 0 each: the token budget holds it
    requests = _sampled((1, 13, 2), (29, 11, 2), (13, 6, 1), (4, 2, 3))
    steps = _steps("vllm_v1", 96, CHUNKED, requests)
    short = [x for x in steps if 0 < x.left < x.head_seqs and not x.preempted]
    assert short and {x.held_by for x in short} == {B}


def test_chunked_a_step_that_preempts_leaves_the_head_to_memory() -> None:
    # vllm_v1: a step that preempts a group of 3 samples (the head now) and leaves 1 token
    # of its budget, too few for 3 shares: memory holds the head (it preempted), not the
    # budget (the steps after it, which preempt nothing, are held by the budget)
    requests = _sampled((2, 20, 1), (7, 11, 2), (39, 3, 3), (7, 2, 3))
    steps = _steps("vllm_v1", 96, CHUNKED, requests)
    spent = [x for x in steps if x.preempted and x.waiting and x.left < x.head_seqs]
    assert spent and {x.held_by for x in spent} == {M}


def test_chunked_a_swapped_head_waits_on_memory_when_the_budget_is_spent() -> None:
    # vllm v0 with chunked prefill: two-sample groups are swapped out (recompute mode
    # swaps a group of several sequences); while one is, admissions wait on its swap-in
    # even in a step whose budget running prompts' chunks spent
    requests = _sampled((14, 35, 1), (8, 39, 2), (3, 33, 1), (35, 10, 1), (13, 13, 2))
    steps = _steps("vllm", 160, CHUNKED, requests, cpu=256)
    spent = [x for x in steps if x.swapped and x.left <= 0]
    assert spent and {x.held_by for x in steps if x.swapped} == {M}


def test_chunked_a_decode_run_judges_the_budget_its_decodes_leave() -> None:
    # max_num_seqs = max_num_batched_tokens = 4: three decodes leave 1 token, a share for
    # the one-sequence head, which waits on memory (its 60-token prompt needs all 16
    # blocks) in the fast-forwarded decode steps as in the steps run one at a time
    config = _cfg(max_num_seqs=4, max_num_batched_tokens=4, chunked_prefill=True)
    requests = [Request(i, 0, 1, 20) for i in range(3)] + [Request(3, 0.5, 60, 1)]
    frame = _same_with_fast_forward("vllm", 64, config, requests)
    decoding = frame[(frame["num_waiting"] > 0) & (frame["decode_seqs"] == 3)]
    assert len(decoding) > 1 and set(decoding["queue_held_by"]) == {M}


@st.composite
def _workloads(draw: st.DrawFn) -> list[Request]:
    requests, t = [], 0
    for i in range(draw(st.integers(2, 10))):
        t += draw(st.sampled_from([0, 0, 1, 3]))
        prompt = draw(st.sampled_from([1, 4, 7, 13, 20, 32, 40, 60, 63]))
        output = draw(st.integers(1, 64 - prompt))
        n = draw(st.sampled_from([1, 1, 2, 3]))
        requests.append(Request(i, float(t), prompt, output, SamplingParams(n=n)))
    return requests


@pytest.mark.parametrize("system", ["vllm", "vllm_v1", "orca_oracle", "orca_max",
                                    "fastertransformer"])  # fmt: skip
@given(requests=_workloads(), slots=st.sampled_from([64, 96, 160, 4096]),
       seats=st.sampled_from([1, 2, 4, 8]), budget=st.sampled_from([8, 9, 24, 64]),
       chunked=st.booleans(), swap=st.booleans())  # fmt: skip
@settings(max_examples=60, deadline=None)
def test_a_limit_is_named_only_when_it_holds_and_memory_only_when_it_does(
    system: str,
    requests: list[Request],
    slots: int,
    seats: int,
    budget: int,
    chunked: bool,
    swap: bool,
) -> None:
    """After every plan: a named limit is exceeded by the head (``max_num_seqs`` by its
    sequences, the token budget by its prompt (Orca, a vLLM prompt step) or its sequences'
    shares (chunked prefill)); memory is named for a head within every limit only where it
    does not fit now (cannot be allocated or swapped in), or the step preempted, or (vLLM
    v0.1) admissions waited on a swap-in the step began with. So free KV the metrics count
    as fragmentation is never free KV a limit left idle, nor the reverse."""
    chunked = system == "vllm_v1" or (system == "vllm" and chunked)
    mode = "swap" if swap and system == "vllm" else "recompute"
    config = SchedulerConfig(
        max_num_seqs=seats, max_num_batched_tokens=budget if chunked else 64, max_model_len=64,
        chunked_prefill=chunked, preemption_mode=mode,
    )  # fmt: skip
    sched = _make(system, slots, config, cpu=256 if system == "vllm" else 0)

    def check(s: BaseScheduler, plan: StepPlan, swapped_before: bool, ran_before: bool) -> None:
        head = s.swapped[0] if s.swapped else s.waiting[0] if s.waiting else None
        code = plan.queue_held_by
        if head is None:
            assert code == M
            return
        used = len(plan.decode) + sum(c.length for c in plan.prefill)
        left = config.max_num_batched_tokens - used
        seqs = head.live_seqs()
        over_seats = sum(g.sampling.num_seqs for g in s.running) + head.sampling.num_seqs > seats
        preempted = bool(plan.preempted or plan.preempted_by_swap)
        if system == "fastertransformer":
            over_budget = False
        elif system.startswith("orca"):
            over_budget = head.seqs[0].num_tokens > left
        elif s.swapped or preempted:
            over_budget = False  # its swap-in or the preemption: memory, whatever is left
        elif chunked:
            over_budget = left < len(seqs)
        else:
            over_budget = bool(plan.prefill) and sum(q.num_tokens for q in seqs) > left
        if code == HELD_BY_BATCH:
            assert system == "fastertransformer" and ran_before
            return
        assert not (system == "fastertransformer" and ran_before)
        if code == S:
            assert over_seats
        elif code == B:
            assert over_budget and not over_seats
        else:
            assert code == M and not over_seats and not over_budget
            if s.swapped:
                fits = not preempted and s.manager.can_swap_in(head)
            else:
                first = max(left, 1) if chunked else None
                waited = swapped_before and not chunked  # v0.1 admits nothing that step
                fits = not (preempted or waited) and (
                    s.manager.can_allocate(head, first) is AllocStatus.OK
                )
            assert not fits, "a head that fits memory and every limit is said held by memory"

    _serve(sched, requests, check)
