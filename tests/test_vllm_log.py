"""Real vLLM runs as workloads: the run-directory log, token ids, bench JSON, bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from core.workload.spec import build_workload
from core.workload.trace_io import TraceFormatError
from core.workload.vllm_bench import read_bench_result
from core.workload.vllm_log import read_vllm_log

SHARED_RUN = Path(__file__).resolve().parents[1] / "../shared/measurements/vllm"


def _row(i: int, q: float, **over: float) -> dict:
    row = {
        "request_id": f"bench-{i}",
        "input_toks": 4,
        "output_toks": 3,
        "arrival_time": 1000.0 + q,
        "queued_ts": q,
        "scheduled_ts": q + 0.01,
        "first_token_ts": q + 0.1,
        "last_token_ts": q + 0.3,
    }
    return row | over


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    (tmp_path / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return tmp_path


def test_arrivals_lengths_and_latencies(tmp_path: Path) -> None:
    run = _write(tmp_path, [_row(0, 50.0), _row(1, 50.5, input_toks=7, output_toks=2)])
    logged = read_vllm_log(run)
    assert [r.arrival for r in logged] == [0.0, 0.5]
    assert logged[1].prompt_len == 7 and logged[1].output_len == 2
    assert logged[0].ttft == pytest.approx(0.1)
    assert logged[0].tpot == pytest.approx(0.2 / 2)
    assert logged[0].e2e == pytest.approx(0.3)
    reqs = build_workload({"kind": "vllm_log", "path": str(run)})
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in reqs] == [
        (0.0, 4, 3),
        (0.5, 7, 2),
    ]


def test_token_ids_replay_from_the_workload_file(tmp_path: Path) -> None:
    run = _write(tmp_path, [_row(0, 0.0), _row(1, 1.0)])
    tokens = tmp_path / "sent.jsonl"
    tokens.write_text('{"input_tok_ids": [1, 2, 3, 4]}\n{"input_tok_ids": [1, 2, 3, 5]}\n')
    reqs = build_workload({"kind": "vllm_log", "path": str(run), "tokens_path": str(tokens)})
    assert reqs[1].prompt_token_ids == (1, 2, 3, 5)
    tokens.write_text('{"input_tok_ids": [1, 2, 3]}\n{"input_tok_ids": [1, 2, 3, 5]}\n')
    with pytest.raises(TraceFormatError, match=r"sent.jsonl, line 1: 3 input_tok_ids"):
        build_workload({"kind": "vllm_log", "path": str(run), "tokens_path": str(tokens)})


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"first_token_ts": None}, r"line 2: missing key 'first_token_ts'"),
        ({"last_token_ts": 0.05 + 1.0}, r"line 2: negative duration: last_token_ts"),
        ({"arrival_time": 99999.0}, r"line 2: clocks do not align"),
        ({"output_toks": 0}, r"line 2: output_toks must be a positive integer"),
    ],
)
def test_bad_logs_name_file_line_and_key(tmp_path: Path, bad: dict, message: str) -> None:
    second = {k: v for k, v in (_row(1, 1.0) | bad).items() if v is not None}
    run = _write(tmp_path, [_row(0, 0.0), second])
    with pytest.raises(TraceFormatError, match=message) as info:
        read_vllm_log(run)
    assert "requests.jsonl" in str(info.value) and "\n" not in str(info.value)


def test_a_null_number_is_named_null_not_missing(tmp_path: Path) -> None:
    run = _write(tmp_path, [_row(0, 0.0), _row(1, 1.0) | {"output_toks": None}])
    with pytest.raises(TraceFormatError, match=r"line 2: output_toks is null$"):
        read_vllm_log(run)


def test_bench_serve_json_gives_lengths_but_redraws_arrivals(tmp_path: Path) -> None:
    doc = {
        "request_rate": 2.0,
        "burstiness": 1.0,
        "duration": 3.0,
        "input_lens": [10, 20, 30],
        "output_lens": [5, 6, 7],
        "ttfts": [0.1, 0.2, 0.3],
        "itls": [[0.01] * 4, [0.01] * 5, [0.01] * 6],
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    assert read_bench_result(path).request_rate == 2.0
    reqs = build_workload({"kind": "vllm_bench", "path": str(path)}, seed=3)
    assert [r.prompt_len for r in reqs] == [10, 20, 30]
    assert reqs[-1].arrival_time > 0
    path.write_text(json.dumps({k: v for k, v in doc.items() if k != "input_lens"}))
    with pytest.raises(TraceFormatError, match=r"key 'input_lens': missing .*--save-detailed"):
        read_bench_result(path)


@pytest.mark.skipif(not SHARED_RUN.is_dir(), reason="../shared/measurements absent")
def test_the_shared_rtx4090_run_replays_with_prefix_ids() -> None:
    run = SHARED_RUN / "rtx4090-llama-3.1-8b"
    tokens = SHARED_RUN / "sharegpt-llama-3.1-8b-300-sps10.jsonl"
    reqs = build_workload(
        {"kind": "vllm_log", "path": str(run), "tokens_path": str(tokens)}, max_model_len=32768
    )
    assert len(reqs) == 300
    assert reqs[0].arrival_time == 0.0 and 28 < reqs[-1].arrival_time < 31
    assert all(r.prompt_token_ids is not None for r in reqs)


def test_vllm_v1_preset_runs_mixed_steps_with_prefix_caching(tmp_path: Path) -> None:
    import yaml

    from experiments.lib.setup import build_setup
    from sim.catalog import CONFIGS
    from sim.cost import build_cost_model
    from sim.driver import simulate

    system = yaml.safe_load((CONFIGS / "system" / "vllm_v1.yaml").read_text())
    assert system["chunked_prefill"] and system["enable_prefix_caching"]
    cfg = {
        "model": {"name": "tiny-llama", "tp": 1},
        "hardware": {"name": "h100"},
        "system": system | {"max_num_batched_tokens": 64, "max_num_seqs": 64},
        "workload": {"kind": "shared_prefix", "rate": None, "num_requests": 30, "prefix_len": 48,
                     "vocab_size": 512},
        "num_gpu_blocks": 200,
    }  # fmt: skip
    setup = build_setup(cfg)
    scheduler = setup.make_scheduler()
    assert scheduler.config.chunked_prefill and scheduler.manager.enable_prefix_caching
    cost = build_cost_model("roofline", setup.model, setup.gpu)
    steps = simulate(setup.requests, setup.make_scheduler, cost).recorder.steps_frame()
    mixed = steps[(steps["prefill_tokens"] > 0) & (steps["decode_seqs"] > 0)]
    assert len(mixed) > 0
    assert (steps["prefill_tokens"] + steps["decode_seqs"]).max() <= 64
    assert steps["prefill_kv_read_tokens"].sum() > 0  # cached prefix blocks were reused


def test_scheduled_ts_is_optional(tmp_path: Path) -> None:
    """Without scheduled_ts the queue wait is unknown (NaN), not zero."""
    rows = [_row(0, 0.0), _row(1, 1.0)]
    for r in rows:
        del r["scheduled_ts"]
    logged = read_vllm_log(_write(tmp_path, rows))
    assert all(math.isnan(r.queue_wait) for r in logged)
    assert logged[1].ttft == pytest.approx(0.1)


def test_token_ids_follow_the_request_id_row(tmp_path: Path) -> None:
    """A log written in another order than the workload was sent (e.g. by finish time)
    still gets each request's own token ids, by the row in ``bench-<row>``."""
    run = _write(tmp_path, [_row(1, 1.0, input_toks=5), _row(0, 0.0)])
    tokens = tmp_path / "sent.jsonl"
    tokens.write_text('{"input_tok_ids": [1, 2, 3, 4]}\n{"input_tok_ids": [1, 2, 3, 4, 5]}\n')
    reqs = build_workload({"kind": "vllm_log", "path": str(run), "tokens_path": str(tokens)})
    assert {r.prompt_len: r.prompt_token_ids for r in reqs} == {
        4: (1, 2, 3, 4),
        5: (1, 2, 3, 4, 5),
    }


def test_clock_error_names_the_odd_line(tmp_path: Path) -> None:
    rows = [_row(i, float(i)) for i in range(5)]
    rows[1]["arrival_time"] -= 60.0
    with pytest.raises(TraceFormatError, match=r"line 2: clocks do not align"):
        read_vllm_log(_write(tmp_path, rows))


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"input_lens": [10, None]}, r"key 'input_lens\[1\]': None is not a whole number"),
        ({"output_lens": [5, "x"]}, r"key 'output_lens\[1\]': 'x' is not a whole number"),
        ({"request_rate": "fast"}, r"key 'request_rate': 'fast' is not a positive number"),
        ({"itls": 5}, r"key 'itls': expected 2 lists of numbers"),
        ({"burstiness": "x"}, r"key 'burstiness': 'x' is not a positive number"),
        ({"ttfts": [0.1, -1]}, r"key 'ttfts\[1\]': -1 is not a finite number >= 0"),
        ({"input_lens": [10, math.nan]}, r"key 'input_lens\[1\]': nan is not a whole number"),
    ],
)
def test_bad_bench_values_name_the_key(tmp_path: Path, doc: dict, message: str) -> None:
    good = {"input_lens": [10, 20], "output_lens": [5, 6], "ttfts": [0.1, 0.2]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(good | doc))
    with pytest.raises(TraceFormatError, match=message):
        read_bench_result(path)


class _Said:
    """A stand-in logger (Hydra apps run earlier in the suite disable module loggers)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, message: str, *args: object) -> None:
        self.lines.append(message % args if args else message)


@pytest.mark.parametrize(
    ("ids", "rows", "said"),
    [
        (["bench-2", "bench-0", "bench-1"], [2, 0, 1], None),
        (["bench-1", "bench-1", "bench-0"], [0, 1, 2], "share a <prefix>-<row> id"),
        (["bench-1", "chat", "bench-0"], [0, 1, 2], "not every logged request id"),
        (["a", "b"], [0, 1], None),
    ],
)
def test_token_rows_fall_back_to_the_log_order_with_a_warning(
    ids: list[str], rows: list[int], said: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.workload import vllm_log

    stand_in = _Said()
    monkeypatch.setattr(vllm_log, "log", stand_in)
    assert vllm_log._source_rows(ids) == rows
    if said is None:
        assert stand_in.lines == []
    else:
        assert len(stand_in.lines) == 1 and said in stand_in.lines[0]


def test_a_window_past_the_logs_last_arrival_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a vLLM log's window cut as a trace's, but without the trace's warning
    run = _write(tmp_path, [_row(i, 10.0 + i) for i in range(4)])  # arrivals 0..3 s
    base = {"kind": "vllm_log", "path": str(run)}
    with caplog.at_level("WARNING", logger="core.workload.spec.window"):
        assert len(build_workload({**base, "duration_s": 2.5})) == 3  # cuts: no warning
        assert len(build_workload({**base, "duration_s": 60.0, "num_requests": 2})) == 2
        assert len(build_workload({**base, "duration_s": 12.0})) == 4  # 9 mean gaps: silent
        assert not caplog.records
        assert len(build_workload({**base, "duration_s": 60.0})) == 4
    assert [r.getMessage() for r in caplog.records] == [
        "workload.duration_s=60 s runs past the trace's last arrival (3 s from the replay's "
        "start, after time_scale): the replay holds that span, not 60 s"
    ]
