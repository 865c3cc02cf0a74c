"""A system's own defaults: what ``build_scheduler`` and ``LLMEngine`` give a caller who
leaves them out is what the system's YAML (the command line's) gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.defaults import DEFAULT_WATERMARK
from core.sched.base import SchedulerConfig
from core.systems import BUILT_IN, build_scheduler, default_config, get_system

SYSTEM_DIR = Path(__file__).resolve().parents[1] / "configs" / "system"


def _yaml(name: str) -> dict:
    own = yaml.safe_load((SYSTEM_DIR / f"{name}.yaml").read_text())
    shared = yaml.safe_load((SYSTEM_DIR.parent / "system_defaults.yaml").read_text())
    return {**shared, **{k: v for k, v in own.items() if k != "defaults"}}


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_the_spec_and_the_yaml_agree_on_what_a_system_does(name: str) -> None:
    spec, doc = get_system(name), _yaml(name)
    assert bool(doc.get("chunked_prefill", False)) == spec.chunked_prefill
    assert bool(doc.get("enable_prefix_caching", False)) == spec.enable_prefix_caching
    assert float(doc.get("watermark", DEFAULT_WATERMARK)) == spec.watermark


def test_vllm_v1_left_to_its_defaults_is_vllm_v1() -> None:
    # build_scheduler("vllm_v1", n) ran vLLM v0's rules: prompt-only steps, a 2560-token
    # budget, the 1% watermark and no prefix caching, the same results as "vllm"
    v1 = build_scheduler("vllm_v1", 1600)
    assert v1.config.chunked_prefill and v1.config.max_num_batched_tokens == 2048
    assert v1.manager.watermark_blocks == 0
    # prefix caching only when asked: requests of lengths alone have no ids to hash
    assert not v1.manager.enable_prefix_caching
    asked = build_scheduler("vllm_v1", 1600, enable_prefix_caching=True)
    assert asked.manager.enable_prefix_caching
    v0 = build_scheduler("vllm", 1600)
    assert v0.config == SchedulerConfig() and v0.manager.watermark_blocks == 1
    assert default_config("vllm") == SchedulerConfig()
    # a caller's own values still win
    assert build_scheduler("vllm_v1", 1600, watermark=0.01).manager.watermark_blocks == 1


def test_the_engine_left_to_its_defaults_runs_the_systems_own() -> None:
    pytest.importorskip("torch")
    from engine import LLMEngine
    from sim.catalog import get_model

    engine = LLMEngine(get_model("tiny-opt"), system="vllm_v1", num_blocks=64)
    assert engine.sched_config.chunked_prefill and engine.enable_prefix_caching
    assert engine.watermark == 0.0 and engine.sched_config.max_model_len == 256


@pytest.mark.parametrize("name", ["vllm", "vllm_v1"])
def test_vllm_v1_rejects_a_beam_request_with_its_reason(name: str) -> None:
    # vLLM V1 searches beams on top of its engine, which kvlab does not model: vllm_v1
    # served v0's in-engine beams under today's name
    from core.request import Request, SamplingParams

    assert get_system("vllm").beam_search and not get_system("vllm_v1").beam_search
    scheduler = build_scheduler(name, 4096)
    beams = scheduler.add(Request(0, 0.0, 20, 8, SamplingParams(beam_width=2)), 0.0)
    samples = scheduler.add(Request(1, 0.0, 20, 8, SamplingParams(n=2)), 0.0)
    assert samples.reject_reason is None
    if get_system(name).beam_search:
        assert beams.reject_reason is None
    else:
        assert "beam search (beam_width=2): vllm_v1 runs no beams" in str(beams.reject_reason)
