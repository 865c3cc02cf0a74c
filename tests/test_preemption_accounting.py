"""Preemption's counts agree wherever a run reports them: ``steps.csv``'s ``num_preempted``
sums to ``requests.csv``'s ``num_preemptions``, every block swapped out comes back in (no
request is aborted once scheduled), and ``swap_fallbacks`` counts exactly the victims that
would have swapped (swap mode, or a group of several sequences under ``vllm``) and were
recomputed because the CPU pool could not take them. Fuzzed over tiny caches and CPU
pools, both preemption modes, prefix caching, chunked prefill, samples and beams."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.plan import StepPlan
from core.request import Request, SamplingParams
from core.sched.base import SchedulerConfig
from core.systems import build_scheduler
from tests.sched_harness import run_loop

BLOCK = 4


@st.composite
def _case(draw: st.DrawFn) -> tuple[str, str, bool, bool, int, int, list[Request]]:
    system = draw(st.sampled_from(["vllm", "vllm", "vllm_v1"]))
    mode = "recompute" if system == "vllm_v1" else draw(st.sampled_from(["recompute", "swap"]))
    caching, chunked = draw(st.booleans()), system == "vllm_v1" or draw(st.booleans())
    num_blocks, num_cpu_blocks = draw(st.integers(5, 12)), draw(st.sampled_from([0, 1, 3, 64]))
    reqs = []
    for i in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["one", "one", "two", "beam"]))
        if kind == "one":
            sampling = SamplingParams()
        elif kind == "two" or system == "vllm_v1":
            sampling = SamplingParams(n=2, temperature=1.0, seed=i)
        else:
            sampling = SamplingParams(beam_width=2)
        plen = draw(st.integers(1, 16))
        ids = list(range(100 * i, 100 * i + plen))
        if reqs and draw(st.booleans()):  # request 0's leading tokens: prefix-cache hits
            k = min(plen, reqs[0].prompt_len)
            ids = reqs[0].prompt_token_ids[:k] + ids[k:]
        arrival = draw(st.sampled_from([0.0, 0.0, 0.005, 0.02]))
        reqs.append(Request(i, arrival, plen, draw(st.integers(1, 14)), sampling, ids))
    return system, mode, caching, chunked, num_blocks, num_cpu_blocks, reqs


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(_case())
def test_preemption_counts_agree_in_steps_requests_and_fallbacks(
    case: tuple[str, str, bool, bool, int, int, list[Request]],
) -> None:
    system, mode, caching, chunked, num_blocks, num_cpu_blocks, reqs = case
    config = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=8 if chunked else 64, max_model_len=64,
        preemption_mode=mode, chunked_prefill=chunked,
    )  # fmt: skip
    sched = build_scheduler(
        system, num_blocks * BLOCK, config, block_size=BLOCK,
        num_cpu_slots=num_cpu_blocks * BLOCK, enable_prefix_caching=caching, watermark=0.0,
    )  # fmt: skip
    fallbacks = 0

    def on_plan(plan: StepPlan) -> None:  # every schedule call, an empty plan's too
        nonlocal fallbacks
        for group in plan.preempted:
            fallbacks += mode == "swap" or (len(group.live_seqs()) > 1 and sched.swap_groups)

    out = run_loop(sched, reqs, on_plan=on_plan, beams_rng=np.random.default_rng(0))
    steps, requests = out.recorder.steps_frame(), out.recorder.requests_frame()
    # none aborted once scheduled (a request too big for the cache is rejected at intake)
    assert requests.loc[requests["status"] == "rejected", "first_scheduled_s"].isna().all()
    assert steps["num_preempted"].sum() == requests["num_preemptions"].sum()
    assert steps["swap_out_blocks"].sum() == steps["swap_in_blocks"].sum()
    assert sched.swap_fallbacks == fallbacks
    if mode == "recompute" and system == "vllm_v1":
        assert steps["swap_out_blocks"].sum() == 0
