"""Mutation audit of the code added 2026-12-05..07 (step_compare, validate's schedule check,
offered_rate and the runs index, workload.max_total_tokens, batch_log.heard, the vectorized
integrity check): each test kills a hand-made mutant the earlier tests let through."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments import validate
from experiments.lib.checks import ConfigError
from experiments.lib.step_compare import compare_schedules, describe

ENGINE = Path(__file__).resolve().parents[1] / "docs/validation/h200/first-run/engine"


def _steps(decodes: list[int]) -> pd.DataFrame:
    n = len(decodes)
    return pd.DataFrame({"step": range(n), "decode_seqs": decodes, "num_waiting": [1] * n})


def _requests(ids: list[int], **columns: list[object]) -> pd.DataFrame:
    n = len(ids)
    base: dict[str, list[object]] = {
        "request_id": ids, "status": ["finished"] * n, "first_token_step": [1.0] * n,
        "finish_step": [5.0] * n, "num_preemptions": [0] * n,
    }  # fmt: skip
    return pd.DataFrame({**base, **columns})


# ----------------------------------------------------------------- step_compare


def test_a_differing_step_is_named_even_where_the_tables_differ_in_length() -> None:
    # mutants: the length check ran after a found step and replaced it; the last differing
    # step named instead of the first
    found = compare_schedules(_steps([1, 3, 4]), _steps([1, 2, 2, 2]), *[_requests([0])] * 2)
    assert found["first_divergence"] == {
        "step": 1, "columns": {"decode_seqs": {"engine": 3, "simulator": 2}}
    }  # fmt: skip


def test_a_request_in_one_table_only_is_named_with_the_table_it_is_in() -> None:
    # mutants: only the ids both tables hold compared; in_engine read off the other table;
    # describe naming the other body
    steps = _steps([1, 1])
    found = compare_schedules(steps, steps, _requests([0, 1, 2]), _requests([0, 2]))
    assert found["first_request_divergence"] == {
        "request_id": 1, "columns": {}, "in_engine": True
    }  # fmt: skip
    assert describe(found) == ["requests: request 1 is in the engine's table only"]
    found = compare_schedules(steps, steps, _requests([0, 2]), _requests([0, 1, 2]))
    assert found["first_request_divergence"]["in_engine"] is False
    assert describe(found)[-1] == "requests: request 1 is in the simulator's table only"


def test_the_lowest_differing_request_is_named() -> None:
    steps = _steps([1])
    engine = _requests([0, 1, 2], finish_step=[5.0, 6.0, 7.0])
    simulator = _requests([0, 1, 2], finish_step=[5.0, 9.0, 9.0])
    found = compare_schedules(steps, steps, engine, simulator)
    assert found["first_request_divergence"]["request_id"] == 1


def test_a_request_differing_only_in_its_preemptions_is_served_otherwise() -> None:
    # mutant: num_preemptions left out of REQUEST_STEPS
    steps = _steps([1])
    engine, simulator = _requests([0], num_preemptions=[0]), _requests([0], num_preemptions=[2])
    found = compare_schedules(steps, steps, engine, simulator)
    assert found["first_request_divergence"] == {
        "request_id": 0, "columns": {"num_preemptions": {"engine": 0, "simulator": 2}}
    }  # fmt: skip


def test_a_value_missing_on_one_side_only_differs_and_is_written_as_none() -> None:
    # mutants: one missing value taken as alike; NaN written as NaN (not JSON's null)
    steps = _steps([1])
    engine = _requests([0], first_token_step=[math.nan])  # rejected in the engine
    simulator = _requests([0], first_token_step=[3.0])
    found = compare_schedules(steps, steps, engine, simulator)
    assert found["first_request_divergence"] == {
        "request_id": 0, "columns": {"first_token_step": {"engine": None, "simulator": 3.0}}
    }  # fmt: skip
    assert "first_token_step: engine None, simulator 3.0" in describe(found)[-1]
    assert json.loads(json.dumps(found, allow_nan=False)) == found


def test_differing_values_are_plain_python_numbers() -> None:
    # mutant: numpy scalars kept (json.dumps refuses an int64)
    found = compare_schedules(_steps([1, 3]), _steps([1, 2]), _requests([0]), _requests([0]))
    value = found["first_divergence"]["columns"]["decode_seqs"]["engine"]
    assert type(value) is int
    json.dumps(found)


def test_beyond_three_differing_columns_describe_counts_the_rest() -> None:
    # mutants: two columns listed instead of three; the count said from three on, or all
    names = ["a", "b", "c", "d", "e"]
    engine = pd.DataFrame({"step": [0], **{c: [1] for c in names}})
    simulator = pd.DataFrame({"step": [0], **{c: [2] for c in names}})
    found = compare_schedules(engine, simulator, _requests([0]), _requests([0]))
    line = describe(found)[0]
    assert line == (
        "schedule: departs from the engine's at step 0 (a: engine 1, simulator 2; "
        "b: engine 1, simulator 2; c: engine 1, simulator 2; 2 more column(s) in "
        "validation.json)"
    )
    three = compare_schedules(engine[names[:3]], simulator[names[:3]], *[_requests([0])] * 2)
    assert "more column" not in describe(three)[0] and "c: engine 1" in describe(three)[0]


# ----------------------------------------------------------------- experiments.validate


def _parted(monkeypatch: pytest.MonkeyPatch, exact: bool, step: bool) -> None:
    """validate() returns a replay whose schedule parts (at a step, or only at a request)."""
    where = {"step": 2, "columns": {"decode_seqs": {"engine": 3, "simulator": 2}}}
    request = {"request_id": 1, "columns": {"finish_step": {"engine": 5, "simulator": 6}}}
    result = {
        "cost_model": "recorded", "comparison": [], "exact_replay_expected": exact,
        "schedule": {"steps": 4, "columns": ["decode_seqs"],
                     "first_divergence": where if step else None,
                     "first_request_divergence": request},
    }  # fmt: skip
    monkeypatch.setattr(validate, "validate", lambda *args, **kwargs: result)
    monkeypatch.setattr(validate, "read_run_config", lambda run_dir: {"system": {"name": "x"}})


@pytest.mark.parametrize("step", [True, False])
def test_an_exact_replay_parting_at_a_step_or_only_a_request_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], step: bool
) -> None:
    # mutant: only a parted step counted (a request served otherwise passed with status 0)
    _parted(monkeypatch, exact=True, step=step)
    out = tmp_path / "v.json"
    assert validate.main([str(tmp_path), "--recorded", "--out", str(out)]) == 1
    assert "x decided otherwise in the two bodies" in capsys.readouterr().err
    assert json.loads(out.read_text())["schedule"]["first_request_divergence"]["request_id"] == 1


def test_a_replay_not_expected_to_be_exact_parts_with_status_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # mutant: any parted schedule exited 1, also where validation.json says why it need not
    _parted(monkeypatch, exact=False, step=True)
    assert validate.main([str(tmp_path), "--recorded", "--out", str(tmp_path / "v.json")]) == 0
    said = capsys.readouterr()
    assert "departs from the engine's at step 2" in said.out and "decided" not in said.err


def test_tables_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    # mutant: a file passed, and mkdir then failed with a traceback after the replay
    file = tmp_path / "tables"
    file.write_text("")
    with pytest.raises(ConfigError, match="not a directory") as info:
        validate.check_tables_out(file, tmp_path / "run")
    assert info.value.key == "--tables-out"
    validate.check_tables_out(tmp_path / "new", tmp_path / "run")  # not there yet: fine


def test_an_offline_runs_arrivals_have_no_window_even_where_one_was_configured(
    tmp_path: Path,
) -> None:
    """serve offers an offline run no rate (every arrival at 0); the replay's workload has
    no window then either, where an online run's has the window that cut the trace."""
    # mutant: the configured window kept offline (the simulator then offered n / window)
    shutil.copy(ENGINE / "trace_opt-13b.csv", tmp_path)
    run = tmp_path / "run"
    shutil.copytree(ENGINE / "opt-13b_vllm_offline", run)
    cfg: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))  # type: ignore[assignment]
    cfg["workload"] |= {"duration_s": 10.0, "num_requests": None}
    offline, _ = validate.run_workload({**cfg, "mode": "offline"}, run)
    online, _ = validate.run_workload({**cfg, "mode": "online"}, run)
    assert online.window_s == 10.0 and offline.window_s is None
    assert {r.arrival_time for r in offline.requests} == {0.0}


# ----------------------------------------------------------------- core/kv/pool_integrity


@pytest.mark.parametrize("field", ["_free", "_evict_queue"])
@pytest.mark.parametrize("block", [-1, 3])
def test_a_pool_list_naming_the_first_id_past_either_end_is_named(field: str, block: int) -> None:
    # mutants: an id equal to num_blocks, or a negative one, let through (then a numpy
    # shape or bincount error instead of the pool's own message)
    from core.kv.base import KVCacheError
    from core.kv.block_pool import BlockPool

    p = BlockPool(3, 2)
    getattr(p, field).append(block)
    with pytest.raises(KVCacheError, match=rf"holds block {block}, not one of its 3 blocks"):
        p.check_integrity()


@pytest.mark.parametrize("block", [-1, 4])
def test_a_table_naming_a_block_past_either_end_of_its_pool_is_named(block: int) -> None:
    # mutants: a negative entry read as the pool's last block (numpy's -1) and counted
    from core.kv.base import KVCacheError
    from core.kv.paged import PagedKVCacheManager
    from tests.kv_helpers import make_group

    m = PagedKVCacheManager(4, 2, 2)
    g = make_group(3)
    m.allocate(g)
    m._seqs[g.seqs[0].seq_id].table[1] = block
    with pytest.raises(KVCacheError, match=rf"block {block} \(#1\) is not one of 4"):
        m.check_integrity()


# ----------------------------------------------------------------- offered_rate


def test_the_offered_rate_counts_the_rejected_requests_too(tmp_path: Path) -> None:
    # mutant: only the finished requests counted as offered
    from experiments.reproduce import compose_config
    from experiments.simulate import run

    path = tmp_path / "azure.csv"  # OPT-13B serves 2,048 tokens: the 5,000-token row is rejected
    rows = [(0.0, 100, 20), (0.5, 5000, 20), (1.0, 200, 8), (2.0, 50, 10)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{t:09.6f},{p},{o}\n" for t, p, o in rows))  # fmt: skip
    m = run(compose_config(["workload=azure_conv", f"workload.path={path}"]))
    assert (m["num_requests"], m["rejected"]) == (4, 1)
    assert m["offered_rate"] == pytest.approx(4 / 2.0)


# ----------------------------------------------------------------- workload.max_total_tokens


@pytest.mark.parametrize("kind", ["mooncake", "vidur"])
def test_the_mooncake_and_vidur_readers_apply_the_cap(tmp_path: Path, kind: str) -> None:
    # mutants: a reader that does not hand max_total_tokens on (only azure's was tested alone)
    from core.workload.spec import build_workload

    rows = [(0.0, 100, 20), (0.5, 5000, 20), (1.0, 2040, 8)]
    if kind == "mooncake":
        path = tmp_path / "trace.jsonl"
        objs = [{"timestamp": int(t * 1000), "input_length": p, "output_length": o}
                for t, p, o in rows]  # fmt: skip
        path.write_text("".join(json.dumps(obj) + "\n" for obj in objs))
    else:
        path = tmp_path / "trace.csv"
        path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(
            f"{t},{p},{o}\n" for t, p, o in rows))  # fmt: skip
    c = {"kind": kind, "path": str(path), "apply_filter": False}
    kept = build_workload({**c, "max_total_tokens": "auto"})
    assert [r.prompt_len for r in kept] == [100, 2040]
    assert len(build_workload(c)) == 3


def test_simulate_run_offers_the_rate_over_the_runs_window(tmp_path: Path) -> None:
    # mutant: simulate_run's summary over the span to the last arrival (validate()'s window
    # was fixed in 1d85596 and tested; no test read this sibling's)
    from experiments import calibrate

    shutil.copy(ENGINE / "trace_opt-13b.csv", tmp_path)
    run = tmp_path / "run"
    shutil.copytree(ENGINE / "opt-13b_vllm_offline", run)
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.mode, cfg.workload.duration_s, cfg.workload.num_requests = "online", 10.0, None
    OmegaConf.save(cfg, run / "config.yaml")
    simulated, _ = validate.simulate_run(run, calibrate.calibrate(run))
    assert simulated["offered_rate"] == pytest.approx(simulated["num_requests"] / 10.0)


# the header a runs index had before offered_rate joined it (commit c3d90fb), as written
EARLIER_HEADER = (
    "time,app,status,run_dir,overrides,completed,num_requests,rejected,request_throughput,"
    "output_throughput,normalized_latency,mean_ttft_ms,mean_tpot_ms,mean_e2el_ms,"
    "mean_batch_size,mean_step_batch,error"
)


def test_an_index_begun_before_offered_rate_is_taken_and_kept_in_its_columns(
    tmp_path: Path,
) -> None:
    # mutant: EARLIER_INDEX_COLUMNS the same as today's (the old test wrote its header from
    # that constant, so it could not tell)
    from experiments.lib import results
    from experiments.lib.cli import check_index_writable

    old = tmp_path / "index.csv"
    old.write_text(EARLIER_HEADER + "\n")
    check_index_writable(old)
    assert results.index_header_columns(old) == tuple(EARLIER_HEADER.split(","))
    results.append_index(old, "simulate", "ok", tmp_path, [], {"offered_rate": 2.0,
                                                               "completed": 3})  # fmt: skip
    header, row = old.read_text().splitlines()
    assert header == EARLIER_HEADER and len(row.split(",")) == len(header.split(","))


def test_the_cap_keeps_what_the_filter_dropped_dropped_and_is_silent_when_it_drops_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # mutants: the cap's keep mask taken alone (a row the filter dropped as too short came
    # back); a warning logged that the cap dropped 0 rows
    import logging

    from core.workload.trace_io import drop_log, read_azure_trace

    monkeypatch.setattr(drop_log, "disabled", False)
    path = tmp_path / "azure.csv"
    rows = [(0.0, 100, 20), (0.5, 2, 5), (1.0, 50, 10)]  # 2 prompt tokens: under MIN_LEN
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{t:09.6f},{p},{o}\n" for t, p, o in rows))  # fmt: skip
    with caplog.at_level(logging.WARNING, logger=drop_log.name):
        kept = read_azure_trace(path, apply_filter=True, max_total_tokens=500)
    assert [r.prompt_len for r in kept] == [100, 50]
    said = [r.getMessage() for r in caplog.records if r.name == drop_log.name]
    assert not [m for m in said if "max_total_tokens" in m], said


@pytest.mark.parametrize("text", ["{", '{"code": ["x"]}', '{"code": {"code_sha256": 1'])
def test_a_provenance_json_that_cannot_be_read_is_said_so_not_raised(
    tmp_path: Path, text: str
) -> None:
    # mutant: only a missing file or key caught (a torn or odd file raised mid-error)
    (tmp_path / "provenance.json").write_text(text)
    assert "no readable provenance.json" in validate.recording_code(tmp_path)


def test_where_a_replay_that_outran_the_recording_parted_is_said_without_a_pointer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """departure() is part of a one-line error, which validation.json is not written beside:
    beyond three differing columns it counts the rest and points nowhere."""
    # mutant: describe's default pointer " in validation.json" kept in the error
    names = ["a", "b", "c", "d"]
    engine = pd.DataFrame({"step": [0], "duration_s": [0.1], **{c: [1] for c in names}})
    replay = pd.DataFrame({"step": [0], **{c: [2] for c in names}})

    class Recorder:
        def steps_frame(self) -> pd.DataFrame:
            return replay

        def requests_frame(self) -> pd.DataFrame:
            return _requests([0])

    _requests([0]).to_csv(tmp_path / "requests.csv", index=False)
    monkeypatch.setattr(validate, "_simulate_run", lambda *args: (Recorder(), 0, None))
    said = validate.departure(tmp_path, engine)
    assert said.startswith("; schedule: departs from the engine's at step 0 (a: engine 1")
    assert said.endswith("; 1 more column(s))") and "validation.json" not in said


def test_heard_restores_the_levels_it_found() -> None:
    # mutant: the loggers left at NOTSET after the block (a silenced logger heard again in
    # every later run of the process)
    import logging

    from experiments.lib.batch_log import heard

    lg = logging.getLogger("kvlab.test_recent_mutation_gaps")
    lg.setLevel(logging.ERROR)
    with heard(lg.name):
        assert lg.level == logging.NOTSET
    assert lg.level == logging.ERROR
