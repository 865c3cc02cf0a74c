"""Gaps a mutation audit of the engine's glue found (engine.engine, engine.phases,
experiments.serve, engine.weights): the executor's transfer order and phase accounting,
the engine's argument checks, and what its options reach."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from core.plan import StepPlan
from core.request import Request, SamplingParams
from core.sched.base import SchedulerConfig
from engine.engine import EngineError, EngineResult, LLMEngine, WallClock, _ModelExecutor
from engine.phases import PhaseTimer
from sim.catalog import get_model
from tests.engine_helpers import make_engine, one_torch_thread  # noqa: F401 (autouse fixture)

SMALL = SchedulerConfig(max_model_len=64, max_num_batched_tokens=64, max_num_seqs=8)


class FakeClock:
    """A step timer that advances only when a fake component says it spent time."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _fake_executor(clock: FakeClock, log: list[str], timer: PhaseTimer | None) -> _ModelExecutor:
    """An executor over fakes that log their calls and charge distinct seconds: transfers
    1 + 2 + 4, prepare 10, forward 100, sample 1000."""

    def spend(name: str, seconds: float, result: object = None) -> Callable[..., object]:
        def call(*_args: object) -> object:
            log.append(name)
            clock.t += seconds
            return result

        return call

    kv = SimpleNamespace(
        swap_out=spend("swap_out", 1), swap_in=spend("swap_in", 2), copy_blocks=spend("copy", 4)
    )
    runner = SimpleNamespace(
        prepare=spend("prepare", 10, SimpleNamespace(sample_seqs=[])),
        forward=spend("forward", 100, "logits"),
    )
    samples = SimpleNamespace(token_ids={}, extra_samples={}, beams=[])
    sampler = SimpleNamespace(sample=spend("sample", 1000, samples))
    sched = SimpleNamespace(manager=None)
    return _ModelExecutor(
        kv,
        runner,
        sampler,
        sched,
        torch.device("cpu"),
        timer,
        now=clock,  # type: ignore[arg-type]
    )


def test_the_executor_moves_blocks_in_the_plans_order_and_times_each_phase() -> None:
    """StepPlan's contract: swap-outs, then swap-ins, then copies, before the forward (a
    swap-in may reuse a device block a swap-out of the same step freed). The step's duration
    is all four executed phases; each phase and the forward's issue time go to the timer."""
    clock, log = FakeClock(), []
    timer = PhaseTimer(clock)
    executor = _fake_executor(clock, log, timer)
    plan = StepPlan(swap_out=[(0, 0)], swap_in=[(1, 1)], copies=[(2, 3)])
    timer.before_schedule(None)  # type: ignore[arg-type]
    clock.t += 0.5
    timer.after_schedule(plan)
    outcome = executor.execute(plan, None, 0.0)  # type: ignore[arg-type]
    assert log == ["swap_out", "swap_in", "copy", "prepare", "forward", "sample"]
    assert outcome.duration_s == 1117
    executor.at_end(plan, outcome)
    clock.t += 50  # the scheduler's update and the recording
    timer.after_step(plan, [])
    assert timer.rows == [(0.5, 7, 10, 100, 1000, 50, 100)]


def test_the_schedule_phase_adds_up_a_reschedule_and_starts_afresh_each_step() -> None:
    """A preemption that ran nothing makes the loop schedule again: both calls are the
    step's schedule_s. The next step's schedule_s counts only its own calls."""
    clock = FakeClock()
    timer = PhaseTimer(clock)
    work = StepPlan(copies=[(0, 1)])
    for seconds, plan in ((3, StepPlan(preempted=[object()])), (2, work)):  # type: ignore[list-item]
        timer.before_schedule(None)  # type: ignore[arg-type]
        clock.t += seconds
        timer.after_schedule(plan)
    timer.executed(0, 0, 0, 0, 0)
    timer.output_begins()
    timer.after_step(work, [])
    timer.before_schedule(None)  # type: ignore[arg-type]
    clock.t += 1
    timer.after_schedule(work)
    timer.output_begins()
    timer.after_step(work, [])
    assert [row[0] for row in timer.rows] == [5, 1]


def _ids(n: int, start: int = 1) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def test_the_engine_refuses_both_a_budget_and_a_block_count() -> None:
    """Exactly one of kv_budget_bytes and num_blocks sizes the cache: both is an error, not
    a silent choice of one."""
    spec = get_model("tiny-opt")
    with pytest.raises(EngineError, match="exactly one"):
        LLMEngine(spec, kv_budget_bytes=1 << 20, num_blocks=16, block_size=4, sched_config=SMALL)
    with pytest.raises(EngineError, match="exactly one"):
        LLMEngine(spec, block_size=4, sched_config=SMALL)


def test_phase_timing_turned_off_at_construction_records_no_phases() -> None:
    """time_phases=False is obeyed on CPU too (where the default is on)."""
    engine = LLMEngine(get_model("tiny-opt"), num_blocks=16, block_size=4, sched_config=SMALL,
                       time_phases=False)  # fmt: skip
    assert engine.phase_timer is None
    assert engine.generate([Request(0, 0.0, 4, 2, SamplingParams(), _ids(4))]).phases is None


def test_the_engines_options_reach_its_scheduler_and_manager() -> None:
    """watermark, prefix caching and the CPU swap pool (in slots: blocks x block size) are
    what the engine's manager runs with."""
    engine = make_engine(num_cpu_blocks=6, watermark=0.25, enable_prefix_caching=True,
                         preemption_mode="swap")  # fmt: skip
    manager = engine.scheduler.manager
    assert manager.watermark == 0.25
    assert manager.enable_prefix_caching
    assert manager.num_cpu_blocks == 6


def test_add_request_refuses_a_repeated_id_and_step_returns_the_ended_groups() -> None:
    """Step-at-a-time use: a request id can be added once; step() returns the groups that
    ended in it (and only those), so a caller can collect outputs as they finish."""
    engine = make_engine()
    engine.add_request(Request(0, 0.0, 4, 1, SamplingParams(), _ids(4)))
    engine.add_request(Request(1, 0.0, 4, 3, SamplingParams(), _ids(4, 9)))
    with pytest.raises(EngineError, match="already added"):
        engine.add_request(Request(0, 0.0, 4, 1, SamplingParams(), _ids(4)))
    ended: list[list[int]] = []
    while engine.has_unfinished():
        ended.append([g.request.request_id for g in engine.step()])
    assert ended == [[0], [], [1]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"mode": "batch"}, "mode must be"), ({"clock": "cpu"}, "clock must be")],
)
def test_serving_refuses_an_unknown_mode_or_clock(kwargs: dict[str, str], match: str) -> None:
    """A misspelt mode or clock is an error, not silently a default."""
    engine = make_engine()
    with pytest.raises(EngineError, match=match):
        engine.generate([Request(0, 0.0, 4, 2, SamplingParams(), _ids(4))], **kwargs)


def test_generate_refuses_repeated_request_ids() -> None:
    """Request ids key the outputs: two requests of one id in one run are refused."""
    engine = make_engine()
    reqs = [Request(0, 0.0, 4, 2, SamplingParams(), _ids(4)) for _ in range(2)]
    with pytest.raises(EngineError, match="unique"):
        engine.generate(reqs)


def test_the_clock_goes_on_from_the_runs_end() -> None:
    """After a run the engine clock stands at the run's end, so requests added step by step
    afterwards arrive after it."""
    engine = make_engine()
    result = engine.generate([Request(0, 0.0, 4, 3, SamplingParams(), _ids(4))])
    assert result.end_time_s > 0 and engine.now == result.end_time_s


def test_the_wall_clock_sleeps_until_an_arrival_and_reads_real_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An online wall-clock run waits for the next arrival (never for a past one), and a
    step ends when the real clock says, not at start + duration."""
    slept: list[float] = []
    monkeypatch.setattr("engine.engine.time.sleep", slept.append)
    clock = WallClock()
    clock.wait_until(clock.now() + 100.0)
    clock.wait_until(-1.0)
    assert len(slept) == 1 and 99.0 < slept[0] <= 100.0
    assert clock.step_end(0.0, 1000.0) < 1000.0


def test_the_engine_seed_sets_the_dummy_weights_and_the_draws() -> None:
    """seed seeds the dummy weights and the sampler: two seeds give different weights, and
    the same weights sample differently under two engine seeds."""
    spec = get_model("tiny-opt")
    first, second = (LLMEngine(spec, num_blocks=16, block_size=4, sched_config=SMALL, seed=s)
                     for s in (0, 1))  # fmt: skip
    w0, w1 = (next(e.model.parameters()) for e in (first, second))
    assert not torch.equal(w0, w1)
    second.model.load_state_dict(first.model.state_dict())
    req = Request(0, 0.0, 4, 16, SamplingParams(temperature=1.0), _ids(4))
    a, b = (e.generate([req]).outputs[0].token_ids for e in (first, second))
    assert a != b


def test_the_engine_refuses_a_max_model_len_past_the_models_context() -> None:
    """A scheduler max_model_len beyond the model's maximum context is refused (positions
    past it have no embedding), naming both lengths; the maximum itself is accepted."""
    spec = get_model("tiny-opt")
    limit = spec.max_model_len
    config = SchedulerConfig(max_model_len=limit + 1, max_num_batched_tokens=limit + 1)
    with pytest.raises(EngineError, match=rf"max_model_len={limit + 1} exceeds .*\({limit}\)"):
        LLMEngine(spec, num_blocks=16, block_size=4, sched_config=config)
    config = SchedulerConfig(max_model_len=limit, max_num_batched_tokens=limit)
    assert LLMEngine(spec, num_blocks=16, block_size=4, sched_config=config).sched_config is config


def test_an_unknown_step_timer_is_an_engine_error() -> None:
    """A bad step_timer_name surfaces as the engine's own error (what its callers catch),
    naming the timers there are."""
    with pytest.raises(EngineError, match="step_timer must be one of"):
        LLMEngine(get_model("tiny-opt"), num_blocks=16, block_size=4, sched_config=SMALL,
                  step_timer_name="cycles")  # fmt: skip


def test_warm_up_sizes_its_batch_by_half_the_cache_and_the_model_len(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """warm_up's throwaway batch: prompts totalling min(token budget, half the cache's
    slots), each at most max_model_len - output_len (so none is rejected), split evenly
    over ceil(total / longest) requests; then one prompt of each power of two below the
    longest. Here: 128 tokens (half of 256 slots) over 3 prompts of 42 (longest 64 - 2)."""
    engine = make_engine(num_blocks=64, block_size=4, max_model_len=64)
    calls: list[list[tuple[int, int]]] = []
    results: list[EngineResult] = []
    real = engine.generate

    def spy(requests: Iterable[Request], **kwargs: Any) -> EngineResult:
        reqs = list(requests)
        calls.append([(r.prompt_len, r.output_len) for r in reqs])
        results.append(real(reqs, **kwargs))
        return results[-1]

    monkeypatch.setattr(engine, "generate", spy)
    steps = engine.warm_up()
    assert calls[0] == [(42, 2)] * 3
    assert [c[0] for c in calls[1:]] == [(1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (32, 1)]
    assert all(out.reject_reason is None for r in results for out in r.outputs.values())
    assert steps == sum(r.num_steps for r in results)


# -- experiments.serve ------------------------------------------------------------------
SERVE_SMALL = ["model=tiny-opt", "workload.num_requests=3", "kv_cache_gb=0.002", "progress=false"]


def test_the_cpu_default_budget_never_holds_less_than_one_sequence() -> None:
    """The CPU default is capped at CPU_DEFAULT_CAP_BYTES, except that it always holds one
    max_model_len sequence (else every long request would be rejected)."""
    from experiments.serve import CPU_DEFAULT_CAP_BYTES, kv_budget_bytes

    opt = get_model("opt-125m")
    per_token = 2 * 12 * 768 * 4
    mml = (CPU_DEFAULT_CAP_BYTES // per_token // 16 + 64) * 16  # one sequence > the cap
    c = {"device": "cpu", "system": {"max_num_seqs": 8}}
    assert kv_budget_bytes(c, opt, torch.float32, mml) == mml * per_token


def test_a_cache_of_exactly_one_sequence_is_enough_and_under_a_block_is_the_engines() -> None:
    """check_holds_one_sequence refuses fewer tokens than max_model_len (naming the key that
    sized the cache), accepts exactly max_model_len, and leaves a budget below one block to
    the engine's own error."""
    from experiments.lib.checks import ConfigError
    from experiments.serve import budget_key, check_holds_one_sequence

    check_holds_one_sequence({"num_gpu_blocks": 16}, None, 64, 16, 256)
    with pytest.raises(ConfigError, match="num_gpu_blocks"):
        check_holds_one_sequence({"num_gpu_blocks": 15}, None, 64, 16, 256)
    check_holds_one_sequence({"kv_cache_gb": 1e-9}, 63, 64, 16, 256)  # 0 blocks: not here
    with pytest.raises(ConfigError, match="kv_cache_gb"):
        check_holds_one_sequence({"kv_cache_gb": 1e-6}, 64 * 15, 64, 16, 256)
    assert budget_key({"num_gpu_blocks": 4, "kv_cache_gb": 1.0}) == "num_gpu_blocks"
    assert budget_key({"kv_cache_gb": 1.0}) == "kv_cache_gb"
    assert budget_key({}) == "kv_budget_fraction"


def test_serve_passes_its_keys_to_the_engine_and_its_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """seed, check_integrity_every, threads and the swap pool reach the engine, and mode,
    clock and progress reach its serving run."""
    from experiments.lib.compose import compose_config
    from experiments.serve import start

    cfg = compose_config("serve", [*SERVE_SMALL, "seed=7", "check_integrity_every=3",
                                   "threads=2", "swap_space_gb=0.001", "mode=offline",
                                   "clock=wall", "system.preemption_mode=swap"])  # fmt: skip
    serving = start(cfg)
    engine = serving.engine
    assert torch.get_num_threads() == 2
    assert engine.seed == 7 and engine.sampler.seed == 7
    assert engine.check_integrity_every == 3
    per_block = engine.kv_cache.block_size * 2 * 2 * 64 * 4  # tiny-opt, fp32
    assert engine.kv_cache.num_cpu_blocks == int(0.001 * 1024**3) // per_block > 0
    seen: dict = {}
    monkeypatch.setattr(engine, "serving", lambda reqs, **kw: seen.update(kw))
    serving.steps()
    assert seen == {"mode": "offline", "clock": "wall", "progress": False}


def test_serve_removes_a_stale_beams_file_and_records_the_phase_columns(tmp_path: Path) -> None:
    """A run without beam search deletes an earlier run's beams.csv in its folder (it is
    not this run's), and engine.json names the phase columns steps.csv carries."""
    import json

    from engine.phases import PHASE_COLUMNS
    from experiments.bench.cpu_cross_run import serve_run

    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "beams.csv").write_text("stale\n")
    serve_run(tmp_path, SERVE_SMALL)
    assert not (tmp_path / "beams.csv").exists()
    doc = json.loads((tmp_path / "engine.json").read_text())
    assert doc["phase_columns"] == list(PHASE_COLUMNS)


# -- engine.weights ---------------------------------------------------------------------
def test_dummy_weights_follow_their_rules() -> None:
    """Seeded dummies: norm weights 1 and norm/linear biases 0, matrices of one seed
    differ from each other (one generator runs through them), the same seed draws the same
    values whatever the dtype (drawn in fp32, then cast), and a std of 0 is refused."""
    from engine.models import build_model
    from engine.weights import init_dummy_weights

    spec = get_model("tiny-opt")
    full, half = (
        build_model(spec, "torch", torch.float32),
        build_model(spec, "torch", torch.bfloat16),
    )
    init_dummy_weights(full, seed=3)
    init_dummy_weights(half, seed=3)
    params = dict(full.named_parameters())
    for name, p in params.items():
        if name.endswith("bias"):
            assert torch.all(p == 0), name
        elif "norm" in name:
            assert torch.all(p == 1), name
    q, k = (params[f"model.decoder.layers.0.self_attn.{n}_proj.weight"] for n in "qk")
    assert not torch.equal(q, k)
    for (name, p), h in zip(full.named_parameters(), half.parameters(), strict=True):
        assert torch.equal(p.to(torch.bfloat16), h), name
    with pytest.raises(ValueError, match="positive"):
        init_dummy_weights(full, seed=3, std=0.0)


def test_a_tied_lm_head_is_drawn_once_as_the_embedding() -> None:
    """Each parameter is drawn once, in module order, from one generator seeded by seed: the
    token embedding is the generator's first draw, not redrawn when the tied LM head that
    shares it comes up (which would change every seed's weights)."""
    from engine.models import build_model
    from engine.weights import DEFAULT_STD, init_dummy_weights

    model = build_model(get_model("tiny-opt"), "torch", torch.float32)
    init_dummy_weights(model, seed=5)
    embed = model.model.decoder.embed_tokens.weight
    assert model.lm_head.weight is embed
    gen = torch.Generator().manual_seed(5)
    expected = torch.empty(embed.shape).normal_(0.0, DEFAULT_STD, generator=gen)
    assert torch.equal(embed, expected)


def _seeded_opt(seed: int) -> torch.nn.Module:
    from engine.models import build_model
    from engine.weights import init_dummy_weights

    model = build_model(get_model("tiny-opt"), "torch", torch.float32)
    init_dummy_weights(model, seed=seed)
    return model


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_a_checkpoint_directory_prefers_safetensors_and_ignores_the_config_name(
    tmp_path: Path,
) -> None:
    """In a directory, *.safetensors are read when present (a pytorch_model.bin beside them
    is not), and config.json must agree with the model except for its name."""
    import json

    from safetensors.torch import save_file

    from engine.weights import load_checkpoint

    source, target = _seeded_opt(1), _seeded_opt(2)
    state = {k: v.contiguous() for k, v in source.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a torch file")
    config = get_model("tiny-opt").to_hf_config() | {"_name_or_path": "someone/other-name"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    load_checkpoint(target, tmp_path)
    assert _same_weights(source, target)


def test_load_weights_reads_bare_decoder_keys_and_skips_rotary_buffers(tmp_path: Path) -> None:
    """OPT checkpoints saved from the bare OPTModel (keys decoder.*) load as model.decoder.*,
    a tied LM head may be absent, *rotary_emb.inv_freq buffers are skipped, and a lone *.pt
    file in a directory is a checkpoint."""
    from engine.weights import load_checkpoint, load_weights

    source, target = _seeded_opt(1), _seeded_opt(2)
    state = {k.removeprefix("model."): v for k, v in source.state_dict().items()
             if k != "lm_head.weight"}  # fmt: skip
    state["decoder.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    load_weights(target, state.items())
    assert _same_weights(source, target)
    other = _seeded_opt(3)
    torch.save(dict(source.state_dict()), tmp_path / "weights.pt")
    load_checkpoint(other, tmp_path)
    assert _same_weights(source, other)


def test_a_wall_clock_run_waits_in_real_time_for_a_later_arrival(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """clock='wall' serves on the real clock: idle until a later arrival, it sleeps (a
    virtual clock would jump to it)."""
    import time

    real_sleep = time.sleep
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr("engine.engine.time.sleep", sleep)
    engine = make_engine()
    reqs = [Request(i, 0.1 * i, 4, 2, SamplingParams(), _ids(4, i)) for i in range(2)]
    result = engine.generate(reqs, mode="online", clock="wall")
    assert slept and 0 < sum(slept) <= 0.1
    assert all(len(o.token_ids[0]) == 2 for o in result.outputs.values())


def test_a_beam_run_reports_each_beams_score_and_logs_its_choices() -> None:
    """A beam-search request's output carries each beam's cum_logprob (negative: a sum of
    log-probabilities), and the engine logs its beam choices for a replay."""
    engine = make_engine()
    req = Request(0, 0.0, 4, 4, SamplingParams(beam_width=2), _ids(4))
    out = engine.generate([req]).outputs[0]
    assert len(out.token_ids) == len(out.scores) == 2
    assert all(score < 0 for score in out.scores)
    group = engine.groups[0]
    assert out.scores == [s.cum_logprob for s in group.seqs]
    assert engine.beam_log.rows


def test_reading_an_hf_config_refuses_what_the_engine_cannot_run(tmp_path: Path) -> None:
    """spec_from_hf_dict and spec_from_json check engine support: a Llama config with
    attention biases is refused when read, naming the feature; a plain one is read."""
    import dataclasses
    import json

    from engine.config import spec_from_hf_dict, spec_from_json

    plain = get_model("tiny-llama")
    config = dataclasses.replace(plain, attention_bias=True).to_hf_config()
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="attention_bias"):
        spec_from_hf_dict(config)
    with pytest.raises(ValueError, match="attention_bias"):
        spec_from_json(tmp_path)
    assert spec_from_hf_dict(plain.to_hf_config()).attention_bias is False


def test_attention_metadata_counts_sequences_and_their_query_lengths() -> None:
    """num_seqs is the batch's sequence count (the Triton backend skips a batch of none),
    and query_lens are the differences of query_start_loc."""
    from engine.attention.metadata import AttentionMetadata

    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, 3, 4], dtype=torch.int32),
        context_lens=torch.tensor([3, 9], dtype=torch.int32),
        block_tables=torch.zeros(2, 3, dtype=torch.int32),
        slot_mapping=torch.arange(4),
        max_query_len=3,
        max_context_len=9,
    )
    assert meta.num_seqs == 2
    assert meta.query_lens.tolist() == [3, 1]


def test_the_cpu_default_budget_holds_a_sequence_of_a_length_off_the_block_grid() -> None:
    """The derived CPU budget is room for max_num_seqs sequences in whole blocks: with one
    sequence of 250 tokens (16-token blocks) it holds 256 slots, so serve accepts the config
    instead of refusing its own default as "fewer than one max_model_len sequence"."""
    from experiments.lib.compose import compose_config
    from experiments.serve import kv_budget_bytes, start

    tiny = get_model("tiny-opt")
    per_token = 2 * 2 * 64 * 4
    c = {"device": "cpu", "system": {"max_num_seqs": 1}}
    assert kv_budget_bytes(c, tiny, torch.float32, 250) == 256 * per_token
    overrides = ["model=tiny-opt", "workload.num_requests=2", "progress=false"]
    cfg = compose_config("serve", [*overrides, "system.max_num_seqs=1", "system.max_model_len=250"])
    kv = start(cfg).engine.kv_cache
    assert kv.num_blocks * kv.block_size >= 250


def test_phase_rows_must_match_the_steps_they_join() -> None:
    """with_phases appends one phase row per step; a count that differs is an error, not a
    misaligned or NaN-padded steps.csv."""
    import pandas as pd

    from experiments.serve import with_phases

    steps = pd.DataFrame({"duration_s": [1.0, 2.0]}, index=[5, 6])
    phases = pd.DataFrame({"forward_s": [0.5, 1.5]})
    joined = with_phases(steps, phases)
    assert joined["forward_s"].tolist() == [0.5, 1.5] and list(joined.index) == [5, 6]
    with pytest.raises(RuntimeError, match="1 phase rows for 2 steps"):
        with_phases(steps, phases.iloc[:1])


def test_serve_warms_a_cuda_engine_up_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """warmup null means: warm up on CUDA (only); false turns it off there too."""
    import experiments.serve as serve

    warmed: list[str] = []
    real_build = serve.build_engine

    def on_cuda(c: Any) -> tuple[LLMEngine, int]:
        engine, mml = real_build(c)
        engine.device = torch.device("cuda")  # as far as start's warm-up rule reads it
        return engine, mml

    monkeypatch.setattr(serve, "build_engine", on_cuda)
    monkeypatch.setattr(LLMEngine, "warm_up", lambda self: warmed.append("yes") or 0)
    from experiments.lib.compose import compose_config

    serve.start(compose_config("serve", SERVE_SMALL))
    assert warmed == ["yes"]
    serve.start(compose_config("serve", [*SERVE_SMALL, "warmup=false"]))
    assert warmed == ["yes"]


def test_the_runs_log_says_where_the_engine_ran_and_what_sized_its_cache(caplog) -> None:
    # serve.log was empty: nothing said the device, the threads or how the KV cache was sized
    import logging

    from experiments import serve
    from experiments.lib.compose import compose_config

    with caplog.at_level(logging.INFO, logger="experiments.serve"):
        serve.start(compose_config("serve", [*SERVE_SMALL, "kv_cache_gb=0.0005"]))
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "engine: tiny-opt on cpu (" in said and "torch thread(s)), backend torch" in said
    assert "KV cache: 32 blocks of 16 tokens, 0.0004883 GiB (kv_cache_gb=0.0005)" in said
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="experiments.serve"):
        serve.start(compose_config("serve", [*SERVE_SMALL, "kv_cache_gb=null"]))
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "(derived: room for max_num_seqs sequences of max_model_len, at most 1 GiB)" in said


@pytest.mark.parametrize(
    ("terminal", "setting", "bar"),
    [(True, "null", True), (False, "null", False), (True, "false", False)],
)
def test_serves_bar_follows_the_terminal_unless_set(
    monkeypatch: pytest.MonkeyPatch, terminal: bool, setting: str, bar: bool
) -> None:
    """progress=null (serve's default, as simulate's) draws the bar only where the command
    line's stderr is a terminal (a redirected log got its carriage returns)."""
    from experiments import serve
    from experiments.lib.compose import compose_config

    monkeypatch.setattr(serve, "_PROGRESS_WHEN_UNSET", terminal)
    serving = serve.start(compose_config("serve", [*SERVE_SMALL, f"progress={setting}"]))
    seen: dict = {}
    monkeypatch.setattr(serving.engine, "serving", lambda reqs, **kw: seen.update(kw))
    serving.steps()
    assert seen["progress"] is bar


def test_a_late_first_arrival_on_the_wall_clock_is_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A trace whose first request arrives late made clock='wall' sit at 0 done without a
    word; the wait is said (at 0.1 s here, the threshold lowered for the test)."""
    monkeypatch.setattr("engine.engine.WALL_WAIT_NOTE_S", 0.05)
    reqs = [Request(0, 0.1, 4, 2, SamplingParams(), _ids(4, 0))]
    with caplog.at_level("INFO", logger="engine.engine"):
        make_engine().generate(reqs, mode="online", clock="wall")
        make_engine().generate(reqs, mode="online", clock="virtual")
    said = [r.getMessage() for r in caplog.records if "waiting for it" in r.getMessage()]
    assert said == ["clock 'wall': the first request arrives at 0.1 s; waiting for it in real time"]
