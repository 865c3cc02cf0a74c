"""Every bad input of a newcomer gets one line ``error: <key>: ...``, exit status 2 and no
traceback; runtime failures keep theirs and leave ``error.txt``.

The apps run in-process through their real command-line entry (Hydra included) so the
table stays fast; two subprocess runs check the process-level behaviour."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments import serve, simulate
from experiments.lib.cli import exclusive_nulls
from tests.engine_helpers import one_torch_thread  # noqa: F401 (autouse fixture)

REPO = Path(__file__).resolve().parents[1]
SIM_SMALL = ["workload.num_requests=5"]
SERVE_SMALL = ["workload.num_requests=3", "workload.rate=20", "progress=false"]


def run_cli(app, args: list[str], tmp: Path) -> tuple[int, str, str]:
    """Run ``python -m experiments.<app> args`` in this process: (status, stdout, stderr)."""
    import contextlib
    import io

    argv = [
        f"{app.__name__}.py",
        *args,
        f"hydra.run.dir={tmp / 'run'}",
        f"index={tmp / 'index.csv'}",
        "hydra/job_logging=disabled",
        "hydra/hydra_logging=disabled",
    ]
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = argv
    status = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            app.main_with_checks(app.main, config_name=app.__name__.rsplit(".", 1)[-1])
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old
    return status, out.getvalue(), err.getvalue()


def _dup_ids(tmp: Path) -> str:
    from core.request import Request
    from core.workload.trace_io import write_trace

    path = tmp / "dup.csv"
    write_trace(path, [Request(0, 0.0, 10, 10), Request(0, 1.0, 10, 10)])
    return str(path)


def _bench_bad(tmp: Path) -> str:
    path = tmp / "bench.json"
    path.write_text('{"input_lens": [10, "x"], "output_lens": [5, 6], "ttfts": [0.1, 0.2]}')
    return str(path)


def _junk(tmp: Path, name: str) -> str:
    """Bytes that no weights reader takes, in a folder of their own (``{tmp}`` itself
    stands for a folder without weights)."""
    path = tmp / "junk" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(bytes(range(256)) * 8)
    return str(path)


def _empty(tmp: Path) -> str:
    path = tmp / "empty.csv"
    path.write_text("\n")
    return str(path)


def _header_only(tmp: Path) -> str:
    from core.workload.trace_io import write_trace

    path = tmp / "header_only.csv"
    write_trace(path, [])
    return str(path)


def _malformed(tmp: Path) -> str:
    path = tmp / "bad.csv"
    path.write_text("#kvlab-trace v1\nnot,a,header\n")
    return str(path)


def _text_shape(tmp: Path) -> str:
    """An HF config.json whose hidden size is text."""
    import json

    shape = {"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2,
             "num_attention_heads": 2, "vocab_size": 100, "intermediate_size": 8,
             "max_position_embeddings": 64}  # fmt: skip
    (tmp / "hf").mkdir()
    (tmp / "hf" / "config.json").write_text(json.dumps(shape))
    return str(tmp / "hf" / "config.json")


# (id, app, overrides ({tmp} is the test's folder), the key the line must name, a phrase)
CASES = [
    ("trace_without_path", simulate, ["workload=trace"], "workload.path", "needs a trace file"),
    ("trace_missing_file", simulate, ["workload=trace", "workload.path={tmp}/nope.csv"],
     "workload.path", "no such file"),
    ("trace_empty_file", simulate, ["workload=trace", "workload.path={empty}"],
     "workload.path", "empty"),
    ("trace_without_requests", simulate, ["workload=trace", "workload.path={header_only}"],
     "workload.path", "no requests"),
    ("trace_malformed", simulate, ["workload=trace", "workload.path={malformed}"],
     "workload.path", "line"),
    ("negative_kv_budget", simulate, ["kv_cache_gb=-1"], "kv_cache_gb", "positive"),
    ("kv_budget_above_gpu", simulate, ["kv_cache_gb=500"], "kv_cache_gb", "more than the memory"),
    ("kv_budget_below_a_sequence", simulate, ["kv_cache_gb=0.01"], "kv_cache_gb",
     "fewer than one max_model_len"),
    ("unset_environment_variable", simulate, ["seed=${{oc.env:KVLAB_TEST_UNSET_VARIABLE}}"],
     "seed", "cannot resolve (KeyError raised while resolving interpolation"),
    ("samples_wider_than_a_batch", simulate, ["workload.n=300"], "workload.n",
     "more than system.max_num_seqs=256"),
    ("serve_beams_wider_than_a_batch", serve, ["workload.beam_width=8", "system.max_num_seqs=4"],
     "workload.beam_width", "more than system.max_num_seqs=4"),
    ("beams_on_vllm_v1", simulate, ["system=vllm_v1", "workload.beam_width=2"],
     "workload.beam_width", "vllm_v1 runs no beams in its engine"),
    ("serve_beams_on_vllm_v1", serve, ["system=vllm_v1", "workload.beam_width=2"],
     "workload.beam_width", "vllm_v1 runs no beams in its engine"),
    ("serve_kv_budget_below_a_sequence", serve, ["kv_cache_gb=0.00002"], "kv_cache_gb",
     "fewer than one max_model_len=256"),
    ("serve_blocks_below_a_sequence", serve, ["num_gpu_blocks=1"], "num_gpu_blocks",
     "holds 16 tokens (1 block(s) of 16), fewer than one max_model_len"),
    ("derived_kv_below_max_model_len", simulate, ["model=llama-3.1-8b", "hardware=l40s",
     "system=vllm_v1", "system.max_model_len=131072", "gpu_memory_utilization=0.5"],
     "system.max_model_len", "fewer than one max_model_len"),
    ("block_size_zero", simulate, ["system.block_size=0"], "system.block_size", "power of two"),
    ("block_size_not_pow2", simulate, ["system.block_size=12"], "system.block_size",
     "power of two"),
    ("num_requests_zero", simulate, ["workload.num_requests=0"], "workload.num_requests",
     "positive"),
    ("rate_zero", simulate, ["workload.rate=0"], "workload.rate", "positive"),
    ("rate_not_a_number", simulate, ["workload.rate=fast"], "workload.rate", "positive"),
    ("duration_negative", simulate, ["workload.duration_s=-5"], "workload.duration_s",
     "positive"),
    ("slo_not_a_mapping", simulate, ["slo_ms=200"], "slo_ms", "mapping"),
    ("slo_unknown_key", simulate, ["slo_ms={{ttfb: 200}}"], "slo_ms.ttfb", "unknown SLO"),
    ("unknown_model", simulate, ["model=opt-7b"], "model", "unknown model"),
    ("unknown_hardware", simulate, ["hardware=a100"], "hardware", "unknown hardware"),
    # null where the key has no null meaning, text where a number or a name belongs: these
    # had ended in a TypeError or ValueError traceback (a config audit)
    ("seed_null", simulate, ["seed=null"], "seed", "null is not a value here"),
    ("no_conversations", simulate, ["workload=multi_turn", "workload.num_conversations=0"],
     "workload.num_conversations", "not a count"),
    ("tp_null", simulate, ["model.tp=null"], "model.tp", "null is not a value here"),
    ("swap_null", simulate, ["swap_space_gb=null"], "swap_space_gb", "null is not a value"),
    # null had read as false, turning vllm_v1's default-on features off without a word
    ("prefix_caching_null", simulate, ["system=vllm_v1", "system.enable_prefix_caching=null"],
     "system.enable_prefix_caching", "null is not a value here"),
    ("chunked_prefill_null", serve, ["system=vllm_v1", "system.chunked_prefill=null"],
     "system.chunked_prefill", "null is not a value here"),
    ("allreduce_text", simulate, ["cost.allreduce_latency_s=abc"], "cost.allreduce_latency_s",
     "not a time"),
    ("calibration_path_number", simulate, ["cost=calibrated", "cost.path=123"], "cost.path",
     "not a path"),
    ("dataset_number", simulate, ["workload.dataset=0"], "workload.dataset", "not a name"),
    # the weights fit; a 131,072-token profile run (the budget's default, max_model_len) not
    ("profile_run_too_large", simulate, ["model=llama-3.1-8b", "hardware=rtx4090"],
     "system.max_model_len", "set system.max_model_len (or system.max_num_batched_tokens) lower"),
    ("profile_run_given_too_large", simulate,
     ["model=llama-3.1-8b", "hardware=rtx4090", "system=vllm_v1",
      "system.max_num_batched_tokens=131072"],
     "system.max_num_batched_tokens", "the weights fit"),
    # model.name and system.name switch what they name; hardware.name would only relabel
    ("gpu_relabelled", simulate, ["hardware.name=h100"], "hardware.name",
     "choose the GPU with hardware=h100"),
    # the line says how a policy of one's own is named (a plugin, not a system= option)
    ("unknown_system", simulate, ["system=orca"], "system", "system.plugin=<module>"),
    ("unknown_system_name", simulate, ["system.name=vllm2"], "system", "system.plugin=<module>"),
    ("model_too_big", simulate, ["model=opt-66b", "model.tp=1"], "model", "does not fit"),
    # a budget given below the context (null takes max(2560, max_model_len))
    ("token_budget_below_max_model_len", simulate,
     ["model=llama-3.1-8b", "hardware=h100", "system.max_num_batched_tokens=2560"],
     "system.max_num_batched_tokens", "below max_model_len"),
    ("max_num_seqs_zero", simulate, ["system.max_num_seqs=0"], "system.max_num_seqs",
     "not a positive count"),
    ("prefix_len_text", simulate, ["workload=shared_prefix", "workload.prefix_len=abc"],
     "workload.prefix_len", "not a length"),
    # beam search at a sampling temperature: the line had named only "workload"
    ("beam_search_sampled", simulate, ["workload.beam_width=2", "workload.temperature=0.5"],
     "workload.temperature", "temperature must be 0"),
    # samples and beams at once: the line had named only "workload"
    ("samples_and_beams", simulate, ["workload.n=2", "workload.beam_width=2"],
     "workload.beam_width", "not both"),
    # a shared prefix as long as the context: the line had named only "workload"
    ("prefix_beyond_the_context", simulate, ["workload=shared_prefix",
     "workload.prefix_len=2047"], "workload.prefix_len", "leaves no room for a suffix"),
    ("rounds_text", serve, ["workload=multi_turn", "workload.num_conversations=2",
                            "workload.rounds=x"], "workload.rounds", "not a round count"),
    # serve's default workload size (num_requests 32) is read; the chat's 1024-token
    # history does not fit tiny-opt's 256 tokens, and the line says which key to set
    ("chat_history_beyond_the_model", serve, ["workload=multi_turn"],
     "workload.max_prompt_len",
     "max_prompt_len 1024 must be >= 1 and below the model's max_model_len 256"),
    ("serve_swap_pool_under_a_block", serve, ["system.preemption_mode=swap",
     "swap_space_gb=0.00001"], "swap_space_gb", "no whole KV block"),
    ("apply_filter_not_a_boolean", simulate, ["workload=azure_code", "workload.apply_filter=no"],
     "workload.apply_filter", "not a boolean"),
    ("max_total_tokens_negative", simulate, ["workload=azure_code",
     "workload.max_total_tokens=-1"], "workload.max_total_tokens", "not a token count"),
    ("max_total_tokens_text", simulate, ["workload=azure_conv",
     "workload.max_total_tokens=all"], "workload.max_total_tokens", "expected auto"),
    ("sigma_text", simulate, ["workload.sigma_input=abc"], "workload.sigma_input",
     "not a spread"),
    ("budget_below_max_num_seqs", simulate, ["system=vllm_v1",
     "system.max_num_batched_tokens=64"], "system.max_num_batched_tokens",
     "below max_num_seqs=256"),
    ("serve_negative_kv_budget", serve, ["kv_cache_gb=-1"], "kv_cache_gb", "positive"),
    ("serve_kv_budget_above_host", serve, ["kv_cache_gb=100000"], "kv_cache_gb",
     "more than the memory"),
    ("serve_fraction_on_cpu", serve, ["kv_budget_fraction=0.5"], "kv_budget_fraction",
     "CUDA"),
    ("serve_triton_on_cpu", serve, ["backend=triton"], "backend", "interpreter"),
    ("serve_threads_zero", serve, ["threads=0"], "threads", "thread count"),
    ("serve_step_timer_unknown", serve, ["step_timer=cycles"], "step_timer", "unknown step timer"),
    ("serve_thread_cpu_many_threads", serve, ["step_timer=thread_cpu", "threads=2"],
     "step_timer", "other torch threads"),
    ("serve_thread_cpu_wall_clock", serve, ["step_timer=thread_cpu", "threads=1", "clock=wall"],
     "step_timer", "real time"),
    ("serve_slo_not_a_mapping", serve, ["slo_ms=200"], "slo_ms", "mapping"),
    ("serve_unknown_model", serve, ["model=gpt5"], "model", "unknown model"),
    ("serve_block_size_zero", serve, ["system.block_size=0"], "system.block_size",
     "power of two"),
    ("trace_path_a_directory", simulate, ["workload=trace", "workload.path={tmp}"],
     "workload.path", "a directory"),
    ("efficiency_negative", simulate, ["cost.compute_efficiency=-0.5"],
     "cost.compute_efficiency", "not a fraction"),
    ("efficiency_above_one", simulate, ["cost.memory_efficiency=2"], "cost.memory_efficiency",
     "not a fraction"),
    ("progress_not_a_boolean", simulate, ["progress=maybe"], "progress", "not a boolean"),
    ("integrity_every_negative", simulate, ["check_integrity_every=-1"], "check_integrity_every",
     "not a step count"),
    ("integrity_every_serve", serve, ["check_integrity_every=x"], "check_integrity_every",
     "not a step count"),
    ("serve_checkpoint_missing", serve, ["model.path={tmp}/nope"], "model.path",
     "no such file"),
    ("serve_checkpoint_without_weights", serve, ["model.path={tmp}"], "model.path",
     "no weights"),
    ("run_dir_is_a_file", simulate, ["hydra.run.dir={junk_bin}"], "hydra.run.dir",
     "is a file, not a folder"),
    ("serve_weights_beyond_memory", serve, ["model=opt-175b", "model.tp=1"], "model",
     "weights need"),
    ("serve_checkpoint_not_torch", serve, ["model.path={junk_bin}"], "model.path",
     "cannot be read as a torch weights file"),
    ("serve_checkpoint_not_safetensors", serve, ["model.path={junk_safetensors}"],
     "model.path", "cannot be read as a safetensors file"),
    ("num_gpu_blocks_text", simulate, ["num_gpu_blocks=many"], "num_gpu_blocks",
     "not a block count"),
    ("serve_num_gpu_blocks_zero", serve, ["num_gpu_blocks=0"], "num_gpu_blocks",
     "not a block count"),
    ("unknown_key", simulate, ["bogus_key=1"], "bogus_key", "no such key"),
    ("swap_on_a_contiguous_system", simulate, ["system=fastertransformer",
     "system.preemption_mode=swap"], "system.preemption_mode", "paged systems only"),
    ("serve_swap_on_a_contiguous_system", serve, ["system=orca_max",
     "system.preemption_mode=swap"], "system.preemption_mode", "paged systems only"),
    ("serve_chunked_prefill_on_a_contiguous_system", serve, ["system=orca_oracle",
     "system.chunked_prefill=true"], "system.chunked_prefill", "paged systems only"),
    ("prefix_caching_on_a_contiguous_system", simulate, ["system=orca_pow2",
     "system.enable_prefix_caching=true"], "system.enable_prefix_caching", "paged systems only"),
    ("added_unknown_key", simulate, ["+bogus_key=1"], "bogus_key", "no part of this app"),
    ("serve_force_added_unknown_key", serve, ["++warmpu=true"], "warmpu", "no part of this app"),
    ("unknown_workload_key", simulate, ["workload.foo=1"], "workload.foo", "no such key"),
    ("key_of_another_option", simulate, ["workload=trace", "workload.path={malformed}",
                                          "workload.rate=3"], "workload.rate", "no such key"),
    ("malformed_override", simulate, ["workload.rate=[1,"], "overrides", "no viable"),
    ("serve_has_no_cost_group", serve, ["cost=roofline"], "cost", "no such key"),
    ("hf_config_number_as_text", simulate, ["model.hf_config={text_shape}"], "model.hf_config",
     "config.json: llama config: hidden_size must be a whole number >= 1, got 'big'"),
    ("blocks_beyond_the_gpu", simulate, ["num_gpu_blocks=100000000"], "num_gpu_blocks",
     "exceed a100-40gb's"),
    ("blocks_and_budget_both", simulate, ["num_gpu_blocks=1000", "kv_cache_gb=5"],
     "num_gpu_blocks", "give one of num_gpu_blocks and kv_cache_gb"),
    ("budget_and_weights_beyond_the_gpu", simulate, ["kv_cache_gb=39"], "kv_cache_gb",
     "and opt-13b's weights"),
    ("too_many_requests", simulate, ["workload.num_requests=100000000000"],
     "workload.num_requests", "too many requests to hold in memory"),
    ("rate_times_duration_too_many", simulate, ["workload.rate=1e12", "workload.duration_s=20",
     "workload.num_requests=null"], "workload.rate", "too many to hold in memory"),
    ("trace_repeats_a_request_id", simulate, ["workload=trace", "workload.path={dup_ids}"],
     "workload.path", "line 4: request_id 0 repeats line 3"),
    ("vllm_log_tokens_missing", simulate, ["workload=vllm_log", "workload.path={tmp}",
     "workload.tokens_path={tmp}/nope.jsonl"], "workload.tokens_path", "no such file"),
    ("vllm_bench_length_not_a_number", simulate, ["workload=vllm_bench",
     "workload.path={bench_bad}"], "workload.path", "key 'input_lens[1]'"),
    ("calibration_for_another_tp", simulate, ["model=llama-3.1-8b", "hardware=rtx4090",
     "model.tp=2", "system=vllm_v1", "system.max_model_len=4096", "cost=calibrated",
     "cost.path={repo}/docs/validation/vllm-rtx4090/calibration.json"], "cost.path",
     "fitted for another tp"),
]  # fmt: skip


@pytest.mark.parametrize(("app", "overrides", "key", "phrase"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_input_is_one_line_naming_the_key(
    app, overrides: list[str], key: str, phrase: str, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    files = {
        "tmp": str(tmp_path),
        "empty": _empty(tmp_path),
        "header_only": _header_only(tmp_path),
        "malformed": _malformed(tmp_path),
        "text_shape": _text_shape(tmp_path),
        "bench_bad": _bench_bad(tmp_path),
        "dup_ids": _dup_ids(tmp_path),
        "repo": str(REPO),
        "junk_bin": _junk(tmp_path, "junk.bin"),
        "junk_safetensors": _junk(tmp_path, "junk.safetensors"),
    }
    small = SIM_SMALL if app is simulate else SERVE_SMALL
    args = [*small, *(o.format(**files) for o in overrides)]
    status, out, err = run_cli(app, args, tmp_path)
    lines = err.strip().splitlines()
    assert status == 2, (out, err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {key}: "), lines[0]
    assert phrase in lines[0]
    assert "Traceback" not in out + err
    run_dir = tmp_path / "run"
    assert not (run_dir / "metrics.json").exists()
    if run_dir.exists():  # Hydra made it: it says why the run did not happen
        assert (run_dir / "error.txt").read_text().strip() == lines[0]


def test_a_gpu_yaml_on_hydras_search_path_is_an_option(tmp_path: Path) -> None:
    """The README's route for a new GPU: one YAML in the user's config folder."""
    import yaml

    hw = yaml.safe_load((REPO / "configs" / "hardware" / "h200.yaml").read_text())
    (tmp_path / "conf" / "hardware").mkdir(parents=True)
    (tmp_path / "conf" / "hardware" / "my-gpu.yaml").write_text(
        yaml.safe_dump({**hw, "name": "my-gpu", "memory_gb": 48, "reported_memory_gib": None})
    )
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    status, _, err = run_cli(simulate, [*SIM_SMALL, search, "hardware=my-gpu"], tmp_path)
    assert status == 0, err
    assert "name: my-gpu" in (tmp_path / "run" / "config.yaml").read_text()
    status, _, err = run_cli(simulate, [*SIM_SMALL, search, "hardware=my-gpux"], tmp_path / "b")
    assert status == 2 and err.startswith("error: hardware: unknown hardware")
    assert "my-gpu" in err and "h200" in err  # the user's options listed beside the shipped
    (tmp_path / "conf" / "hardware" / "broken.yaml").write_text("name: [unclosed\n")
    status, _, err = run_cli(simulate, [*SIM_SMALL, search, "hardware=broken"], tmp_path / "c")
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: config: ") and "broken.yaml, line 2, column 1: not YAML" in err


def test_num_requests_alone_is_a_size(tmp_path: Path) -> None:
    status, out, err = run_cli(simulate, ["workload.num_requests=4"], tmp_path)
    assert status == 0, err
    assert "4/4 done" in out
    assert "Successful requests:" in out and "Mean TTFT (ms):" in out
    index = (tmp_path / "index.csv").read_text().splitlines()
    assert index[0].startswith("time,app,status,run_dir,overrides,completed")
    assert ",simulate,ok," in index[1] and "workload.num_requests=4" in index[1]


def test_giving_one_size_nulls_the_other() -> None:
    assert exclusive_nulls(["workload.num_requests=8"]) == {"workload.duration_s": None}
    assert exclusive_nulls(["workload.duration_s=60"]) == {"workload.num_requests": None}
    assert exclusive_nulls(["workload.num_requests=8", "workload.duration_s=60"]) == {}
    assert exclusive_nulls(["workload.num_requests=null"]) == {}
    assert exclusive_nulls(["system=vllm"]) == {}


def test_both_sizes_given_is_an_error(tmp_path: Path) -> None:
    args = ["workload.num_requests=4", "workload.duration_s=60"]
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 2 and err.startswith("error: workload.duration_s: give one of")


def test_every_request_rejected_says_why(tmp_path: Path) -> None:
    """A trace whose one request is longer than max_model_len: the run finishes, and the
    summary line and table say why nothing was served."""
    from core.request import Request
    from core.workload.trace_io import write_trace

    write_trace(tmp_path / "long.csv", [Request(0, 0.0, 3000, 10)])
    args = ["workload=trace", f"workload.path={tmp_path / 'long.csv'}"]
    status, out, err = run_cli(simulate, args, tmp_path)
    assert status == 0, err
    assert "0/1 done; rejected: 1 over max_model_len" in out
    assert "over max_model_len:" in out  # the table's row


def _cmd(app: str, *args: str, tmp: Path) -> list[str]:
    return [sys.executable, "-m", f"experiments.{app}", *args, f"hydra.run.dir={tmp / 'run'}",
            f"index={tmp / 'index.csv'}"]  # fmt: skip


def test_process_exit_status_and_full_error(tmp_path: Path) -> None:
    """A real process: status 2 and one stderr line; HYDRA_FULL_ERROR=1 shows the
    traceback instead."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    cmd = _cmd("simulate", "kv_cache_gb=-1", tmp=tmp_path)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: kv_cache_gb: KV budget must be positive "
        "(got -1; expected a number > 0 (GiB) or null (derived))"
    )
    env["HYDRA_FULL_ERROR"] = "1"
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "kv_cache_gb" in proc.stderr


def test_runtime_failure_keeps_traceback_and_writes_error_txt(tmp_path: Path, monkeypatch):
    """Not a config error: the exception propagates and error.txt holds its traceback."""

    def broken(*args, **kwargs):
        raise RuntimeError("the cost model blew up")

    monkeypatch.setattr(simulate, "simulate", broken)
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(RuntimeError, match="blew up"):
        run_cli(simulate, SIM_SMALL, tmp_path)
    text = (tmp_path / "run" / "error.txt").read_text()
    assert text.startswith("Traceback") and "the cost model blew up" in text
    assert not (tmp_path / "run" / "metrics.json").exists()
    assert ",simulate,failed," in (tmp_path / "index.csv").read_text()


def test_serve_cli_prints_table_with_device(tmp_path: Path) -> None:
    status, out, err = run_cli(serve, [*SERVE_SMALL, "threads=1"], tmp_path)
    assert status == 0, err
    assert "Successful requests:" in out and "3/3 done" in out
    threads = torch.get_num_threads()
    assert f"{threads} thread{'' if threads == 1 else 's'})" in out


def test_an_index_that_cannot_be_written_is_refused_before_the_run(tmp_path: Path) -> None:
    from experiments.lib.checks import ConfigError
    from experiments.lib.cli import check_index_writable

    (tmp_path / "a-file").write_text("")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    for bad, phrase in ((tmp_path / "a-file" / "index.csv", "cannot make its folder"),
                        (tmp_path, "cannot write the runs index"),
                        (tmp_path / "other.csv", "not a kvlab runs index")):  # fmt: skip
        with pytest.raises(ConfigError, match=phrase) as err:
            check_index_writable(bad)
        assert err.value.key == "index"
    check_index_writable(tmp_path / "new" / "index.csv")  # its folder is made
    assert (tmp_path / "new").is_dir()


def test_a_sweep_to_a_foreign_index_is_refused_once_before_any_job(tmp_path: Path, capsys):
    """Checked with the command line, not as each job starts: no job folder is made."""
    from experiments.lib.cli import main_with_checks

    index = tmp_path / "other.csv"
    index.write_text("a,b\n1,2\n")
    argv = ["-m", "system=vllm,orca_max", "workload.num_requests=3", f"index={index}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]  # fmt: skip
    with pytest.raises(SystemExit) as ended:
        main_with_checks(lambda: pytest.fail("the sweep ran"), argv, "simulate")
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1 and "not a kvlab runs index" in err
    assert not (tmp_path / "sweep").exists() and index.read_text() == "a,b\n1,2\n"


def test_a_command_refused_before_hydra_still_gets_its_index_row(tmp_path: Path) -> None:
    status, _, err = run_cli(simulate, ["system=orca"], tmp_path)
    assert status == 2 and err.startswith("error: system: unknown system")
    rows = (tmp_path / "index.csv").read_text().splitlines()
    assert len(rows) == 2 and ",simulate,config error,," in rows[1] and "system=orca" in rows[1]


def test_valid_sweeps_pass_the_checks() -> None:
    """A sweep (with -m or hydra.mode=MULTIRUN) of valid values is checked as its jobs and
    passes."""
    from experiments.lib.compose import check_overrides_compose

    for argv in (["hydra.mode=MULTIRUN", "seed=1,2"], ["-m", "seed=1,2"],
                 ["-m", "seed=range(1,3)"]):  # fmt: skip
        check_overrides_compose("simulate", argv)  # nothing raised


def test_an_added_key_under_a_known_name_is_left_to_the_config() -> None:
    from experiments.lib.checks import ConfigError
    from experiments.lib.compose import check_added_keys

    check_added_keys("simulate", ["slo_ms.ttft", "model.hf_config", "hydra.job.name", "cost",
                                  "hydra/launcher", "model@x"])  # fmt: skip
    check_added_keys("serve", [])
    with pytest.raises(ConfigError, match="warmup"):
        check_added_keys("simulate", ["warmup"])  # serve's key, not simulate's
    with pytest.raises(ConfigError, match="cost"):
        check_added_keys("serve", ["cost"])  # a group serve does not compose


def test_a_run_from_another_config_checks_and_makes_no_default_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--config-dir D --config-name config`` (the README's rerun of a run folder) writes to
    the index its config names (``index: null`` there: none); before, the pre-Hydra check
    took the default ``outputs/index.csv`` from the command line: it made an empty one in
    the working directory, and refused the run where a foreign file sat at that path."""
    from experiments.lib.cli import main_with_checks

    monkeypatch.chdir(tmp_path)
    for argv in (["--config-dir", str(tmp_path / "run"), "--config-name", "config"],
                 ["-cd", str(tmp_path / "run"), "--config-name=config"]):  # fmt: skip
        ran: list[bool] = []
        main_with_checks(lambda ran=ran: ran.append(True), argv, "simulate")
        assert ran == [True] and not (tmp_path / "outputs").exists()
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "index.csv").write_text("a,b\n1,2\n")  # not this run's index
    ran = []
    main_with_checks(lambda: ran.append(True), argv, "simulate")
    assert ran == [True] and (tmp_path / "outputs" / "index.csv").read_text() == "a,b\n1,2\n"
