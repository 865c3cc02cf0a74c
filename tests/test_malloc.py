"""``experiments.lib.malloc``: CPU timing runs pin glibc malloc's thresholds, and the
benchmark that shows why summarises its processes."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from experiments.bench.cpu_malloc import main, spread_contexts, summarize
from experiments.lib.malloc import DEFAULT, LEFT, PINNED, UNAVAILABLE, pin_malloc

GLIBC = sys.platform.startswith("linux")


def test_a_fresh_process_starts_default_and_pins_once() -> None:
    code = (
        "from experiments.lib.malloc import malloc_state, pin_malloc\n"
        "print(malloc_state(), pin_malloc(), pin_malloc(), malloc_state())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()  # fmt: skip
    assert out[0] == DEFAULT
    assert out[1] == out[2] == out[3] in (PINNED, UNAVAILABLE)
    if GLIBC:
        assert out[1] == PINNED


def test_kvlab_malloc_default_leaves_the_defaults_and_says_so() -> None:
    code = "from experiments.lib.malloc import pin_malloc; print(pin_malloc())"
    env = {**os.environ, "KVLAB_MALLOC": "default"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout.strip()  # fmt: skip
    assert out == LEFT


def test_pinning_again_in_this_process_changes_nothing() -> None:
    assert pin_malloc() == pin_malloc() != DEFAULT


def test_spread_contexts_keep_the_total_and_stay_positive() -> None:
    rng = random.Random(1)
    for seqs, mean in ((8, 1024), (16, 512), (2, 64)):
        contexts = spread_contexts(seqs, mean, rng)
        assert len(contexts) == seqs and sum(contexts) == seqs * mean
        assert min(contexts) >= 32


def test_summary_averages_processes_and_gives_their_range() -> None:
    rows = [
        {"process": p, "malloc": "default", "seqs": 8, "mean_context": 1024,
         "contexts": "mixed", "attn_ms_per_layer": a, "forward_ms": 10 * a}
        for p, a in enumerate((18.0, 20.0, 22.0))
    ]  # fmt: skip
    (row,) = summarize(rows)
    assert row["processes"] == 3
    assert row["attn_ms_per_layer"] == pytest.approx(20.0)
    assert row["attn_range"] == pytest.approx(0.2)
    assert row["forward_range"] == pytest.approx(0.2)


def test_bad_counts_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--reps", "0"])
    assert exit_.value.code == 2
    assert "--reps and --processes must be >= 1" in capsys.readouterr().err
