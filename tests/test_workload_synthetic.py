"""Synthetic workloads: fitted lengths, benchmark filter, seeding, shared prefix, multi-turn,
and build_workload dispatch."""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from core.request import Request, RequestError, SamplingParams
from core.workload import build_workload, describe, multi_turn, shared_prefix, synthesize
from core.workload.filters import REASONS, filter_requests, keep_mask
from core.workload.lengths import PUBLISHED, DatasetStats, filtered_means, fit, solve_mus
from core.workload.trace_io import write_trace


def _req(i: int, p: int, o: int) -> Request:
    return Request(i, 0.0, p, o)


# ---------------------------------------------------------------- filter


def test_filter_boundaries() -> None:
    cases = {
        (3, 100): False,
        (4, 100): True,
        (100, 3): False,
        (100, 4): True,
        (1024, 100): True,
        (1025, 100): False,
        (1000, 1048): True,
        (1000, 1049): False,
    }
    reqs = [_req(i, p, o) for i, (p, o) in enumerate(cases)]
    result = filter_requests(reqs)
    assert [(r.prompt_len, r.output_len) for r in result.kept] == [
        k for k, keep in cases.items() if keep
    ]
    assert result.dropped == {
        "prompt_too_short": 1,
        "output_too_short": 1,
        "prompt_too_long": 1,
        "total_too_long": 1,
    }
    assert result.num_dropped == 4


def test_filter_counts_each_request_once_under_its_first_reason() -> None:
    # Prompt too short AND output too short; prompt too long AND total too long.
    result = filter_requests([_req(0, 2, 2), _req(1, 1500, 1500)])
    assert result.kept == []
    assert result.dropped["prompt_too_short"] == 1
    assert result.dropped["prompt_too_long"] == 1
    assert result.num_dropped == 2
    assert set(result.dropped) == set(REASONS)


def test_filter_max_model_len_is_configurable() -> None:
    mask = keep_mask(np.array([500, 500]), np.array([500, 600]), max_model_len=1000)
    assert mask.tolist() == [True, False]
    with pytest.raises(RequestError, match="shape"):
        keep_mask(np.array([1, 2]), np.array([1]))


# ---------------------------------------------------------------- length fit


@pytest.mark.parametrize("dataset", ["sharegpt", "alpaca"])
def test_fit_hits_published_filtered_means_exactly(dataset: str) -> None:
    stats = PUBLISHED[dataset]
    mean_in, mean_out = filtered_means(fit(dataset))
    assert mean_in == pytest.approx(stats.mean_input, abs=1e-6)
    assert mean_out == pytest.approx(stats.mean_output, abs=1e-6)
    assert fit(dataset).sigma_input == stats.sigma_input


def test_a_configured_sigma_keeps_the_published_means_and_widens_the_spread() -> None:
    stats = PUBLISHED["sharegpt"]
    narrow, wide = fit("sharegpt", None, 0.6), fit("sharegpt", None, 1.4)
    for model in (narrow, wide):
        mean_in, mean_out = filtered_means(model)
        assert mean_in == pytest.approx(stats.mean_input, abs=1e-6)
        assert mean_out == pytest.approx(stats.mean_output, abs=1e-6)
    assert (narrow.sigma_input, narrow.sigma_output) == (stats.sigma_input, 0.6)
    spread = {
        s: np.std([r.output_len for r in build_workload(
            {"kind": "synthetic", "rate": None, "num_requests": 4000, "sigma_output": s}, seed=3
        )])
        for s in (0.6, 1.4)
    }  # fmt: skip
    assert spread[0.6] < spread[1.4]
    with pytest.raises(RequestError, match="sigma_output must be in"):
        fit("sharegpt", None, 9.0)
    with pytest.raises(RequestError, match="not used by kind 'multi_turn'"):
        build_workload({"kind": "multi_turn", "num_conversations": 2, "sigma_output": 1.0})


def test_solve_mus_rejects_impossible_targets() -> None:
    with pytest.raises(RequestError, match="mean_input"):
        solve_mus(DatasetStats(2000.0, 100.0, 1.0, 1.0))
    with pytest.raises(RequestError, match="sigma"):
        solve_mus(DatasetStats(100.0, 100.0, 0.0, 1.0))


@pytest.mark.parametrize("dataset", ["sharegpt", "alpaca"])
def test_generated_filtered_means_within_5_percent(dataset: str) -> None:
    reqs = synthesize(dataset, rate=None, num_requests=20000, seed=11)
    stats = PUBLISHED[dataset]
    prompt = np.array([r.prompt_len for r in reqs])
    output = np.array([r.output_len for r in reqs])
    assert prompt.mean() == pytest.approx(stats.mean_input, rel=0.05)
    assert output.mean() == pytest.approx(stats.mean_output, rel=0.05)
    assert keep_mask(prompt, output).all()


def test_sharegpt_has_higher_variance_than_alpaca() -> None:
    share, alp = describe("sharegpt", 20000, 0), describe("alpaca", 20000, 0)
    for side in ("input", "output"):
        assert share[f"{side}_std"] > 4 * alp[f"{side}_std"]
        assert share[f"sigma_{side}"] >= alp[f"sigma_{side}"]
    assert share["input_max"] <= 1024 and share["output_max"] <= 2044
    assert share["input_p50"] <= share["input_p90"] <= share["input_p99"]


def test_describe_reports_means_near_targets() -> None:
    d = describe("alpaca", 20000, 3)
    assert d["input_mean"] == pytest.approx(d["target_input_mean"], rel=0.05)
    assert d["output_mean"] == pytest.approx(d["target_output_mean"], rel=0.05)


# ---------------------------------------------------------------- synthesize


def _key(reqs: list[Request]) -> list[tuple[float, int, int]]:
    return [(r.arrival_time, r.prompt_len, r.output_len) for r in reqs]


def test_same_seed_same_trace_different_seed_different() -> None:
    a = synthesize("sharegpt", rate=2.0, num_requests=200, seed=5)
    b = synthesize("sharegpt", rate=2.0, num_requests=200, seed=5)
    c = synthesize("sharegpt", rate=2.0, num_requests=200, seed=6)
    assert a == b
    assert _key(a) != _key(c)


def test_token_ids_do_not_change_arrivals_or_lengths() -> None:
    plain = synthesize("alpaca", rate=4.0, num_requests=50, seed=1)
    ids = synthesize("alpaca", rate=4.0, num_requests=50, seed=1, with_token_ids=True, vocab_size=7)
    assert _key(plain) == _key(ids)
    for r in ids:
        assert r.prompt_token_ids is not None and len(r.prompt_token_ids) == r.prompt_len
        assert all(0 <= t < 7 for t in r.prompt_token_ids)
    again = synthesize(
        "alpaca", rate=4.0, num_requests=50, seed=1, with_token_ids=True, vocab_size=7
    )
    assert ids == again


def test_duration_mode_and_ids_in_arrival_order() -> None:
    reqs = synthesize(
        "sharegpt", rate=5.0, duration_s=100.0, seed=2, arrival="gamma", burstiness=0.5
    )
    times = [r.arrival_time for r in reqs]
    assert times == sorted(times) and times[-1] < 100.0
    assert [r.request_id for r in reqs] == list(range(len(reqs)))
    assert 300 < len(reqs) < 700


def test_synthesize_respects_max_model_len_and_sampling() -> None:
    sp = SamplingParams(n=4, temperature=1.0)
    reqs = synthesize("sharegpt", rate=None, num_requests=2000, max_model_len=512, sampling=sp)
    assert max(r.total_len for r in reqs) <= 512
    assert all(r.arrival_time == 0.0 and r.sampling == sp for r in reqs)


def test_synthesize_argument_errors() -> None:
    with pytest.raises(RequestError, match="exactly one"):
        synthesize("sharegpt", rate=1.0, num_requests=5, duration_s=5.0)
    with pytest.raises(RequestError, match="exactly one"):
        synthesize("sharegpt", rate=1.0)
    with pytest.raises(RequestError, match="unknown dataset 'wmt'"):
        synthesize("wmt", rate=1.0, num_requests=5)
    with pytest.raises(RequestError, match="seed"):
        synthesize("alpaca", rate=1.0, num_requests=5, seed=-1)


# ---------------------------------------------------------------- shared prefix / multi-turn


def test_shared_prefix_every_prompt_starts_with_the_same_prefix() -> None:
    reqs = shared_prefix(341, rate=1.0, num_requests=100, seed=4)
    prefix = reqs[0].prompt_token_ids[:341]  # type: ignore[index]
    for r in reqs:
        assert r.prompt_token_ids is not None
        assert r.prompt_token_ids[:341] == prefix
        assert r.prompt_len > 341 and r.total_len <= 2048
    suffixes = {r.prompt_token_ids[341:] for r in reqs}  # type: ignore[index]
    assert len(suffixes) > 90
    assert reqs == shared_prefix(341, rate=1.0, num_requests=100, seed=4)
    other = shared_prefix(341, rate=1.0, num_requests=100, seed=5)
    assert other[0].prompt_token_ids[:341] != prefix  # type: ignore[index]


def test_shared_prefix_errors() -> None:
    with pytest.raises(RequestError, match="prefix_len"):
        shared_prefix(2047, rate=1.0, num_requests=3)
    with pytest.raises(RequestError, match="prefix_len"):
        shared_prefix(-1, rate=1.0, num_requests=3)


def test_shared_prefix_says_how_many_outputs_it_cut(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="core.workload.synthetic"):
        reqs = shared_prefix(2000, rate=1.0, num_requests=50, seed=1)
    full = [r for r in reqs if r.total_len == 2048]  # the cut ones, and any that just fit
    assert all(r.total_len <= 2048 for r in reqs)
    said = re.search(r"(\d+) of 50 outputs cut to fit max_model_len 2048", caplog.text)
    assert said and 0 < int(said.group(1)) <= len(full)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="core.workload.synthetic"):
        shared_prefix(80, rate=1.0, num_requests=50, seed=1)
    assert "cut" not in caplog.text


def test_multi_turn_prompt_is_truncated_history() -> None:
    reqs = multi_turn(1, rounds=6, rate=1.0, think_time_s=50.0, seed=3, with_token_ids=True)
    assert len(reqs) == 6
    assert all(r.prompt_len <= 1024 and r.output_len <= 1024 for r in reqs)
    gaps = np.diff([r.arrival_time for r in reqs])
    np.testing.assert_allclose(gaps, 50.0)
    truncated = 0
    for prev, cur in itertools.pairwise(reqs):
        assert prev.prompt_token_ids is not None and cur.prompt_token_ids is not None
        # History grows by the previous reply and at least one token of the new message.
        assert cur.prompt_len >= min(1024, prev.prompt_len + prev.output_len + 1)
        if cur.prompt_len < 1024:
            assert cur.prompt_token_ids[: prev.prompt_len] == prev.prompt_token_ids
        else:
            truncated += 1
    assert truncated > 0  # six ShareGPT rounds overflow 1024 tokens (seeded)


def test_multi_turn_rate_is_request_rate_and_seeded() -> None:
    reqs = multi_turn(400, rounds=4, rate=8.0, think_time_s=0.0, seed=1)
    assert len(reqs) == 1600
    times = np.array([r.arrival_time for r in reqs])
    assert np.all(np.diff(times) >= 0)
    assert len(reqs) / times[-1] == pytest.approx(8.0, rel=0.15)
    assert reqs == multi_turn(400, rounds=4, rate=8.0, think_time_s=0.0, seed=1)
    assert all(r.total_len <= 2048 for r in reqs)


def test_multi_turn_errors() -> None:
    with pytest.raises(RequestError, match="rounds"):
        multi_turn(3, rounds=0)
    with pytest.raises(RequestError, match="max_prompt_len"):
        multi_turn(3, max_prompt_len=2048)


# ---------------------------------------------------------------- build_workload


def test_build_synthetic_matches_synthesize() -> None:
    cfg = {
        "kind": "synthetic",
        "dataset": "sharegpt",
        "rate": 2.0,
        "duration_s": 60,
        "num_requests": None,
        "arrival": "poisson",
        "burstiness": 1.0,
        "n": 2,
        "beam_width": 1,
        "path": None,  # unset: a key another kind reads may be present as None
    }
    got = build_workload(cfg, max_model_len=2048, seed=3)
    want = synthesize(
        "sharegpt", 2.0, duration_s=60, seed=3, sampling=SamplingParams(n=2, beam_width=1)
    )
    assert got == want


def test_build_other_generators() -> None:
    sp = build_workload({"kind": "shared_prefix", "prefix_len": 80, "rate": 1.0, "num_requests": 5})
    assert len(sp) == 5 and all(r.prompt_token_ids is not None for r in sp)
    mt = build_workload({"kind": "multi_turn", "num_conversations": 3, "rounds": 2, "rate": 1.0})
    assert len(mt) == 6
    with pytest.raises(RequestError, match="num_conversations"):
        build_workload({"kind": "multi_turn", "rate": 1.0})


def test_build_file_kinds(tmp_path: Path) -> None:
    native = tmp_path / "t.csv"
    write_trace(native, [Request(i, float(i), 10, 10) for i in range(10)])
    got = build_workload({"kind": "native", "path": str(native), "duration_s": 5.0})
    assert [r.request_id for r in got] == [0, 1, 2, 3, 4]
    vidur = tmp_path / "v.csv"
    vidur.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,10,20\n1.5,30,40\n")
    got = build_workload({"kind": "vidur", "path": str(vidur), "beam_width": 2})
    assert [(r.arrival_time, r.sampling.beam_width) for r in got] == [(0.0, 2), (1.0, 2)]
    alpaca = tmp_path / "a.json"
    alpaca.write_text(
        '[{"instruction": "say hi to all them", "input": "", "output": "hi hi hi hi"},'
        ' {"instruction": "count to five now", "input": "please", "output": "1 2 3 4 5"}]'
    )
    got = build_workload(
        {"kind": "alpaca_json", "path": str(alpaca), "rate": 1.0, "num_requests": 5}, seed=1
    )
    assert len(got) == 5 and [r.request_id for r in got] == list(range(5))
    assert {r.prompt_len for r in got} == {5}
    times = [r.arrival_time for r in got]
    assert times == sorted(times) and times[0] > 0


def test_build_validation_errors() -> None:
    with pytest.raises(RequestError, match="'poisson_mix'"):
        build_workload({"kind": "poisson_mix"})
    with pytest.raises(RequestError, match="kind"):
        build_workload({"rate": 1.0})
    with pytest.raises(RequestError, match="'azure' needs a 'path'"):
        build_workload({"kind": "azure", "path": None})
    with pytest.raises(RequestError, match="ratee"):
        build_workload({"kind": "synthetic", "ratee": 1.0, "num_requests": 3})


def test_multi_turn_num_requests_keeps_the_first_requests_by_arrival() -> None:
    cfg = {"kind": "multi_turn", "num_conversations": 20, "rate": 4.0}
    whole = build_workload(cfg, seed=2)
    first = build_workload({**cfg, "num_requests": 7}, seed=2)
    by_arrival = sorted(whole, key=lambda r: (r.arrival_time, r.request_id))
    assert first == by_arrival[:7] and len(whole) == 80


def test_a_longer_model_context_does_not_lengthen_the_synthetic_datasets() -> None:
    """vLLM's benchmark drops prompt + output > 2048 whatever the model, and the length
    models are fitted after that filter: a 128k-context model gets the same trace as OPT,
    a shorter context a stricter filter."""
    long = synthesize("sharegpt", 2.0, num_requests=500, max_model_len=131072, seed=3)
    assert long == synthesize("sharegpt", 2.0, num_requests=500, max_model_len=2048, seed=3)
    short = synthesize("sharegpt", 2.0, num_requests=500, max_model_len=1024, seed=3)
    assert max(r.prompt_len + r.output_len for r in short) <= 1024
