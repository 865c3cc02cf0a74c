"""Behaviour of the path that holds kvlab's predictions against a real vLLM run
(sim/capacity.py, sim/catalog.py, core/workload/vllm_log.py, experiments/calibrate_vllm.py)
that a mutation audit found no test pinned down: each test here fails under a mutant of
the code it exercises and passes on the code as it stands."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from core.model_spec import ModelSpec
from core.workload.trace_io import TraceFormatError
from core.workload.vllm_bench import read_bench_result
from core.workload.vllm_log import (
    CLOCK_TOLERANCE_S,
    SECONDS_PER_TOKEN_BOUND,
    LoggedRequest,
    check_dataset_hash,
    read_token_ids,
    read_vllm_log,
    run_duration,
)
from experiments.calibrate_vllm import (
    METRICS,
    part_metrics,
    rejection_note,
    relative_errors,
    run_calibration,
    simulate_command,
    split_ids,
)
from experiments.lib.vllm_run import RunError, read_run
from sim.capacity import (
    SAMPLER_BYTES_PER_LOGIT,
    DoesNotFit,
    activation_bytes,
    kv_capacity,
    replicated_kv_params,
    table1,
)
from sim.catalog import (
    GIB,
    HardwareError,
    get_gpu,
    get_model,
    gpu_from_config,
    model_from_config,
    resolve_gpu,
)
from tests.test_calibrate_vllm import _fake_run
from tests.test_vllm_log import _row as _log_row

# --- sim/capacity.py --------------------------------------------------------------------


def _tiny(name: str = "tiny-opt", **changes: Any) -> ModelSpec:
    return replace(get_model(name), **changes)


def test_replicated_kv_heads_carry_their_biases_where_the_model_has_them() -> None:
    """A model with q/k/v biases (``attention_bias``) whose KV heads are replicated over tp
    holds, per layer and per K and V, one bias element per replicated output beyond its
    even share: ``2 × (hidden + 1) × excess``; ``biases=False`` counts the matmuls only."""
    plain = get_model("llama-3.1-70b")
    biased = replace(plain, attention_bias=True)
    excess = plain.head_dim - plain.kv_size / 16
    matmuls = plain.num_layers * 2 * plain.hidden_size * excess
    assert replicated_kv_params(plain, 16) == matmuls
    assert replicated_kv_params(biased, 16, biases=False) == matmuls
    assert (
        replicated_kv_params(biased, 16) == plain.num_layers * 2 * (plain.hidden_size + 1) * excess
    )


def test_the_sampler_samples_at_most_one_row_per_batched_token() -> None:
    """The profile run's sampler has ``min(max_num_batched_tokens, max_num_seqs)`` rows:
    a token budget below max_num_seqs bounds the rows (and so the logits) it holds."""
    model = get_model("llama-3.1-8b")
    assert activation_bytes(model, 1, 100, 256) == activation_bytes(model, 1, 100, 100)
    sampler = 100 * model.vocab_size * SAMPLER_BYTES_PER_LOGIT
    assert activation_bytes(model, 1, 100, 256) == sampler + 100 * model.hidden_size * 2


def test_the_forward_peak_holds_q_and_both_k_and_v_when_qkv_is_the_widest() -> None:
    """Where the QKV output (``q/tp + 2 × kv_width``) is wider than the MLP's, it makes the
    forward peak: ``T × (2 × hidden + q + 2 × kv)`` in dtype bytes."""
    model = _tiny(ffn_hidden_size=32)  # MLP: (1 + 1) × 32 = 64 < QKV: 64 + 2 × 64
    t = 100
    expected = t * (2 * model.hidden_size + model.q_size + 2 * model.kv_size) * 2
    assert activation_bytes(model, 1, t, 0) == expected


def test_weights_per_gpu_are_rounded_up_to_whole_bytes() -> None:
    """A weight total that does not split evenly over tp counts the larger share:
    ``ceil(num_params × dtype / tp)`` bytes per GPU."""
    model = _tiny(name="tiny-opt", hidden_size=70, num_heads=5, num_kv_heads=5, head_dim=14)
    total = model.num_params() * 2
    assert total % 5  # the case the rounding decides
    cap = kv_capacity(model, "a100-40gb", tp=5)
    assert cap.weight_bytes == -(-total // 5)


def test_a_gpu_exactly_big_enough_at_full_use_is_offered_utilization_one() -> None:
    """Where the reserved memory and one max_model_len sequence exactly fill the device,
    the error at a lower utilization offers 1.00, and 1.00 then holds that sequence."""
    model = get_model("opt-125m")
    base = get_gpu("a100-40gb")
    probe = kv_capacity(model, base, max_model_len=2048)
    reserved = probe.weight_bytes + probe.activation_bytes
    gpu = replace(base, memory_bytes=reserved + 2048 * probe.bytes_per_token_per_gpu,
                  reported_memory_bytes=None)  # fmt: skip
    with pytest.raises(ValueError, match=r"raise gpu_memory_utilization to 1\.00"):
        kv_capacity(model, gpu, max_model_len=2048)
    assert kv_capacity(model, gpu, max_model_len=2048, gpu_memory_utilization=1.0).num_slots == 2048


def test_reserved_memory_that_exactly_fills_the_usable_share_does_not_fit() -> None:
    """Weights and activations equal to the usable memory leave no cache at all: that is
    :class:`DoesNotFit` (the weights-and-reservations error), not an empty cache."""
    model = get_model("opt-125m")
    base = get_gpu("a100-40gb")
    probe = kv_capacity(model, base, max_model_len=2048)
    reserved = probe.weight_bytes + probe.activation_bytes
    gpu = replace(base, memory_bytes=reserved, reported_memory_bytes=None)
    with pytest.raises(DoesNotFit, match="does not fit"):
        kv_capacity(model, gpu, max_model_len=2048, gpu_memory_utilization=1.0)


def test_a_forward_pass_too_large_is_named_as_the_peak() -> None:
    """When the profile run's forward pass (its max_num_batched_tokens tokens) makes the
    activations' peak, :class:`DoesNotFit` says so (``peak == "forward"``) and names the
    token budget, not the sampler."""
    with pytest.raises(DoesNotFit) as info:
        kv_capacity("opt-13b", "a100-40gb", max_num_batched_tokens=262144, max_num_seqs=1)
    assert info.value.peak == "forward"
    assert "a profile run of 262144 tokens (max_num_batched_tokens)" in str(info.value)
    assert "sampler" not in str(info.value)


def test_the_sampler_peak_names_the_rows_it_samples() -> None:
    """The sampler's rows are ``min(max_num_batched_tokens, max_num_seqs)``: with a token
    budget of 200 under 256 sequences the message names 200 rows, then offers the
    utilization as the other way out ("; or ...")."""
    with pytest.raises(DoesNotFit) as info:
        kv_capacity("opt-13b", "a100-40gb", gpu_memory_utilization=0.6,
                    max_num_batched_tokens=200, max_num_seqs=256)  # fmt: skip
    assert info.value.peak == "sampler"
    assert "sampler on 200 rows (max_num_seqs)" in str(info.value)
    assert str(info.value).endswith("× 50272 logits; or raise gpu_memory_utilization to 0.65")


def test_non_torch_memory_that_leaves_no_room_is_not_blamed_on_activations() -> None:
    """Weights plus non-torch memory beyond the usable share: the weights and reservations
    do not fit whatever the profile run, so no activation peak is named (``peak`` None)."""
    with pytest.raises(DoesNotFit) as info:
        kv_capacity("opt-13b", "a100-40gb", non_torch_bytes=20 * GIB)
    assert info.value.peak is None
    assert "the weights fit" not in str(info.value)


def test_a_given_cache_and_the_weights_must_fit_the_gpu_together() -> None:
    """A given cache smaller than the GPU is still refused when it and the weights exceed
    the device total (OPT-13B's 24 GiB of weights plus a 20 GiB cache on 40 GiB)."""
    with pytest.raises(ValueError, match=r"the given KV cache \(20\.00 GiB per GPU\) and"):
        kv_capacity("opt-13b", "a100-40gb", kv_cache_bytes=20 * GIB)
    blocks = 20 * GIB // (16 * 2 * 40 * 5120 * 2)
    with pytest.raises(ValueError, match="the given KV cache"):
        kv_capacity("opt-13b", "a100-40gb", num_gpu_blocks=blocks)


def test_shortening_the_context_is_advised_only_when_a_block_fits() -> None:
    """A cache with whole blocks but fewer than one max_model_len sequence is told to lower
    max_model_len; one with no whole block at all is not (no context length would fit)."""
    per_token = 2 * 12 * 768 * 2  # opt-125m
    with pytest.raises(ValueError) as some:
        kv_capacity("opt-125m", "a100-40gb", kv_cache_bytes=160 * per_token, max_model_len=2048)
    assert "lower system.max_model_len" in str(some.value)
    with pytest.raises(ValueError) as none:
        kv_capacity("opt-125m", "a100-40gb", kv_cache_bytes=15 * per_token, max_model_len=2048)
    assert "lower system.max_model_len" not in str(none.value)
    assert str(none.value).endswith("give a larger cache")


def test_no_utilization_is_offered_when_whole_blocks_would_not_fit_the_whole_gpu() -> None:
    """max_model_len 2040 needs 128 whole blocks of 16 (2048 slots): a GPU with room for
    2040 slots but not 2048 beside the reserved memory is too small at any utilization,
    so no raised utilization is offered."""
    model = get_model("opt-125m")
    base = get_gpu("a100-40gb")
    probe = kv_capacity(model, base, max_model_len=2040)
    reserved = probe.weight_bytes + probe.activation_bytes
    gpu = replace(base, memory_bytes=reserved + 2040 * probe.bytes_per_token_per_gpu,
                  reported_memory_bytes=None)  # fmt: skip
    with pytest.raises(ValueError) as info:
        kv_capacity(model, gpu, max_model_len=2040)
    assert "raise gpu_memory_utilization" not in str(info.value)
    with pytest.raises(ValueError, match="fewer than one max_model_len=2040"):
        kv_capacity(model, gpu, max_model_len=2040, gpu_memory_utilization=1.0)


def test_table1_reports_the_memory_of_all_its_gpus() -> None:
    """Table 1's memory column is the GPUs' nominal total: 1 × 40, 4 × 40 and 8 × 80 GiB."""
    assert [row.total_mem_gib for row in table1()] == [40.0, 160.0, 640.0]


# --- sim/catalog.py ---------------------------------------------------------------------


def test_a_reported_total_of_zero_bytes_is_refused() -> None:
    """``reported_memory_bytes`` must be a whole number above 0 (or None): 0 raises
    :class:`HardwareError` keyed by ``reported_memory_gib``, as a float does."""
    gpu = get_gpu("rtx4090")
    for bad in (0, -1, 1.0e9):
        with pytest.raises(HardwareError) as info:
            replace(gpu, reported_memory_bytes=bad)
        assert info.value.key == "reported_memory_gib"
    assert replace(gpu, reported_memory_bytes=1).total_memory_bytes == 1


def test_a_reported_total_equal_to_the_nominal_memory_is_the_reported_one() -> None:
    """A measured total equal to ``memory_gb`` is still the measured one: the budget names
    ``reported_memory_gib`` as its source and calls it the reported total."""
    base = get_gpu("a100-40gb")
    gpu = replace(base, reported_memory_bytes=base.memory_bytes)
    assert gpu.total_memory_key == "reported_memory_gib"
    cap = kv_capacity("opt-13b", gpu)
    assert "reported total" in cap.source["usable"]
    assert "(reported_memory_gib:" in cap.source["usable"]


def _hw(**changes: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"name": "my-gpu", "memory_gb": 24, "mem_bandwidth_gbs": 1000,
                           "peak_tflops": 100, "host_link_gbs": 32, "peer_link_gbs": 32,
                           "peer_link": "pcie"}  # fmt: skip
    cfg.update(changes)
    return cfg


def test_a_nominal_memory_set_below_the_reported_total_wins() -> None:
    """``memory_bytes`` lowered below the reported total after reading (a run's measured
    total) is the total the KV budget starts from, keyed ``memory_gb``."""
    gpu = get_gpu("rtx4090")
    assert gpu.reported_memory_bytes is not None
    lower = replace(gpu, memory_bytes=gpu.reported_memory_bytes - GIB)
    assert lower.total_memory_bytes == gpu.reported_memory_bytes - GIB
    assert lower.total_memory_key == "memory_gb"


def test_a_boolean_hardware_number_is_refused() -> None:
    """YAML's ``true`` is not a number of GiB (float(True) would read it as 1)."""
    with pytest.raises(HardwareError, match="must be a finite number > 0") as info:
        gpu_from_config(_hw(memory_gb=True))
    assert info.value.key == "memory_gb"


def test_a_memory_under_one_byte_is_refused() -> None:
    """A memory that scales to less than one whole byte is refused by name."""
    with pytest.raises(HardwareError, match="under one byte") as info:
        gpu_from_config(_hw(memory_gb=1e-10))
    assert info.value.key == "memory_gb"


def test_a_reported_total_equal_to_memory_gb_is_accepted() -> None:
    """``reported_memory_gib`` may equal ``memory_gb`` (at most, not below only)."""
    gpu = gpu_from_config(_hw(reported_memory_gib=24))
    assert gpu.reported_memory_bytes == 24 * GIB == gpu.total_memory_bytes
    with pytest.raises(HardwareError, match="exceeds memory_gb"):
        gpu_from_config(_hw(reported_memory_gib=24.5))


def test_a_hardware_yaml_without_a_name_is_named_after_its_file() -> None:
    """A hardware YAML that omits ``name`` takes its file's stem."""
    cfg = _hw()
    del cfg["name"]
    assert gpu_from_config(cfg, "configs/hardware/my-card.yaml").name == "my-card"


def test_a_bad_shape_names_its_file_but_not_the_runs_own_group() -> None:
    """A shape error from a model YAML is prefixed with the file; from the run's own
    ``model`` group it is raised as is (the caller names ``model.shape``)."""
    bad = {"shape": {"model_type": "llama", "hidden_size": 64}}
    with pytest.raises(ValueError) as own:
        model_from_config(bad)
    assert str(own.value).startswith("llama config lacks required key")
    with pytest.raises(ValueError) as filed:
        model_from_config(bad, "configs/model/x.yaml")
    assert str(filed.value).startswith("configs/model/x.yaml: llama config lacks")


def test_a_null_reported_total_in_a_run_group_falls_back_to_the_nominal_memory() -> None:
    """``hardware.reported_memory_gib=null`` on a catalog GPU drops its measured total:
    the budget starts from ``memory_gb`` and the source says who set it."""
    gpu = resolve_gpu({"name": "rtx4090", "reported_memory_gib": None})
    assert gpu.reported_memory_bytes is None
    assert gpu.total_memory_bytes == gpu.memory_bytes == 24 * GIB
    assert gpu.source["reported_memory_gib"].startswith("set by ")
    assert resolve_gpu({"name": "rtx4090"}) == get_gpu("rtx4090")


def test_a_run_group_with_any_number_is_read_as_its_own_gpu() -> None:
    """One number in a run's hardware group makes it a GPU of its own numbers (so a
    missing one is named), never the catalog entry with the number silently dropped."""
    with pytest.raises(HardwareError) as info:
        resolve_gpu({"name": "rtx4090", "memory_gb": 32})
    assert info.value.key == "mem_bandwidth_gbs"


def test_numbers_without_a_name_are_refused() -> None:
    """A hardware group with numbers but no ``name`` raises naming ``name``."""
    cfg = _hw()
    del cfg["name"]
    with pytest.raises(HardwareError, match="the GPU has no name") as info:
        resolve_gpu(cfg)
    assert info.value.key == "name"


# --- core/workload/vllm_log.py ----------------------------------------------------------


def _row(i: int, q: float, **over: Any) -> dict[str, Any]:
    """test_vllm_log's request line, a key given None left out."""
    return {k: v for k, v in _log_row(i, q, **over).items() if v is not None}


def _write(run: Path, rows: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if meta is not None:
        (run / "meta.json").write_text(json.dumps(meta))
    return run


def test_a_one_token_output_has_no_tpot(tmp_path: Path) -> None:
    """TPOT is NaN for a one-token output (no token after the first), not a division."""
    logged = read_vllm_log(_write(tmp_path, [_row(0, 0.0, output_toks=1), _row(1, 1.0)]))
    assert math.isnan(logged[0].tpot)
    assert logged[1].tpot == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("scheduled", "message"),
    [(0.95, "scheduled_ts 0.95 < queued_ts 1.0"), (1.2, "first_token_ts 1.1 < scheduled_ts 1.2")],
)
def test_a_scheduled_ts_out_of_order_is_a_negative_duration(
    tmp_path: Path, scheduled: float, message: str
) -> None:
    """``scheduled_ts`` lies between ``queued_ts`` and ``first_token_ts``: one before its
    queueing or after its first token is refused naming the line."""
    run = _write(tmp_path, [_row(0, 0.0), _row(1, 1.0, scheduled_ts=scheduled)])
    with pytest.raises(TraceFormatError, match=f"line 2: negative duration: {message}"):
        read_vllm_log(run)


def test_lines_without_a_request_id_are_not_duplicates(tmp_path: Path) -> None:
    """A log whose lines carry no ``request_id`` is read (in file order), not refused as
    one id repeated."""
    rows = [_row(i, float(i), request_id=None) for i in range(3)]
    logged = read_vllm_log(_write(tmp_path, rows))
    assert [r.row for r in logged] == [0, 1, 2]


def test_request_ids_are_compared_as_json_values(tmp_path: Path) -> None:
    """``request_id`` 1 and ``"1"`` are different JSON values, so not a repeated id; the
    same value twice is refused naming both lines."""
    read_vllm_log(
        _write(tmp_path / "a", [_row(0, 0.0, request_id=1), _row(1, 1.0, request_id="1")])
    )
    with pytest.raises(TraceFormatError, match=r"line 2: request_id 1 already on line 1"):
        read_vllm_log(
            _write(tmp_path / "b", [_row(0, 0.0, request_id=1), _row(1, 1.0, request_id=1)])
        )


def test_a_run_that_finishes_before_it_starts_is_refused(tmp_path: Path) -> None:
    """meta.json's ``finished_at`` before ``started_at`` is an error naming the key."""
    meta = {"started_at": "2026-01-01T00:01:00", "finished_at": "2026-01-01T00:00:00"}
    with pytest.raises(TraceFormatError, match=r"key 'finished_at'.*before started_at"):
        run_duration(tmp_path, meta)


def test_a_time_without_a_zone_is_read_as_utc(tmp_path: Path) -> None:
    """A meta.json time that names no zone is UTC, so it spans to a zoned one."""
    meta = {"started_at": "2026-01-01T00:00:00", "finished_at": "2026-01-01T00:01:30+00:00"}
    assert run_duration(tmp_path, meta) == (90.0, "meta.json's started_at to finished_at")


def test_the_timeseries_duration_adds_its_longest_tick(tmp_path: Path) -> None:
    """Without start and end times the run lasted to ``timeseries.csv``'s last ``t`` plus
    its longest tick (it ended before the next sample)."""
    (tmp_path / "timeseries.csv").write_text("t,running,waiting\n0,1,0\n1,1,0\n3,0,0\n3.5,0,0\n")
    assert run_duration(tmp_path, None) == (5.5, "timeseries.csv's last t plus one tick")


def test_a_negative_num_requests_is_refused(tmp_path: Path) -> None:
    """meta.json's ``num_requests`` must be a whole number >= 0."""
    run = _write(tmp_path, [_row(0, 0.0), _row(1, 1.0)], meta={"num_requests": -1})
    with pytest.raises(TraceFormatError, match=r"key 'num_requests'.*not a whole number"):
        read_vllm_log(run)


def test_client_and_engine_clocks_may_drift_up_to_the_tolerance(tmp_path: Path) -> None:
    """``arrival_time − queued_ts`` may stray ``CLOCK_TOLERANCE_S`` from its median and no
    more: 4.9 s off is read, 5.5 s off is refused naming the line."""
    rows = [_row(i, float(i)) for i in range(4)]
    near = [*rows, _row(4, 4.0, arrival_time=1004.0 + CLOCK_TOLERANCE_S - 0.1)]
    assert len(read_vllm_log(_write(tmp_path / "a", near))) == 5
    far = [*rows, _row(4, 4.0, arrival_time=1004.0 + CLOCK_TOLERANCE_S + 0.5)]
    with pytest.raises(TraceFormatError, match="line 5: clocks do not align"):
        read_vllm_log(_write(tmp_path / "b", far))


def test_a_run_may_end_up_to_the_tolerance_after_its_recorded_duration(tmp_path: Path) -> None:
    """With meta.json's duration (10 s), engine timestamps up to that plus
    ``CLOCK_TOLERANCE_S`` after the first ``queued_ts`` are one clock."""
    meta = {"started_at": "2026-01-01T00:00:00", "finished_at": "2026-01-01T00:00:10"}
    rows = [_row(0, 0.0), _row(1, 1.0, last_token_ts=13.0)]
    assert read_vllm_log(_write(tmp_path / "a", rows, meta))[1].last_token == 13.0
    rows = [_row(0, 0.0), _row(1, 1.0, last_token_ts=16.0)]
    with pytest.raises(TraceFormatError, match="line 2: engine timestamps on two clocks"):
        read_vllm_log(_write(tmp_path / "b", rows, meta))


def test_without_a_duration_the_bound_runs_from_the_last_arrival(tmp_path: Path) -> None:
    """With no recorded duration a run may end the token bound (14 tokens × 10 s) after
    the span of its ``queued_ts``: a request queued at 130 s ending at 150 s is one clock."""
    rows = [_row(0, 0.0), _row(1, 130.0, last_token_ts=150.0)]
    assert 14 * SECONDS_PER_TOKEN_BOUND == 140
    assert read_vllm_log(_write(tmp_path, rows))[1].last_token == 150.0


def test_a_row_past_the_workloads_end_is_named(tmp_path: Path) -> None:
    """A request whose id names a row one past the workload's last is a format error
    naming the row count, not an index error."""
    logged = read_vllm_log(_write(tmp_path, [_row(0, 0.0), _row(2, 1.0)]))
    sent = tmp_path / "sent.jsonl"
    sent.write_text('{"input_tok_ids": [1, 2, 3, 4]}\n{"input_tok_ids": [5, 6, 7, 8]}\n')
    with pytest.raises(TraceFormatError, match=r"2 requests, but the log's request 1 needs row 2"):
        read_token_ids(sent, logged)


def test_a_dataset_hash_matches_with_its_prefix_and_any_case(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """meta.json's ``dataset_hash`` may carry a ``sha256:`` prefix and upper-case hex: the
    same digest gives no warning; another one does."""
    sent = tmp_path / "sent.jsonl"
    sent.write_text('{"input_tok_ids": [1, 2]}\n')
    digest = hashlib.sha256(sent.read_bytes()).hexdigest()
    with caplog.at_level(logging.WARNING):
        check_dataset_hash(sent, {"dataset_hash": f"sha256:{digest.upper()}"}, tmp_path / "m")
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        check_dataset_hash(sent, {"dataset_hash": "sha256:" + "0" * 64}, tmp_path / "m")
    assert len(caplog.records) == 1


@pytest.mark.parametrize("key", ["request_rate", "burstiness"])
def test_a_zero_rate_or_burstiness_in_a_bench_result_is_refused(tmp_path: Path, key: str) -> None:
    """``request_rate`` and ``burstiness`` must be positive: 0 names the key."""
    doc = {"input_lens": [4, 4], "output_lens": [3, 3], "ttfts": [0.1, 0.1], key: 0}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match=f"key '{key}'.*not a positive number"):
        read_bench_result(path)


# --- experiments/calibrate_vllm.py ------------------------------------------------------


def _logged(arrivals: list[float]) -> list[LoggedRequest]:
    return [LoggedRequest(i, 4, 3, a, a, a + 0.1, a + 0.3, i) for i, a in enumerate(arrivals)]


def test_a_split_of_zero_is_refused() -> None:
    """``--split`` lies strictly between 0 and 1: 0 leaves no fit part and is refused."""
    for split in (0.0, 1.0):
        with pytest.raises(RunError, match=r"--split must be in \(0, 1\)"):
            split_ids(_logged([0.0, 1.0, 2.0]), split)


def test_the_fit_part_is_the_first_requests_by_arrival_not_by_line() -> None:
    """The split takes the earliest arrivals, whatever their order in the log."""
    fit, held = split_ids(_logged([2.0, 0.0, 1.0, 3.0]), 0.5)
    assert (fit, held) == ({1, 2}, {0, 3})


def test_the_fit_part_is_the_split_share_rounded_to_the_nearest_request() -> None:
    """``split × n`` requests, to the nearest whole one: 0.6 of 3 is 2 (not 1); and both
    parts keep at least one request."""
    fit, held = split_ids(_logged([0.0, 1.0, 2.0]), 0.6)
    assert (fit, held) == ({0, 1}, {2})
    assert split_ids(_logged([0.0, 1.0, 2.0]), 0.99) == ({0, 1}, {2})
    assert split_ids(_logged([0.0, 1.0, 2.0]), 0.01) == ({0}, {1, 2})


def test_a_parts_throughput_runs_over_its_own_makespan() -> None:
    """The held-out part's makespan runs from its own first arrival to its last finish (not
    the run's first arrival); a one-token request's missing TPOT is left out of the mean."""
    frame = pd.DataFrame({
        "request_id": [0, 1, 2], "arrival_s": [0.0, 4.0, 5.0], "finish_s": [1.0, 6.0, 5.5],
        "output_len": [10, 10, 1], "ttft_s": [0.1, 0.2, 0.3],
        "tpot_s": [0.01, 0.02, math.nan], "e2el_s": [1.0, 2.0, 0.5],
    })  # fmt: skip
    held = part_metrics(frame, {1, 2})
    assert held["makespan_s"] == 2.0
    assert held["request_throughput"] == 1.0 and held["output_throughput"] == 5.5
    assert held["mean_tpot_ms"] == pytest.approx(20.0)


def test_relative_errors_are_over_the_measured_value() -> None:
    """Each error is (simulated − measured) / measured."""
    meas = dict.fromkeys(METRICS, 2.0)
    sim = dict.fromkeys(METRICS, 3.0)
    assert relative_errors(sim, meas) == dict.fromkeys(METRICS, 0.5)


def _edit_rows(run: Path, edit: dict[int, dict[str, Any]]) -> None:
    lines = (run / "requests.jsonl").read_text().splitlines()
    for i, changes in edit.items():
        row = json.loads(lines[i])
        for key, value in changes.items():
            if value is None:
                row.pop(key)
            else:
                row[key] = value
        lines[i] = json.dumps(row)
    (run / "requests.jsonl").write_text("\n".join(lines) + "\n")


def test_a_rejected_request_before_the_split_leaves_the_fit_part(tmp_path: Path) -> None:
    """A logged request the simulator rejects is dropped from the fit part too (the
    calibration fits on the nine others), not only from the held-out metrics."""
    run = _fake_run(tmp_path, n=20)
    _edit_rows(run, {3: {"input_toks": 5000}})
    result = run_calibration(run, "rtx4090", plot=False)
    assert result["rejected_by_simulator"].keys() == {"3"}
    assert (result["num_fit_requests"], result["num_heldout_requests"]) == (9, 10)


def test_a_fit_part_wholly_rejected_is_refused_in_one_line(tmp_path: Path) -> None:
    """Every request before the split rejected by the simulator leaves nothing to fit on:
    a RunError that says which side is empty."""
    run = _fake_run(tmp_path, n=6)
    _edit_rows(run, {i: {"input_toks": 5000} for i in range(3)})
    with pytest.raises(RunError, match="every request before the split is rejected"):
        run_calibration(run, "rtx4090", plot=False)


def test_the_no_scheduled_ts_note_needs_every_line_to_lack_it(tmp_path: Path) -> None:
    """The fit falls back to TPOTs only, with a note, when no line has ``scheduled_ts``;
    one line without it is no such case, but its note counts it (its TTFT is left out)."""
    run = _fake_run(tmp_path, n=8)
    _edit_rows(run, {5: {"scheduled_ts": None}})
    notes = run_calibration(run, "rtx4090", plot=False)["notes"]
    assert not any("the log has no scheduled_ts" in n for n in notes)
    assert any(n.startswith("1 of the log's 8 requests have no scheduled_ts") for n in notes)
    _edit_rows(run, {i: {"scheduled_ts": None} for i in range(8) if i != 5})
    notes = run_calibration(run, "rtx4090", plot=False)["notes"]
    assert any("the log has no scheduled_ts" in n for n in notes)


def test_the_rejection_note_names_the_first_request_and_the_right_question() -> None:
    """The note names the earliest rejected request of the log; it asks about the token ids
    only when every rejection is of another kind, else about meta.json's limits."""
    mixed = {7: "prompt token id 99999 outside the vocabulary", 3: "exceeds max_model_len 4096"}
    note = rejection_note(mixed)
    assert "the first, request 3 of the log counting from 0: exceeds max_model_len" in note
    assert note.endswith("do meta.json's max_model_len and num_gpu_blocks match the run?")
    other = rejection_note({7: "prompt token id 99999 outside the vocabulary"})
    assert other.endswith("are --workload's token ids the model's, and the prompts the run sent?")
    assert "(1 for other reasons;" in other  # not "(requests.csv)": calibrate writes none


def test_the_simulate_command_keeps_the_model_and_token_ids_it_was_given(tmp_path: Path) -> None:
    """The printed replay names the ``--model`` given (not meta.json's model) and the
    ``--workload`` token ids, so the replay prices the same model and replays prefix hits."""
    run_dir = _fake_run(tmp_path, n=4)
    run = read_run(run_dir)
    sent, cal = tmp_path / "sent.jsonl", tmp_path / "out" / "calibration.json"
    args = simulate_command(run, run_dir, "rtx4090", "llama-3.1-8b", 400, sent, cal).split()
    assert "model.name=llama-3.1-8b" in args and run.model_name != "llama-3.1-8b"
    assert f"workload.tokens_path={sent}" in args
    assert "num_gpu_blocks=400" in args and f"cost.path={cal}" in args
    assert not any(a.startswith("workload.tokens_path") for a in simulate_command(
        run, run_dir, "rtx4090", None, 400, None, cal).split())  # fmt: skip
