"""A vLLM run directory with engine timestamps on two clocks, meta.json settings of the wrong
kind, settings only ``resolved_config`` holds, and ``--hardware`` contradicting the device
meta.json names: each is refused in one line naming the file and key, or read as vLLM ran."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.workload.trace_io import TraceFormatError
from core.workload.vllm_log import SECONDS_PER_TOKEN_BOUND, read_vllm_log
from experiments.calibrate_vllm import main
from experiments.lib.vllm_run import (
    BLOCK_COUNT,
    RunError,
    check_device,
    num_blocks,
    read_run,
    resolve_gpu,
)
from sim.catalog import CONFIGS, get_model

EPOCH = 1.7e9  # the wall clock's origin is this far from the engine's monotonic one
RTX4090 = "NVIDIA GeForce RTX 4090"


def _rows(n: int = 6) -> list[dict[str, Any]]:
    """``n`` requests on one engine clock, 0.5 s apart, 64 prompt and 8 output tokens."""
    rows = []
    for i in range(n):
        q = 100.0 + 0.5 * i
        rows.append({
            "request_id": f"bench-{i}", "input_toks": 64, "output_toks": 8,
            "arrival_time": EPOCH + q, "queued_ts": q, "scheduled_ts": q,
            "first_token_ts": q + 0.05, "last_token_ts": q + 0.05 + 7 * 0.02,
        })  # fmt: skip
    return rows


def _meta() -> dict[str, Any]:
    return {
        "model": "meta-llama/Llama-3.1-8B",
        "engine_kwargs": {
            "max_num_seqs": 16, "max_num_batched_tokens": 256, "max_model_len": 4096,
            "dtype": "bfloat16", "tensor_parallel_size": 1,
        },
        "kv_cache": {"num_gpu_blocks": 400, "block_size": 16, "enable_prefix_caching": True,
                     "gpu_memory_utilization": 0.9},
        "hardware": {"device_name": RTX4090, "device_total_memory_bytes": 25250627584},
        "resolved_config": {"scheduler_config": {"enable_chunked_prefill": True}},
    }  # fmt: skip


def _run(tmp_path: Path, rows: list[dict] | None = None, edit: Callable | None = None) -> Path:
    run = tmp_path / "run"
    run.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps(r) for r in (_rows() if rows is None else rows))
    (run / "requests.jsonl").write_text("\n".join(lines) + "\n")
    meta = _meta()
    if edit is not None:
        edit(meta)
    (run / "meta.json").write_text(json.dumps(meta))
    return run


# --- 1. engine timestamps on two clocks --------------------------------------------------


def test_token_times_on_another_clock_are_refused(tmp_path: Path) -> None:
    rows = _rows()
    for r in rows:  # first and last token times on the wall clock, as arrival_time is
        r["first_token_ts"] += EPOCH
        r["last_token_ts"] += EPOCH
    with pytest.raises(TraceFormatError) as info:
        read_vllm_log(_run(tmp_path, rows))
    message = str(info.value)
    assert "requests.jsonl, line 6: engine timestamps on two clocks: first_token_ts" in message
    assert "\n" not in message
    # one request's last token alone on the other clock: its line and key are named
    rows = _rows()
    rows[2]["last_token_ts"] += EPOCH
    with pytest.raises(TraceFormatError, match=r"line 3: engine timestamps on two clocks: "
                                               r"last_token_ts"):  # fmt: skip
        read_vllm_log(_run(tmp_path, rows))


def test_a_one_clock_run_ending_long_after_its_arrivals_is_kept(tmp_path: Path) -> None:
    """A burst whose last token comes long after the last arrival, but within the bound
    (the span of queued_ts plus SECONDS_PER_TOKEN_BOUND per token), is one clock."""
    rows = _rows(2)
    tokens = sum(r["input_toks"] + r["output_toks"] for r in rows)
    late = rows[-1]["queued_ts"] + 0.9 * tokens * SECONDS_PER_TOKEN_BOUND
    rows[0]["last_token_ts"] = late
    assert read_vllm_log(_run(tmp_path, rows))[0].e2e == pytest.approx(late - 100.0)
    rows[0]["last_token_ts"] = late + 0.2 * tokens * SECONDS_PER_TOKEN_BOUND
    with pytest.raises(TraceFormatError, match="line 1: engine timestamps on two clocks"):
        read_vllm_log(_run(tmp_path, rows))


def test_the_calibration_refuses_a_mixed_clock_run_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    rows = _rows()
    for r in rows:
        r["first_token_ts"] += EPOCH
        r["last_token_ts"] += EPOCH
    run = _run(tmp_path, rows)
    assert main([str(run), "--hardware", "rtx4090", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "requests.jsonl, line 6: engine timestamps on two clocks" in err
    assert "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


# --- 2. and 3. meta.json settings of the wrong kind ---------------------------------------


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def edit(meta: dict) -> None:
        node = meta
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return edit


@pytest.mark.parametrize(
    ("key", "value", "want"),
    [
        ("engine_kwargs.max_num_seqs", "abc", "a whole number >= 1"),
        ("engine_kwargs.max_num_seqs", 2.7, "a whole number >= 1"),
        ("engine_kwargs.max_num_batched_tokens", True, "a whole number >= 1"),
        ("engine_kwargs.tensor_parallel_size", "two", "a whole number >= 1"),
        ("engine_kwargs.tensor_parallel_size", 0, "a whole number >= 1"),
        ("hardware.device_total_memory_bytes", "lots", "a whole number >= 1"),
        ("kv_cache.gpu_memory_utilization", "x", "a number in (0, 1]"),
        ("kv_cache.gpu_memory_utilization", 2.0, "a number in (0, 1]"),
        ("kv_cache.num_gpu_blocks", "2588", BLOCK_COUNT.what),
        ("kv_cache.num_gpu_blocks", 1e12, BLOCK_COUNT.what),
        ("kv_cache.block_size", 0, "a power of two >= 1 (16, 32, ...)"),
        ("kv_cache.block_size", 24, "a power of two >= 1 (16, 32, ...)"),
        ("resolved_config.scheduler_config.enable_chunked_prefill", "false",
         "true or false (a JSON boolean)"),
        ("kv_cache.enable_prefix_caching", "false", "true or false (a JSON boolean)"),
        ("engine_kwargs.enforce_eager", "false", "true or false (a JSON boolean)"),
        ("engine_kwargs.enforce_eager", 0, "true or false (a JSON boolean)"),
    ],
)  # fmt: skip
def test_meta_values_of_the_wrong_kind_name_file_and_key(
    tmp_path: Path, key: str, value: Any, want: str
) -> None:
    run = _run(tmp_path, edit=_set(key, value))
    with pytest.raises(RunError) as info:
        read_run(run)
    assert str(info.value) == f"{run / 'meta.json'}: {key} must be {want}, got {value!r}"


def test_a_bad_meta_value_is_one_line_from_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = _run(tmp_path, edit=_set("engine_kwargs.max_num_seqs", "abc"))
    assert main([str(run), "--hardware", "rtx4090", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"calibrate_vllm: error: {run / 'meta.json'}: engine_kwargs.max_num_seqs "
                   "must be a whole number >= 1, got 'abc'")  # fmt: skip


def test_settings_fall_back_to_the_resolved_config(tmp_path: Path) -> None:
    """Without kv_cache and engine_kwargs entries, vLLM's resolved_config says what ran
    (as the shared run's meta.json nests it); whole floats and JSON booleans are read."""

    def edit(meta: dict) -> None:
        del meta["kv_cache"]
        del meta["engine_kwargs"]["tensor_parallel_size"]
        meta["engine_kwargs"]["max_num_seqs"] = 16.0
        meta["resolved_config"].update(
            cache_config={"block_size": 32, "enable_prefix_caching": False,
                          "num_gpu_blocks": 777, "gpu_memory_utilization": 0.8},
            parallel_config={"tensor_parallel_size": 2},
            model_config={"enforce_eager": True},
        )  # fmt: skip
        meta["resolved_config"]["scheduler_config"]["enable_chunked_prefill"] = False
        meta["engine_kwargs"]["max_num_batched_tokens"] = 4096

    run = read_run(_run(tmp_path, edit=edit))
    assert run.block_size == 32 and run.num_gpu_blocks == 777 and run.tp == 2
    assert run.system["enable_prefix_caching"] is False
    assert run.system["chunked_prefill"] is False
    assert run.system["max_num_seqs"] == 16 and isinstance(run.system["max_num_seqs"], int)
    assert run.gpu_memory_utilization == 0.8 and run.cuda_graph_max_size == 0


def test_the_resolved_config_is_checked_like_the_rest(tmp_path: Path) -> None:
    key = "resolved_config.parallel_config.tensor_parallel_size"

    def edit(meta: dict) -> None:
        del meta["engine_kwargs"]["tensor_parallel_size"]
        _set(key, "2")(meta)

    run = _run(tmp_path, edit=edit)
    with pytest.raises(RunError, match=rf"meta.json: {key} must be a whole number >= 1, got '2'"):
        read_run(run)


def test_a_max_model_len_the_kv_cache_cannot_hold_names_its_key(tmp_path: Path) -> None:
    """vLLM refuses to start with a max_model_len its cache cannot hold; a meta.json saying
    otherwise was blamed on the simulator's system.max_model_len (or, past 2**26 blocks, on
    the simulator's BlockPool)."""
    run = _run(tmp_path, edit=_set("engine_kwargs.max_model_len", 10**9))
    with pytest.raises(RunError) as info:
        read_run(run)
    assert str(info.value) == (
        f"{run / 'meta.json'}: engine_kwargs.max_model_len 1000000000 is more tokens than the "
        "KV cache holds (kv_cache.num_gpu_blocks 400 blocks × 16 = 6400): vLLM does not start so"
    )
    unrecorded = read_run(_run(tmp_path / "e", edit=lambda meta: (
        meta["kv_cache"].pop("num_gpu_blocks"), _set("engine_kwargs.max_model_len", 10**6)(meta)
    )))  # fmt: skip
    with pytest.raises(RunError, match=r"meta.json: engine_kwargs.max_model_len 1000000 is "
                                       r"more tokens than kvlab's estimate"):  # fmt: skip
        num_blocks(unrecorded, get_model("llama-3.1-8b"), resolve_gpu("rtx4090"))


def test_a_tensor_parallel_size_recorded_twice_in_disagreement_is_noted(tmp_path: Path) -> None:
    run = read_run(_run(tmp_path, edit=_set("resolved_config.parallel_config."
                                            "tensor_parallel_size", 2)))  # fmt: skip
    assert run.tp == 1 and len(run.notes) == 1
    assert run.notes[0].endswith(
        "engine_kwargs.tensor_parallel_size 1 and resolved_config.parallel_config."
        "tensor_parallel_size 2 disagree: the run is simulated with tp=1 "
        "(engine_kwargs.tensor_parallel_size)"
    )
    few = read_run(_run(tmp_path / "d", edit=lambda meta: (
        _set("engine_kwargs.tensor_parallel_size", 2)(meta),
        _set("hardware.device_count", 1)(meta),
    )))  # fmt: skip
    assert few.tp == 2 and len(few.notes) == 1
    assert few.notes[0].endswith(
        "tensor-parallel size 2 is more than hardware.device_count 1: the run is simulated "
        "with tp=2 (engine_kwargs.tensor_parallel_size)"
    )
    both = read_run(_run(tmp_path / "b", edit=lambda meta: (
        _set("engine_kwargs.tensor_parallel_size", 2)(meta),
        _set("resolved_config.parallel_config.tensor_parallel_size", 1)(meta),
        _set("hardware.device_count", 1)(meta),
    )))  # fmt: skip
    assert [n.split(": ", 1)[1].split(" ", 1)[0] for n in both.notes] == [
        "engine_kwargs.tensor_parallel_size",
        "tensor-parallel",
    ]  # the record in disagreement, then the devices too few: neither hides the other
    assert read_run(_run(tmp_path / "ok")).notes == []
    with pytest.raises(RunError, match=r"hardware\.device_count must be a whole number >= 1, "
                                       r"got 0$"):  # fmt: skip
        read_run(_run(tmp_path / "z", edit=_set("hardware.device_count", 0)))


# --- 4. --hardware against meta.json's device ----------------------------------------------


def test_hardware_contradicting_the_device_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = _run(tmp_path)
    assert main([str(run), "--hardware", "h200", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"calibrate_vllm: error: {run / 'meta.json'}: hardware.device_name {RTX4090!r} is the "
        "catalog's rtx4090 but --hardware is h200: pass --hardware rtx4090, or add "
        "--allow-device-mismatch to simulate the run on h200 deliberately"
    )
    assert not (tmp_path / "o").exists()


def test_a_deliberate_mismatch_runs_with_a_note(tmp_path: Path) -> None:
    run = _run(tmp_path)
    out = tmp_path / "o"
    assert main([str(run), "--hardware", "h200", "--allow-device-mismatch", "--out", str(out)]) == 0
    notes = json.loads((out / "errors.json").read_text())["notes"]
    assert any(n.startswith("--allow-device-mismatch: the run is simulated on h200") for n in notes)


def test_device_checks_note_what_they_cannot_check(tmp_path: Path) -> None:
    run = read_run(_run(tmp_path))
    assert check_device(run, resolve_gpu("rtx4090"), "rtx4090") is None
    assert check_device(run, resolve_gpu(RTX4090), RTX4090) is None
    # a YAML without the device among its device_names: a note, no refusal
    doc = yaml.safe_load((CONFIGS / "hardware" / "rtx4090.yaml").read_text())
    doc.pop("device_names")
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(doc))
    mine = str(tmp_path / "mine.yaml")
    note = check_device(run, resolve_gpu(mine), mine)
    assert note is not None and "not checked" in note and RTX4090 in note
    # a device the catalog does not know: a note, no refusal
    unknown = read_run(_run(tmp_path / "u", edit=_set("hardware.device_name", "Some GPU 9")))
    note = check_device(unknown, resolve_gpu("h200"), "h200")
    assert note is not None and "'Some GPU 9' is not in the hardware catalog" in note
    # no device recorded: nothing to check
    bare = read_run(_run(tmp_path / "b", edit=lambda m: m.pop("hardware")))
    assert check_device(bare, resolve_gpu("h200"), "h200") is None


def test_kv_cache_memory_bytes_sizes_the_cache_without_a_block_count(tmp_path: Path) -> None:
    """vLLM's kv_cache_memory_bytes (per GPU) takes the place of gpu_memory_utilization's
    accounting: without a recorded block count the cache is that many bytes."""

    def sized(meta: dict[str, Any]) -> None:
        meta["kv_cache"].pop("num_gpu_blocks")
        meta["kv_cache"]["kv_cache_memory_bytes"] = 2 * 1024**3

    run = read_run(_run(tmp_path, edit=sized))
    assert run.kv_cache_memory_bytes == 2 * 1024**3
    blocks, text = num_blocks(run, get_model("llama-3.1-8b"), resolve_gpu("rtx4090"))
    assert blocks == 2 * 1024**3 // (16 * 131072)  # Llama-3.1-8B bf16: 128 KiB a token
    assert "(given)" in text
