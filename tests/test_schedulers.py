"""Property tests for the three scheduling policies on the real KV-cache managers."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.kv.base import AllocStatus
from core.kv.paged import PagedKVCacheManager
from core.plan import StepOutcome
from core.request import Request, SamplingParams, SequenceStatus
from core.sched.base import SchedulerConfig, SchedulerConfigError
from core.sched.vllm import VLLMScheduler
from core.systems import SYSTEMS, SystemConfigError, build_scheduler, plugin_of
from tests.sched_harness import run_loop

MAX_LEN = 64

# the shipped systems: a test module that loads a policy plugin first (tests.policy_plugin's
# shortest-prompt-first, which is not FCFS) must not add it to these parametrizations
SHIPPED = sorted(s for s in SYSTEMS if plugin_of(s) is None)


@st.composite
def workloads(draw, max_requests: int = 25):
    n = draw(st.integers(1, max_requests))
    t = 0.0
    reqs = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.005, 0.02, 0.1]))
        prompt = draw(st.integers(1, 40))
        output = draw(st.integers(1, 40))
        samples = draw(st.sampled_from([1, 1, 1, 2, 3]))
        reqs.append(Request(i, t, prompt, output, SamplingParams(n=samples)))
    return reqs


def _sched(system: str, slots: int, block: int, mode: str = "recompute", cpu: int = 0):
    cfg = SchedulerConfig(
        max_num_seqs=16, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN,
        preemption_mode=mode,
    )  # fmt: skip
    return build_scheduler(system, slots, config=cfg, block_size=block, num_cpu_slots=cpu)


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _assert_all_done(groups, requests):
    # a request of n samples under vllm_v1 is n groups of one (core.request.ParentRequest)
    assert sorted({g.request_id for g in groups}) == sorted(r.request_id for r in requests)
    parents = {id(g.parent): g.parent for g in groups if g.parent is not None}
    assert len(groups) == len(requests) - len(parents) + sum(
        len(p.children) for p in parents.values()
    )
    for g in groups:
        if g.reject_reason is not None:
            assert g.reject_reason.strip(), "a rejection must say why"
            continue
        assert g.finish_time is not None, f"request {g.request_id} never finished"
        assert g.num_generated == g.request.output_len
        assert len(g.live_seqs()) == 0
        if g.request.output_len > 1:
            assert len(g.seqs) == g.sampling.num_seqs
        assert g.first_token_time <= g.finish_time
        assert g.first_scheduled_time >= g.arrival_time


def _assert_fcfs(groups):
    served = [g for g in groups if g.first_scheduled_time is not None]
    served.sort(key=lambda g: (g.arrival_time, g.request_id))
    for a, b in itertools.pairwise(served):
        assert a.first_scheduled_time <= b.first_scheduled_time, (a, b)


@pytest.mark.parametrize("system", SHIPPED)
@given(reqs=workloads(), slots=st.sampled_from([64, 96, 160, 512]))
@SETTINGS
def test_every_request_finishes_fcfs_and_memory_consistent(system, reqs, slots):
    sched = _sched(system, slots, block=8, cpu=256)
    res = run_loop(sched, reqs)
    _assert_all_done(res.groups, reqs)
    _assert_fcfs(res.groups)
    assert sched.manager.breakdown().free == slots  # everything returned


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@given(reqs=workloads(), slots=st.sampled_from([64, 96, 128]))
@SETTINGS
def test_vllm_preempts_latest_first_and_blocks_admission(mode, reqs, slots):
    sched = _sched("vllm", slots, block=4, mode=mode, cpu=512)
    res = run_loop(sched, reqs)
    _assert_all_done(res.groups, reqs)
    for log in res.steps:
        victims = log.plan.preempted + log.plan.preempted_by_swap
        if victims:
            latest_kept = max((g.arrival_time for g in log.running_after_schedule), default=-1)
            assert latest_kept <= min(g.arrival_time for g in victims)
        new_admits = [c.seq.group for c in log.plan.prefill if c.seq.group.num_preemptions == 0]
        if new_admits:
            assert not log.swapped_before, "admitted new work while swapped work waits"
            waiting_preempted = [
                g for g in log.waiting_before
                if g.num_preemptions > 0 and g.seqs[0].status is SequenceStatus.WAITING
            ]  # fmt: skip
            assert not waiting_preempted, "admitted new work while preempted work waits"
        if log.plan.prefill:
            assert not log.plan.decode, "vLLM v0.1 never mixes prompts and decodes"


@given(reqs=workloads(), slots=st.sampled_from([64, 160]))
@SETTINGS
def test_request_level_batch_runs_until_all_finish(reqs, slots):
    sched = _sched("fastertransformer", slots, block=8)
    res = run_loop(sched, reqs)
    _assert_all_done(res.groups, reqs)
    for log in res.steps:
        if log.plan.prefill:
            assert not log.running_before, "a request joined a batch in flight"


def test_orca_never_preempts_and_mixes_prompts_with_decodes():
    reqs = [Request(i, 0.01 * i, 10, 20) for i in range(12)]
    sched = _sched("orca_oracle", 256, block=8)
    res = run_loop(sched, reqs)
    _assert_all_done(res.groups, reqs)
    assert all(g.num_preemptions == 0 for g in res.groups)
    assert any(log.plan.prefill and log.plan.decode for log in res.steps)


def test_too_long_request_is_rejected_others_finish():
    reqs = [Request(0, 0.0, 10, 10), Request(1, 0.0, 50, 50), Request(2, 0.0, 5, 5)]
    sched = _sched("vllm", 256, block=8)
    res = run_loop(sched, reqs)
    by_id = {g.request_id: g for g in res.groups}
    assert "exceeds max_model_len=64" in by_id[1].reject_reason
    assert by_id[0].finish_time is not None and by_id[2].finish_time is not None


def test_request_larger_than_cache_is_rejected():
    sched = _sched("orca_max", 32, block=8)  # max reservation (64) never fits
    g = sched.add(Request(0, 0.0, 4, 4), 0.0)
    assert g.reject_reason and "KV-cache" in g.reject_reason


def test_parallel_samples_share_prompt_blocks():
    sched = _sched("vllm", 512, block=4)
    req = Request(0, 0.0, 16, 8, SamplingParams(n=4))
    group = sched.add(req, 0.0)
    sched.update(sched.schedule(0.0), StepOutcome(1.0), 1.0)  # the prompt, then the fork
    decode = sched.schedule(1.0)
    assert len(decode.decode) == 4
    m = sched.manager
    parent, *children = (s.seq_id for s in group.live_seqs())
    for child in children:  # the 16-token prompt's 4 full blocks, held once
        assert m.block_table(child)[:4] == m.block_table(parent)[:4]
    assert m.blocks_saved_by_sharing() >= 4 * 3
    res = run_loop(_sched("vllm", 512, block=4), [req])
    assert res.groups[0].finish_time is not None


def test_parallel_samples_that_fit_the_cache_exactly_are_served() -> None:
    # n=2, prompt 4, output 4, blocks of 4: the prompt block is shared and each sample
    # owns one block for its output, 3 blocks in all, the whole cache.
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    sched = build_scheduler("vllm", 12, config=cfg, block_size=4, watermark=0.0)
    res = run_loop(sched, [Request(0, 0.0, 4, 4, SamplingParams(n=2))])  # a stall raises
    group = res.groups[0]
    assert group.reject_reason is None
    assert group.finish_time is not None and len(group.seqs) == 2


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize(
    ("system", "chunked"),
    [("vllm", False), ("vllm", True)] + [(s, False) for s in SHIPPED if s != "vllm"],
)
def test_no_system_runs_more_sequences_than_max_num_seqs(system: str, chunked: bool, n: int):
    """Six requests of ``n`` samples arrive at once on a roomy cache: every policy counts
    a request as the ``n`` sequences it forks into, so no step (and no running batch after
    a step) holds more than ``max_num_seqs=4`` sequences."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                          chunked_prefill=chunked)  # fmt: skip
    sched = build_scheduler(system, 4096, config=cfg, block_size=4)
    reqs = [Request(i, 0.0, 8, 6, SamplingParams(n=n)) for i in range(6)]

    def check_plan(plan) -> None:
        assert len(plan.scheduled_seqs()) <= 4

    def check_step(plan, finished) -> None:
        assert sum(len(g.live_seqs()) for g in sched.running) <= 4

    res = run_loop(sched, reqs, on_plan=check_plan, on_step=check_step)
    _assert_all_done(res.groups, reqs)


@pytest.mark.parametrize("system", ["vllm", "orca_oracle", "fastertransformer"])
def test_a_group_wider_than_max_num_seqs_is_rejected_not_stalled(system: str) -> None:
    cfg = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64)
    sched = build_scheduler(system, 4096, config=cfg, block_size=4)
    group = sched.add(Request(0, 0.0, 8, 6, SamplingParams(n=3)), 0.0)
    assert group.reject_reason is not None and "max_num_seqs=2" in group.reject_reason
    assert not sched.has_unfinished()


def test_prefix_caching_on_a_contiguous_system_is_refused() -> None:
    with pytest.raises(SystemConfigError, match="prefix caching"):
        build_scheduler("orca_oracle", 4096, enable_prefix_caching=True)


@pytest.mark.parametrize("system", ["orca_max", "orca_oracle", "orca_pow2", "fastertransformer"])
def test_swap_preemption_on_a_contiguous_system_is_refused(system: str) -> None:
    """It would be ignored: these systems reserve at admission and never preempt."""
    with pytest.raises(SystemConfigError, match="never preempts"):
        build_scheduler(system, 4096, config=SchedulerConfig(preemption_mode="swap"))


def test_bad_scheduler_config_errors():
    with pytest.raises(SchedulerConfigError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_batched_tokens=100, max_model_len=2048)
    with pytest.raises(SchedulerConfigError, match="preemption_mode"):
        SchedulerConfig(preemption_mode="drop")


@pytest.mark.parametrize("system", ["vllm", "vllm_v1"])
@given(reqs=workloads(), slots=st.sampled_from([64, 96, 160]), budget=st.sampled_from([16, 24]))
@SETTINGS
def test_chunked_prefill_under_memory_pressure_finishes_everything(system, reqs, slots, budget):
    """Chunked prefill on a cache of a few sequences: vLLM v0 allocates each prompt whole,
    V1 chunk by chunk (a chunk short of blocks preempts the last admitted). Every request
    still finishes or is rejected with a reason, first scheduled in arrival order, and every
    block comes back."""
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget, max_model_len=MAX_LEN,
                          chunked_prefill=True)  # fmt: skip
    sched = build_scheduler(system, slots, config=cfg, block_size=4)
    res = run_loop(sched, reqs)
    _assert_all_done(res.groups, reqs)
    _assert_fcfs(res.groups)
    assert sched.manager.breakdown().free == slots


LIMIT_SEQS = 4  # small enough that a few requests fill it


@st.composite
def limit_workloads(draw, widths: tuple[int, ...]):
    """Up to 12 requests of ``widths`` samples each, bursty arrivals (several per step),
    prompts up to nearly the whole budget."""
    t, reqs = 0.0, []
    for i in range(draw(st.integers(1, 12))):
        t += draw(st.sampled_from([0.0, 0.0, 0.005, 0.02, 0.1]))
        prompt = draw(st.integers(1, MAX_LEN - 2))
        output = draw(st.integers(1, min(24, MAX_LEN - prompt)))
        n = draw(st.sampled_from(widths))
        reqs.append(Request(i, t, prompt, output, SamplingParams(n=n)))
    return reqs


LIMIT_CASES = [(s, "recompute", False) for s in SHIPPED] + [
    ("vllm", "swap", False),
    ("vllm", "recompute", True),
    ("vllm", "swap", True),
    ("vllm_v1", "recompute", True),
]


@pytest.mark.parametrize("widths", [(1,), (2,), (1, 2)], ids=["n1", "n2", "n1-2"])
@pytest.mark.parametrize(("system", "mode", "chunked"), LIMIT_CASES)
@given(data=st.data(), slots=st.sampled_from([64, 96, 160, 512, 1024]))
@SETTINGS
def test_no_step_exceeds_max_num_seqs_or_the_token_budget(
    system, mode, chunked, widths, data, slots
):
    """Every system, requests of one or two samples (alike or mixed), recompute and swap,
    on caches from a few requests to plenty: no step computes more sequences than
    ``max_num_seqs`` and, after a step, the running groups hold no more live sequences
    than that (a two-sample group counts twice, before and after its fork). No step
    computes more tokens than ``max_num_batched_tokens`` (each decode counts one), except
    FasterTransformer's, which has no token budget, and vLLM v0.1's step of one recomputed
    multi-sequence group bigger than the budget, which runs alone rather than never."""
    reqs = data.draw(limit_workloads(widths))
    cfg = SchedulerConfig(
        max_num_seqs=LIMIT_SEQS, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN,
        preemption_mode=mode, chunked_prefill=chunked,
    )  # fmt: skip
    sched = build_scheduler(system, slots, config=cfg, block_size=4, num_cpu_slots=128)

    def check_plan(plan) -> None:
        assert len(plan.scheduled_seqs()) <= LIMIT_SEQS, plan
        tokens = plan.shape().num_tokens
        if system == "fastertransformer":
            return
        groups = {id(c.seq.group) for c in plan.prefill}
        alone = len(groups) == 1 and len(plan.prefill) > 1 and not plan.decode
        if system.startswith("vllm") and not chunked and alone:
            return  # a recomputed group of several sequences over the budget goes alone
        assert tokens <= MAX_LEN, f"{tokens} tokens in a step, budget {MAX_LEN}"

    def check_step(plan, finished) -> None:
        assert sum(len(g.live_seqs()) for g in sched.running) <= LIMIT_SEQS

    res = run_loop(sched, reqs, on_plan=check_plan, on_step=check_step)
    _assert_all_done(res.groups, reqs)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize(("mode", "cpu"), [("swap", 512), ("swap", 32), ("recompute", 512)])
@given(reqs=workloads(max_requests=15), slots=st.sampled_from([48, 64, 96, 128]))
@SETTINGS
def test_vllm_never_swaps_in_during_a_step_that_preempts(chunked, mode, cpu, reqs, slots):
    """vLLM v0.1's rule: swapped groups come back only in a step that preempted nothing,
    so no step both preempts a group (swapping it out, or recomputing it: a one-sequence
    group in recompute mode, or any group the small CPU pool cannot take) and swaps one
    in. Requests of one to three samples (several-sequence groups are always swapped)."""
    cfg = SchedulerConfig(
        max_num_seqs=16, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN,
        preemption_mode=mode, chunked_prefill=chunked,
    )  # fmt: skip
    sched = build_scheduler("vllm", slots, config=cfg, block_size=4, num_cpu_slots=cpu)

    def check(plan) -> None:
        if plan.preempted or plan.preempted_by_swap:
            assert not plan.swap_in, "swapped in during a step that preempted"

    res = run_loop(sched, reqs, on_plan=check)
    _assert_all_done(res.groups, reqs)


# two token sequences whose prefixes every prompt of shared_prefix_workloads is
_BASES = (tuple(range(100, 100 + MAX_LEN)), tuple(range(300, 300 + MAX_LEN)))


@st.composite
def shared_prefix_workloads(draw, max_requests: int = 12):
    """Requests whose prompts are prefixes of one of :data:`_BASES`, so that a prefix cache
    hits across requests."""
    n = draw(st.integers(1, max_requests))
    t, reqs = 0.0, []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.005, 0.05]))
        prompt = draw(st.integers(1, 48))
        output = draw(st.integers(1, 16))
        samples = draw(st.sampled_from([1, 1, 2]))
        ids = _BASES[draw(st.integers(0, 1))][:prompt]
        reqs.append(Request(i, t, prompt, output, SamplingParams(n=samples), ids))
    return reqs


# request 0 leaves its 40-token prompt cached; 1 and 2 then hit 36 of their 40 tokens each:
# one prompt step computes 4 + 4 tokens of the 64 it may
_TWO_CACHED_PROMPTS = [
    Request(0, 0.0, 40, 1, prompt_token_ids=_BASES[0][:40]),
    Request(1, 0.05, 40, 2, prompt_token_ids=_BASES[0][:40]),
    Request(2, 0.05, 40, 2, prompt_token_ids=_BASES[0][:40]),
]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
@given(reqs=shared_prefix_workloads(), slots=st.sampled_from([48, 96, 160]),
       seats=st.sampled_from([2, 3, 16]))  # fmt: skip
@example(reqs=_TWO_CACHED_PROMPTS, slots=160, seats=16)
@SETTINGS
def test_vllm_leaves_its_queue_head_out_only_for_a_reason(mode, reqs, slots, seats):
    """vLLM v0.1's swap-in and admission loops are greedy. After a step that preempts
    nothing, a swapped head stays out only if its sequences would pass ``max_num_seqs`` or
    its blocks do not fit; with nothing swapped when the step began, a waiting head stays
    out only if it would pass ``max_num_seqs``, cannot be allocated now, or (a prompt step)
    needs more tokens than the step's chunks left of the budget: the tokens a prefix cache
    holds are not computed, so they take none of it."""
    cfg = SchedulerConfig(max_num_seqs=seats, max_num_batched_tokens=MAX_LEN,
                          max_model_len=MAX_LEN, preemption_mode=mode)  # fmt: skip
    sched = build_scheduler("vllm", slots, config=cfg, block_size=4, num_cpu_slots=512,
                            watermark=0.0, enable_prefix_caching=True)  # fmt: skip

    def check(plan) -> None:
        if plan.preempted or plan.preempted_by_swap:
            return
        seated = sum(g.sampling.num_seqs for g in sched.running)
        if sched.swapped:
            head = sched.swapped[0]
            over_seats = seated + head.sampling.num_seqs > seats
            assert over_seats or not sched.manager.can_swap_in(head), "a swap-in left out"
        elif sched.waiting and not plan.swap_in:  # admissions wait for every swap-in
            head = sched.waiting[0]
            left = MAX_LEN - sum(c.length for c in plan.prefill)
            over_budget = bool(plan.prefill) and sum(s.num_tokens for s in head.seqs) > left
            over_seats = seated + head.sampling.num_seqs > seats
            fits = sched.manager.can_allocate(head) is AllocStatus.OK
            assert over_budget or over_seats or not fits, "an admission left out"

    res = run_loop(sched, reqs, on_plan=check)
    _assert_all_done(res.groups, reqs)


@pytest.mark.parametrize("decoders", [1, 2])
def test_orca_counts_decodes_against_the_budget_and_admits_an_exact_fit(decoders: int) -> None:
    """Orca counts each running decode against the step's token budget of 64 and admits a
    prompt that fills what is left exactly: beside 1 decode a 63-token prompt joins the
    first step after its arrival (64 tokens); beside 2 decodes it would make 65 and waits."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN)
    sched = build_scheduler("orca_oracle", 4096, config=cfg, block_size=4)
    reqs = [Request(i, 0.0, 10, 20) for i in range(decoders)] + [Request(9, 0.05, MAX_LEN - 1, 1)]
    res = run_loop(sched, reqs)
    _assert_all_done(res.groups, reqs)
    first = next(log for log in res.steps if any(g.request_id == 9 for g in log.waiting_before))
    joined = [c.seq.group.request_id for c in first.plan.prefill] == [9]
    assert joined == (decoders == 1)
    if joined:
        assert first.plan.shape().num_tokens == MAX_LEN
    assert max(log.plan.shape().num_tokens for log in res.steps) <= MAX_LEN


def test_two_sample_request_just_over_the_cache_is_rejected_at_intake() -> None:
    """Blocks of 4, prompt 6, output 6, two samples: the first prompt block is shared, the
    partial one (tokens 4-5) is each sample's own (copy-on-write), so the peak is
    1 + 2 x 2 = 5 blocks. A 4-block cache rejects the request at intake, with a reason,
    rather than admitting and aborting it; a 5-block cache serves it."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN)
    req = Request(0, 0.0, 6, 6, SamplingParams(n=2))
    small = build_scheduler("vllm", 16, config=cfg, block_size=4, watermark=0.0)
    group = small.add(req, 0.0)
    assert group.reject_reason is not None and "KV-cache" in group.reject_reason
    assert not small.has_unfinished()
    exact = build_scheduler("vllm", 20, config=cfg, block_size=4, watermark=0.0)
    res = run_loop(exact, [req])
    assert res.groups[0].reject_reason is None and res.groups[0].finish_time is not None


def _tiny_vllm(blocks: int, mode: str = "recompute", cpu_blocks: int = 16):
    """vLLM on ``blocks`` blocks of 4 slots, no admission watermark."""
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN,
                          preemption_mode=mode)  # fmt: skip
    return build_scheduler("vllm", 4 * blocks, config=cfg, block_size=4,
                           num_cpu_slots=4 * cpu_blocks, watermark=0.0)  # fmt: skip


def _ids(groups) -> list[int]:
    return [g.request_id for g in groups]


def test_vllm_swaps_groups_back_in_by_arrival_whatever_order_they_left() -> None:
    """Swapped groups come back first-come-first-served, not in swap-out order. Three
    blocks of 4; A, B, C (prompts of 4, arriving in that order) fill them in the prompt
    step. At the first decode each needs a new block: A, served first, preempts the
    latest, C; B then finds none and goes itself, so C is swapped out before B. Neither
    fits back (1 block + 1 for its next token) until A finishes; then 3 blocks are free,
    room for one of them: B, the older, returns first and C only after B finishes."""
    sched = _tiny_vllm(3, mode="swap")
    reqs = [Request(0, 0.0, 4, 3), Request(1, 0.0, 4, 4), Request(2, 0.0, 4, 4)]
    res = run_loop(sched, reqs)
    _assert_all_done(res.groups, reqs)
    swapped_out = [log.plan.preempted_by_swap for log in res.steps if log.plan.preempted_by_swap]
    assert [_ids(v) for v in swapped_out] == [[2, 1]]  # C left first
    came_back = [
        _ids(g for g in log.swapped_before if g in log.running_after_schedule)
        for log in res.steps
    ]  # fmt: skip
    assert [ids for ids in came_back if ids] == [[1], [2]]


class _NoSwapIn(PagedKVCacheManager):
    """A paged manager stricter than the shipped one: no swapped group comes back."""

    def can_swap_in(self, group) -> bool:
        return False


def test_vllm_aborts_a_swapped_group_that_cannot_come_back_and_frees_its_cpu_blocks() -> None:
    """The run above on a manager that lets no swapped group back in: once A finishes, the
    device is empty and B and C still cannot return, so both are aborted (the shipped
    manager never refuses then: the intake bound covers it) and their CPU blocks released,
    which the harness's check after every step would find held otherwise."""
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN,
                          preemption_mode="swap")  # fmt: skip
    manager = _NoSwapIn(3, block_size=4, num_cpu_blocks=16, watermark=0.0)
    reqs = [Request(0, 0.0, 4, 3), Request(1, 0.0, 4, 4), Request(2, 0.0, 4, 4)]
    res = run_loop(VLLMScheduler(manager, cfg), reqs)
    assert res.groups[0].finish_time is not None
    assert all("outgrew the KV cache" in str(g.reject_reason) for g in res.groups[1:])
    assert manager.num_free_cpu_blocks() == 16 and not manager.held_seq_ids()


def test_vllm_readmits_a_recomputed_group_before_later_arrivals() -> None:
    """A group preempted by recomputation goes back to the front of the waiting queue (it
    is older than anything waiting) and is re-admitted before later arrivals. Three
    blocks of 4; A and B (prompts of 4) take one each in the prompt step; C (prompt 8,
    2 blocks) arrives during it and waits. At the first decode A takes the last block, B
    finds none and is recomputed: queued ahead of C. Both need 2 blocks (B's prompt and
    first token, 5 tokens), so neither fits until A finishes; then B is re-admitted, and
    C only after B finishes."""
    sched = _tiny_vllm(3)
    reqs = [Request(0, 0.0, 4, 4), Request(1, 0.0, 4, 4), Request(2, 0.005, 8, 4)]
    res = run_loop(sched, reqs)
    _assert_all_done(res.groups, reqs)
    preempted = [(i, _ids(log.plan.preempted)) for i, log in enumerate(res.steps)]
    [(step, victims)] = [(i, v) for i, v in preempted if v]
    assert victims == [1]
    assert _ids(res.steps[step + 1].waiting_before) == [1, 2]
    admitted = [_ids(c.seq.group for c in log.plan.prefill) for log in res.steps[step + 1 :]]
    assert [ids for ids in admitted if ids] == [[1], [2]]


def test_vllm_decode_run_stops_where_the_free_blocks_run_out() -> None:
    """``decode_run`` promises decode steps only while their new blocks fit the free ones:
    a run that takes exactly all free blocks is promised whole, one more block is not.
    Eight blocks of 4; A (prompt 4) and B (prompt 6) hold 1 + 2 after the prompt step,
    5 free. A opens a block at decode steps 0, 4, 8, ...; B at 2, 6, 10, ...: the fifth
    new block comes at step 8, the sixth at step 10, so the run is 10 steps long."""
    sched = _tiny_vllm(8)
    reqs = [Request(0, 0.0, 4, 20), Request(1, 0.0, 6, 20)]
    runs = []

    def on_step(plan, finished) -> None:
        if plan.prefill and not runs:  # the prompt step (B is recomputed later on)
            assert sched.manager.num_free_blocks() == 5
            runs.append(sched.decode_run(100))

    run_loop(sched, reqs, on_step=on_step)
    [run] = runs
    assert run is not None
    assert run.new_blocks == [1, 0] * 5
    assert sum(run.new_blocks) == 5


@pytest.mark.parametrize("chunked", [False, True])
def test_a_token_budget_below_max_num_seqs_is_refused_in_every_mode(chunked: bool) -> None:
    # without chunked prefill it was taken, and a step of eight decodes ran on a budget of
    # five (vLLM refuses the pair in every mode)
    from core.sched.base import SchedulerConfigError

    with pytest.raises(SchedulerConfigError, match="below max_num_seqs=8"):
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=5, max_model_len=5,
                        chunked_prefill=chunked)  # fmt: skip
    SchedulerConfig(max_num_seqs=5, max_num_batched_tokens=5, max_model_len=5,
                    chunked_prefill=chunked)  # fmt: skip
