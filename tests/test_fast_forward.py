"""Fast-forward (plain decode steps run at once) changes nothing but the speed.

The paged manager's lockstep growth must leave the state, the per-step block counts and
the memory breakdowns that one ``append_all`` per step leaves; a whole simulation with
fast-forward must write the same tables, token gaps and clock as one step at a time.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.kv.contiguous import ContiguousKVCacheManager
from core.kv.paged import PagedKVCacheManager
from core.loop import StepLoop
from core.request import Request, SequenceGroup
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import build_scheduler
from core.workload.spec import build_workload
from sim.cost.roofline import RooflineCostModel
from sim.driver import simulate
from tests.kv_helpers import admit_and_fork, make_group


def _state(m: PagedKVCacheManager, seqs: list[Any]) -> tuple[Any, ...]:
    pool = m.device_pool
    tables = [(m.block_table(s.seq_id), m.num_slots(s.seq_id)) for s in seqs]
    totals = (pool.num_used, pool.num_filled, pool.ref_total, pool.num_free())
    return tables, list(pool.ref), list(pool.fill), list(pool._free), totals


@settings(max_examples=80, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    block_size=st.integers(1, 8),
    spare=st.integers(0, 12),
    steps=st.integers(1, 30),
)
def test_lockstep_growth_is_append_all_step_by_step(
    prompts: list[int], block_size: int, spare: int, steps: int
) -> None:
    need = sum(-(-p // block_size) for p in prompts)
    managers = [PagedKVCacheManager(need + spare, block_size, watermark=0.0) for _ in "ab"]
    runs = []
    for m in managers:
        groups = [make_group(p, output_len=100) for p in prompts]
        for g in groups:
            m.allocate(g)
            g.seqs[0].num_generated += 1  # the prompt step sampled a token
        runs.append([g.seqs[0] for g in groups])
    (fast, slow), (fast_seqs, slow_seqs) = managers, runs
    blocks = fast.lockstep_blocks(fast_seqs, steps)
    assert blocks is not None and len(blocks) == steps
    # step by step: the blocks each append_all takes, the breakdown after it
    taken, memories, fit = [], [], 0
    for _ in range(steps):
        free = slow.num_free_blocks()
        if slow.append_all([s.group for s in slow_seqs]) is None:
            break
        taken.append(free - slow.num_free_blocks())
        memories.append(slow.breakdown())
        for s in slow_seqs:
            s.num_generated += 1
        fit += 1
    # what decode_run promises: the longest prefix whose blocks are free
    free, cum, promised = fast.num_free_blocks(), 0, 0
    for b in blocks:
        cum += b
        if cum > free:
            break
        promised += 1
    assert promised == fit
    assert blocks[:fit] == taken
    assert fast.lockstep_breakdowns(len(fast_seqs), blocks[:fit]) == memories
    fast.advance_lockstep(fast_seqs, fit)
    for s in fast_seqs:
        s.num_generated += fit
    assert _state(fast, fast_seqs) == _state(slow, slow_seqs)
    fast.check_integrity()


def test_lockstep_blocks_refuses_what_is_not_a_plain_decode() -> None:
    m = PagedKVCacheManager(20, 4, watermark=0.0)
    g = make_group(6)
    m.allocate(g)
    seq = g.seqs[0]
    assert m.lockstep_blocks([seq], 3) is None  # no token sampled yet: nothing to append
    seq.num_generated += 2
    assert m.lockstep_blocks([seq], 3) is None  # two slots behind
    seq.num_generated -= 1
    assert m.lockstep_blocks([seq], 3) == [0, 0, 1]  # slots 7, 8 fill block 1; 9 opens 2


def _simulate(
    seed: int, rate: float, slots: int, replicas: int, check_every: int, fast: bool,
    system: str = "vllm", knobs: dict[str, Any] | None = None, caching: bool = False,
    workload: dict[str, Any] | None = None,
) -> tuple[Any, ...]:  # fmt: skip
    wl = {"kind": "synthetic", "dataset": "sharegpt", "rate": rate, "duration_s": 15.0}
    requests = build_workload({**wl, **(workload or {})}, max_model_len=2048, seed=seed)
    cpu = 2048 if system == "vllm" else 0
    config = SchedulerConfig(**(knobs or {}))

    def make() -> Any:
        return build_scheduler(
            system, slots, config=config, num_cpu_slots=cpu, enable_prefix_caching=caching
        )

    cost = RooflineCostModel("opt-13b", "a100-40gb")
    return _run(requests, make, cost, fast, replicas, seed=seed, check_every=check_every)


def _run(
    requests: list[Request], make: Any, cost: Any, fast: bool, replicas: int = 1,
    seed: int = 0, check_every: int = 0,
) -> tuple[Any, ...]:  # fmt: skip
    """A simulation's tables, token gaps, clock and step count, and every sequence's
    final ``(num_computed, num_generated)`` (by request id, then sequence id)."""
    groups: list[SequenceGroup] = []
    schedulers: list[BaseScheduler] = []

    def make_kept() -> BaseScheduler:
        sched = make()
        schedulers.append(sched)
        add = sched.add

        def keep(request: Request, now: float) -> SequenceGroup:
            group = add(request, now)
            groups.append(group)
            return group

        sched.add = keep  # type: ignore[method-assign]
        return sched

    result = simulate(
        requests, make_kept, cost, replicas, seed=seed, check_integrity_every=check_every,
        fast_forward=fast,
    )  # fmt: skip
    rec = result.recorder
    seqs = sorted(
        (g.request_id, s.seq_id, s.num_computed, s.num_generated) for g in groups for s in g.seqs
    )
    return (
        rec.steps_frame(),
        rec.requests_frame(),
        list(rec.inter_token_latencies()),
        result.end_time_s,
        result.num_steps,
        seqs,
        # what each pool holds at the end: blocks left cached (evictable) and their hashes
        [sorted(getattr(s.manager, "device_pool", s.manager)._block_of)
         if hasattr(s.manager, "device_pool") else None for s in schedulers],
    )  # fmt: skip


def _assert_same(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    pd.testing.assert_frame_equal(a[0], b[0], check_exact=True)
    pd.testing.assert_frame_equal(a[1], b[1], check_exact=True)
    assert a[2:5] == b[2:5]
    assert a[5] == b[5], "a sequence's computed or generated tokens differ"
    assert a[6] == b[6], "the prefix caches hold other blocks at the end"


@settings(max_examples=16, deadline=None)
@given(
    seed=st.integers(0, 1000),
    rate=st.sampled_from([0.5, 2.0, 6.0]),
    slots=st.sampled_from([3072, 8192, 40960]),  # small ones preempt (vllm) or queue (orca)
    replicas=st.sampled_from([1, 2]),
    check_every=st.sampled_from([0, 5]),
    system=st.sampled_from(["vllm", "orca_max", "orca_oracle", "orca_pow2", "fastertransformer"]),
)
def test_fast_forward_gives_the_step_by_step_results(
    seed: int, rate: float, slots: int, replicas: int, check_every: int, system: str
) -> None:
    args = (seed, rate, slots, replicas, check_every)
    fast = _simulate(*args, fast=True, system=system)
    _assert_same(fast, _simulate(*args, fast=False, system=system))


TIGHT_LIMITS = [
    ("vllm", {"max_num_seqs": 2}),
    ("vllm", {"max_num_seqs": 4}),
    ("vllm", {"max_num_seqs": 4, "preemption_mode": "swap"}),
    ("orca_oracle", {"max_num_seqs": 4, "max_num_batched_tokens": 2048}),
    ("orca_max", {"max_num_seqs": 3, "max_num_batched_tokens": 2048}),
    ("fastertransformer", {"max_num_seqs": 4}),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    ("system", "knobs"),
    TIGHT_LIMITS,
    ids=[f"{s}-{'-'.join(map(str, k.values()))}" for s, k in TIGHT_LIMITS],
)
def test_fast_forward_gives_the_step_by_step_results_under_tight_limits(
    system: str, knobs: dict[str, Any], seed: int
) -> None:
    """With a small ``max_num_seqs`` (and the smallest token budget the config allows) the
    queue's head is often held back by a limit rather than by memory: fast-forward must
    skip exactly the steps that admit nothing, and leave every sequence's computed and
    generated tokens as one step at a time leaves them."""
    args = (seed, 2.0, 8192, 1, 0)
    fast = _simulate(*args, fast=True, system=system, knobs=knobs)
    _assert_same(fast, _simulate(*args, fast=False, system=system, knobs=knobs))


class _FlatCost:
    def step_time(self, shape: object) -> float:
        return 0.01

    def describe(self) -> str:
        return "10 ms a step"


# A long request decodes alone; the second arrives mid-way and fits a limit exactly.
EXACT_FITS = {
    "vllm, width fills max_num_seqs": (
        "vllm", {"max_num_seqs": 2}, Request(1, 0.05, 10, 5),
    ),
    "orca, width fills max_num_seqs": (
        "orca_oracle", {"max_num_seqs": 2}, Request(1, 0.05, 10, 5),
    ),
    "orca, prompt fills the token budget left by the decode": (
        "orca_oracle", {"max_num_seqs": 4}, Request(1, 0.05, 63, 1),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("system", "knobs", "late"), EXACT_FITS.values(), ids=list(EXACT_FITS))
def test_fast_forward_admits_a_head_that_fits_a_limit_exactly(
    system: str, knobs: dict[str, Any], late: Request
) -> None:
    """A head that exactly fills ``max_num_seqs`` or the step's token budget is admitted at
    the first step after its arrival, with or without fast-forward (the decode run's
    'admits nothing' check is the schedule's own limit, not one short of it)."""
    config = SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, **knobs)
    requests = [Request(0, 0.0, 10, 50), late]

    def make() -> BaseScheduler:
        return build_scheduler(system, 4096, config=config, block_size=4)

    slow = _run(requests, make, _FlatCost(), fast=False)
    first = slow[1].set_index("request_id")["first_scheduled_s"]
    assert first[1] == pytest.approx(0.05), "the late request waited past a step that fit it"
    _assert_same(_run(requests, make, _FlatCost(), fast=True), slow)


def test_fast_forward_admits_a_chunk_that_fits_the_budget_the_decodes_leave() -> None:
    """Chunked prefill: the head's first chunk is the step's budget less one token per
    decode (1 block of 4 here, not the 2 a whole budget of 5 would take), so the head is
    admitted at the first step after its arrival that has the one block free, with or
    without fast-forward."""
    config = SchedulerConfig(
        max_num_batched_tokens=5, max_model_len=64, max_num_seqs=4, chunked_prefill=True
    )
    requests = [Request(0, 0.0, 3, 40), Request(1, 0.115, 20, 3)]

    def make() -> BaseScheduler:
        return build_scheduler("vllm_v1", 44, config=config, block_size=4)

    slow = _run(requests, make, _FlatCost(), fast=False)
    first = slow[1].set_index("request_id")["first_scheduled_s"]
    assert first[1] == pytest.approx(0.12)
    _assert_same(_run(requests, make, _FlatCost(), fast=True), slow)


def test_fast_forward_stops_before_a_decode_evicts_the_heads_cached_blocks(
    monkeypatch: Any,
) -> None:
    """vllm_v1 with prefix caching: request 2 has request 1's prompt, so it recomputes the
    prompt's last block (a duplicate: that hash names request 1's block) and chains its
    generated blocks on it. Two recompute preemptions leave its cached chain with a middle
    block released before the blocks after it. While it waits, request 0's next block evicts
    that one: the head loses it and the three cached blocks after it, so its first chunk,
    which counted those evictable hits as blocks to take, needs three blocks fewer for one
    block taken, and it is admitted in that step. A decode run must stop before that step
    (``PagedKVCacheManager.takes_sparing_hits``); without the cap it runs on past it."""
    config = SchedulerConfig(
        max_num_batched_tokens=9, max_model_len=64, max_num_seqs=2, chunked_prefill=True
    )
    prompt = tuple(range(100, 108))  # two blocks of 4
    requests = [
        Request(0, 0.0, 1, 29, prompt_token_ids=(1000,)),
        Request(1, 0.0, 8, 1, prompt_token_ids=prompt),
        Request(2, 0.02, 8, 19, prompt_token_ids=prompt),
    ]

    def make() -> BaseScheduler:
        return build_scheduler(
            "vllm_v1", 48, config=config, block_size=4, enable_prefix_caching=True
        )

    capped = []
    sparing = PagedKVCacheManager.takes_sparing_hits

    def counting(self: PagedKVCacheManager, group: SequenceGroup, limit: int) -> int:
        n = sparing(self, group, limit)
        capped.append(n < limit)
        return n

    slow = _run(requests, make, _FlatCost(), fast=False)
    assert slow[1].set_index("request_id")["num_preemptions"][2] == 2
    monkeypatch.setattr(PagedKVCacheManager, "takes_sparing_hits", counting)
    fast = _run(requests, make, _FlatCost(), fast=True)
    _assert_same(fast, slow)
    assert any(capped), "no decode run met the head's evictable cached blocks"


def test_fast_forward_runs_most_steps_of_a_light_load(monkeypatch: Any) -> None:
    """Not a no-op: on a lightly loaded cache most steps are plain decodes run at once."""
    counted = {"ahead": 0}
    original = StepLoop.fast_forward

    def counting(self: StepLoop, *args: Any) -> float:
        before = self.num_steps
        out = original(self, *args)
        counted["ahead"] += self.num_steps - before
        return out

    monkeypatch.setattr(StepLoop, "fast_forward", counting)
    fast = _simulate(1, 1.0, 40000, 1, 0, fast=True)
    assert counted["ahead"] > fast[4] / 2
    monkeypatch.undo()
    _assert_same(fast, _simulate(1, 1.0, 40000, 1, 0, fast=False))


V1_KNOBS = {"chunked_prefill": True, "max_num_batched_tokens": 2048}


@pytest.mark.parametrize(
    ("system", "caching"), [("vllm", False), ("vllm_v1", False), ("vllm_v1", True)]
)
def test_fast_forward_runs_every_plain_decode_of_a_light_load(
    monkeypatch: Any, system: str, caching: bool
) -> None:
    """On a cache that never fills, only the prompts' steps are scheduled one at a time:
    with chunked prefill (vllm_v1, prefix caching on or off) too, and the step after a run
    that ended by finishing a group (another run follows at once)."""
    kinds = {"prefill": 0, "decode": 0}
    original = StepLoop.begin

    def counting(self: StepLoop, now: float) -> Any:
        pending = original(self, now)
        if pending is not None:
            kinds["prefill" if pending.plan.prefill else "decode"] += 1
        return pending

    monkeypatch.setattr(StepLoop, "begin", counting)
    kw: dict[str, Any] = {"system": system, "caching": caching}
    kw["knobs"] = V1_KNOBS if system == "vllm_v1" else {}
    fast = _simulate(1, 1.0, 40000, 1, 0, fast=True, **kw)
    assert kinds["decode"] == 0 and kinds["prefill"] >= len(fast[1])
    monkeypatch.undo()
    _assert_same(fast, _simulate(1, 1.0, 40000, 1, 0, fast=False, **kw))


# chunked prefill: the queue's head waits for memory, for max_num_seqs, for a budget the
# decodes leave empty (4 sequences, 4 tokens) or small (its chunk's blocks decide)
V1_LIMITS = [
    ({"max_num_seqs": 2, "max_num_batched_tokens": 64}, 8192),
    ({"max_num_seqs": 4, "max_num_batched_tokens": 4}, 8192),
    ({"max_num_seqs": 8, "max_num_batched_tokens": 256}, 3072),
    ({"max_num_batched_tokens": 2048}, 3072),
]


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize(
    ("knobs", "slots"),
    V1_LIMITS,
    ids=[f"{s}-{'-'.join(map(str, k.values()))}" for k, s in V1_LIMITS],
)
def test_fast_forward_with_chunked_prefill_gives_the_step_by_step_results(
    knobs: dict[str, Any], slots: int, caching: bool
) -> None:
    kw: dict[str, Any] = {"system": "vllm_v1", "caching": caching}
    kw["knobs"] = {"chunked_prefill": True, **knobs}
    kw["workload"] = {"kind": "shared_prefix", "prefix_len": 64, "dataset": None}
    for seed in (0, 1):
        args = (seed, 6.0, slots, 1, 0)
        _assert_same(_simulate(*args, fast=True, **kw), _simulate(*args, fast=False, **kw))


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize(("knobs", "slots"), V1_LIMITS[:1] + V1_LIMITS[2:3])
def test_fast_forward_with_v1_samples_gives_the_step_by_step_results(
    knobs: dict[str, Any], slots: int, caching: bool
) -> None:
    """vllm_v1 serves a request's three samples as three requests (core.request.ParentRequest):
    runs of decode steps over them, preempting each other on a small cache, are the steps."""
    kw: dict[str, Any] = {"system": "vllm_v1", "caching": caching, "workload": {"n": 3}}
    kw["knobs"] = {"chunked_prefill": True, **knobs}
    for seed in (0, 1):
        args = (seed, 2.0, slots, 1, 0)
        _assert_same(_simulate(*args, fast=True, **kw), _simulate(*args, fast=False, **kw))


@settings(max_examples=80, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 20), min_size=1, max_size=6),
    forked=st.lists(st.booleans(), min_size=6, max_size=6),
    block_size=st.integers(1, 6),
    spare=st.integers(0, 4),
    rounds=st.integers(1, 12),
)
def test_try_append_is_can_append_then_append(
    prompts: list[int], forked: list[bool], block_size: int, spare: int, rounds: int
) -> None:
    """The preemption path's ``try_append`` (inlined for a lone decoding sequence) leaves
    what ``can_append`` then ``append`` leave, shared last blocks (forks) included."""
    need = sum(2 * -(-p // block_size) for p in prompts)
    twins = [PagedKVCacheManager(need + spare, block_size, watermark=0.0) for _ in "ab"]
    runs = []
    for m in twins:
        groups = []
        for p, fork in zip(prompts, forked, strict=False):
            if fork:
                g, _ = admit_and_fork(m, p)
            else:
                g = make_group(p, output_len=100)
                m.allocate(g)
            groups.append(g)
        runs.append(groups)
    (fast, slow), (fast_groups, slow_groups) = twins, runs
    for _ in range(rounds):
        for gf, gs in zip(fast_groups, slow_groups, strict=True):
            for s in gf.seqs + gs.seqs:
                s.num_generated += 1
            want = slow.append(gs) if slow.can_append(gs) else None
            assert fast.try_append(gf) == want
            if want is None:  # neither changed: step the sequences back
                for s in gf.seqs + gs.seqs:
                    s.num_generated -= 1
    seqs_f = [s for g in fast_groups for s in g.seqs]
    seqs_s = [s for g in slow_groups for s in g.seqs]
    assert _state(fast, seqs_f) == _state(slow, seqs_s)
    fast.check_integrity()


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    outputs=st.lists(st.integers(2, 40), min_size=6, max_size=6),
    policy=st.sampled_from(["max", "pow2", "oracle"]),
    steps=st.integers(1, 40),
)
def test_contiguous_lockstep_is_append_all_step_by_step(
    prompts: list[int], outputs: list[int], policy: str, steps: int
) -> None:
    """Orca's managers: lockstep growth within the true lengths leaves the breakdowns and
    counters that one ``append_all`` per step leaves."""
    twins = [ContiguousKVCacheManager(16384, policy, max_model_len=128) for _ in "ab"]
    runs = []
    for m in twins:
        groups = [make_group(p, output_len=o) for p, o in zip(prompts, outputs, strict=False)]
        for g in groups:
            m.allocate(g)
            g.seqs[0].num_generated += 1
        runs.append([g.seqs[0] for g in groups])
    (fast, slow), (fast_seqs, slow_seqs) = twins, runs
    steps = min(steps, *(s.group.request.output_len - s.num_generated for s in fast_seqs))
    blocks = fast.lockstep_blocks(fast_seqs, steps)
    assert blocks == [0] * steps
    memories = []
    for _ in range(steps):
        assert slow.append_all([s.group for s in slow_seqs]) == []
        memories.append(slow.breakdown())
        for s in slow_seqs:
            s.num_generated += 1
    assert fast.lockstep_breakdowns(len(fast_seqs), blocks) == memories
    fast.advance_lockstep(fast_seqs, steps)
    assert fast.breakdown() == slow.breakdown()
    assert [fast.num_slots(s.seq_id) for s in fast_seqs] == [
        slow.num_slots(s.seq_id) for s in slow_seqs
    ]
    fast.check_integrity()


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 1000),
    rate=st.sampled_from([2.0, 6.0]),
    slots=st.sampled_from([3072, 8192]),  # small: recompute preemptions re-hit, blocks evicted
    check_every=st.sampled_from([0, 5]),
    system=st.sampled_from(["vllm", "vllm_v1"]),
    shared=st.booleans(),
)
def test_fast_forward_with_prefix_caching_gives_the_step_by_step_results(
    seed: int, rate: float, slots: int, check_every: int, system: str, shared: bool
) -> None:
    # decode runs skip prefix caching no more: the blocks a run fills are registered at its
    # end (PagedKVCacheManager.register_run); stand-in prompts (no ids) or a shared prefix
    workload = {"kind": "shared_prefix", "prefix_len": 64, "dataset": None} if shared else {}
    knobs = {"chunked_prefill": True, "max_num_batched_tokens": 2048} if system == "vllm_v1" else {}
    args = (seed, rate, slots, 1, check_every)
    kw: dict[str, Any] = {"system": system, "caching": True, "workload": workload, "knobs": knobs}
    fast = _simulate(*args, fast=True, **kw)
    _assert_same(fast, _simulate(*args, fast=False, **kw))
    assert fast[0]["prefill_kv_read_tokens"].sum() > 0 or not shared
