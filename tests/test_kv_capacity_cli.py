"""``python -m experiments.kv_capacity``: a run's KV cache without simulating, the very
numbers a simulate run of the same overrides holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import kv_capacity


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=llama-3.1-8b", "hardware=l40s", "system.max_model_len=8192"],
        ["model=llama-3.1-70b", "hardware=h100", "model.tp=8", "system=vllm_v1",
         "system.max_model_len=32768"],
        ["kv_cache_gb=12"],
    ],
)  # fmt: skip
def test_the_numbers_are_a_simulate_runs(tmp_path: Path, capsys, overrides: list[str]) -> None:
    from experiments.reproduce import compose_config
    from experiments.simulate import run

    out = tmp_path / "cap.json"
    assert kv_capacity.main([*overrides, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert f"-> {doc['kv_blocks']} blocks of {doc['block_size']}" in printed
    metrics = run(compose_config([*overrides, "workload.num_requests=2"]))
    assert doc["kv_slots"] == metrics["kv_slots"]
    assert doc["kv_cache_gib"] == pytest.approx(metrics["kv_cache_gib"])  # all GPUs, as there
    assert doc["kv_cache_gib_per_gpu"] * doc["tp"] == pytest.approx(doc["kv_cache_gib"])
    assert doc["max_num_seqs"] == metrics["max_num_seqs"]
    assert doc["max_num_batched_tokens"] == metrics["max_num_batched_tokens"]
    parts = ("weights", "activations", "cuda_graphs", "non_torch", "kv_cache")
    if "kv_cache_gb=12" not in overrides:  # derived: the terms use up the usable memory
        used = sum(doc[f"{k}_gib_per_gpu"] for k in parts)
        assert used == pytest.approx(doc["usable_gib_per_gpu"], abs=1e-6)


@pytest.mark.parametrize(
    ("args", "says"),
    [(["model=nope"], "error: model: unknown model (got 'nope'"),
     (["notanoverride"], "error: notanoverride: not an override"),
     (["model.tp=3"], "error: model.tp: opt-13b: 40 attention heads cannot be split"),
     (["model=llama-3.1-70b", "hardware=a100-40gb"], "error: system.max_model_len: "),
     # it told to add -m, which kv_capacity has not
     (["hardware=a100-80gb,h100"], "error: hardware: several values: kv_capacity sizes one")],
)  # fmt: skip
def test_a_config_that_cannot_run_is_one_line(capsys, args: list[str], says: str) -> None:
    with pytest.raises(SystemExit) as stop:
        kv_capacity.main(args)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(says) and "\n" not in err
