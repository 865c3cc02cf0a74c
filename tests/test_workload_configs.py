"""Every workload config in ``configs/workload`` builds, and a key a kind does not use is an
error naming the key (not silently ignored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.request import RequestError
from core.workload.spec import KINDS, KNOWN_KEYS, USES, build_workload
from experiments.lib.setup import as_dict
from experiments.reproduce import compose_config

CONFIGS = sorted(p.stem for p in Path("configs/workload").glob("*.yaml"))
SMALL = {
    "multi_turn": ["workload.num_conversations=5"],
    "trace": None,  # needs a trace file; built in test_native_trace_config
    "vllm_log": None,  # needs a vLLM run directory (tests/test_vllm_log.py)
    "vllm_bench": None,  # needs a bench result JSON (tests/test_vllm_log.py)
    # need their files: test_file_configs_read_their_format
    "mooncake": None,
    "vidur": None,
    "sharegpt_json": None,
    "alpaca_json": None,
}


def test_every_kind_reads_only_known_keys() -> None:
    assert set(USES) == set(KINDS)
    for kind, keys in USES.items():
        assert keys <= KNOWN_KEYS, kind


@pytest.mark.parametrize("name", [c for c in CONFIGS if SMALL.get(c, []) is not None])
def test_workload_config_builds(name: str) -> None:
    extra = SMALL.get(name) or ["workload.num_requests=20", "workload.duration_s=null"]
    cfg = as_dict(compose_config([f"workload={name}", *extra]))["workload"]
    requests = build_workload(cfg, max_model_len=2048, seed=0)
    assert requests
    if cfg.get("apply_filter") is not False:  # unfiltered traces leave that to the scheduler
        assert all(r.prompt_len + r.output_len <= 2048 for r in requests)


_FILES = {
    "mooncake": ("t.jsonl", "".join(
        json.dumps({"timestamp": 500 * i, "input_length": 20 + i, "output_length": 5,
                    "hash_ids": [i]}) + "\n" for i in range(6))),
    "vidur": ("t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens,extra\n" + "".join(
        f"{0.5 * i},{20 + i},5,x\n" for i in range(6))),
    "sharegpt_json": ("s.json", json.dumps([
        {"conversations": [{"from": "human", "value": "tell me " * (5 + i)},
                           {"from": "gpt", "value": "sure " * 6}]} for i in range(6)])),
    "alpaca_json": ("a.json", json.dumps([
        {"instruction": "say " * (5 + i), "input": "", "output": "ok " * 6}
        for i in range(6)])),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(_FILES))
def test_file_configs_read_their_format(name: str, tmp_path: Path) -> None:
    """Each file kind's config, given a file of its format, builds its six requests: the
    traces with the file's arrivals (0.5 s apart), the datasets drawn at the config's rate."""
    file, text = _FILES[name]
    (tmp_path / file).write_text(text)
    cfg = as_dict(
        compose_config(
            [
                f"workload={name}",
                f"workload.path={tmp_path / file}",
                "workload.duration_s=null",
                "workload.num_requests=6",
            ]
        )
    )
    requests = build_workload(cfg["workload"], max_model_len=2048, seed=0)  # fmt: skip
    assert len(requests) == 6
    arrivals = sorted(r.arrival_time for r in requests)
    if name in ("mooncake", "vidur"):
        assert arrivals == [0.5 * i for i in range(6)]
        assert sorted(r.prompt_len for r in requests) == [20 + i for i in range(6)]
    else:
        assert arrivals[0] > 0 and arrivals == sorted(set(arrivals))  # drawn at rate 1
        assert {r.output_len for r in requests} == {6}


def test_native_trace_config(tmp_path: Path) -> None:
    from core.request import Request
    from core.workload.trace_io import write_trace

    path = tmp_path / "t.csv"
    write_trace(path, [Request(i, float(i), 10, 10) for i in range(5)])
    cfg = as_dict(compose_config(["workload=trace", f"workload.path={path}"]))["workload"]
    assert len(build_workload(cfg)) == 5
    with pytest.raises(RequestError, match="time_scale"):
        build_workload({**cfg, "time_scale": 0.5})


def test_start_s_starts_the_replay_there_then_the_window_and_count_apply(tmp_path: Path) -> None:
    from core.request import Request
    from core.workload.trace_io import write_trace

    path = tmp_path / "t.csv"
    write_trace(path, [Request(i, float(i), 10, 10) for i in range(10)])  # one a second
    cfg = as_dict(compose_config(["workload=trace", f"workload.path={path}"]))["workload"]
    late = build_workload({**cfg, "start_s": 3.5, "duration_s": 4.0})
    assert [(r.request_id, r.arrival_time) for r in late] == [(4, 0.5), (5, 1.5), (6, 2.5),
                                                               (7, 3.5)]  # fmt: skip
    assert [r.request_id for r in build_workload({**cfg, "start_s": 7, "num_requests": 2})] == [
        7, 8]  # fmt: skip
    assert len(build_workload({**cfg, "start_s": 0})) == 10
    with pytest.raises(RequestError, match=r"^10 s: no request arrives at or after it"):
        build_workload({**cfg, "start_s": 10})


def test_a_window_that_holds_no_arrival_names_duration_s(tmp_path: Path) -> None:
    """A window between two arrivals is an error naming duration_s and where the first
    arrival falls, not an empty workload (which the CLI blamed on the file)."""
    from core.request import Request
    from core.workload.trace_io import write_trace

    path = tmp_path / "t.csv"
    write_trace(path, [Request(i, float(i), 10, 10) for i in range(10)])  # one a second
    cfg = as_dict(compose_config(["workload=trace", f"workload.path={path}"]))["workload"]
    with pytest.raises(RequestError, match=r"^0.25 s: no request arrives in the window") as exc:
        build_workload({**cfg, "start_s": 3.5, "duration_s": 0.25})
    assert exc.value.key == "duration_s"
    assert "first arrives at 0.5 s" in str(exc.value)


def test_a_window_past_the_trace_end_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``duration_s`` that runs past the last arrival replays less than it asks: it says so
    (a 2-hour window on a 1-hour trace replayed the hour without a word)."""
    from core.request import Request
    from core.workload.trace_io import write_trace

    path = tmp_path / "t.csv"
    write_trace(path, [Request(i, float(i), 10, 10) for i in range(10)])  # one a second
    cfg = as_dict(compose_config(["workload=trace", f"workload.path={path}"]))["workload"]
    with caplog.at_level("WARNING", logger="core.workload.spec.window"):
        assert len(build_workload({**cfg, "duration_s": 5.0})) == 5  # cuts: no warning
        assert len(build_workload({**cfg, "duration_s": 60.0, "num_requests": 3})) == 3
        # a tail of 6 mean gaps past the last arrival: the next one just fell outside
        assert len(build_workload({**cfg, "duration_s": 15.0})) == 10
        assert not caplog.records
        assert len(build_workload({**cfg, "start_s": 4.0, "duration_s": 60.0})) == 6
    assert [r.getMessage() for r in caplog.records] == [
        "workload.duration_s=60 s runs past the trace's last arrival (5 s from the replay's "
        "start, after time_scale): the replay holds that span, not 60 s"
    ]


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        ({"kind": "synthetic", "num_requests": 3, "start_s": 5.0}, "start_s"),
        ({"kind": "multi_turn", "num_conversations": 3, "duration_s": 60.0}, "duration_s"),
        ({"kind": "synthetic", "num_requests": 3, "prefix_len": 80}, "prefix_len"),
        ({"kind": "shared_prefix", "num_requests": 3, "dataset": "alpaca"}, "dataset"),
        ({"kind": "azure", "path": "x.csv", "rate": 2.0}, "rate"),
    ],
)
def test_unused_key_is_an_error_naming_it(cfg: dict, key: str) -> None:
    with pytest.raises(RequestError, match=rf"key\(s\) {key} not used by kind '{cfg['kind']}'"):
        build_workload(cfg)


def test_the_summary_says_where_arrivals_come_from() -> None:
    from core.workload.spec import arrivals_note

    assert arrivals_note({"kind": "synthetic", "rate": 2.0, "arrival": "poisson"}) == "rate=2.0"
    # all_at_once draws no rate: the line said the config's unused rate=1.0
    assert arrivals_note({"kind": "synthetic", "rate": 1.0, "arrival": "all_at_once"}) == (
        "all arrivals at t=0")  # fmt: skip
    assert arrivals_note({"kind": "multi_turn", "rate": 1.0, "arrival": "all_at_once"}) == (
        "conversations all start at t=0")  # fmt: skip
    assert arrivals_note({"kind": "azure", "rate": None}) == "arrivals from the workload file"


def test_a_rate_for_a_trace_points_at_its_time_scale() -> None:
    with pytest.raises(RequestError, match=r"time_scale sets its rate, 0.5 replaying it twice"):
        build_workload({"kind": "azure", "path": "x.csv", "rate": 2.0})


def test_unset_keys_and_vocab_size_pass() -> None:
    cfg = {"kind": "multi_turn", "num_conversations": 2, "duration_s": None, "vocab_size": 100}
    assert len(build_workload(cfg)) == 8


def test_num_requests_that_cuts_a_trace_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``num_requests`` cutting a trace file says how many it kept of how many: serve.yaml's
    default of 32 served the first 32 rows of a 40-row trace without a word."""
    from core.request import Request
    from core.workload.trace_io import write_trace

    path = tmp_path / "t.csv"
    write_trace(path, [Request(i, float(i), 10, 10) for i in range(40)])
    cfg = as_dict(compose_config(["workload=trace", f"workload.path={path}"]))["workload"]
    with caplog.at_level("INFO", logger="core.workload.spec.window"):
        assert len(build_workload({**cfg, "num_requests": 40})) == 40  # cuts nothing: silent
        assert not caplog.records
        assert len(build_workload({**cfg, "num_requests": 32})) == 32
    assert [r.getMessage() for r in caplog.records] == [
        "workload.num_requests=32 keeps the first 32 of the 40 requests in the window "
        "(workload.num_requests=null keeps them all)"
    ]


def test_a_native_trace_that_idles_before_its_first_arrival_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Native times are kept as written: a trace written in Unix seconds idles for decades
    before its first request, and offered_rate counts that; a warning says so and names the
    start_s that starts at the first arrival (a trace user study met it in silence)."""
    from core.request import Request
    from core.workload.trace_io import write_trace
    from experiments.lib.setup import build_run_workload

    path = tmp_path / "t.csv"
    workload = as_dict(compose_config(["workload=trace", f"workload.path={path}"]))["workload"]
    cfg = {"workload": workload}
    with caplog.at_level("WARNING", logger="experiments.lib.setup"):
        write_trace(path, [Request(i, 0.5 + i, 10, 10) for i in range(10)])  # from 0.5 s
        build_run_workload(cfg, max_model_len=2048)
        write_trace(path, [Request(i, 5.0 + i, 10, 10) for i in range(10)])  # 5 s of 14
        build_run_workload(cfg, max_model_len=2048)
        assert not caplog.records
        write_trace(path, [Request(i, 1000.0 + i, 10, 10) for i in range(10)])
        build_run_workload(cfg, max_model_len=2048)
        assert len(caplog.records) == 1
        assert "arrives at 1000 s and the last at 1009 s" in caplog.records[0].getMessage()
        assert "workload.start_s=1000" in caplog.records[0].getMessage()
        caplog.clear()
        cut = {"workload": {**cfg["workload"], "start_s": 1000.0}}
        assert len(build_run_workload(cut, max_model_len=2048).requests) == 10
        assert not caplog.records
