"""One policy, two bodies: the simulator replaying the engine's measured step times makes
the engine's decisions, step for step (the rule "one policy, two bodies": README)."""

from __future__ import annotations

import pandas as pd
import pytest

from core.beam_log import RecordedBeams
from core.metrics.recorder import Recorder
from core.metrics.summary import summarize_recorder
from core.plan import StepOutcome, StepPlan
from core.request import Request, SamplingParams
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import build_scheduler
from engine.engine import LLMEngine
from engine.weights import init_dummy_weights
from sim.cost.recorded import RecordedCostModel
from sim.driver import simulate
from tests.engine_helpers import (
    TEST_STD,
    make_engine,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    prompt_ids,
    requests,
    tiny_config,
)

LENS = [(9, 8), (5, 12), (14, 6), (7, 10), (6, 9), (11, 7), (4, 11), (8, 9), (13, 7)]
# Four requests at t=0 outgrow 14 blocks of 4 slots by themselves (vllm must preempt
# whatever the step times); mid-run arrivals a few ms apart (how many land mid-run depends
# on the machine's speed); a late pair after everything finished (an idle jump).
ARRIVALS = [0.0, 0.0, 0.0, 0.0, 0.004, 0.011, 0.02, 30.0, 30.0]
STEP_COLUMNS = ["prefill_tokens", "prefill_seqs", "decode_seqs", "num_preempted"]
REQUEST_COLUMNS = ["request_id", "status", "first_token_step", "finish_step", "num_preemptions"]

# (system, preemption mode, device blocks, prefix caching): with prefix caching a request
# preempted by recompute hits its own earlier blocks, generated tokens included
CASES = [
    ("vllm", "recompute", 14, False),
    ("vllm", "swap", 14, False),
    ("orca_oracle", "recompute", 24, False),
    ("vllm", "recompute", 14, True),
]


@pytest.mark.parametrize(("system", "mode", "num_blocks", "caching"), CASES)
def test_simulator_replays_the_engine(
    system: str, mode: str, num_blocks: int, caching: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[list[int]] = []
    original = BaseScheduler.update

    def spy(self: BaseScheduler, plan: StepPlan, outcome: StepOutcome, now: float):
        batches.append([seq.group.request_id for seq in plan.scheduled_seqs()])
        return original(self, plan, outcome, now)

    monkeypatch.setattr(BaseScheduler, "update", spy)
    engine = make_engine(
        system, num_blocks=num_blocks, num_cpu_blocks=64, preemption_mode=mode, max_model_len=64,
        enable_prefix_caching=caching,
    )  # fmt: skip
    reqs = requests(LENS, ARRIVALS)
    eng = engine.generate(reqs, mode="online", clock="virtual").recorder
    engine_batches, batches[:] = list(batches), []

    config = SchedulerConfig(max_model_len=64, preemption_mode=mode)

    def make_scheduler() -> BaseScheduler:
        return build_scheduler(
            system, num_blocks * 4, config, block_size=4, num_cpu_slots=256,
            enable_prefix_caching=caching,
        )  # fmt: skip

    cost = RecordedCostModel(eng.steps_frame()["duration_s"])
    sim = simulate(reqs, make_scheduler, cost).recorder
    assert cost.steps_left == 0
    assert batches == engine_batches

    e_steps, s_steps = eng.steps_frame(), sim.steps_frame()
    # Same batches, token counts, queue lengths, memory breakdowns and start times ...
    assert e_steps[STEP_COLUMNS].equals(s_steps[STEP_COLUMNS])
    assert e_steps.equals(s_steps)
    # ... and the same per-request steps and timestamps.
    e_req = eng.requests_frame()
    assert e_req[REQUEST_COLUMNS].equals(sim.requests_frame()[REQUEST_COLUMNS])
    assert e_req.equals(sim.requests_frame())
    assert (e_req["status"] == "finished").all()
    assert 30.0 in e_steps["start_s"].tolist()  # idle, then jumped to the late arrivals
    if system == "vllm":
        assert e_steps["num_preempted"].sum() > 0
        swapped = e_steps["swap_out_blocks"].sum() > 0
        assert swapped == (mode == "swap")
    if caching:  # re-admitted after a recompute, a request reads its own cached blocks
        assert e_steps["prefill_kv_read_tokens"].sum() > 0
        assert e_req["readmit_cached_tokens"].sum() > 0  # and its row counts them
    _assert_same_block_moves(eng, sim, e_steps)


MOVES = ("copy_blocks", "swap_out_blocks", "swap_in_blocks")


def _assert_same_block_moves(eng: Recorder, sim: Recorder, steps: pd.DataFrame) -> None:
    """Both bodies' metrics.json count the run's block copies and swaps, steps.csv's
    columns summed."""
    e_m, s_m = summarize_recorder(eng), summarize_recorder(sim)
    for col in MOVES:
        assert e_m[f"total_{col}"] == s_m[f"total_{col}"] == steps[col].sum()


@pytest.mark.parametrize("num_blocks", [9, 10, 12])
def test_two_requests_of_one_prompt_keep_their_generated_blocks_apart(num_blocks: int) -> None:
    """Same prompt, sampled apart (seeds 7 and 8), prefix caching on, request 1 preempted
    by recompute: the simulator's stand-in ids of sequences 0 and 1 must not name each
    other's generated blocks (they did when they were -1 and -2, which CPython hashes
    alike), or its hits and block counts part from the engine's."""
    import dataclasses

    from core.request import SamplingParams

    reqs = requests([(8, 20), (8, 20)], [0.0, 0.0])
    reqs = [
        dataclasses.replace(
            r, sampling=SamplingParams(temperature=1.0, seed=7 + r.request_id),
            prompt_token_ids=reqs[0].prompt_token_ids,
        )
        for r in reqs
    ]  # fmt: skip
    engine = make_engine(
        "vllm", num_blocks=num_blocks, max_model_len=64, enable_prefix_caching=True,
        watermark=0.0,
    )  # fmt: skip
    eng = engine.generate(reqs, mode="online", clock="virtual").recorder
    config = SchedulerConfig(max_model_len=64)

    def make_scheduler() -> BaseScheduler:
        return build_scheduler(
            "vllm", num_blocks * 4, config, block_size=4, watermark=0.0,
            enable_prefix_caching=True,
        )  # fmt: skip

    cost = RecordedCostModel(eng.steps_frame()["duration_s"])
    sim = simulate(reqs, make_scheduler, cost, check_integrity_every=1).recorder
    assert cost.steps_left == 0
    assert eng.steps_frame().equals(sim.steps_frame())
    assert eng.requests_frame()["num_preemptions"].sum() > 0


def _forked_run(monkeypatch: pytest.MonkeyPatch, reshare: bool) -> pd.DataFrame:
    """Request 1 (two samples, 8-token prompt) is preempted by recompute (no CPU pool to
    swap to) while request 0 runs; request 2 waits behind it. Both bodies, the engine's
    step times replayed; the requests frame, equal in both."""
    import dataclasses

    from core.kv.paged import PagedKVCacheManager
    from core.request import SamplingParams

    if not reshare:  # re-admitted without its shared prompt blocks, it outgrows 12 blocks
        monkeypatch.setattr(PagedKVCacheManager, "_shared_prompt_blocks", lambda self, s: 0)
    reqs = requests([(4, 20), (8, 20), (40, 1)], [0.0, 0.001, 0.002])
    reqs[1] = dataclasses.replace(reqs[1], sampling=SamplingParams(n=2))
    engine = make_engine("vllm", num_blocks=12, max_model_len=64, watermark=0.0)
    eng = engine.generate(reqs, mode="online", clock="virtual").recorder
    config = SchedulerConfig(max_model_len=64)

    def make_scheduler() -> BaseScheduler:
        return build_scheduler("vllm", 12 * 4, config, block_size=4, watermark=0.0)

    cost = RecordedCostModel(eng.steps_frame()["duration_s"])
    sim = simulate(reqs, make_scheduler, cost).recorder
    e_req = eng.requests_frame()
    assert e_req.equals(sim.requests_frame())
    return e_req


def test_a_forked_request_preempted_by_recompute_shares_its_prompt_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    e_req = _forked_run(monkeypatch, reshare=True)
    assert (e_req["status"] == "finished").all()
    assert e_req.loc[1, "num_preemptions"] >= 1


def test_an_aborted_request_that_leaves_nothing_scheduled_does_not_stop_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the re-sharing, request 1 is aborted alone in a decode step and that step
    schedules nothing; both bodies schedule again and serve request 2 (they used to stop:
    nothing scheduled, nothing preempted)."""
    e_req = _forked_run(monkeypatch, reshare=False)
    assert e_req["status"].tolist() == ["finished", "rejected", "finished"]
    assert "outgrew the KV cache" in str(e_req.loc[1, "reject_reason"])


def test_both_bodies_reject_an_unreadable_prompt_and_serve_the_others() -> None:
    """A prompt id outside the model's vocabulary: rejected at intake by the engine and by
    the simulator given the model's vocabulary, with the same reason; the rest as ever."""
    import dataclasses

    engine = make_engine("vllm", num_blocks=24, max_model_len=64)
    vocab = engine.model_config.vocab_size
    reqs = requests(LENS[:4])
    bad_ids = (*reqs[2].prompt_token_ids[:-1], vocab)
    reqs[2] = dataclasses.replace(reqs[2], prompt_token_ids=bad_ids)
    eng = engine.generate(reqs, mode="online", clock="virtual").recorder

    def make_scheduler() -> BaseScheduler:
        return build_scheduler("vllm", 24 * 4, SchedulerConfig(max_model_len=64), block_size=4)

    cost = RecordedCostModel(eng.steps_frame()["duration_s"])
    sim = simulate(reqs, make_scheduler, cost, vocab_size=vocab).recorder
    e_req, s_req = eng.requests_frame(), sim.requests_frame()
    assert e_req.equals(s_req)
    assert e_req.set_index("request_id")["status"].to_dict() == {
        0: "finished",
        1: "finished",
        2: "rejected",
        3: "finished",
    }
    assert f"outside the model's vocabulary [0, {vocab})" in str(e_req.loc[2, "reject_reason"])


@pytest.mark.parametrize("caching", [False, True])
def test_v1_chunk_by_chunk_allocation_in_both_bodies(caching: bool) -> None:
    """vllm_v1 under chunked prefill allocates a prompt's blocks chunk by chunk, and a chunk
    short of blocks preempts the last admitted: on 12 blocks the engine preempts, the
    simulator replaying its step times makes the same steps, and the greedy tokens equal
    those of a cache large enough never to preempt."""
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64,
                             chunked_prefill=True)  # fmt: skip

    def engine(num_blocks: int) -> LLMEngine:
        e = LLMEngine(
            tiny_config(),
            system="vllm_v1",
            num_blocks=num_blocks,
            block_size=4,
            sched_config=config,
            enable_prefix_caching=caching,
            watermark=0.0,
        )
        init_dummy_weights(e.model, 0, std=TEST_STD)
        return e

    # a short request decoding, then two long prompts: their chunks run short of blocks
    reqs = requests([(8, 20), (44, 2), (30, 4), (6, 5)], [0.0, 1e-4, 2e-4, 0.05])
    tight = engine(12).generate(reqs, mode="online", clock="virtual")
    roomy = engine(256).generate(reqs, mode="online", clock="virtual")
    e_steps = tight.recorder.steps_frame()
    assert e_steps["num_preempted"].sum() > 0
    assert roomy.recorder.steps_frame()["num_preempted"].sum() == 0
    assert tight.outputs == roomy.outputs

    def make_scheduler() -> BaseScheduler:
        return build_scheduler("vllm_v1", 12 * 4, config, block_size=4, watermark=0.0,
                               enable_prefix_caching=caching)  # fmt: skip

    cost = RecordedCostModel(e_steps["duration_s"])
    sim = simulate(reqs, make_scheduler, cost).recorder
    assert cost.steps_left == 0
    assert e_steps.equals(sim.steps_frame())
    assert tight.recorder.requests_frame().equals(sim.requests_frame())


def _mixed_beam_run() -> tuple[list[Request], LLMEngine, pd.DataFrame]:
    """A plain request and a 2-beam one at t=0 (the beams finish first, then the plain one
    decodes alone: steps with no beam choice), then a 2-beam and a plain request at 30 s.
    Returns the requests, the engine and its steps."""
    beam, plain = SamplingParams(beam_width=2), SamplingParams()
    spec = [(8, 10, 0.0, plain), (6, 3, 0.0, beam), (7, 4, 30.0, beam), (5, 3, 30.0, plain)]
    reqs = [Request(i, t, p, o, s, prompt_ids(p, 100 + i)) for i, (p, o, t, s) in enumerate(spec)]
    engine = make_engine("vllm", num_blocks=32, max_model_len=64)
    steps = engine.generate(reqs, mode="online", clock="virtual").recorder.steps_frame()
    return reqs, engine, steps


def _replay(reqs: list[Request], steps: pd.DataFrame, beams: RecordedBeams):
    config = SchedulerConfig(max_num_batched_tokens=2560, max_model_len=64)

    def make_scheduler() -> BaseScheduler:
        return build_scheduler("vllm", 32 * 4, config, block_size=4)

    cost = RecordedCostModel(steps["duration_s"])
    sim = simulate(reqs, make_scheduler, cost, recorded_beams=beams).recorder
    assert cost.steps_left == 0
    return sim


def test_a_run_of_beam_and_plain_requests_replays_the_engines_beams() -> None:
    """Each beams.csv row names the index of the step whose end chose it, counting every
    step, those without a beam choice too: the second beam request's choices come after
    steps where only the plain request ran, and the replay still makes the engine's steps
    and requests exactly."""
    reqs, engine, e_steps = _mixed_beam_run()
    rows = engine.beam_log.rows
    sim = _replay(reqs, e_steps, RecordedBeams(rows))
    assert e_steps.equals(sim.steps_frame())
    assert engine.recorder.requests_frame().equals(sim.requests_frame())
    assert {r[1] for r in rows} == {1, 2}
    _assert_same_block_moves(engine.recorder, sim, e_steps)
    assert e_steps["copy_blocks"].sum() > 0  # the beams wrote into blocks they shared
    chose = sorted({r[0] for r in rows})
    assert set(range(len(e_steps))) - set(chose)  # some steps chose no beams
    assert max(chose) >= len(chose)  # and some of them came before a step that did


@pytest.mark.parametrize("earlier_arrival", [0.2, 0.3])
def test_an_arrival_at_a_steps_end_joins_the_next_step_in_both_bodies(
    earlier_arrival: float,
) -> None:
    # request 2 arrives exactly as the step ending at 0.5 s ends: the engine's loop adds
    # every arrival <= now before a step; the simulator did too only when the arrival's
    # timeout was queued before the step's (request 1 arriving before that step began)
    from core.loop import StepLoop, VirtualClock
    from core.metrics.recorder import Recorder
    from sim.driver import CostExecutor

    class Quarter:
        def step_time(self, shape) -> float:
            return 0.25

        def describe(self) -> str:
            return "0.25 s a step"

    config = SchedulerConfig(max_model_len=64, max_num_batched_tokens=64, max_num_seqs=64)

    def make() -> BaseScheduler:
        return build_scheduler("vllm", 4096, config, block_size=4)

    reqs = [Request(0, 0.0, 4, 10), Request(1, earlier_arrival, 4, 10), Request(2, 0.5, 4, 10)]
    sim = simulate(reqs, make, Quarter()).recorder.requests_frame()
    loop = StepLoop(make(), CostExecutor(Quarter().step_time, None), Recorder())
    loop.run(reqs, VirtualClock())
    engine_loop = loop.recorder.requests_frame()
    assert sim["first_scheduled_s"].tolist() == engine_loop["first_scheduled_s"].tolist()
    assert sim["first_scheduled_s"].iloc[2] == 0.5
