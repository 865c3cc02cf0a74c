"""vllm_v1 serves a request of n > 1 samples as n requests of one sample (vLLM V1's
``ParentRequest``): they share the prompt's full blocks only through the prefix cache, each
holds its own last partial block, and the request is reported once, when its last child is
done. Other systems keep one forked group (``core.systems.SystemSpec.sampling_fanout``)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from core.loop import StepLoop, VirtualClock
from core.metrics.recorder import Recorder
from core.plan import StepOutcome, StepPlan
from core.request import ParentRequest, Request, SamplingParams, child_request
from core.sched.base import BaseScheduler, SchedulerConfig
from core.sched.orca import OrcaScheduler
from core.systems import SYSTEMS, SystemConfigError, SystemSpec, build_scheduler, register_system
from engine.engine import LLMEngine
from engine.weights import init_dummy_weights
from sim.cost.recorded import RecordedCostModel
from sim.driver import simulate
from tests.engine_helpers import (
    TEST_STD,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    prompt_ids,
    tiny_config,
)

BLOCK = 4
CONFIG = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64,
                         chunked_prefill=True)  # fmt: skip


class _FixedStep:
    """Every step takes 10 ms."""

    def execute(self, plan: StepPlan, shape: object, start: float) -> StepOutcome:
        return StepOutcome(0.01)

    def at_end(self, plan: StepPlan, outcome: StepOutcome) -> None:
        pass


def _serve(system: str, caching: bool, reqs: list[Request]) -> Recorder:
    sched = build_scheduler(system, 40 * BLOCK, CONFIG, block_size=BLOCK, watermark=0.0,
                            enable_prefix_caching=caching)  # fmt: skip
    recorder = Recorder()
    StepLoop(sched, _FixedStep(), recorder, check_every=1).run(reqs, VirtualClock())
    return recorder


@pytest.mark.parametrize("ids", [None, tuple(range(10))])
@pytest.mark.parametrize("caching", [False, True])
def test_v1_samples_share_full_prompt_blocks_only_through_the_prefix_cache(
    caching: bool, ids: tuple[int, ...] | None
) -> None:
    """A 10-token prompt (2 full blocks of 4 and a partial one), n=2. Prefix caching off:
    each sample computes and holds the whole prompt (6 blocks, nothing shared); on: the
    second sample hits the first's 2 full blocks in the same step and computes only its
    partial block (4 blocks held, 6 without sharing), with or without prompt token ids."""
    req = Request(0, 0.0, 10, 3, SamplingParams(n=2, seed=3), ids)
    first = _serve("vllm_v1", caching, [req]).steps_frame().iloc[0]
    assert first["prefill_seqs"] == 2
    assert first["kv_logical_blocks"] == 6
    if caching:
        assert (first["prefill_tokens"], first["kv_physical_blocks"]) == (10 + 2, 4)
        assert first["prefill_kv_read_tokens"] == 8
    else:
        assert (first["prefill_tokens"], first["kv_physical_blocks"]) == (20, 6)
    # vllm (v0) computes the prompt once and forks it, caching or not
    v0 = _serve("vllm", caching, [req]).steps_frame().iloc[0]
    assert (v0["prefill_seqs"], v0["prefill_tokens"], v0["kv_physical_blocks"]) == (1, 10, 3)


def test_a_v1_parent_is_one_row_of_its_childrens_times() -> None:
    """Two samples under a seat limit of one sequence: the second is admitted after the
    first finishes, so the row's first token is the first child's, its finish the second's
    and its TPOT the children's own, averaged; the ITL gaps are taken within each child."""
    config = dataclasses.replace(CONFIG, max_num_seqs=1, max_num_batched_tokens=64)
    sched = build_scheduler("vllm_v1", 40 * BLOCK, config, block_size=BLOCK, watermark=0.0)
    recorder = Recorder()
    loop = StepLoop(sched, _FixedStep(), recorder, check_every=1)
    req = Request(0, 0.0, 6, 3, SamplingParams(n=2))
    loop.run([req], VirtualClock())
    rows = recorder.requests_frame()
    assert len(rows) == 1
    row = rows.iloc[0]
    assert (row["num_seqs"], row["output_len"], row["status"]) == (2, 3, "finished")
    assert row["first_token_s"] == pytest.approx(0.01)  # the first child's prompt step
    assert row["finish_s"] == pytest.approx(0.06)  # the second child, after the first's 3
    assert row["first_token_step"] == 0 and row["finish_step"] == 5
    # each child's own (0.03 - 0.01) / 2 and (0.06 - 0.04) / 2, not (0.06 - 0.01) / 2, which
    # counts the second child's wait for the seat
    assert row["tpot_s"] == pytest.approx(0.01)
    assert recorder.inter_token_latencies() == pytest.approx([0.01] * 4)  # none across
    assert recorder.max_itl_by_request() == {0: pytest.approx(0.01)}


def test_a_v1_request_too_long_is_rejected_whole_once() -> None:
    sched = build_scheduler("vllm_v1", 40 * BLOCK, CONFIG, block_size=BLOCK, watermark=0.0)
    recorder = Recorder()
    done: list[int] = []
    loop = StepLoop(sched, _FixedStep(), recorder, on_done=done.append)
    parent = loop.add(Request(0, 0.0, 60, 10, SamplingParams(n=3)), 0.0)
    assert isinstance(parent, ParentRequest) and len(parent.children) == 1
    assert "max_model_len" in str(parent.reject_reason)
    assert done == [1] and loop.num_open == 0 and not sched.waiting
    assert recorder.requests_frame()["status"].tolist() == ["rejected"]


def test_a_v1_rejection_says_it_is_each_samples_need() -> None:
    """A child's reason counts its own one sequence; the parent's says it is each of n."""
    sched = build_scheduler("vllm_v1", 8 * BLOCK, CONFIG, block_size=BLOCK, watermark=0.0)
    recorder = Recorder()
    loop = StepLoop(sched, _FixedStep(), recorder)
    parent = loop.add(Request(0, 0.0, 40, 10, SamplingParams(n=3)), 0.0)
    why = str(parent.reject_reason)
    assert why.startswith("each of its n=3 samples, served as a request of one sample")
    assert "KV-cache memory" in why and "1 sequence(s)" in why
    assert recorder.requests_frame()["reject_reason"].tolist() == [why]


def test_child_requests_take_one_sample_and_vllms_seed_offsets() -> None:
    parent = Request(4, 1.0, 5, 2, SamplingParams(n=3, seed=10), (1, 2, 3, 4, 5))
    kids = [child_request(parent, i) for i in range(3)]
    assert [k.sampling.seed for k in kids] == [10, 11, 12]
    assert all(k.sampling.n == 1 and k.sampling.temperature == 1.0 for k in kids)
    assert all(k.prompt_token_ids == parent.prompt_token_ids for k in kids)
    unseeded = child_request(dataclasses.replace(parent, sampling=SamplingParams(n=2)), 1)
    assert unseeded.sampling.seed is None


def test_only_vllm_v1_fans_out_and_only_over_paged_kv() -> None:
    assert {n for n, s in SYSTEMS.items() if s.sampling_fanout == "requests"} == {"vllm_v1"}
    with pytest.raises(SystemConfigError, match="needs paged KV"):
        register_system(SystemSpec("orca_fanout", OrcaScheduler, "contiguous", "max",
                                   sampling_fanout="requests"))  # fmt: skip
    with pytest.raises(SystemConfigError, match="sampling_fanout 'beams' is not one of"):
        register_system(SystemSpec("bad_fanout", OrcaScheduler, "contiguous", "max",
                                   sampling_fanout="beams"))  # fmt: skip
    assert "orca_fanout" not in SYSTEMS and "bad_fanout" not in SYSTEMS


def _v1_engine(num_blocks: int, caching: bool, config: SchedulerConfig) -> LLMEngine:
    engine = LLMEngine(
        tiny_config(), system="vllm_v1", num_blocks=num_blocks, block_size=BLOCK,
        sched_config=config, enable_prefix_caching=caching, watermark=0.0,
    )  # fmt: skip
    init_dummy_weights(engine.model, 0, std=TEST_STD)
    return engine


@pytest.mark.parametrize("caching", [False, True])
def test_v1_samples_in_both_bodies(caching: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests of 2 and 3 samples among plain ones on 16 blocks (the children preempt each
    other): the simulator replaying the engine's step times makes its steps and rows; the
    engine's sample ``i`` of a seeded request draws what a one-sample request seeded
    ``seed + i`` draws."""
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16, max_model_len=64,
                             chunked_prefill=True)  # fmt: skip
    spec = [(9, 12, 0.0, 2), (6, 10, 0.0, 1), (13, 8, 0.002, 3), (5, 9, 0.01, 1)]
    reqs = [
        Request(i, t, p, o, SamplingParams(n=n, seed=50 + 10 * i) if n > 1 else SamplingParams(),
                prompt_ids(p, 100 + i))
        for i, (p, o, t, n) in enumerate(spec)
    ]  # fmt: skip
    batches: list[list[int]] = []
    original = BaseScheduler.update

    def spy(self: BaseScheduler, plan: StepPlan, outcome: StepOutcome, now: float):
        batches.append([seq.seq_id for seq in plan.scheduled_seqs()])
        return original(self, plan, outcome, now)

    monkeypatch.setattr(BaseScheduler, "update", spy)
    result = _v1_engine(16, caching, config).generate(reqs, mode="online", clock="virtual")
    e_steps, e_req = result.recorder.steps_frame(), result.recorder.requests_frame()
    engine_batches, batches[:] = list(batches), []
    assert e_steps["num_preempted"].sum() > 0
    assert e_req["num_seqs"].tolist() == [2, 1, 3, 1]
    assert (e_req["status"] == "finished").all()
    assert [len(result.outputs[i].token_ids) for i in range(4)] == [2, 1, 3, 1]
    assert all(len(t) == o for (_, o, _, _), r in zip(spec, result.outputs.values(), strict=True)
               for t in r.token_ids)  # fmt: skip
    if caching:  # the samples' later children hit the first's full prompt blocks
        assert (e_steps["kv_physical_blocks"] < e_steps["kv_logical_blocks"]).any()
    else:
        assert e_steps["kv_physical_blocks"].equals(e_steps["kv_logical_blocks"])

    def make_scheduler() -> BaseScheduler:
        return build_scheduler("vllm_v1", 16 * BLOCK, config, block_size=BLOCK, watermark=0.0,
                               enable_prefix_caching=caching)  # fmt: skip

    cost = RecordedCostModel(e_steps["duration_s"])
    sim = simulate(reqs, make_scheduler, cost).recorder
    assert cost.steps_left == 0
    assert batches == engine_batches
    pd.testing.assert_frame_equal(e_steps, sim.steps_frame())
    pd.testing.assert_frame_equal(e_req, sim.requests_frame())

    # sample i of request 2 (seed 70) is a one-sample request seeded 70 + i, alone
    roomy = _v1_engine(256, caching, config)
    for i in range(3):
        alone = dataclasses.replace(reqs[2], sampling=SamplingParams(temperature=1.0, seed=70 + i))
        tokens = roomy.generate([alone]).outputs[2].token_ids
        assert tokens == [result.outputs[2].token_ids[i]]


def test_a_workloads_n_wider_than_a_batch_is_refused_only_where_samples_share_a_group() -> None:
    """vllm_v1 seats its samples one by one, so ``workload.n`` above ``max_num_seqs`` runs
    (the children queue); vllm's group of ``n`` could never be scheduled."""
    from experiments.lib.checks import ConfigError, Facts, check_sampling_width

    def config(system: str) -> dict[str, object]:
        return {"system": {"name": system, "max_num_seqs": 4}, "workload": {"n": 8}}

    check_sampling_width(config("vllm_v1"), "simulate", Facts())
    with pytest.raises(ConfigError, match="max_num_seqs=4"):
        check_sampling_width(config("vllm"), "simulate", Facts())
