"""``kv_sharing_saving_pct`` and the per-step physical / logical block counts (Fig. 15)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from core.kv.contiguous import ContiguousKVCacheManager
from core.kv.paged import PagedKVCacheManager
from core.metrics.summary import sharing_saving_pct, summarize
from core.systems import build_scheduler
from core.workload.spec import build_workload
from sim.cost.roofline import RooflineCostModel
from sim.driver import simulate
from tests.kv_helpers import admit_and_fork, make_group


def test_breakdown_counts_blocks_with_and_without_sharing() -> None:
    m = PagedKVCacheManager(num_device_blocks=10, block_size=4, watermark=0.0)
    admit_and_fork(m, 6)
    b = m.breakdown()
    assert (b.physical_blocks, b.logical_blocks) == (2, 4)
    assert b.logical_blocks - b.physical_blocks == m.blocks_saved_by_sharing()


def test_contiguous_blocks_are_never_shared() -> None:
    m = ContiguousKVCacheManager(4096, "oracle", max_model_len=2048)
    m.allocate(make_group(prompt_len=30, output_len=20, n=2))
    b = m.breakdown()
    assert b.physical_blocks == b.logical_blocks == (4096 - b.free) // 16 > 0


def test_saving_is_weighted_by_step_duration_and_blocks() -> None:
    steps = pd.DataFrame(
        {"duration_s": [1.0, 3.0], "kv_logical_blocks": [10, 20], "kv_physical_blocks": [10, 10]}
    )
    # (1*0 + 3*10) / (1*10 + 3*20)
    assert sharing_saving_pct(steps) == pytest.approx(100 * 30 / 70)
    assert math.isnan(sharing_saving_pct(steps.assign(kv_logical_blocks=0)))


def _simulate(system: str, n: int) -> tuple[dict, pd.DataFrame]:
    wl = {"kind": "synthetic", "dataset": "alpaca", "rate": 4.0, "duration_s": 20.0, "n": n}
    requests = build_workload(wl, max_model_len=2048, seed=0)
    result = simulate(
        requests,
        lambda: build_scheduler(system, 8192),
        RooflineCostModel("opt-13b", "a100-40gb"),
        check_integrity_every=5,
    )
    rec = result.recorder
    steps = rec.steps_frame()
    return summarize(rec.requests_frame(), steps), steps


def test_parallel_sampling_saves_memory_and_single_samples_do_not() -> None:
    shared, steps = _simulate("vllm", 4)
    assert (steps["kv_physical_blocks"] <= steps["kv_logical_blocks"]).all()
    assert (steps["kv_physical_blocks"] * 16 + steps["kv_free"] == 8192).all()
    assert 0 < shared["kv_sharing_saving_pct"] < 100
    single, _ = _simulate("vllm", 1)
    assert single["kv_sharing_saving_pct"] == 0
    orca, _ = _simulate("orca_oracle", 4)
    assert orca["kv_sharing_saving_pct"] == 0


def _shared_prompt_requests(spacing_s: float) -> list:
    from core.request import Request

    prefix = tuple(range(1, 513))  # 32 full blocks of 16
    return [
        Request(i, spacing_s * i, 544, 30, prompt_token_ids=prefix + tuple(range(10_000 + 32 * i,
                10_032 + 32 * i)))
        for i in range(10)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("system", "spacing_s", "hits"),
    [
        ("vllm_v1", 0.0, 9 * 512),  # same step: V1 finds a block from the step that fills it
        # v0: a block is found once its step ends; all ten prompts fit one step (8,192
        # tokens), so none finds another's (at 2,560 the first step holds 4; the 6 after hit)
        ("vllm", 0.0, 0),
        ("vllm", 1.0, 9 * 512),  # 1 s apart: every later request finds the prefix
    ],
)
def test_prefix_cache_hits_count_the_prompt_tokens_found_at_admission(
    system: str, spacing_s: float, hits: int
) -> None:
    from experiments.simulate import simulate_requests

    setting = [f"system={system}", "system.enable_prefix_caching=true", "model=opt-125m",
               "system.max_num_batched_tokens=8192"]  # fmt: skip
    run_ = simulate_requests(_shared_prompt_requests(spacing_s), setting)
    cached = run_.requests["cached_prompt_tokens"].tolist()
    assert sum(cached) == run_.metrics["prefix_cache_hit_tokens"] == hits
    assert set(cached) <= {0, 512} and cached[0] == 0  # the first request finds nothing
    assert run_.metrics["prefix_cache_hit_pct"] == pytest.approx(100 * hits / (10 * 544))
    if spacing_s:  # a hit is not a saving: these requests never overlap
        assert run_.metrics["kv_sharing_saving_pct"] == 0


def test_no_prefix_caching_no_hits() -> None:
    from experiments.simulate import simulate_requests

    run_ = simulate_requests(_shared_prompt_requests(0.0), ["system=vllm", "model=opt-125m"])
    assert run_.metrics["prefix_cache_hit_tokens"] == 0
    assert set(run_.requests["cached_prompt_tokens"]) == {0}


def test_requests_without_ids_find_only_their_own_blocks_as_the_engines_drawn_ids_do() -> None:
    # the simulator turned prefix caching off for requests of lengths alone while the engine,
    # which draws each prompt's ids, kept it on: a request preempted by recompute hit its
    # own blocks in the engine only (+38% prompt tokens recomputed in the simulator)
    from core.request import Request
    from core.seeding import with_drawn_prompt_ids
    from experiments.simulate import simulate_requests

    lengths = [Request(i, 0.0, 300 + 7 * i, 200) for i in range(24)]
    drawn = [with_drawn_prompt_ids(r, 50272, seed=0) for r in lengths]
    setting = ["system=vllm_v1", "model=opt-125m", "num_gpu_blocks=130", "kv_cache_gb=null"]
    runs = [simulate_requests(reqs, setting) for reqs in (lengths, drawn)]
    for run_ in runs:
        assert run_.metrics["num_preemptions"] > 0  # a small cache: recomputes happen
        assert run_.metrics["prefix_cache_hit_tokens"] == 0  # no prefix is shared
    assert runs[0].steps["prefill_tokens"].sum() == runs[1].steps["prefill_tokens"].sum()
    assert runs[0].steps["prefill_kv_read_tokens"].sum() > 0  # own blocks found again
    assert runs[0].requests.equals(runs[1].requests)


@pytest.mark.parametrize("system", ["vllm", "vllm_v1"])
def test_readmissions_count_the_tokens_found_again_apart_from_first_admission_hits(
    system: str,
) -> None:
    # No prefix is shared, so the first-admission hits are 0; but a request preempted by
    # recompute finds its own blocks (prompt and generated) again, which counted nowhere
    from core.request import Request
    from experiments.simulate import simulate_requests

    lengths = [Request(i, 0.0, 300 + 7 * i, 200) for i in range(24)]
    setting = [f"system={system}", "model=opt-125m", "num_gpu_blocks=130", "kv_cache_gb=null"]
    on, off = (
        simulate_requests(lengths, [*setting, f"system.enable_prefix_caching={flag}"])
        for flag in ("true", "false")
    )
    readmit = on.requests["readmit_cached_tokens"]
    assert on.metrics["prefix_cache_hit_tokens"] == 0
    assert on.metrics["prefix_cache_readmit_tokens"] == readmit.sum() > 0
    assert (readmit[on.requests["num_preemptions"] == 0] == 0).all()  # only re-admissions
    # every token a prompt step read from the cache was found again at a re-admission
    assert on.steps["prefill_kv_read_tokens"].sum() == readmit.sum()
    assert off.metrics["prefix_cache_readmit_tokens"] == 0 < off.metrics["num_preemptions"]
