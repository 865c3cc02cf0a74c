"""The profile the simulator ships is Vidur's A100 table, derived, and prices steps exactly
as the table itself does given the same fixed part of its matmuls (fitted on CodeLlama-34B's
tables for the shipped profile, on the table's own tp degrees when it is read directly)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from core.plan import BatchShape
from experiments.lib.embed_profile import (
    ALLREDUCE_SOURCE,
    EMBEDDED,
    FIXED_SOURCE,
    REPO,
    SOURCE,
    derive,
)
from sim.cost import build_cost_model
from sim.cost.profile import ProfileError, read_kvlab_profile, read_vidur_profile

needs_shared = pytest.mark.skipif(
    not (REPO / SOURCE).exists(), reason="../shared/measurements absent"
)


@needs_shared
def test_shipped_profile_is_the_derivation_of_vidurs_table() -> None:
    text, meta = derive(REPO / SOURCE, REPO / FIXED_SOURCE, REPO / ALLREDUCE_SOURCE)
    assert (REPO / EMBEDDED / "operator_profile.csv").read_text() == text
    assert json.loads((REPO / EMBEDDED / "operator_profile.json").read_text()) == meta


@needs_shared
@pytest.mark.parametrize("model,gpu", [("opt-13b", "a100-40gb"), ("llama-7b", "a100-80gb")])
def test_shipped_profile_prices_steps_as_vidurs_table(model: str, gpu: str) -> None:
    shipped = build_cost_model("profiled", model, gpu, 1, profile=str(REPO / EMBEDDED))
    linear, other = shipped.profile.linear_fixed_s, shipped.profile.other_fixed_s
    assert linear > 0 and other > 0
    table = replace(read_vidur_profile(REPO / SOURCE), linear_fixed_s=linear, other_fixed_s=other)
    vidur = build_cost_model("profiled", model, gpu, 1, profile=table)
    rng = np.random.default_rng(0)
    for _ in range(50):
        prefill_seqs = int(rng.integers(0, 4))
        prefill_tokens = prefill_seqs * int(rng.integers(1, 600))
        decode_seqs = int(rng.integers(0, 200))
        shape = BatchShape(
            prefill_seqs=prefill_seqs,
            prefill_tokens=prefill_tokens,
            prefill_attn_pairs=prefill_tokens * 50,
            decode_seqs=decode_seqs,
            decode_ctx_tokens=decode_seqs * int(rng.integers(1, 1500)),
        )
        assert shipped.step_time(shape) == pytest.approx(vidur.step_time(shape), rel=1e-6)


def test_a_kvlab_profile_without_linear_rows_is_refused(tmp_path: Path) -> None:
    (tmp_path / "operator_profile.json").write_text(
        json.dumps(
            {"format": "kvlab-operator-profile/1", "model": "llama-7b", "gpu": "a100-80gb", "tp": 1}
        )
    )
    (tmp_path / "operator_profile.csv").write_text(
        "op,num_tokens,context_tokens,time_ms\nother,1,0,0.1\nother,2,0,0.2\n"
    )
    with pytest.raises(ProfileError, match="missing operators linear"):
        read_kvlab_profile(tmp_path)


def test_help_prints_usage_and_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.lib.embed_profile import main

    shipped = REPO / EMBEDDED / "operator_profile.csv"
    before = shipped.stat().st_mtime_ns
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out
    assert shipped.stat().st_mtime_ns == before
