"""Workload fixes: narrow/wide length sigmas, vllm_bench start_times / failed rows /
appended results, native traces sorted by arrival, Azure 2024 timestamps, BOMs."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from core.workload import build_workload
from core.workload.lengths import PUBLISHED, filtered_means, fit
from core.workload.trace_io import NATIVE_COLUMNS, NATIVE_MAGIC, TraceFormatError

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"

# ---------------------------------------------------------------- length fit


@pytest.mark.parametrize(
    ("dataset", "sigma_input", "sigma_output"),
    [
        ("sharegpt", 0.3, None),
        ("sharegpt", None, 0.2),
        ("sharegpt", 0.05, 0.05),
        ("sharegpt", 3.0, 0.05),
        ("alpaca", 0.1, None),
        ("alpaca", None, 0.05),
        ("alpaca", 3.0, None),
        ("alpaca", 3.0, 3.0),
    ],
)
def test_every_admitted_sigma_solves_to_the_published_means(
    dataset: str, sigma_input: float | None, sigma_output: float | None
) -> None:
    model = fit(dataset, sigma_input, sigma_output)
    stats = PUBLISHED[dataset]
    mean_in, mean_out = filtered_means(model)
    assert mean_in == pytest.approx(stats.mean_input, abs=1e-6)
    assert mean_out == pytest.approx(stats.mean_output, abs=1e-6)


def test_default_fits_and_workloads_are_unchanged() -> None:
    """The paper-reproduction inputs: the same mus and byte-identical requests per seed."""
    assert fit("sharegpt").mu_input == 4.601981420908885
    assert fit("sharegpt").mu_output == 5.455713823423878
    assert fit("alpaca").mu_input == 2.775857875107306
    assert fit("alpaca").mu_output == 3.6598247361101244
    expected = {
        ("sharegpt", 0): "05e1b3ca2ff9f6b4e9c1f7efcf3601e2b661c71614830ed15289cfbdea1b6ca4",
        ("sharegpt", 1): "9cbfdf2d8a49edc12e32070ca9730e4c4ff7ed4279998c381c3d69599b453d19",
        ("alpaca", 0): "b8b4315701dbeeb09a79a2151e46c58ae8d24d7a504439ab76eb8f9212aff37e",
        ("alpaca", 1): "973c7dd43c6422383f83c306b445cf36226dabdbc0218a1e5413f35bd920bb04",
    }
    rates = {"sharegpt": 2.0, "alpaca": 20.0}
    for (dataset, seed), digest in expected.items():
        cfg = {"kind": "synthetic", "dataset": dataset, "rate": rates[dataset]}
        reqs = build_workload(cfg | {"duration_s": 120.0}, seed=seed)
        assert hashlib.sha256(repr(reqs).encode()).hexdigest() == digest, (dataset, seed)


# ---------------------------------------------------------------- vllm_bench

BENCH: dict[str, Any] = {
    "request_rate": 2.0,
    "burstiness": 1.0,
    "duration": 3.2,
    "input_lens": [100, 120, 80, 150, 90, 60],
    "output_lens": [50, 40, 60, 0, 30, 70],
    "ttfts": [0.05, 0.04, 0.06, 0.0, 0.03, 0.05],
    "itls": [[0.01, 0.01], [0.01], [0.02], [], [0.01], [0.01]],
    "errors": ["", "", "", "timeout", "", ""],
}


def _bench(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(BENCH | changes))
    return path


def _bench_workload(path: Path, **keys: Any) -> list:
    return build_workload({"kind": "vllm_bench", "path": str(path)} | keys, seed=3)


def test_bench_start_times_are_the_arrivals_sorted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _bench(tmp_path, start_times=[100.5, 100.0, 102.0, 103.0, 101.0, 104.0])
    with caplog.at_level(logging.INFO):
        reqs = _bench_workload(path)
    assert [r.arrival_time for r in reqs] == [0.0, 0.5, 1.0, 2.0, 4.0]
    assert [r.prompt_len for r in reqs] == [120, 100, 90, 80, 60]
    assert [r.request_id for r in reqs] == [0, 1, 2, 3, 4]
    assert "arrivals from the file's start_times" in caplog.text
    earliest = _bench_workload(path, num_requests=2)
    assert [r.prompt_len for r in earliest] == [120, 100]


def test_bench_without_start_times_says_arrivals_are_redrawn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        reqs = _bench_workload(_bench(tmp_path))
    assert len(reqs) == 5 and reqs[-1].arrival_time > 0
    assert "arrivals redrawn" in caplog.text and "no start_times" in caplog.text


@pytest.mark.parametrize(
    ("start_times", "where"),
    [([1.0, 2.0], "key 'start_times'"), ([1, 2, 3, "x", 5, 6], "key 'start_times[3]'")],
)
def test_bad_start_times_name_the_key(tmp_path: Path, start_times: list, where: str) -> None:
    with pytest.raises(TraceFormatError, match=re.escape(f"bench.json, {where}: ")):
        _bench_workload(_bench(tmp_path, start_times=start_times))


def test_appended_results_are_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(BENCH) + "\n" + json.dumps(BENCH) + "\n")
    with pytest.raises(TraceFormatError) as info:
        _bench_workload(path)
    message = str(info.value)
    assert "holds 2 results" in message and "--append-result" in message
    assert "Extra data" not in message and "\n" not in message


def test_failed_rows_are_counted_and_ids_stay_contiguous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    successes = [True, False, True, True, True, True]
    with caplog.at_level(logging.WARNING):
        reqs = _bench_workload(_bench(tmp_path, successes=successes))
    assert [r.request_id for r in reqs] == [0, 1, 2, 3]
    assert [r.prompt_len for r in reqs] == [100, 80, 90, 60]
    assert "dropped 2 of 6 rows" in caplog.text
    assert "1 output_lens 0" in caplog.text and "1 successes false" in caplog.text


def test_num_requests_counts_requests_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _bench(tmp_path)
    assert [r.prompt_len for r in _bench_workload(path, num_requests=4)] == [100, 120, 80, 90]
    with caplog.at_level(logging.WARNING):
        assert len(_bench_workload(path, num_requests=9)) == 5
    assert "num_requests=9 but the file holds 5 usable requests" in caplog.text


def test_simulate_summary_says_where_arrivals_come_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    import experiments.simulate as simulate

    hc = SimpleNamespace(runtime=SimpleNamespace(output_dir=str(tmp_path / "out"), choices={}))
    hc.overrides = SimpleNamespace(task=[])
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hc))
    monkeypatch.setattr(simulate, "run_app", lambda app, cfg, run, describe: describe(metrics))
    metrics = {"system": "vllm", "model": "m", "completed": 1, "num_requests": 1}
    metrics |= {"normalized_latency": 0.1, "request_throughput": 1.0}

    def summary(**workload: Any) -> str:
        cfg = OmegaConf.create({"workload": {"rate": None} | workload})
        return simulate.simulate_job(cfg)

    plain = _bench(tmp_path)
    assert "arrivals redrawn at the file's request_rate=2.0" in summary(
        kind="vllm_bench", path=str(plain)
    )
    timed = tmp_path / "timed.json"
    timed.write_text(json.dumps(BENCH | {"start_times": [0, 1, 2, 3, 4, 5]}))
    assert "arrivals from the workload file" in summary(kind="vllm_bench", path=str(timed))
    assert "rate=3.0" in summary(kind="vllm_bench", path=str(timed), rate=3.0)


# ---------------------------------------------------------------- trace files


def test_native_trace_is_sorted_then_windowed_by_arrival(tmp_path: Path) -> None:
    rows = [(0, 5.0), (1, 1.0), (2, 3.0), (3, 0.5), (4, 1.0)]
    text = "".join(f"{i},{t},100,20,1,1,0.0,1.0,-1,,\n" for i, t in rows)
    path = tmp_path / "trace.csv"
    path.write_text(f"{NATIVE_MAGIC}\n{','.join(NATIVE_COLUMNS)}\n{text}")
    reqs = build_workload({"kind": "native", "path": str(path)})
    assert [(r.request_id, r.arrival_time) for r in reqs] == [
        (3, 0.5), (1, 1.0), (4, 1.0), (2, 3.0), (0, 5.0),
    ]  # fmt: skip
    two = build_workload({"kind": "native", "path": str(path), "num_requests": 2})
    assert [r.request_id for r in two] == [3, 1]


def _azure(tmp_path: Path, body: str, prefix: str = "") -> list:
    path = tmp_path / "azure.csv"
    path.write_bytes((prefix + AZURE_HEADER + body).encode("utf-8"))
    return build_workload({"kind": "azure", "path": str(path)})


def test_azure_2024_timestamps_with_offsets_are_utc(tmp_path: Path) -> None:
    body = "2024-05-10 00:00:00.009930+00:00,100,10\n2024-05-10 00:00:01+00:00,200,20\n"
    assert [r.arrival_time for r in _azure(tmp_path, body)] == [0.0, 0.99007]
    mixed = "2023-11-16 18:17:00+00:00,100,10\n2023-11-16 18:17:04+05:00,200,20\n"
    assert [(r.prompt_len, r.arrival_time) for r in _azure(tmp_path, mixed)] == [
        (200, 0.0),
        (100, 5 * 3600 - 4.0),
    ]
    zulu = "2023-11-16 18:17:00Z,100,10\n2023-11-16 18:17:01.5,200,20\n"
    assert [r.arrival_time for r in _azure(tmp_path, zulu)] == [0.0, 1.5]


@pytest.mark.parametrize(
    "stamp", ["2023-11-16 18:17:04+25:00", "2023-11-16 18:17:04.1+5:00", "2023-11-16 18:17:04.1.2"]
)
def test_malformed_timestamp_offset_names_the_row(tmp_path: Path, stamp: str) -> None:
    body = f"2023-11-16 18:17:00,100,10\n{stamp},200,20\n"
    with pytest.raises(TraceFormatError, match=r"azure.csv, line 3: .*TIMESTAMP") as info:
        _azure(tmp_path, body)
    assert "\n" not in str(info.value)


def test_a_byte_order_mark_does_not_break_the_header(tmp_path: Path) -> None:
    reqs = _azure(tmp_path, "2023-11-16 18:17:03.1,100,10\n", prefix="\ufeff")
    assert [r.prompt_len for r in reqs] == [100]
