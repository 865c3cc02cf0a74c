"""Interleaved sittings: turn order, results and the engine serving a step at a time."""

from __future__ import annotations

import itertools
from collections.abc import Generator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.engine import run_to_end
from experiments.bench.interleave import Participant, spread, take_turns
from tests.engine_helpers import make_engine, one_torch_thread, requests  # noqa: F401


def counter(name: str, units: int, log: list[str]) -> Generator[None, None, str]:
    for _ in range(units):
        log.append(name)
        yield
    return f"{name} done"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 30)), min_size=1, max_size=5))
def test_every_turn_goes_to_the_least_advanced(shape: list[tuple[int, int]]) -> None:
    log: list[str] = []
    people = [
        Participant(f"p{i}", counter(f"p{i}", units, log), expected)
        for i, (units, expected) in enumerate(shape)
    ]
    finished: list[str] = []
    take_turns(people, on_finish=lambda p: finished.append(p.name))
    # every participant ran all its units, returned its result and was finished once
    assert sorted(finished) == sorted(p.name for p in people)
    for p, (units, _) in zip(people, shape, strict=True):
        assert p.finished and p.result == f"{p.name} done"
        assert p.done == units == log.count(p.name) == len(p.turn_times)
    # replay: each unit went to a live participant with the least done / expected
    done = {p.name: 0 for p in people}
    left = {p.name: units for p, (units, _) in zip(people, shape, strict=True)}
    expected = {p.name: p.expected for p in people}
    order = [p.name for p in people]
    for name in log:
        live = [n for n in order if left[n] > 0]  # not yet exhausted
        least = min(done[n] / expected[n] for n in live)
        assert done[name] / expected[name] == least
        assert name == next(n for n in live if done[n] / expected[n] == least)
        done[name] += 1
        left[name] -= 1
    rows = spread(people)
    assert [r["participant"] for r in rows] == order
    assert all(r["units"] == p.done for r, p in zip(rows, people, strict=True))


def test_participants_with_right_expectations_finish_together() -> None:
    log: list[str] = []
    people = [Participant("long", counter("long", 90, log), 90),
              Participant("short", counter("short", 10, log), 10)]  # fmt: skip
    take_turns(people)
    # the short one is spread over the whole sitting: one unit in every ten
    positions = [i for i, n in enumerate(log) if n == "short"]
    assert positions[0] == 1 and positions[-1] >= len(log) - 10
    assert max(b - a for a, b in itertools.pairwise(positions)) <= 10


def test_bad_participants_are_refused() -> None:
    with pytest.raises(ValueError, match="expected units"):
        Participant("x", counter("x", 1, []), 0)
    a = Participant("x", counter("x", 1, []), 1)
    b = Participant("x", counter("x", 1, []), 1)
    with pytest.raises(ValueError, match="unique"):
        take_turns([a, b])


def test_an_error_in_a_participant_propagates() -> None:
    def broken() -> Generator[None, None, None]:
        yield
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        take_turns([Participant("ok", counter("ok", 5, []), 5), Participant("bad", broken(), 2)])


def test_two_engines_served_in_turn_compute_what_each_computes_alone() -> None:
    lens = [(3, 4), (5, 9), (2, 6), (7, 3)]
    alone = [make_engine(seed=s).generate(requests(lens)) for s in (1, 2)]
    engines = [make_engine(seed=s) for s in (1, 2)]
    people = [Participant(f"e{i}", e.serving(requests(lens)), 9) for i, e in enumerate(engines)]
    take_turns(people)
    for p, ref in zip(people, alone, strict=True):
        assert {k: v.token_ids for k, v in p.result.outputs.items()} == {
            k: v.token_ids for k, v in ref.outputs.items()
        }
        assert p.result.num_steps == ref.num_steps == p.done
    assert run_to_end(make_engine(seed=1).serving(requests(lens))).num_steps == alone[0].num_steps
