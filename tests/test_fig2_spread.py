"""The Fig. 2 length-spread study: one grid point runs; the summary spans the grid."""

from __future__ import annotations

import pandas as pd

from experiments.report.fig2_spread import SHARES, SYSTEMS, run_point, summary


def test_one_point_runs_with_its_sigmas() -> None:
    row = run_point("orca_pow2", 1.0, 0.8, duration=20.0, seed=0)
    assert (row["sigma_input"], row["sigma_output"]) == (1.0, 0.8)
    shares = sum(row[k] for k in SHARES)
    assert 0.0 < shares <= 100.0 + 1e-6


def test_summary_gives_the_assumed_point_and_the_grid_range() -> None:
    rows = pd.DataFrame([
        {"system": s, "sigma_input": a, "sigma_output": b, "mean_batch_size": 1.0,
         **{k: 10.0 * a + b for k in SHARES}}
        for s in SYSTEMS for a in (1.0, 1.2) for b in (1.0, 1.2)
    ])  # fmt: skip
    text = summary(rows)
    pow2_external = next(
        line for line in text.splitlines() if "Orca (Pow2)" in line and "external" in line
    )
    assert "| 13.0 | 11.0–13.2 | 41.6 |" in pow2_external
