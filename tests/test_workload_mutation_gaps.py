"""Workload behaviour a mutation audit of core/workload found untested: arrival dispatch and
burstiness, filter limits, length-model options, generator edges, build_workload keys, and
the trace readers' options."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.request import RequestError
from core.workload import build_workload, describe, multi_turn, shared_prefix, synthesize
from core.workload.arrivals import make_arrivals, poisson
from core.workload.datasets_json import read_alpaca_json
from core.workload.filters import keep_mask
from core.workload.lengths import LengthModel, fit
from core.workload.trace_io import NATIVE_COLUMNS, NATIVE_MAGIC, TraceFormatError, read_azure_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _cv(times: np.ndarray) -> float:
    gaps = np.diff(np.asarray(times, dtype=float), prepend=0.0)
    return float(gaps.std() / gaps.mean())


def _azure(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "azure.csv"
    path.write_text(AZURE_HEADER + body)
    return path


def _alpaca(tmp_path: Path, prompt_words: list[int]) -> Path:
    path = tmp_path / "alpaca.json"
    words = [" ".join(f"w{i}" for i in range(n)) for n in prompt_words]
    path.write_text(json.dumps([{"instruction": w, "output": "a b c d"} for w in words]))
    return path


def _bench(tmp_path: Path, n: int, **changes: Any) -> Path:
    doc = {
        "request_rate": 2.0,
        "burstiness": 1.0,
        "duration": n / 2.0,
        "input_lens": [100] * n,
        "output_lens": [50] * n,
        "ttfts": [0.05] * n,
        "itls": [[0.01]] * n,
        "errors": [""] * n,
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc | changes))
    return path


# ---------------------------------------------------------------- arrivals


def test_gamma_dispatch_keeps_the_burstiness() -> None:
    times = make_arrivals("gamma", 2.0, n=20000, burstiness=0.25, rng=np.random.default_rng(4))
    assert _cv(times) == pytest.approx(2.0, rel=0.1)
    reqs = synthesize("alpaca", 2.0, num_requests=20000, arrival="gamma", burstiness=0.25, seed=4)
    assert _cv(np.array([r.arrival_time for r in reqs])) == pytest.approx(2.0, rel=0.1)


def test_all_at_once_ignores_a_rate() -> None:
    np.testing.assert_array_equal(make_arrivals("all_at_once", 3.0, n=4), np.zeros(4))


def test_fractional_count_is_refused() -> None:
    with pytest.raises(RequestError, match="n must be"):
        poisson(1.0, n=2.5)


def test_arrivals_without_a_generator_are_reproducible() -> None:
    np.testing.assert_array_equal(poisson(2.0, n=20), poisson(2.0, n=20))


# ---------------------------------------------------------------- filter and length model


def test_filter_needs_room_for_two_minimum_lengths() -> None:
    with pytest.raises(RequestError, match="max_model_len"):
        keep_mask(np.array([4]), np.array([4]), max_model_len=7)


def test_sample_honours_max_prompt_len() -> None:
    prompt, _ = fit("sharegpt").sample(2000, np.random.default_rng(0), max_prompt_len=100)
    assert prompt.max() <= 100


def test_raw_lengths_are_at_least_one() -> None:
    model = LengthModel(mu_input=-3.0, sigma_input=1.0, mu_output=-3.0, sigma_output=1.0)
    prompt, output = model.sample_raw(1000, np.random.default_rng(0))
    assert prompt.min() >= 1 and output.min() >= 1


def test_a_configured_sigma_input_is_used() -> None:
    assert fit("sharegpt", 0.3, None).sigma_input == 0.3
    narrow = synthesize("sharegpt", None, num_requests=4000, seed=2, sigmas=(0.3, None))
    wide = synthesize("sharegpt", None, num_requests=4000, seed=2)
    assert np.std([r.prompt_len for r in narrow]) < np.std([r.prompt_len for r in wide])


def test_describe_reports_the_samples_of_its_seed() -> None:
    d = describe("alpaca", 5000, 7)
    prompt, output = fit("alpaca").sample(5000, np.random.default_rng(7))
    assert d["input_mean"] == pytest.approx(prompt.mean())
    assert d["input_std"] == pytest.approx(prompt.std())
    assert d["output_p90"] == pytest.approx(np.percentile(output, 90))


# ---------------------------------------------------------------- generators


def test_vocab_size_one_is_refused() -> None:
    with pytest.raises(RequestError, match="vocab_size"):
        synthesize("alpaca", None, num_requests=3, with_token_ids=True, vocab_size=1)


def test_multi_turn_first_round_arrives_at_the_conversation_start() -> None:
    reqs = multi_turn(1, rounds=3, rate=None, think_time_s=5.0, seed=0)
    assert [r.arrival_time for r in reqs] == [0.0, 5.0, 10.0]


def test_multi_turn_prompt_is_the_last_max_prompt_len_tokens_of_the_chat() -> None:
    # A context so long that replies are never cut by it: only max_prompt_len differs.
    def chat(max_prompt_len: int) -> list:
        return multi_turn(
            1, rounds=6, rate=1.0, think_time_s=50.0, seed=3, with_token_ids=True,
            max_prompt_len=max_prompt_len, max_model_len=100_000,
        )  # fmt: skip

    cut, full = chat(1024), chat(99_999)
    assert [r.output_len for r in cut] == [r.output_len for r in full]
    for a, b in zip(cut, full, strict=True):
        assert b.prompt_token_ids is not None
        assert a.prompt_token_ids == b.prompt_token_ids[-1024:]
    assert any(b.prompt_len > 1024 for b in full)


def test_multi_turn_uses_its_dataset() -> None:
    alp = multi_turn(200, rounds=1, rate=None, dataset="alpaca", seed=0)
    share = multi_turn(200, rounds=1, rate=None, dataset="sharegpt", seed=0)
    assert np.mean([r.prompt_len for r in alp]) < 0.5 * np.mean([r.prompt_len for r in share])


def test_multi_turn_refuses_an_infinite_think_time() -> None:
    with pytest.raises(RequestError, match="think_time_s"):
        multi_turn(2, think_time_s=math.inf)


def test_shared_prefix_keeps_a_suffix_at_the_longest_prefix() -> None:
    reqs = shared_prefix(2046, rate=None, num_requests=20, seed=0)
    assert all(r.prompt_len == 2047 and r.output_len == 1 for r in reqs)


# ---------------------------------------------------------------- build_workload keys


def test_shared_prefix_suffix_and_output_means_are_their_own() -> None:
    cfg = {"kind": "shared_prefix", "prefix_len": 10, "num_requests": 2000}
    reqs = build_workload(cfg | {"suffix_len_mean": 100.0, "output_len_mean": 10.0}, seed=1)
    assert np.mean([r.prompt_len - 10 for r in reqs]) == pytest.approx(100.0, rel=0.08)
    assert np.mean([r.output_len for r in reqs]) == pytest.approx(10.0, rel=0.08)


def test_multi_turn_prompt_and_output_limits_are_their_own() -> None:
    cfg = {"kind": "multi_turn", "num_conversations": 50, "rounds": 3, "rate": 1.0}
    reqs = build_workload(cfg | {"max_prompt_len": 300, "max_output_len": 50}, seed=1)
    assert max(r.output_len for r in reqs) == 50
    assert max(r.prompt_len for r in reqs) == 300


def test_temperature_reaches_every_request() -> None:
    cfg = {"kind": "synthetic", "num_requests": 3, "temperature": 0.7}
    assert all(r.sampling.temperature == 0.7 for r in build_workload(cfg))


def test_azure_serves_every_row_by_default(tmp_path: Path) -> None:
    path = _azure(tmp_path, "2023-11-16 18:17:00,3000,10\n2023-11-16 18:17:01,100,10\n")
    reqs = build_workload({"kind": "azure", "path": str(path)})
    assert [r.prompt_len for r in reqs] == [3000, 100]
    assert len(build_workload({"kind": "azure", "path": str(path), "apply_filter": True})) == 1


def test_dataset_draws_are_seeded_permutations(tmp_path: Path) -> None:
    path = _alpaca(tmp_path, list(range(4, 24)))

    def lengths(seed: int, **keys: Any) -> list[int]:
        cfg = {"kind": "alpaca_json", "path": str(path), "rate": 1.0} | keys
        return [r.prompt_len for r in build_workload(cfg, seed=seed)]

    one, two = lengths(1, num_requests=20), lengths(2, num_requests=20)
    assert sorted(one) == sorted(two) == list(range(4, 24))
    assert one != two
    assert sorted(lengths(1)) == list(range(4, 24))  # no count: the whole file once


def test_native_ties_are_broken_by_request_id(tmp_path: Path) -> None:
    rows = "".join(f"{i},1.0,100,20,1,1,0.0,1.0,-1,,\n" for i in (5, 2, 7))
    path = tmp_path / "trace.csv"
    path.write_text(f"{NATIVE_MAGIC}\n{','.join(NATIVE_COLUMNS)}\n{rows}")
    assert [r.request_id for r in build_workload({"kind": "native", "path": str(path)})] == [
        2, 5, 7,
    ]  # fmt: skip


def test_bench_arrivals_start_at_the_earliest_row_even_a_failed_one(tmp_path: Path) -> None:
    starts = [100.5, 100.0, 102.0, 99.5, 101.0, 104.0]
    path = _bench(tmp_path, 6, start_times=starts, output_lens=[50, 50, 50, 0, 50, 50])
    reqs = build_workload({"kind": "vllm_bench", "path": str(path)})
    assert [r.arrival_time for r in reqs] == [0.5, 1.0, 1.5, 2.5, 4.5]


def test_bench_redrawn_arrivals_keep_the_files_burstiness(tmp_path: Path) -> None:
    path = _bench(tmp_path, 20000, burstiness=0.25)
    reqs = build_workload({"kind": "vllm_bench", "path": str(path)}, seed=5)
    assert _cv(np.array([r.arrival_time for r in reqs])) == pytest.approx(2.0, rel=0.1)


def test_vllm_log_num_requests_keeps_the_earliest(tmp_path: Path) -> None:
    def row(i: int, q: float, prompt: int) -> dict:
        return {
            "request_id": f"bench-{i}", "input_toks": prompt, "output_toks": 3,
            "arrival_time": 1000.0 + q, "queued_ts": q, "scheduled_ts": q + 0.01,
            "first_token_ts": q + 0.1, "last_token_ts": q + 0.3,
        }  # fmt: skip

    rows = [row(0, 5.0, 4), row(1, 1.0, 7)]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reqs = build_workload({"kind": "vllm_log", "path": str(tmp_path), "num_requests": 1})
    assert [(r.arrival_time, r.prompt_len) for r in reqs] == [(0.0, 7)]


# ---------------------------------------------------------------- readers


def test_unfiltered_zero_output_names_the_line(tmp_path: Path) -> None:
    path = _azure(tmp_path, "2023-11-16 18:17:00,100,10\n2023-11-16 18:17:01,100,0\n")
    with pytest.raises(TraceFormatError, match="line 3"):
        read_azure_trace(path, apply_filter=False)


def test_readers_honour_max_prompt_len(tmp_path: Path) -> None:
    path = _azure(tmp_path, "2023-11-16 18:17:00,300,10\n2023-11-16 18:17:01,100,10\n")
    assert [r.prompt_len for r in read_azure_trace(path, max_prompt_len=200)] == [100]
    alpaca = _alpaca(tmp_path, [5, 8])
    assert [r.prompt_len for r in read_alpaca_json(alpaca, max_prompt_len=6)] == [5]


def test_a_24_hour_offset_is_refused(tmp_path: Path) -> None:
    path = _azure(tmp_path, "2023-11-16 18:17:00,100,10\n2023-11-16 18:17:04+24:00,200,20\n")
    with pytest.raises(TraceFormatError, match="line 3: TIMESTAMP offset"):
        read_azure_trace(path)


def test_dataset_filter_drops_are_info_and_trace_drops_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a Hydra app run earlier in this process disables module loggers, and a rate search's
    # batch logging silences this one (experiments.lib.batch_log): its own level is set here
    dropped = "core.workload.trace_io.dropped"
    monkeypatch.setattr(logging.getLogger(dropped), "disabled", False)
    alpaca = _alpaca(tmp_path, [5, 2])
    with caplog.at_level(logging.INFO, logger=dropped):
        assert len(read_alpaca_json(alpaca)) == 1
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    caplog.clear()
    azure = _azure(tmp_path, "2023-11-16 18:17:00,2,10\n2023-11-16 18:17:01,100,10\n")
    with caplog.at_level(logging.INFO, logger=dropped):
        assert len(read_azure_trace(azure)) == 1
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_alpaca_input_follows_the_instruction_on_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps([{"instruction": "abcd", "input": "efgh", "output": "ijkl"}]))
    reqs = read_alpaca_json(path, tokenize=lambda s: [ord(c) for c in s], with_token_ids=True)
    assert reqs[0].prompt_token_ids == tuple(ord(c) for c in "abcd\nefgh")
