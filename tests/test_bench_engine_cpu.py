"""The CPU engine benchmark in its ``--quick`` mode: files, columns and bookkeeping."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from core.request import Request
from experiments.bench.engine_cpu import main, scale_lengths

COLUMNS = {
    "system",
    "engine",
    "completed",
    "output_tokens",
    "computed_tokens",
    "wall_s",
    "output_tok_s",
    "mean_batch_size",
    "num_steps",
}


@pytest.mark.slow
def test_quick_run_writes_rows_ratios_and_metadata(tmp_path: Path, capsys) -> None:
    threads = torch.get_num_threads()
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    assert torch.get_num_threads() == threads  # restored
    with (tmp_path / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["system"] for r in rows] == ["hf_static_b2", "vllm", "orca_max"]
    assert set(rows[0]) >= COLUMNS
    doc = json.loads((tmp_path / "results.json").read_text())
    meta = doc["meta"]
    for key in ("torch", "transformers", "date", "command", "cpu_count", "kv_slots"):
        assert meta[key]
    assert "--quick" in meta["command"] and meta["torch_threads"] == 1
    assert set(doc["ratios"]) == {
        "vllm_over_hf_throughput",
        "vllm_over_orca_max_throughput",
        "vllm_over_orca_max_batch",
    }
    by_system = {r["system"]: r for r in doc["rows"]}
    # every system served the same requests and counted the same useful tokens
    assert len({r["output_tokens"] for r in doc["rows"]}) == 1
    assert all(r["completed"] == meta["plan"]["num_requests"] for r in doc["rows"])
    hf = by_system["hf_static_b2"]
    assert hf["computed_tokens"] >= hf["output_tokens"]  # padding to the batch's longest
    # orca_max reserves max_model_len per request: the budget holds orca_max_batch of them
    assert by_system["orca_max"]["mean_batch_size"] <= meta["plan"]["orca_max_batch"]
    assert "vllm_over_hf_throughput" in capsys.readouterr().out


def test_scale_lengths_keeps_a_floor_and_the_first_ids() -> None:
    reqs = [Request(0, 0.0, 10, 40, prompt_token_ids=tuple(range(10))), Request(1, 0.0, 3, 2)]
    a, b = scale_lengths(reqs, 0.5)
    assert (a.prompt_len, a.output_len, a.prompt_token_ids) == (5, 20, (0, 1, 2, 3, 4))
    assert (b.prompt_len, b.output_len, b.prompt_token_ids) == (4, 4, None)
    with pytest.raises(ValueError, match="length scale"):
        scale_lengths(reqs, 0.0)


def test_an_output_folder_that_is_a_file_is_refused_before_serving(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exit_:
        main(["--quick", "--out", str(blocker)])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and captured.out == ""
    assert captured.err.strip() == f"error: --out: {blocker} is a file, not a folder"
