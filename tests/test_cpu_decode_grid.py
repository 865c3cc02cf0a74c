"""The decode-attention grid's arithmetic (experiments.bench.cpu_decode_grid); no timing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments.bench.cpu_decode_grid import price_from_knots, spread_contexts, summarize


@given(st.integers(1, 64), st.integers(1, 4096), st.integers(0, 2**32))
def test_spread_contexts_keep_the_sum(seqs: int, mean: int, seed: int) -> None:
    ctx = spread_contexts(seqs, mean, random.Random(seed))
    assert len(ctx) == seqs and sum(ctx) == seqs * mean and min(ctx) >= 1


def test_the_price_is_the_profiles_line_through_the_powers_of_two() -> None:
    contexts = [16, 24, 32, 48, 64, 96]
    equal = [1.0, 9.0, 2.0, 9.0, 1.5, 9.0]  # 64 measured faster than 32: the running maximum
    assert price_from_knots(contexts, equal) == pytest.approx([1.0, 1.5, 2.0, 2.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="two knots"):
        price_from_knots([16, 24], [1.0, 2.0])
    # through the multiples of 16: 48 is a knot now
    assert price_from_knots(contexts, equal, 16)[3:] == pytest.approx([9.0, 9.0, 9.0])


def test_summary_compares_price_equal_and_spread() -> None:
    rows = []
    for c, eq, sp in [(16, 1.0, 1.1), (24, 2.0, 2.2), (32, 2.0, 2.0)]:
        for kind, ms in (("equal", eq), ("spread", sp)):
            rows.append({"seqs": 4, "context": c, "contexts": kind, "layers": 2,
                         "attn_ms": ms, "forward_ms": 10.0})  # fmt: skip
    mid = summarize(rows)[1]
    assert mid["knot"] is False and mid["price_ms"] == pytest.approx(1.5)
    assert mid["price_vs_equal"] == pytest.approx(-0.25)
    assert mid["spread_vs_equal"] == pytest.approx(0.1)
    assert mid["attn_share"] == pytest.approx(2 * 2.2 / 10)
    assert mid["step_vs_spread"] == pytest.approx((1.5 / 2.2 - 1) * 0.44)
