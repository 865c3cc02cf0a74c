"""Corrupted vLLM inputs from the input audit (small corrupted copies of the shared run, and
bench result JSONs): each is refused in one line naming the file and the line or key, or
gives one warning line, and the shared run itself still loads as before."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.request import RequestError
from core.workload import vllm_log
from core.workload.spec import build_workload
from core.workload.trace_io import TraceFormatError
from core.workload.vllm_bench import read_bench_result
from core.workload.vllm_log import read_token_ids, read_vllm_log
from experiments.calibrate_vllm import main, run_calibration
from experiments.lib.vllm_run import RunError, read_run, resolve_model, run_simulation
from sim.catalog import get_gpu, get_model
from sim.cost import RooflineCostModel

SHARED = Path(__file__).resolve().parents[1] / "../shared/measurements/vllm"
RUN = SHARED / "rtx4090-llama-3.1-8b"
SENT = SHARED / "sharegpt-llama-3.1-8b-300-sps10.jsonl"
needs_shared = pytest.mark.skipif(not RUN.is_dir(), reason="../shared/measurements absent")
EPOCH = 1.7e9  # the wall clock's origin is this far from the engine's monotonic one
DAY = 86400.0


class _Said:
    """A stand-in logger (Hydra apps run earlier in the suite disable module loggers)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, message: str, *args: object) -> None:
        self.lines.append(message % args if args else message)


@pytest.fixture
def said(monkeypatch: pytest.MonkeyPatch) -> _Said:
    stand_in = _Said()
    monkeypatch.setattr(vllm_log, "log", stand_in)
    return stand_in


def _copy(tmp_path: Path, keep: int | None = None) -> Path:
    """A writable copy of the shared run (its first ``keep`` requests when given)."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("meta.json", "requests.jsonl", "timeseries.csv"):
        shutil.copyfile(RUN / name, run / name)
    if keep is not None:
        _write_rows(run, _rows(run)[:keep])
    return run


def _rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]


def _write_rows(run: Path, rows: list[dict[str, Any]]) -> None:
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _edit_meta(run: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    meta = json.loads((run / "meta.json").read_text())
    edit(meta)
    (run / "meta.json").write_text(json.dumps(meta))


def _workload(
    tmp_path: Path, edit: Callable[[int, dict[str, Any]], None], separators: tuple = (", ", ": ")
) -> Path:
    """A copy of the shared workload with ``edit(row, obj)`` applied to each row."""
    out = tmp_path / "sent.jsonl"
    with out.open("w") as f:
        for row, line in enumerate(SENT.read_text().splitlines()):
            obj = json.loads(line)
            edit(row, obj)
            f.write(json.dumps(obj, separators=separators) + "\n")
    return out


def _one_line_error(run: Path, capsys: pytest.CaptureFixture, *extra: str) -> str:
    """calibrate_vllm's stderr for ``run``, checked to be one line and exit status 2."""
    out = run.parent / "out"
    assert main([str(run), "--hardware", "rtx4090", *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert not out.exists()
    return err


_BENCH: dict[str, Any] = {
    "request_rate": 10.0,
    "burstiness": 1.0,
    "duration": 20.0,
    "input_lens": [100, 120, 80, 150, 90, 60],
    "output_lens": [50, 40, 60, 10, 30, 70],
    "ttfts": [0.05, 0.04, 0.06, 0.02, 0.03, 0.05],
    "itls": [[0.01], [0.01], [0.02], [0.01], [0.01], [0.01]],
    "start_times": [1000.0, 1000.5, 1001.0, 1002.0, 1003.0, 1004.0],
}


def _bench(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "bench.json"
    doc = {k: v for k, v in (_BENCH | changes).items() if v is not None}
    path.write_text(json.dumps(doc))
    return path


# --- 1. a bench result without requests ----------------------------------------------------


def test_a_bench_result_with_empty_lists_has_no_requests(tmp_path: Path) -> None:
    empty = {k: [] for k in ("input_lens", "output_lens", "ttfts", "itls", "start_times")}
    path = _bench(tmp_path, **empty)
    with pytest.raises(TraceFormatError, match=r"bench.json, file: no requests") as info:
        build_workload({"kind": "vllm_bench", "path": str(path)})
    assert "\n" not in str(info.value)


# --- 2. one line of requests.jsonl on another clock ----------------------------------------


@needs_shared
def test_the_shared_run_loads_as_before() -> None:
    logged = read_vllm_log(RUN)
    assert len(logged) == 300 and logged[0].arrival == 0.0
    assert 29.1 < logged[-1].arrival < 29.2 and 183.5 < max(r.last_token for r in logged) < 184


@needs_shared
@pytest.mark.parametrize(
    ("shift", "keys", "message"),
    [
        (EPOCH, ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts"),
         "line 11: queued_ts on another clock"),
        (DAY, ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts"),
         "line 11: queued_ts on another clock"),
        (DAY, ("first_token_ts", "last_token_ts"),
         "line 11: engine timestamps on two clocks: first_token_ts"),
        (-DAY, ("queued_ts",), "line 11: queued_ts on another clock"),
    ],
)  # fmt: skip
def test_one_line_on_another_clock_is_refused_without_arrival_times(
    tmp_path: Path, shift: float, keys: tuple[str, ...], message: str
) -> None:
    run = _copy(tmp_path)
    rows = [{k: v for k, v in r.items() if k != "arrival_time"} for r in _rows(run)]
    for key in keys:
        rows[10][key] += shift
    _write_rows(run, rows)
    with pytest.raises(TraceFormatError, match=message) as info:
        read_vllm_log(run)
    assert "requests.jsonl" in str(info.value) and "started_at to finished_at" in str(info.value)


@needs_shared
def test_without_start_and_finish_times_the_timeseries_bounds_the_run(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    _edit_meta(run, lambda m: [m.pop("started_at"), m.pop("finished_at")])
    assert len(read_vllm_log(run)) == 300
    rows = _rows(run)
    rows[10]["first_token_ts"] += DAY
    rows[10]["last_token_ts"] += DAY
    _write_rows(run, rows)
    with pytest.raises(TraceFormatError, match=r"line 11: .*timeseries.csv's last t"):
        read_vllm_log(run)


@needs_shared
def test_a_start_time_that_is_not_a_time_names_the_key(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    _edit_meta(run, lambda m: m.update(finished_at="soon"))
    with pytest.raises(TraceFormatError, match=r"meta.json, key 'finished_at': 'soon' is not"):
        read_vllm_log(run)


# --- 3. a bench start time on another clock ------------------------------------------------


def test_a_bench_start_time_on_another_clock_names_its_entry(tmp_path: Path) -> None:
    times = [*_BENCH["start_times"][:5], _BENCH["start_times"][5] - EPOCH]
    with pytest.raises(TraceFormatError, match=r"bench.json, key 'start_times\[5\]': "):
        read_bench_result(_bench(tmp_path, start_times=times))
    assert read_bench_result(_bench(tmp_path)).start_times == _BENCH["start_times"]


# --- 4. a workload that is not the one sent ------------------------------------------------


@needs_shared
def test_a_workload_with_another_hash_gives_one_warning(tmp_path: Path, said: _Said) -> None:
    read_run(RUN, SENT)
    assert said.lines == []
    other = _workload(tmp_path, lambda row, obj: None, (",", ":"))  # re-serialized
    read_run(RUN, other)
    assert len(said.lines) == 1
    assert str(other) in said.lines[0] and "meta.json's dataset_hash" in said.lines[0]


@needs_shared
def test_a_workload_asking_fewer_tokens_than_produced_is_refused(tmp_path: Path) -> None:
    other = _workload(tmp_path, lambda row, obj: obj.update(output_toks=obj["output_toks"] - 1))
    want = r"sent.jsonl, line 1: output_toks 530 but the log's output_toks is 531 \(request 0 "
    with pytest.raises(TraceFormatError, match=want):
        read_token_ids(other, read_vllm_log(RUN))


@needs_shared
def test_requests_that_stopped_early_give_one_warning(tmp_path: Path, said: _Said) -> None:
    """A run sent without ignore_eos produces at most what each row asked for."""
    other = _workload(tmp_path, lambda row, obj: obj.update(output_toks=obj["output_toks"] + 1))
    read_token_ids(other, read_vllm_log(RUN))
    assert len(said.lines) == 1 and "300 of 300 logged requests produced fewer" in said.lines[0]


# --- 5. duplicated lines and request ids ---------------------------------------------------


@needs_shared
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda rows: rows.insert(21, rows[20]),
         "line 22: request_id 'bench-20' already on line 21"),
        (lambda rows: rows[20].update(request_id="bench-19"),
         "line 21: request_id 'bench-19' already on line 20"),
        (lambda rows: rows.append(rows[20]), "line 301: request_id 'bench-20' already on line 21"),
    ],
)  # fmt: skip
def test_a_duplicated_request_id_names_both_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture, edit: Callable, message: str
) -> None:
    run = _copy(tmp_path)
    rows = _rows(run)
    edit(rows)
    _write_rows(run, rows)
    assert _one_line_error(run, capsys).endswith(f"requests.jsonl, {message}")


# --- 6. token ids the simulation would reject ----------------------------------------------


@needs_shared
@pytest.mark.parametrize(("bad", "shown"), [(-5, "-5"), (True, "True"), ("7", "'7'")])
def test_token_ids_must_be_whole_numbers_at_least_zero(
    tmp_path: Path, bad: Any, shown: str
) -> None:
    def edit(row: int, obj: dict[str, Any]) -> None:
        if row == 7:
            obj["input_tok_ids"][3] = bad

    other = _workload(tmp_path, edit)
    with pytest.raises(TraceFormatError, match=rf"line 8: input_tok_ids\[3\] is {shown}, not a"):
        read_token_ids(other, read_vllm_log(RUN))


@needs_shared
def test_the_calibration_rejects_ids_outside_the_vocabulary_as_simulate_does(
    tmp_path: Path,
) -> None:
    def edit(row: int, obj: dict[str, Any]) -> None:
        if row == 3:
            obj["input_tok_ids"][0] = 10**9

    run_dir, sent = _copy(tmp_path, keep=12), _workload(tmp_path, edit)
    run = read_run(run_dir, sent)
    model = get_model(run.model_name)
    cost = RooflineCostModel(model, get_gpu("rtx4090"), 1, run.dtype_bytes, block_size=16)
    assert (run_simulation(run, cost, 2588)[0]["status"] == "finished").all()  # no vocabulary
    run.vocab_size = model.vocab_size
    frame = run_simulation(run, cost, 2588)[0].set_index("request_id")
    assert frame.loc[3, "status"] == "rejected" and "vocabulary" in frame.loc[3, "reject_reason"]
    assert (frame.drop(index=3)["status"] == "finished").all()
    result = run_calibration(run_dir, "rtx4090", workload=sent, plot=False)
    assert list(result["rejected_by_simulator"]) == ["3"]


# --- 7. timeseries.csv cells that are not numbers ------------------------------------------


@needs_shared
@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        (3, "lots", "timeseries.csv, line 6: running is 'lots', not a number"),
        (0, "abc", "timeseries.csv, line 6: t is 'abc', not a number"),
        (None, "1,2,3,4,5,6,7,8", "timeseries.csv: not a CSV table (Error tokenizing data."),
    ],
)
def test_timeseries_cells_must_be_numbers_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, column: int | None, value: str, message: str
) -> None:
    run = _copy(tmp_path)
    lines = (run / "timeseries.csv").read_text().splitlines()
    cells = lines[5].split(",")
    if column is None:
        lines[5] = value
    else:
        cells[column] = value
        lines[5] = ",".join(cells)
    (run / "timeseries.csv").write_text("\n".join(lines) + "\n")
    assert message in _one_line_error(run, capsys)


# --- 8. meta.json containers of the wrong type ---------------------------------------------


@needs_shared
@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("kv_cache", [2588, 16], "kv_cache must be a JSON object (read for kv_cache."),
        ("kv_cache", "num_gpu_blocks=2588", "kv_cache must be a JSON object"),
        ("engine_kwargs", "oops", "engine_kwargs must be a JSON object (read for engine_kwargs."),
        ("hardware", "rtx4090", "hardware must be a JSON object (read for hardware."),
    ],
)
def test_a_meta_container_of_the_wrong_type_is_named(
    tmp_path: Path, key: str, value: Any, message: str
) -> None:
    run = _copy(tmp_path)
    _edit_meta(run, lambda m: m.update({key: value}))
    with pytest.raises(RunError, match="meta.json: " + message.replace("(", r"\(")):
        read_run(run)


# --- 9. messages that name the right key ---------------------------------------------------


@needs_shared
def test_a_model_that_is_not_a_name_names_meta_jsons_key(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    _edit_meta(run, lambda m: m.update(model=42))
    with pytest.raises(RunError, match=r"meta.json: model must be a model name .* got 42"):
        read_run(run)


@needs_shared
def test_an_unknown_model_names_meta_jsons_key_or_the_option(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    _edit_meta(run, lambda m: m.update(model="acme/NoSuchModel-7B"))
    read = read_run(run)
    with pytest.raises(RunError, match=r"meta.json: model 'acme/NoSuchModel-7B': unknown model"):
        resolve_model(None, read)
    with pytest.raises(RunError, match=r"^--model nope: unknown model 'nope'"):
        resolve_model("nope", read)


@needs_shared
def test_a_parallel_size_that_is_not_a_number_says_so(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    _edit_meta(run, lambda m: m["engine_kwargs"].update(data_parallel_size="1"))
    with pytest.raises(RunError, match=r"engine_kwargs.data_parallel_size must be a whole number"):
        read_run(run)


def test_a_bench_list_with_an_extra_entry_is_the_one_named(tmp_path: Path) -> None:
    path = _bench(tmp_path, input_lens=[*_BENCH["input_lens"], 5])
    with pytest.raises(TraceFormatError, match=r"key 'input_lens': 7 entries, but output_lens"):
        read_bench_result(path)


def test_a_bench_file_without_request_rate_says_it_is_absent(tmp_path: Path) -> None:
    path = _bench(tmp_path, request_rate=None, start_times=None)
    with pytest.raises(RequestError, match=r"key 'request_rate': absent"):
        build_workload({"kind": "vllm_bench", "path": str(path)})
    assert len(build_workload({"kind": "vllm_bench", "path": str(path), "rate": 2.0})) == 6


# --- 10. a log shorter than meta.json's num_requests ---------------------------------------


@needs_shared
def test_a_log_shorter_than_num_requests_gives_one_warning(tmp_path: Path, said: _Said) -> None:
    read_vllm_log(RUN)
    assert said.lines == []
    run = _copy(tmp_path)
    _write_rows(run, _rows(run)[:-1])
    assert len(read_vllm_log(run)) == 299
    assert (
        len(said.lines) == 1
        and "299 requests, but meta.json's num_requests is 300" in (said.lines[0])
    )
