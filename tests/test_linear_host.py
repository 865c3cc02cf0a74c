"""experiments.bench.linear_host: the dry run on CPU writes a row per shape and token count."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pandas as pd

from experiments.bench.linear_host import main, token_counts


def test_dry_run_times_each_shape_at_each_token_count(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path), "--dry"]) == 0
    rows = pd.read_csv(tmp_path / "linear_host.csv")
    assert len(rows) == 2 * len(token_counts(dry=True))
    assert set(rows["shape"]) == {"small", "wide"}
    assert (rows.host_us > 0).all() and (rows.first_us > 0).all()
    assert (rows.kernels == 0).all()  # CPU: nothing launched


def test_the_gpu_sweep_covers_every_count_to_64_then_every_8() -> None:
    counts = token_counts(dry=False)
    assert counts[:64] == list(range(1, 65)) and counts[-1] == 512
    assert all(b - a == 8 for a, b in pairwise(counts[64:]))
