"""Arrival processes: rates, burstiness (CV = 1/sqrt(burstiness)), windows, validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.request import RequestError
from core.workload.arrivals import all_at_once, gamma, make_arrivals, poisson


def _gaps(times: np.ndarray) -> np.ndarray:
    return np.diff(times, prepend=0.0)


def test_poisson_mean_gap_is_inverse_rate_and_cv_one() -> None:
    rate = 3.5
    gaps = _gaps(poisson(rate, n=40000, rng=np.random.default_rng(1)))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 2.0, 8.0])
def test_gamma_keeps_mean_and_sets_cv(burstiness: float) -> None:
    rate = 2.0
    gaps = _gaps(gamma(rate, burstiness, n=40000, rng=np.random.default_rng(2)))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_gamma_burstiness_one_is_poisson() -> None:
    a = gamma(1.5, 1.0, n=100, rng=np.random.default_rng(5))
    b = poisson(1.5, n=100, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)


def test_duration_window_holds_every_arrival_before_it() -> None:
    rate, duration = 5.0, 400.0
    times = poisson(rate, duration=duration, rng=np.random.default_rng(3))
    assert times.size > 0 and times.max() < duration
    assert np.all(np.diff(times) > 0)
    # Poisson count: mean rate*duration = 2000, std ~ 45.
    assert abs(times.size - rate * duration) < 5 * math.sqrt(rate * duration)


def test_duration_mode_is_a_prefix_of_the_longer_window() -> None:
    short = gamma(2.0, 0.5, duration=10.0, rng=np.random.default_rng(9))
    # 64 gaps drawn first cover ~32 s, so 5000 s takes several chunks.
    long = gamma(2.0, 0.5, duration=5000.0, rng=np.random.default_rng(9))
    np.testing.assert_array_equal(short, long[long < 10.0])
    counted = gamma(2.0, 0.5, n=long.size, rng=np.random.default_rng(9))
    np.testing.assert_array_equal(counted, long)


def test_seeded_reproducible_and_seed_sensitive() -> None:
    a = poisson(1.0, n=50, rng=np.random.default_rng(7))
    b = poisson(1.0, n=50, rng=np.random.default_rng(7))
    c = poisson(1.0, n=50, rng=np.random.default_rng(8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_all_at_once() -> None:
    np.testing.assert_array_equal(all_at_once(4), np.zeros(4))
    assert all_at_once(0).size == 0
    np.testing.assert_array_equal(make_arrivals("poisson", None, n=3), np.zeros(3))


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan, math.inf])
def test_bad_rate_raises(rate: float) -> None:
    with pytest.raises(RequestError, match="rate"):
        poisson(rate, n=10)


@pytest.mark.parametrize("burstiness", [0.0, -2.0, math.nan, math.inf])
def test_bad_burstiness_raises(burstiness: float) -> None:
    with pytest.raises(RequestError, match="burstiness"):
        gamma(1.0, burstiness, n=10)


def test_count_arguments_validated() -> None:
    with pytest.raises(RequestError, match="exactly one"):
        poisson(1.0, n=5, duration=5.0)
    with pytest.raises(RequestError, match="exactly one"):
        poisson(1.0)
    with pytest.raises(RequestError, match="n must be"):
        poisson(1.0, n=-1)
    with pytest.raises(RequestError, match="duration"):
        poisson(1.0, duration=-1.0)


def test_make_arrivals_dispatch_errors() -> None:
    with pytest.raises(RequestError, match="unknown arrival"):
        make_arrivals("uniform", 1.0, n=3)
    with pytest.raises(RequestError, match="gamma"):
        make_arrivals("poisson", 1.0, n=3, burstiness=0.5)
    with pytest.raises(RequestError, match="num_requests"):
        make_arrivals("all_at_once", None, duration=3.0)


@settings(max_examples=50, deadline=None)
@given(
    rate=st.floats(1e-3, 1e3),
    burstiness=st.floats(0.05, 20.0),
    n=st.integers(0, 200),
    seed=st.integers(0, 2**32 - 1),
)
def test_arrivals_are_sorted_nonnegative_and_counted(
    rate: float, burstiness: float, n: int, seed: int
) -> None:
    times = gamma(rate, burstiness, n=n, rng=np.random.default_rng(seed))
    assert times.shape == (n,)
    assert np.all(times >= 0) and np.all(np.diff(times) >= 0)


def test_duration_mode_draws_more_chunks_until_the_window_is_covered() -> None:
    from core.workload.arrivals import _renewal

    # A claimed mean gap 100x the real one makes every chunk (64 gaps) fall short.
    times = _renewal(lambda size: np.ones(size), mean_gap=100.0, n=None, duration=1000.0)
    np.testing.assert_array_equal(times, np.arange(1.0, 1000.0))


def test_unknown_arrival_kind_is_refused_even_without_a_rate() -> None:
    with pytest.raises(RequestError, match="unknown arrival process 'bogus'"):
        make_arrivals("bogus", None, n=3)
