"""LLMEngine.warm_up: a throwaway batch that leaves no trace in the run served after it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from core.request import Request, SamplingParams
from engine.engine import LLMEngine
from engine.runner import BatchInputs
from experiments.bench.cpu_cross_run import serve_run
from tests.engine_helpers import make_engine

DECISIONS = ["prefill_seqs", "prefill_tokens", "decode_seqs", "decode_ctx_tokens", "num_waiting",
             "num_preempted", "kv_token_states", "kv_physical_blocks"]  # fmt: skip


def _requests() -> list[Request]:
    sampled = SamplingParams(n=2, temperature=1.0)
    return [Request(i, 0.0, 5 + i, 6 + i % 3, sampling=sampled if i % 2 else SamplingParams())
            for i in range(5)]  # fmt: skip


@pytest.mark.parametrize("system", ["vllm", "orca_max"])
def test_a_warmed_engine_serves_a_run_as_a_fresh_one_does(system: str) -> None:
    # Orca (Max) reserves max_model_len per request: 96 slots take 3 at a time
    kw = {"system": system, "num_blocks": 24, "block_size": 4, "max_model_len": 32}
    fresh = make_engine(**kw).generate(_requests())
    warmed_engine = make_engine(**kw)
    assert warmed_engine.warm_up() > 0
    warmed = warmed_engine.generate(_requests())
    assert warmed.num_steps == fresh.num_steps
    assert warmed.outputs == fresh.outputs  # same tokens, random draws included
    steps_w, steps_f = warmed.recorder.steps_frame(), fresh.recorder.steps_frame()
    pd.testing.assert_frame_equal(steps_w[DECISIONS], steps_f[DECISIONS])


def test_warm_up_fits_a_small_cache_and_a_short_model_len() -> None:
    engine = make_engine(num_blocks=6, block_size=4, max_model_len=16)  # 24 slots
    assert engine.warm_up() > 0  # prompts cut to at most half the cache and the model length
    assert engine.warm_up(tokens=1, output_len=1) >= 1


def test_warm_up_runs_a_prefill_of_each_power_of_two_length() -> None:
    """Each query-tile size of the attention kernel is compiled before a timed step."""
    engine = make_engine(num_blocks=24, block_size=4, max_model_len=32)  # longest prompt 30
    seen: set[int] = set()
    forward = engine.runner.forward

    def recording(batch: BatchInputs) -> torch.Tensor:
        seen.add(batch.meta.max_query_len)
        return forward(batch)

    engine.runner.forward = recording
    engine.warm_up()
    assert {1, 2, 4, 8, 16} <= seen


def test_serve_warms_up_when_asked_and_rejects_a_non_boolean(tmp_path: Path, monkeypatch) -> None:
    warm_ups: list[int] = []
    real = LLMEngine.warm_up
    monkeypatch.setattr(LLMEngine, "warm_up", lambda self: warm_ups.append(real(self)) or 0)
    # offline: every request at t = 0, so the steps do not hang on how long each one took
    # (online, arrivals fall between steps as the machine's load times them: 296 against 330
    # steps in one loaded run)
    base = ["model=tiny-opt", "workload.num_requests=3", "kv_cache_gb=0.002", "progress=false",
            "mode=offline"]  # fmt: skip
    plain = pd.read_csv(serve_run(tmp_path / "a", base) / "steps.csv")
    assert warm_ups == []  # unset: on CUDA only
    warmed = pd.read_csv(serve_run(tmp_path / "b", [*base, "warmup=true"]) / "steps.csv")
    assert len(warm_ups) == 1 and warm_ups[0] > 0
    pd.testing.assert_frame_equal(plain[DECISIONS], warmed[DECISIONS])
    with pytest.raises(Exception, match="warmup"):
        serve_run(tmp_path / "c", [*base, "warmup=sometimes"])


def test_warm_gemms_calls_each_linear_shape_at_every_token_count() -> None:
    engine = make_engine(num_blocks=24, block_size=4, max_model_len=32)
    model = engine.runner.model
    seen: dict[tuple[int, int], set[int]] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            key = (module.in_features, module.out_features)
            module.register_forward_hook(
                lambda _m, args, _out, key=key: seen.setdefault(key, set()).add(args[0].shape[0])
            )
    head = (model.lm_head.in_features, model.lm_head.out_features)
    calls = engine.warm_gemms(max_tokens=40, max_rows=3)
    assert seen[head] == {1, 2, 3}
    body = {k: v for k, v in seen.items() if k != head}
    assert body and all(v == set(range(1, 41)) for v in body.values())
    assert calls == 40 * len(body) + 3
    assert engine.warm_gemms(max_tokens=600, max_rows=1) == (512 + 5 + 1) * len(body) + 1


def test_warm_up_waits_for_its_queued_gpu_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the warm-up's kernels are queued; the run's first step must not wait for them
    (without it, on the H200, the first step of each run after the first absorbed 135 ms)."""
    engine = make_engine(num_blocks=24, block_size=4, max_model_len=32)
    synced: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    engine.warm_up()
    assert synced == []  # a CPU engine: nothing queued
    engine.device = torch.device("cuda")  # only the warm-up's last step looks at it
    monkeypatch.setattr(engine, "generate", lambda *a, **k: type("R", (), {"num_steps": 1})())
    monkeypatch.setattr(engine, "warm_gemms", lambda *a: synced.append("gemms") or 0)
    engine.warm_up()
    assert synced == ["gemms", torch.device("cuda")]
