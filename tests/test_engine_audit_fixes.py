"""Two defects an engine audit reproduced (2026-12-05): ``LLMEngine`` served model specs the
engine's models do not implement (the feature silently ignored), and a prompt id that is
not a whole number either stopped the whole run or was truncated."""

from __future__ import annotations

import dataclasses

import pytest

from core.request import Request, SamplingParams
from core.sched.base import SchedulerConfig
from engine.engine import EngineError, LLMEngine
from sim.catalog import get_model
from tests.engine_helpers import make_engine, one_torch_thread  # noqa: F401


@pytest.mark.parametrize(
    "feature",
    [
        {"rope_type": "llama3"},
        {"qk_norm": True},
        {"sliding_window": 4},
        {"attention_bias": True},
    ],
)
def test_engine_refuses_a_spec_its_models_do_not_implement(feature: dict) -> None:
    spec = dataclasses.replace(get_model("tiny-llama"), **feature)
    config = SchedulerConfig(max_model_len=64, max_num_batched_tokens=64, max_num_seqs=64)
    with pytest.raises(EngineError, match=next(iter(feature))):
        LLMEngine(spec, num_blocks=32, block_size=4, sched_config=config)


def test_engine_serves_a_supported_llama_spec() -> None:
    config = SchedulerConfig(max_model_len=64, max_num_batched_tokens=64, max_num_seqs=64)
    engine = LLMEngine(get_model("tiny-llama"), num_blocks=32, block_size=4, sched_config=config)
    out = engine.generate([Request(0, 0.0, 4, 2, SamplingParams(), (1, 2, 3, 4))]).outputs[0]
    assert [len(t) for t in out.token_ids] == [2] and out.reject_reason is None


@pytest.mark.parametrize("bad_id", ["3", None, 3.7, 3.0])
def test_a_prompt_id_that_is_not_a_whole_number_is_rejected_alone(bad_id: object) -> None:
    good = Request(0, 0.0, 4, 3, SamplingParams(), (5, 6, 7, 8))
    bad = Request(1, 0.0, 4, 3, SamplingParams(), (1, 2, bad_id, 4))
    result = make_engine().generate([good, bad])
    by_id = result.outputs
    assert [len(t) for t in by_id[0].token_ids] == [3] and by_id[0].reject_reason is None
    assert not any(by_id[1].token_ids)
    assert "not a whole number" in (by_id[1].reject_reason or "")


def test_numpy_integer_ids_are_whole_numbers() -> None:
    np = pytest.importorskip("numpy")
    ids = tuple(np.array([1, 2, 3, 4]))
    out = make_engine().generate([Request(0, 0.0, 4, 2, SamplingParams(), ids)]).outputs[0]
    assert [len(t) for t in out.token_ids] == [2] and out.reject_reason is None
