"""``experiments.bench.profile_transfer``: the profiled model's transfer priced against
Vidur's held-out tables, and the per-layer prices it reads."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from experiments.bench.profile_transfer import SET_TARGETS, TARGETS, VIDUR, main
from sim.cost.profile import read_vidur_profile
from sim.cost.profiled import ProfiledCostModel

needs_shared = pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared/measurements absent")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@needs_shared
def test_the_bench_prices_every_held_out_table_at_every_measured_count(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    points = _rows(tmp_path / "transfer_points.csv")
    pairs = {(r["target"], int(r["tp"])) for r in points}
    assert pairs == {(label, tp) for label, _, tps in TARGETS + SET_TARGETS for tp in tps}
    for label, path, tps in TARGETS:
        n, _, t = read_vidur_profile(VIDUR / path, tps[0]).ops["linear"]
        mine = [r for r in points if (r["target"], int(r["tp"])) == (label, tps[0])]
        assert [int(r["num_tokens"]) for r in mine] == n.astype(int).tolist()
        assert [float(r["linear_measured_ms"]) for r in mine] == pytest.approx(t * 1e3)
    matrix = _rows(tmp_path / "shard_matrix.csv")
    assert len(matrix) == 8 * 7  # every A100 table from every other
    assert {(r["target"], r["target_tp"]) for r in matrix} == {
        (r["source"], r["source_tp"]) for r in matrix
    }
    assert all((r["target"], r["target_tp"]) != (r["source"], r["source_tp"]) for r in matrix)
    errors = _rows(tmp_path / "transfer_errors.csv")
    assert len(errors) == len(pairs) * 3 * 4  # ops x (three bands and all)
    for r in errors:
        assert float(r["mean_abs_error_pct"]) <= float(r["max_abs_error_pct"])
        assert abs(float(r["mean_error_pct"])) <= float(r["mean_abs_error_pct"]) + 0.05


def test_a_missing_vidur_folder_is_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(["--vidur", str(tmp_path / "absent"), "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: --vidur: not a directory")


@needs_shared
def test_a_profile_used_as_measured_prices_a_layer_at_its_own_points() -> None:
    prof = read_vidur_profile(VIDUR / "a100/mlp_llama-2-7b.csv", 1)
    cost = ProfiledCostModel(prof, "llama-7b", "a100-80gb", stack="none")
    for op in ("linear", "other"):
        n, _, t = prof.ops[op]
        assert cost.layer_op_seconds(op, n) == pytest.approx(t, rel=1e-12)
    with pytest.raises(ValueError, match="'linear' or 'other'"):
        cost.layer_op_seconds("attn_decode", np.array([1.0]))
