"""Behaviours of the config checks, the run setup, the result files and the input stamps
(``experiments/lib``) that a mutation audit found unpinned: the boundaries of the value
rules, the key each refusal names, what a write leaves behind when it fails and what makes a
finished run unfit for reuse."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from experiments.lib import input_stamps as stamps_mod
from experiments.lib import results
from experiments.lib.checks import (
    MAX_REQUESTS,
    ConfigError,
    Facts,
    check_config,
    check_cost_keys,
    check_swap_pool,
    check_values,
    check_workload_size,
)
from experiments.lib.compose import compose_config
from experiments.lib.setup import as_dict

GIB = 1024**3


def _cfg(app: str, *overrides: str) -> dict[str, Any]:
    """The resolved config of ``app`` with ``overrides`` (a synthetic workload sized by
    its request count alone)."""
    extra = ["workload.duration_s=null"] if app == "simulate" else []
    return as_dict(compose_config(app, [*extra, *overrides]))


def _refusal(c: dict[str, Any], app: str, facts: Facts | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        check_config(c, app, facts)
    return info.value


# ---------------------------------------------------------------- value rules


def test_the_default_configs_pass_the_checks() -> None:
    """The shipped simulate and serve configs (a small synthetic workload) are accepted:
    the refusals below come from the one value each changes."""
    check_config(_cfg("simulate", "workload.num_requests=5"), "simulate")
    check_config(_cfg("serve"), "serve")


def test_a_null_seed_is_refused_by_name() -> None:
    """A key with no null meaning (``seed``) refuses null, naming the key."""
    err = _refusal(_cfg("simulate", "seed=null"), "simulate")
    assert err.key == "seed" and "null is not a value here" in err.line()


def test_a_required_key_left_out_is_missing() -> None:
    """``workload.kind`` is required: a config without it is refused as missing."""
    c = _cfg("simulate", "workload.num_requests=5")
    del c["workload"]["kind"]
    with pytest.raises(ConfigError) as info:
        check_values(c, "simulate")
    assert info.value.key == "workload.kind" and info.value.problem == "missing"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("workload.rate=0", "workload.rate"),
        ("system.watermark=1", "system.watermark"),
        ("gpu_memory_utilization=0", "gpu_memory_utilization"),
        ("system.block_size=12", "system.block_size"),
        ("workload.num_requests=true", "workload.num_requests"),
        ("slo_ms={ttft: 0}", "slo_ms.ttft"),
        ("slo_ms={}", "slo_ms"),
    ],
)
def test_values_just_outside_a_rule_are_refused(override: str, key: str) -> None:
    """Each rule's edge: a rate of 0, a watermark of 1, a utilisation of 0, a block size
    that is not a power of two, a boolean count, a zero SLO and an empty SLO mapping are
    refused under their key."""
    c = _cfg("simulate", "workload.num_requests=5", override)
    assert _refusal(c, "simulate").key == key


def test_an_infinite_rate_is_refused() -> None:
    """A non-finite number (``inf``) is not a positive rate."""
    c = _cfg("simulate", "workload.num_requests=5")
    c["workload"]["rate"] = math.inf
    assert _refusal(c, "simulate").key == "workload.rate"


def test_a_null_got_is_shown_as_null() -> None:
    """A refusal of a null value shows ``got null`` (not hidden, not Python's None)."""
    assert ConfigError("k", "p", None, "x").line() == "error: k: p (got null; expected x)"
    assert ConfigError("k", "p").line() == "error: k: p"


# ---------------------------------------------------------------- workload size and width


def _size(**workload: Any) -> None:
    check_workload_size({"workload": {"kind": "synthetic", **workload}}, "simulate", Facts())


def test_the_request_cap_is_inclusive() -> None:
    """Exactly :data:`MAX_REQUESTS` requests are allowed, one more is refused (by count,
    and by rate x duration under ``workload.rate``)."""
    _size(num_requests=MAX_REQUESTS)
    with pytest.raises(ConfigError) as info:
        _size(num_requests=MAX_REQUESTS + 1)
    assert info.value.key == "workload.num_requests"
    _size(rate=1.0, duration_s=MAX_REQUESTS)
    with pytest.raises(ConfigError) as info:
        _size(rate=1.0, duration_s=MAX_REQUESTS + 1)
    assert info.value.key == "workload.rate"


def test_a_workload_sized_twice_or_by_duration_without_rate_is_refused() -> None:
    """Both ``num_requests`` and ``duration_s`` given names ``workload.duration_s``; a
    duration without a rate names ``workload.rate``."""
    with pytest.raises(ConfigError) as info:
        _size(num_requests=5, duration_s=10)
    assert info.value.key == "workload.duration_s"
    with pytest.raises(ConfigError) as info:
        _size(duration_s=10, rate=None)
    assert info.value.key == "workload.rate"


@pytest.mark.parametrize("key", ["n", "beam_width"])
def test_a_group_as_wide_as_max_num_seqs_is_allowed_one_wider_is_not(key: str) -> None:
    """``workload.n`` / ``workload.beam_width`` equal to ``system.max_num_seqs`` pass; one
    more is refused under its own key."""
    check_config(
        _cfg("simulate", "workload.num_requests=5", "system.max_num_seqs=4", f"workload.{key}=4"),
        "simulate",
    )
    c = _cfg("simulate", "workload.num_requests=5", "system.max_num_seqs=4", f"workload.{key}=5")
    assert _refusal(c, "simulate").key == f"workload.{key}"


# ---------------------------------------------------------------- trace files


def _trace_cfg(path: str, *overrides: str) -> dict[str, Any]:
    return _cfg("simulate", "workload=trace", f"workload.path={path}", *overrides)


def test_an_empty_trace_path_asks_for_a_trace_file() -> None:
    """``workload.path=''`` is a missing path (not the working directory)."""
    c = _cfg("simulate", "workload=trace")
    c["workload"]["path"] = ""
    err = _refusal(c, "simulate")
    assert err.key == "workload.path" and "needs a trace file" in err.problem


def test_a_whitespace_only_trace_is_empty(tmp_path: Path) -> None:
    """A trace of blank lines holds no request: refused as empty."""
    trace = tmp_path / "blank.csv"
    trace.write_text("\n  \n\n")
    err = _refusal(_trace_cfg(str(trace)), "simulate")
    assert err.key == "workload.path" and err.problem == "empty"


def test_a_missing_tokens_file_is_named(tmp_path: Path) -> None:
    """A ``workload.tokens_path`` that does not exist is refused under that key."""
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_time,prompt_len,output_len\n0,0.0,10,10\n")
    c = _trace_cfg(str(trace))
    c["workload"]["tokens_path"] = str(tmp_path / "nope.jsonl")
    assert _refusal(c, "simulate").key == "workload.tokens_path"


def test_a_directory_is_not_a_trace_file(tmp_path: Path) -> None:
    """Only the ``vllm_log`` kind reads a directory; a trace kind given one is refused."""
    err = _refusal(_trace_cfg(str(tmp_path)), "simulate")
    assert err.key == "workload.path" and "directory" in err.problem


# ---------------------------------------------------------------- memory fits


def test_a_kv_budget_is_measured_against_all_tp_gpus() -> None:
    """In the simulator, ``kv_cache_gb`` may exceed one GPU's memory when ``model.tp``
    GPUs hold it (1.5 x one A100-40GB over tp=2 is accepted)."""
    c = _cfg("simulate", "workload.num_requests=5", "model=opt-13b", "model.tp=2")
    c["kv_cache_gb"] = 60.0
    check_config(c, "simulate")
    c["model"]["tp"] = 1
    assert _refusal(c, "simulate").key == "kv_cache_gb"


def test_a_kv_budget_given_twice_names_num_gpu_blocks() -> None:
    """``kv_cache_gb`` and ``num_gpu_blocks`` together are refused under
    ``num_gpu_blocks``."""
    c = _cfg("simulate", "workload.num_requests=5", "kv_cache_gb=1", "num_gpu_blocks=100")
    assert _refusal(c, "simulate").key == "num_gpu_blocks"


def _serve_weights() -> int:
    from sim.catalog import model_from_config

    return model_from_config(_cfg("serve")["model"]).num_params() * 4  # float32


def test_serve_counts_the_kv_budget_beside_the_weights() -> None:
    """The engine's weights fit the device but weights + ``kv_cache_gb`` do not: refused
    under ``model`` (the weights alone fit)."""
    facts = Facts(device_memory_bytes=GIB + _serve_weights() // 2)
    check_config(_cfg("serve", "kv_cache_gb=0.5"), "serve", facts)
    err = _refusal(_cfg("serve", "kv_cache_gb=1"), "serve", facts)
    assert err.key == "model" and "GiB of KV" in err.problem


def test_serve_sizes_num_gpu_blocks_at_the_runs_block_size() -> None:
    """A pool of ``num_gpu_blocks`` is priced at ``system.block_size``: blocks that fit at
    block size 16 do not at 32."""
    from core.model_spec import kv_bytes_per_token
    from sim.catalog import model_from_config

    spec = model_from_config(_cfg("serve")["model"])
    per_block16 = 16 * kv_bytes_per_token(spec, 4)
    facts = Facts(device_memory_bytes=_serve_weights() + 150 * per_block16)
    check_config(_cfg("serve", "num_gpu_blocks=100", "system.block_size=16"), "serve", facts)
    c = _cfg("serve", "num_gpu_blocks=100", "system.block_size=32")
    assert _refusal(c, "serve", facts).key == "num_gpu_blocks"


def test_swap_space_is_measured_in_gib_against_the_host() -> None:
    """``swap_space_gb`` above the host's memory (in bytes, GiB x 2**30) is refused."""
    facts = Facts(host_memory_bytes=GIB)
    check_config(_cfg("serve", "swap_space_gb=0.5"), "serve", facts)
    assert _refusal(_cfg("serve", "swap_space_gb=2"), "serve", facts).key == "swap_space_gb"


def test_a_checkpoint_folder_without_weight_files_is_refused(tmp_path: Path) -> None:
    """``model.path`` naming a folder with files but none of the weight suffixes is
    refused."""
    (tmp_path / "README.txt").write_text("no weights")
    c = _cfg("serve")
    c["model"]["path"] = str(tmp_path)
    err = _refusal(c, "serve")
    assert err.key == "model.path" and "no weights" in err.problem


# ---------------------------------------------------------------- the engine's device


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["step_timer=thread_cpu", "threads=2"], "step_timer"),
        (["step_timer=thread_cpu", "threads=1", "clock=wall"], "step_timer"),
        (["kv_budget_fraction=0.5"], "kv_budget_fraction"),
        (["model.tp=2"], "model.tp"),
        (["dtype=bfloat16"], "dtype"),
    ],
)
def test_engine_settings_a_cpu_run_cannot_honour(overrides: list[str], key: str) -> None:
    """On CPU: thread-CPU timing with several threads or a wall clock, a fraction of free
    CUDA memory, tensor parallelism and bfloat16 are each refused under their key."""
    assert _refusal(_cfg("serve", *overrides), "serve").key == key


# ---------------------------------------------------------------- cost keys


def test_a_null_cost_key_of_another_kind_is_not_refused() -> None:
    """Only keys given a value are refused: a null key another kind reads is fine."""
    check_cost_keys("calibrated", {"path": "x.json", "compute_efficiency": None})
    with pytest.raises(ConfigError) as info:
        check_cost_keys("calibrated", {"path": "x.json", "compute_efficiency": 0.5})
    assert info.value.key == "cost.compute_efficiency"


def test_profiled_cost_reads_a_per_step_overhead() -> None:
    """``cost=profiled`` takes ``per_step_overhead_s`` (the added time per step)."""
    check_cost_keys("profiled", {"per_step_overhead_s": 0.001})


def test_the_simulators_check_refuses_a_cost_key_its_kind_does_not_read() -> None:
    """``check_config`` itself (before any object is built) refuses ``cost.path`` under
    the roofline kind, naming ``cost.path``."""
    c = _cfg("simulate", "workload.num_requests=5")
    c["cost"]["path"] = "calibration.json"
    assert _refusal(c, "simulate").key == "cost.path"


def test_swap_preemption_needs_a_pool_of_one_block() -> None:
    """``preemption_mode=swap`` with no whole CPU block is refused; one block is enough."""
    check_swap_pool({"preemption_mode": "swap"}, 1, 0.01)
    with pytest.raises(ConfigError) as info:
        check_swap_pool({"preemption_mode": "swap"}, 0, 0.0)
    assert info.value.key == "swap_space_gb"


# ---------------------------------------------------------------- run setup


def test_an_old_and_new_kv_key_together_are_refused() -> None:
    """``kv_budget_gb`` (old name) and ``kv_cache_gb`` both set: refused under the old key;
    the old one alone moves to the new key and is cleared."""
    from experiments.lib.setup import resolve_aliases

    with pytest.raises(ConfigError) as info:
        resolve_aliases({"kv_budget_gb": 1.0, "kv_cache_gb": 2.0})
    assert info.value.key == "kv_budget_gb"
    with pytest.warns(DeprecationWarning):
        moved = resolve_aliases({"kv_budget_gb": 1.0, "kv_cache_gb": None})
    assert moved == {"kv_budget_gb": None, "kv_cache_gb": 1.0}


def test_a_malformed_tokens_file_is_named_by_its_key() -> None:
    """A trace-format error in the workload's ``tokens_path`` names
    ``workload.tokens_path``; one in another file names ``workload.path``."""
    from core.workload.trace_io import TraceFormatError
    from experiments.lib.setup import config_errors

    with pytest.raises(ConfigError) as info, config_errors({"tokens_path": "tok.jsonl"}):
        raise TraceFormatError("tok.jsonl", 3, "bad ids")
    assert info.value.key == "workload.tokens_path"
    with pytest.raises(ConfigError) as info, config_errors({"tokens_path": "tok.jsonl"}):
        raise TraceFormatError("trace.csv", 3, "bad row")
    assert info.value.key == "workload.path"


def test_max_model_len_may_equal_the_models_but_not_exceed_it() -> None:
    """``system.max_model_len`` equal to the model's maximum is served; one more is a
    ConfigError naming the key."""
    from experiments.lib.setup import served_max_model_len
    from sim.catalog import model_from_config

    model = model_from_config({"name": "opt-125m"})
    top = model.max_model_len
    assert served_max_model_len({"max_model_len": top}, model) == top
    with pytest.raises(ConfigError) as info:
        served_max_model_len({"max_model_len": top + 1}, model)
    assert info.value.key == "system.max_model_len"


def test_a_trace_whose_every_request_is_filtered_out_is_refused(tmp_path: Path) -> None:
    """A trace file that yields no request is a ConfigError on ``workload.path``, not an
    empty run."""
    from core.workload.spec import Workload
    from experiments.lib import setup

    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_time,prompt_len,output_len\n0,0.0,10,10\n")
    c = _trace_cfg(str(trace))
    original = setup.load_workload
    try:
        setup.load_workload = lambda *a, **k: Workload([])  # type: ignore[assignment]
        with pytest.raises(ConfigError) as info:
            setup.build_requests(c, 2048)
    finally:
        setup.load_workload = original  # type: ignore[assignment]
    assert info.value.key == "workload.path"


def test_late_arrivals_of_a_trace_at_scale_one_blame_the_trace() -> None:
    """Arrivals past the float64 clock's resolution name ``workload.path`` for a file at
    ``time_scale`` 1, ``workload.time_scale`` when it scales them."""
    from core.request import Request
    from experiments.lib.setup import MAX_ARRIVAL_S, check_arrivals_resolvable

    late = [Request(0, MAX_ARRIVAL_S * 2, 10, 10)]
    with pytest.raises(ConfigError) as info:
        check_arrivals_resolvable({"kind": "native", "path": "t.csv", "time_scale": 1}, late)
    assert info.value.key == "workload.path"
    with pytest.raises(ConfigError) as info:
        check_arrivals_resolvable({"kind": "native", "path": "t.csv", "time_scale": 3}, late)
    assert info.value.key == "workload.time_scale"


def _model_gpu() -> tuple[Any, Any]:
    from experiments.lib.checks import run_gpu
    from sim.catalog import model_from_config

    c = _cfg("simulate")
    return model_from_config(c["model"]), run_gpu(c["hardware"])


def test_the_roofline_prices_blocks_at_the_runs_block_size() -> None:
    """``cost=roofline`` (null keys of other kinds present) is built with the run's
    ``system.block_size``."""
    from experiments.lib.setup import make_cost_model

    model, gpu = _model_gpu()
    cost = {"kind": "roofline", "path": None, "profile": None}
    c = {"cost": cost, "system": {"name": "vllm", "block_size": 32}}
    assert make_cost_model(c, model, gpu).block_size == 32


def _calibration(tmp_path: Path, **fields: Any) -> Path:
    model, gpu = _model_gpu()
    terms = {"constant": 0.001, "linear_flop_time": 1.0, "attn_flop_time": 1.0, "byte_time": 1.0}
    doc = {"kind": "calibrated", "model": model.name, "gpu": gpu.name, "tp": 1}
    doc.update(block_size=16, coefficients=terms)
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({**doc, **fields}))
    return path


def test_a_calibrated_model_takes_the_runs_block_size(tmp_path: Path) -> None:
    """A calibration fitted at block size 16 prices a block-32 run at 32."""
    from experiments.lib.setup import make_cost_model

    model, gpu = _model_gpu()
    path = _calibration(tmp_path)
    c = {"cost": {"kind": "calibrated", "path": str(path)}, "system": {"block_size": 32}}
    assert make_cost_model(c, model, gpu).roofline.block_size == 32


@pytest.mark.parametrize(
    ("fields", "problem"),
    [({"tp": 2}, "fitted for another tp"), ({"kind": "roofline"}, "not a calibration file")],
)
def test_a_calibration_for_another_run_is_refused(
    tmp_path: Path, fields: dict[str, Any], problem: str
) -> None:
    """A calibration fitted at another tensor-parallel size, or a document of another
    kind, is refused under ``cost.path``."""
    from experiments.lib.setup import make_cost_model

    model, gpu = _model_gpu()
    cost = {"kind": "calibrated", "path": str(_calibration(tmp_path, **fields))}
    c = {"cost": cost, "system": {"block_size": 16}}
    with pytest.raises(ConfigError) as info:
        make_cost_model(c, model, gpu)
    assert info.value.key == "cost.path" and problem in info.value.problem


def test_an_empty_calibration_path_asks_for_a_file() -> None:
    """``cost=calibrated`` with ``cost.path=''`` says a calibration file is needed."""
    from experiments.lib.setup import make_cost_model

    model, gpu = _model_gpu()
    with pytest.raises(ConfigError) as info:
        make_cost_model({"cost": {"kind": "calibrated", "path": ""}, "system": {}}, model, gpu)
    assert info.value.key == "cost.path" and "needs a calibration file" in info.value.problem


def test_a_given_block_count_is_blamed_for_a_cache_that_cannot_be() -> None:
    """A KV-cache error with ``num_gpu_blocks`` given names ``num_gpu_blocks`` (before
    ``kv_cache_gb`` or a reservation)."""
    from experiments.lib.setup import capacity_error_key

    args = {"num_gpu_blocks": 10, "kv_cache_bytes": None}
    assert capacity_error_key("the KV cache holds no block", args) == "num_gpu_blocks"


def test_a_swap_pool_past_the_block_limit_names_swap_space_gb() -> None:
    """A CPU swap pool of more than MAX_BLOCKS (but under twice that) is refused under
    ``swap_space_gb``."""
    from core.kv.block_pool import MAX_BLOCKS
    from experiments.lib.setup import pool_slots
    from sim.catalog import model_from_config

    model = model_from_config({"name": "opt-125m"})

    class Cap:
        num_slots = 16 * 1000
        bytes_per_token_per_gpu = 1024

    gib = 1.5 * MAX_BLOCKS * 16 * 1024 / GIB
    c = {"system": {"block_size": 16, "preemption_mode": "recompute"}, "swap_space_gb": gib}
    with pytest.raises(ConfigError) as info:
        pool_slots(c, Cap(), model)  # type: ignore[arg-type]
    assert info.value.key == "swap_space_gb"
    c["swap_space_gb"] = 0.5 * MAX_BLOCKS * 16 * 1024 / GIB
    Cap.num_slots = 16 * int(1.5 * MAX_BLOCKS)
    with pytest.raises(ConfigError) as info:
        pool_slots(c, Cap(), model)  # type: ignore[arg-type]
    assert info.value.key == "hardware.memory_gb"


def test_a_zero_watermark_is_kept() -> None:
    """``system.watermark=0`` is a watermark of 0, not the default."""
    from experiments.lib.setup import manager_options

    assert manager_options({"watermark": 0})["watermark"] == 0.0


# ---------------------------------------------------------------- result files


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    """A write function that fails midway leaves the previous file whole and no
    ``.<name>.*.tmp`` beside it."""
    target = tmp_path / "metrics.json"
    target.write_text("old")

    def half(tmp: Path) -> None:
        tmp.write_text("ne")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        results.write_atomic(target, half)
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["metrics.json"]


def test_an_atomic_write_onto_a_folder_says_so(tmp_path: Path) -> None:
    """Writing a file where a folder is raises an OSError saying it is a folder."""
    with pytest.raises(OSError, match="is a folder"):
        results.write_atomic(tmp_path, "x")


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    return pd.DataFrame({"id": [0], "ttft": [0.5]}), pd.DataFrame({"step": [0], "t": [0.1]})


def test_a_rewrite_that_fails_leaves_no_earlier_metrics(tmp_path: Path) -> None:
    """A run written over an earlier one that fails before its end leaves no
    ``metrics.json`` (the folder is not complete with two runs' files); ``metrics.json`` is
    the last file written, after ``inputs.json``."""
    requests, steps = _frames()
    results.write_run(tmp_path, {"a": 1}, {"completed": 1}, requests, steps)
    assert results.is_complete(tmp_path)

    def broken(cfg: Any) -> dict[str, Any]:
        raise RuntimeError("stamps failed")

    original = results.input_stamps
    results.input_stamps = broken  # type: ignore[assignment]
    try:
        with pytest.raises(RuntimeError):
            results.write_run(tmp_path, {"a": 2}, {"completed": 2}, requests, steps)
    finally:
        results.input_stamps = original  # type: ignore[assignment]
    assert not results.is_complete(tmp_path)


def _finished(tmp_path: Path, cfg: dict[str, Any]) -> Path:
    requests, steps = _frames()
    return results.write_run(tmp_path / "run", cfg, {"completed": 1}, requests, steps)


def test_a_finished_run_is_reused_whatever_its_index(tmp_path: Path) -> None:
    """Where the run's index row goes is not part of the run: a config differing only in
    ``index`` reuses it; one differing elsewhere does not."""
    run = _finished(tmp_path, {"a": 1, "index": "one.csv"})
    assert results.finished_metrics(run, {"a": 1, "index": "two.csv"}) == {"completed": 1}
    assert results.finished_metrics(run, {"a": 2, "index": "one.csv"}) is None


def test_a_run_of_an_edited_input_is_not_reused(tmp_path: Path) -> None:
    """Editing the trace a finished run read makes it unfit for reuse."""
    trace = tmp_path / "trace.csv"
    trace.write_text("a\n")
    cfg = {"workload": {"path": str(trace)}}
    run = _finished(tmp_path, cfg)
    assert results.finished_metrics(run, cfg) == {"completed": 1}
    trace.write_text("ab\n")
    assert results.finished_metrics(run, cfg) is None


@pytest.mark.parametrize(
    ("name", "text"),
    [("metrics.json", "{not json"), ("config.yaml", "a: [1,\n"), ("inputs.json", "[1, 2]")],
)
def test_a_damaged_run_file_means_run_again(tmp_path: Path, name: str, text: str) -> None:
    """A damaged ``metrics.json``, an unparsable ``config.yaml`` or an ``inputs.json`` that
    is not a mapping makes the run unfit for reuse (None), never an exception."""
    run = _finished(tmp_path, {"a": 1})
    (run / name).write_text(text)
    assert results.finished_metrics(run, {"a": 1}) is None


def _index_rows(index: Path) -> list[dict[str, str]]:
    return pd.read_csv(index, dtype=str, keep_default_na=False).to_dict("records")


def test_the_index_has_one_header_and_formats_its_cells(tmp_path: Path) -> None:
    """Two rows under one header; a float metric to 6 significant digits; a refused
    command's ``run_dir`` is empty."""
    index = tmp_path / "index.csv"
    results.append_index(index, "simulate", "ok", tmp_path, ["a=1"], {"mean_ttft_ms": 1 / 3})
    results.append_index(index, "simulate", "config error", None, [], None, "error: x")
    assert index.read_text().count("time,app,status") == 1
    first, second = _index_rows(index)
    assert first["mean_ttft_ms"] == "0.333333" and second["run_dir"] == ""


def test_clear_run_removes_the_stamps_and_killed_writes(tmp_path: Path) -> None:
    """``clear_run`` removes an earlier run's ``inputs.json`` and the ``.<file>.*.tmp``
    of its killed writes, and leaves other files."""
    for name in ("inputs.json", ".steps.csv.abc.tmp", "steps.csv.abc.tmp", "notes.txt"):
        (tmp_path / name).write_text("x")
    results.clear_run(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "steps.csv.abc.tmp"]


def test_non_finite_numbers_become_null_in_json_and_empty_in_csv(tmp_path: Path) -> None:
    """NaN and infinity are written as JSON null (inside lists too) and an empty CSV cell:
    the files stay valid JSON and CSV."""
    results.write_json(tmp_path / "m.json", {"a": math.nan, "b": [1.0, math.inf]})
    assert json.loads((tmp_path / "m.json").read_text()) == {"a": None, "b": [1.0, None]}
    results.write_csv(tmp_path / "s.csv", pd.DataFrame({"x": [1.0, math.nan], "y": [1, 2]}))
    assert (tmp_path / "s.csv").read_text().splitlines() == ["x,y", "1.0,1", ",2"]


def test_rejection_text_leaves_out_zero_counts() -> None:
    """Only the reasons with requests are listed."""
    text = results.rejection_text({"rejected_max_model_len": 2, "rejected_kv_cache": 0})
    assert text == "; rejected: 2 over max_model_len"


def test_an_error_text_ends_with_one_newline(tmp_path: Path) -> None:
    """``error.txt`` ends with exactly one newline whether or not the text had one."""
    results.write_error(tmp_path, "boom\n")
    assert (tmp_path / "error.txt").read_text() == "boom\n"


# ---------------------------------------------------------------- input stamps


def test_a_relative_input_is_found_from_the_working_directory_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path that exists both here and under the repository is read from here."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("mine")
    assert (stamps_mod.REPO / "README.md").exists()
    assert stamps_mod.located_input("README.md") == Path("README.md")


def test_a_stamp_notices_a_new_time_or_a_new_size(tmp_path: Path) -> None:
    """Same size, new mtime: a new stamp; new size, same mtime: a new stamp."""
    f = tmp_path / "trace.csv"
    f.write_text("abc")
    os.utime(f, ns=(10**18, 10**18))
    before = stamps_mod._stamp(f)
    os.utime(f, ns=(2 * 10**18, 2 * 10**18))
    assert stamps_mod._stamp(f) != before
    f.write_text("abcd")
    os.utime(f, ns=(10**18, 10**18))
    assert stamps_mod._stamp(f) != before


def test_a_directory_stamp_covers_nested_files(tmp_path: Path) -> None:
    """Every file under a directory input is stamped, nested ones included."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.json").write_text("{}")
    assert [row[0] for row in stamps_mod._stamp(tmp_path)] == ["sub/x.json"]


def test_the_sources_digest_sees_renames_and_nested_modules(tmp_path: Path) -> None:
    """Renaming a file, or editing a ``.py`` in a subpackage, changes the digest."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("y = 1\n")
    digest = stamps_mod.sources_digest([tmp_path / "pkg"], tmp_path)
    (tmp_path / "pkg" / "sub" / "b.py").write_text("y = 2\n")
    edited = stamps_mod.sources_digest([tmp_path / "pkg"], tmp_path)
    assert edited != digest
    (tmp_path / "pkg" / "a.py").rename(tmp_path / "pkg" / "c.py")
    assert stamps_mod.sources_digest([tmp_path / "pkg"], tmp_path) != edited


def test_the_code_digest_covers_the_experiments_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edit under ``experiments/lib`` (the apps' library) changes the code stamp."""
    (tmp_path / "experiments" / "lib").mkdir(parents=True)
    lib = tmp_path / "experiments" / "lib" / "setup.py"
    lib.write_text("a = 1\n")
    monkeypatch.setattr(stamps_mod, "REPO", tmp_path)
    before = stamps_mod.code_digest.__wrapped__()
    lib.write_text("a = 2\n")
    assert stamps_mod.code_digest.__wrapped__() != before


def test_a_plugin_stamp_covers_its_whole_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``system.plugin=pkg.mod`` is stamped over all of ``pkg/``: editing a helper module
    beside it changes the stamp that ``input_stamps`` records."""
    pkg = tmp_path / "kvlab_audit_plugin_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("from . import helper\n")
    (pkg / "helper.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = {"system": {"plugin": "kvlab_audit_plugin_pkg.mod"}}
    before = stamps_mod.input_stamps(cfg)["system.plugin"]
    (pkg / "helper.py").write_text("x = 2\n")
    assert stamps_mod.input_stamps(cfg)["system.plugin"] != before


def test_a_checkpoint_path_is_stamped(tmp_path: Path) -> None:
    """``model.path`` (a checkpoint) is one of the stamped inputs."""
    (tmp_path / "w.safetensors").write_text("w")
    stamps = stamps_mod.input_stamps({"model": {"path": str(tmp_path)}})
    assert stamps["model.path"][0][0] == "w.safetensors"


def test_a_run_priced_by_an_edited_calibration_profile_is_not_reused(tmp_path: Path) -> None:
    """A calibration file (``cost.path``) may build on an operator profile (its
    ``profile``, beside it): the run reads that profile too, so editing it makes the
    finished run unfit for reuse, as editing the calibration file does."""
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "ops.csv").write_text("op,seconds\nmlp,0.001\n")
    calibration = tmp_path / "calibration.json"
    doc = {"kind": "calibrated", "model": "opt-13b", "coefficients": {}, "profile": "profile"}
    calibration.write_text(json.dumps(doc))
    cfg = {"cost": {"kind": "calibrated", "path": str(calibration)}}
    run = _finished(tmp_path, cfg)
    assert results.finished_metrics(run, cfg) == {"completed": 1}
    (profile / "ops.csv").write_text("op,seconds\nmlp,9.999\n")
    assert results.finished_metrics(run, cfg) is None


def test_a_moved_absolute_profile_is_found_by_its_longest_tail_nearby(tmp_path: Path) -> None:
    """An absolute ``profile`` missing here is looked for by its trailing parts beside the
    calibration file, the longest tail first, and in the folder above; never higher."""
    from experiments.lib.setup import with_profile_found

    here = tmp_path / "call" / "engine"
    (here / "b" / "profile").mkdir(parents=True)
    (here / "profile").mkdir()
    doc = {"profile": "/nowhere-kvlab-audit/a/b/profile"}
    found = with_profile_found(doc, here / "calibration.json")
    assert found["profile"] == str(here / "b" / "profile")
    far = tmp_path / "x" / "call" / "engine"
    far.mkdir(parents=True)
    (tmp_path / "x" / "profile").mkdir()
    assert with_profile_found(doc, far / "calibration.json") == doc


def test_a_token_budget_below_max_model_len_also_offers_a_shorter_context() -> None:
    """A token budget below the served length is refused under
    ``system.max_num_batched_tokens``, with lowering ``system.max_model_len`` as the other
    way out."""
    from experiments.lib.setup import scheduler_config

    system = {"name": "vllm", "max_num_batched_tokens": 512, "max_num_seqs": 8}
    with pytest.raises(ConfigError) as info:
        scheduler_config(system, 2048)
    assert info.value.key == "system.max_num_batched_tokens"
    assert info.value.problem.endswith("(or set system.max_model_len lower)")
