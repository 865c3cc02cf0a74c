import math

import pytest

from sim.search import find_max_rate


def test_bisects_to_the_crossing():
    res = find_max_rate(lambda r: r**2, threshold=2.0, lo=0.1, hi=4.0, rel_tol=1e-3, max_evals=40)
    assert res.max_rate <= math.sqrt(2) <= res.first_failing_rate
    assert res.first_failing_rate - res.max_rate <= 1e-3 * res.first_failing_rate


def test_edges_and_nan():
    assert find_max_rate(lambda r: 0.0, 1.0, 0.5, 2.0).max_rate == 2.0
    assert find_max_rate(lambda r: 9.0, 1.0, 0.5, 2.0).max_rate == 0.0
    assert find_max_rate(lambda r: math.nan, 1.0, 0.5, 2.0).max_rate == 0.0
    up = find_max_rate(lambda r: 1.0 - r / 4, 0.6, 0.1, 4.0, higher_is_better=True)
    assert 1.5 <= up.max_rate <= 1.6 + 1e-9


def test_bad_bracket():
    with pytest.raises(ValueError, match="lo < hi"):
        find_max_rate(lambda r: r, 1.0, 2.0, 1.0)


def test_a_value_at_the_threshold_passes_either_way() -> None:
    """Passing is ``value <= threshold``, or ``>=`` with ``higher_is_better``: a value equal
    to the threshold passes, so a flat curve at it sustains the top of the bracket."""
    assert find_max_rate(lambda r: 0.9, 0.9, 0.5, 2.0).max_rate == 2.0
    assert find_max_rate(lambda r: 0.9, 0.9, 0.5, 2.0, higher_is_better=True).max_rate == 2.0
