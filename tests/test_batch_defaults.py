"""Batch limits left null take vLLM's defaults (core.sched.batch_defaults): prompt-only
steps hold the longest prompt, and vllm_v1 takes `vllm serve`'s limits for the run's GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.sched.batch_defaults import DeviceFacts, batch_limits
from experiments import simulate
from experiments.reproduce import compose_config
from tests.test_config_errors import run_cli

H100 = DeviceFacts("h100", 80.0)


@pytest.mark.parametrize(
    ("version", "max_model_len", "device", "expected"),
    [
        ("v0", 2048, None, (256, 2560)),  # OPT: v0.1's budget, the paper's
        ("v0", 40960, H100, (256, 40960)),  # a prompt-only step holds the longest prompt
        ("v1", 40960, H100, (1024, 8192)),
        ("v1", 2048, DeviceFacts("NVIDIA A100-SXM4-80GB", 79.2), (256, 2048)),
        ("v1", 2048, DeviceFacts("l40s", 48.0), (256, 2048)),
        ("v1", 2048, None, (256, 2048)),  # the engine on a CPU
    ],
)
def test_vllms_rule(version: str, max_model_len: int, device, expected) -> None:
    limits = batch_limits(None, None, version, max_model_len, device)
    assert (limits.max_num_seqs, limits.max_num_batched_tokens) == expected
    given = batch_limits(7, 4096, version, max_model_len, device)
    assert (given.max_num_seqs, given.max_num_batched_tokens) == (7, 4096)
    assert given.seqs_source == given.tokens_source == "given"


def test_a_long_context_model_runs_on_the_default_systems() -> None:
    # Qwen3-8B serves 40,960 tokens: a budget of 2560 had refused every default system
    small = ["model=qwen3-8b", "hardware=l40s", "workload.num_requests=4"]
    for system in ("vllm", "orca_pow2", "fastertransformer"):
        metrics = simulate.run(compose_config([*small, f"system={system}"]))
        assert metrics["completed"] == 4
        assert (metrics["max_num_seqs"], metrics["max_num_batched_tokens"]) == (256, 40960)


@pytest.mark.parametrize(("hardware", "expected"), [("h100", (1024, 8192)),
                                                    ("a100-80gb", (256, 2048))])  # fmt: skip
def test_vllm_v1_takes_vllm_serves_limits_for_the_gpu(hardware: str, expected) -> None:
    small = ["system=vllm_v1", "model=llama-3.1-8b", f"hardware={hardware}",
             "workload.num_requests=4"]  # fmt: skip
    metrics = simulate.run(compose_config(small))
    assert (metrics["max_num_seqs"], metrics["max_num_batched_tokens"]) == expected
    given = simulate.run(compose_config([*small, "system.max_num_seqs=64"]))
    assert given["max_num_seqs"] == 64


def test_the_systems_version_picks_the_rule_not_chunked_prefill() -> None:
    # the paper's vllm with chunked prefill on keeps v0's defaults: turning it on in a
    # comparison changes the step's composition only, not max_num_seqs
    small = ["system=vllm", "system.chunked_prefill=true", "model=llama-3.1-8b",
             "hardware=h100", "system.max_model_len=8192", "workload.num_requests=4"]  # fmt: skip
    metrics = simulate.run(compose_config(small))
    assert (metrics["max_num_seqs"], metrics["max_num_batched_tokens"]) == (256, 8192)


def test_a_sample_wider_than_the_default_batch_is_one_line(tmp_path: Path) -> None:
    # the default the run would take holds the check: 300 samples fit vllm_v1's 1024 on an
    # H100, not vLLM v0's 256
    wide = ["workload.num_requests=1", "workload.n=300", "model=llama-3.1-8b", "hardware=h100"]
    status, _, err = run_cli(simulate, [*wide, "system=vllm"], tmp_path)
    assert status == 2 and "system.max_num_seqs=256 can schedule" in err
    status, _, err = run_cli(simulate, [*wide, "system=vllm_v1"], tmp_path)
    assert status == 0 and "max_num_seqs" not in err
