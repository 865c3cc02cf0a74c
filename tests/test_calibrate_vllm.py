"""calibrate_vllm on a synthetic "vLLM run" whose step times come from a known model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from core.request import Request
from core.sched.base import SchedulerConfig
from core.systems import build_scheduler
from core.workload.vllm_log import read_vllm_log
from experiments.calibrate_vllm import (
    METRICS,
    main,
    part_metrics,
    run_calibration,
    split_ids,
)
from experiments.lib.vllm_fit import bounded_lstsq
from experiments.simulate import run as simulate_run
from sim.catalog import get_gpu, get_model
from sim.cost import CalibratedCostModel
from sim.driver import simulate

TRUE = {"constant": 0.004, "linear_flop_time": 1.6, "attn_flop_time": 1.6, "byte_time": 1.25}


def _fake_run(tmp_path: Path, n: int = 40) -> Path:
    """A run directory in vLLM's format, timed by ``TRUE`` on llama-3.1-8b / rtx4090."""
    model, gpu = get_model("llama-3.1-8b"), get_gpu("rtx4090")
    reqs = [Request(i, 0.25 * i, 64 + 37 * (i % 7), 8 + 5 * (i % 5)) for i in range(n)]
    cfg = SchedulerConfig(
        max_num_seqs=16, max_num_batched_tokens=256, max_model_len=4096, chunked_prefill=True
    )
    truth = CalibratedCostModel(model, gpu, TRUE)
    rec = simulate(
        reqs, lambda: build_scheduler("vllm_v1", 400 * 16, cfg, watermark=0.0), truth
    ).recorder
    rows = rec.requests_frame()
    run = tmp_path / "run"
    run.mkdir()
    with (run / "requests.jsonl").open("w") as f:
        for r in rows.itertuples():
            base = 5000.0
            f.write(json.dumps({
                "request_id": f"bench-{r.request_id}", "input_toks": r.prompt_len,
                "output_toks": r.output_len, "arrival_time": 1e9 + r.arrival_s,
                "queued_ts": base + r.arrival_s, "scheduled_ts": base + r.first_scheduled_s,
                "first_token_ts": base + r.first_token_s, "last_token_ts": base + r.finish_s,
            }) + "\n")  # fmt: skip
    meta = {
        "model": "meta-llama/Llama-3.1-8B",
        "engine_kwargs": {
            "max_num_seqs": 16, "max_num_batched_tokens": 256, "max_model_len": 4096,
            "dtype": "bfloat16", "tensor_parallel_size": 1,
        },
        "kv_cache": {"num_gpu_blocks": 400, "block_size": 16, "enable_prefix_caching": True},
        "resolved_config": {"scheduler_config": {"enable_chunked_prefill": True}},
    }  # fmt: skip
    (run / "meta.json").write_text(json.dumps(meta))
    return run


def test_calibration_recovers_a_known_step_model(tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    result = run_calibration(run, "rtx4090", out=tmp_path / "out", plot=False)
    for key in METRICS:
        # TTFTs of this toy run are ~50 ms, half of it the wait for the step in flight at
        # arrival, which jumps with step boundaries: a looser bound there
        bound = 0.15 if "ttft" in key else 0.02
        assert abs(result["calibrated"][key]) < bound, (key, result["calibrated"][key])
    assert result["fit_rounds"][-1]["simulated_signal_mape"] < 0.01
    # the roofline at default efficiencies is faster than the slowed-down truth
    assert result["uncalibrated"]["mean_tpot_ms"] < -0.1
    errors = json.loads((tmp_path / "out" / "errors.json").read_text())
    assert set(errors["calibrated"]) == set(METRICS)
    calib = json.loads((tmp_path / "out" / "calibration.json").read_text())
    # compute is identifiable; per-step overhead and memory time trade off (both ~per step)
    assert calib["coefficients"]["linear_flop_time"] == pytest.approx(1.6, rel=0.05)
    # simulate takes the file: cost=calibrated cost.path=...
    metrics = simulate_run({
        "model": {"name": "llama-3.1-8b", "tp": 1}, "hardware": {"name": "rtx4090"},
        "system": {"name": "vllm_v1", "max_num_seqs": 16, "max_num_batched_tokens": 256,
                   "max_model_len": 4096, "chunked_prefill": True, "watermark": 0.0},
        "workload": {"kind": "vllm_log", "path": str(run)}, "num_gpu_blocks": 400,
        "cost": {"kind": "calibrated", "path": str(tmp_path / "out" / "calibration.json")},
    })  # fmt: skip
    assert metrics["completed"] == 40


def test_bounded_lstsq_respects_bounds() -> None:
    import numpy as np

    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    x = bounded_lstsq(a, np.array([-1.0, 5.0]), ((0.0, 1.0), (0.0, 3.0)))
    assert x.tolist() == [0.0, 3.0]


def test_bad_runs_give_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = _fake_run(tmp_path, n=6)
    assert main([str(run), "--hardware", "v100", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("calibrate_vllm: error: unknown GPU 'v100'") and "rtx4090" in err
    assert "\n" not in err
    meta = json.loads((run / "meta.json").read_text())
    del meta["engine_kwargs"]["max_model_len"]
    (run / "meta.json").write_text(json.dumps(meta))
    assert main([str(run), "--hardware", "rtx4090", "--out", str(tmp_path / "o")]) == 2
    assert "meta.json: missing key 'engine_kwargs.max_model_len'" in capsys.readouterr().err


def test_more_bad_runs_give_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A zero block count, a garbled timeseries.csv and a hardware YAML that is not YAML."""
    out = ["--out", str(tmp_path / "o")]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    run = _fake_run(tmp_path / "a", n=6)
    meta = json.loads((run / "meta.json").read_text())
    meta.setdefault("kv_cache", {})["num_gpu_blocks"] = 0
    (run / "meta.json").write_text(json.dumps(meta))
    assert main([str(run), "--hardware", "rtx4090", *out]) == 2
    assert "kv_cache.num_gpu_blocks must be a whole number in [1, 67108864]" in (
        capsys.readouterr().err
    )
    run = _fake_run(tmp_path / "b", n=6)
    (run / "timeseries.csv").write_text('t,running\n1,"2\n3,4,5,6\n')
    assert main([str(run), "--hardware", "rtx4090", *out]) == 2
    err = capsys.readouterr().err.strip()
    assert "timeseries.csv: not a CSV table" in err and "\n" not in err
    (tmp_path / "c").mkdir()
    run = _fake_run(tmp_path / "c", n=6)
    (tmp_path / "gpu.yaml").write_text("memory_gb: [24\npeak: 1\n")
    assert main([str(run), "--hardware", str(tmp_path / "gpu.yaml"), *out]) == 2
    err = capsys.readouterr().err.strip()
    assert "gpu.yaml, line 2, column 5: not YAML" in err and "\n" not in err


def test_a_gpu_whose_steps_overflow_the_clock_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Datasheet numbers that pass their checks (finite, > 0) but price a step at inf end
    the run with one line (sim.driver.StepPriceError), not a traceback."""
    import yaml

    from sim.catalog import CONFIGS

    run = _fake_run(tmp_path, n=6)
    hw = yaml.safe_load((CONFIGS / "hardware" / "rtx4090.yaml").read_text())
    slow = {**hw, "name": "slow", "peak_tflops": 1e-307, "mem_bandwidth_gbs": 1e-307}
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(slow))
    args = [str(run), "--hardware", str(tmp_path / "slow.yaml"), "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("calibrate_vllm: error: ") and "out of range" in err
    assert err.count("\n") == 1


def test_gpu_and_model_given_by_yaml_and_config_json(tmp_path: Path) -> None:
    import yaml

    from sim.catalog import CONFIGS

    run = _fake_run(tmp_path, n=12)
    hw = yaml.safe_load((CONFIGS / "hardware" / "rtx4090.yaml").read_text())
    (tmp_path / "my-gpu.yaml").write_text(yaml.safe_dump({**hw, "name": "my-gpu"}))
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(get_model("llama-3.1-8b").to_hf_config()))
    out = tmp_path / "out"
    args = [str(run), "--hardware", str(tmp_path / "my-gpu.yaml"), "--model", str(model_dir)]
    assert main([*args, "--split", "0.5", "--out", str(out)]) == 0
    assert json.loads((out / "calibration.json").read_text())["gpu"] == "my-gpu"
    assert (out / "calibrate_vllm.png").is_file()
    # simulate takes that calibration with the same GPU YAML (copied beside it, on Hydra's
    # search path in the printed command, wherever the user's YAML lies) and config.json
    import shlex

    from experiments.reproduce import compose_config
    from experiments.simulate import run as simulate_run

    (tmp_path / "my-gpu.yaml").unlink()
    assert (out / "hardware" / "my-gpu.yaml").is_file()
    command = json.loads((out / "errors.json").read_text())["simulate_command"]
    args = shlex.split(command)[3:]
    assert f"hydra.searchpath=[file://{out}]" in args and "hardware=my-gpu" in args
    assert simulate_run(compose_config(args), None)["completed"] == 12


def test_a_hardware_yaml_with_a_shipped_name_and_other_numbers_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # its results were labelled, and its replay ran, as the shipped GPU
    import yaml

    from sim.catalog import CONFIGS

    run = _fake_run(tmp_path, n=6)
    hw = yaml.safe_load((CONFIGS / "hardware" / "rtx4090.yaml").read_text())
    (tmp_path / "copy.yaml").write_text(yaml.safe_dump(hw))  # the same numbers: fine
    (tmp_path / "edited.yaml").write_text(yaml.safe_dump({**hw, "mem_bandwidth_gbs": 900}))
    out = ["--out", str(tmp_path / "o")]
    assert main([str(run), "--hardware", str(tmp_path / "copy.yaml"), *out]) == 0
    command = json.loads((tmp_path / "o" / "errors.json").read_text())["simulate_command"]
    assert "hardware=rtx4090" in command and not (tmp_path / "o" / "hardware").exists()
    capsys.readouterr()
    assert main([str(run), "--hardware", str(tmp_path / "edited.yaml"), *out]) == 2
    err = capsys.readouterr().err
    assert "names the shipped GPU 'rtx4090' with other numbers" in err and err.count("\n") == 1


def _edit_meta(run: Path, edit) -> None:
    meta = json.loads((run / "meta.json").read_text())
    edit(meta)
    (run / "meta.json").write_text(json.dumps(meta))


def test_meta_settings_fall_back_to_the_resolved_config(tmp_path: Path) -> None:
    """dtype ``auto`` and a missing engine_kwargs limit are read from resolved_config."""
    run = _fake_run(tmp_path, n=12)

    def edit(meta: dict) -> None:
        meta["engine_kwargs"]["dtype"] = "auto"
        del meta["engine_kwargs"]["max_num_batched_tokens"]
        del meta["engine_kwargs"]["max_model_len"]
        rc = meta["resolved_config"]
        rc["model_config"] = {"dtype": "torch.bfloat16", "max_model_len": 4096}
        rc["scheduler_config"]["max_num_batched_tokens"] = 256
        meta["engine_kwargs"]["kv_cache_dtype"] = "bfloat16"  # the weights' dtype, named

    _edit_meta(run, edit)
    result = run_calibration(run, "rtx4090", out=tmp_path / "out", plot=False)
    assert "system.max_num_batched_tokens=256" in result["simulate_command"]
    assert "system.max_model_len=4096" in result["simulate_command"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["engine_kwargs"].update(kv_cache_dtype="fp8"),
         "engine_kwargs.kv_cache_dtype is 'fp8': kvlab prices the KV cache in the weights' "
         "dtype only (bfloat16)"),
        (lambda m: m["engine_kwargs"].update(pipeline_parallel_size=2),
         "engine_kwargs.pipeline_parallel_size is 2"),
        (lambda m: (m["engine_kwargs"].update(dtype="auto"),
                    m["resolved_config"].update(model_config={"dtype": "torch.float64"})),
         "resolved_config.model_config.dtype 'float64' is not one of"),
        (lambda m: m["resolved_config"]["scheduler_config"].update(enable_chunked_prefill=False),
         "the run's scheduler settings cannot be simulated: max_num_batched_tokens"),
    ],
)  # fmt: skip
def test_settings_kvlab_cannot_price_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, edit, message: str
) -> None:
    run = _fake_run(tmp_path, n=6)
    _edit_meta(run, edit)
    assert main([str(run), "--hardware", "rtx4090", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "error: error" not in err


def test_requests_the_simulator_rejects_are_left_out_and_named(tmp_path: Path) -> None:
    """A logged request over meta.json's max_model_len cannot be replayed: it is named and
    left out of both sides, and every metric stays a number."""
    run = _fake_run(tmp_path, n=20)
    lines = (run / "requests.jsonl").read_text().splitlines()
    row = json.loads(lines[15])
    row["input_toks"] = 5000
    lines[15] = json.dumps(row)
    (run / "requests.jsonl").write_text("\n".join(lines) + "\n")
    result = run_calibration(run, "rtx4090", out=tmp_path / "out", plot=False)
    assert result["rejected_by_simulator"].keys() == {"15"}
    assert any("1 over max_model_len" in n for n in result["notes"])
    assert all(math.isfinite(v) for part in ("uncalibrated", "calibrated")
               for v in result[part].values())  # fmt: skip
    assert result["num_heldout_requests"] == 9


def test_small_logs_and_bad_out_fail_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = _fake_run(tmp_path, n=6)
    lines = (run / "requests.jsonl").read_text().splitlines()
    (run / "requests.jsonl").write_text(lines[0] + "\n")
    assert main([str(run), "--hardware", "rtx4090", "--out", str(tmp_path / "o")]) == 2
    assert "the log holds 1 request" in capsys.readouterr().err
    (tmp_path / "afile").write_text("")
    assert main([str(run), "--hardware", "rtx4090", "--out", str(tmp_path / "afile")]) == 2
    assert "--out: " in capsys.readouterr().err
    # under a file: refused before the simulation, not by mkdir after it
    under = str(tmp_path / "afile" / "sub")
    assert main([str(run), "--hardware", "rtx4090", "--out", under]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"calibrate_vllm: error: --out: {under} lies under {tmp_path / 'afile'}, a " + (
        "file, not a folder"
    )
    missing = str(tmp_path / "nowhere" / "config.json")
    assert main([str(run), "--hardware", "rtx4090", "--model", missing, "--out", "o"]) == 2
    assert f"--model {missing}: no such file" in capsys.readouterr().err
    assert main([str(run), "--hardware", str(tmp_path / "no.yaml"), "--out", "o"]) == 2
    assert "no.yaml: no such file" in capsys.readouterr().err


def test_the_printed_simulate_command_replays_the_calibrated_run(tmp_path: Path) -> None:
    """The ``simulate`` call calibrate_vllm prints gives its calibrated prediction."""
    import shlex

    from experiments.reproduce import compose_config

    run = _fake_run(tmp_path, n=16)
    result = run_calibration(run, "rtx4090", out=tmp_path / "out", plot=False)
    args = shlex.split(result["simulate_command"])
    assert args[:3] == ["python", "-m", "experiments.simulate"]
    simulate_run(compose_config(args[3:]), tmp_path / "sim")
    frame = pd.read_csv(tmp_path / "sim" / "requests.csv")
    held = split_ids(read_vllm_log(run), 0.5)[1]
    assert part_metrics(frame, held) == pytest.approx(result["predicted"]["calibrated"])


def test_part_metrics_count_every_sample_as_summarize_does() -> None:
    import pandas as pd

    from experiments.calibrate_vllm import part_metrics

    frame = pd.DataFrame({
        "request_id": [0, 1], "arrival_s": [0.0, 0.0], "finish_s": [1.0, 2.0],
        "output_len": [10, 10], "num_seqs": [1, 4], "ttft_s": [0.1, 0.2],
        "tpot_s": [0.01, 0.02], "e2el_s": [1.0, 2.0],
    })  # fmt: skip
    assert part_metrics(frame, {0, 1})["output_throughput"] == 50 / 2.0
    assert part_metrics(frame.drop(columns="num_seqs"), {0, 1})["output_throughput"] == 10.0


def test_the_readers_warnings_are_notes_in_errors_json(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A log shorter than meta.json's num_requests (a run cut short) is said once, as a
    note on stderr and in errors.json's notes, not only as a bare line on stderr."""
    run = _fake_run(tmp_path, n=16)
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "num_requests": 20}))
    out = tmp_path / "out"
    assert main([str(run), "--hardware", "rtx4090", "--out", str(out)]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "num_requests" in line]
    assert len(said) == 1 and said[0].startswith("calibrate_vllm: note: ")
    assert "16 requests, but meta.json's num_requests is 20" in said[0]
    notes = json.loads((out / "errors.json").read_text())["notes"]
    assert [n for n in notes if "num_requests" in n] == [said[0].removeprefix(
        "calibrate_vllm: note: ")]  # fmt: skip


def test_a_model_other_than_the_runs_is_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--model`` naming another model than meta.json's (a Qwen3-8B cost model fitted to a
    Llama-3.1-8B run's timings) is said as a note, as ``--allow-device-mismatch`` says a
    GPU other than the run's; the same model given as its config.json is not."""
    run = _fake_run(tmp_path, n=12)
    out = tmp_path / "out"
    assert main([str(run), "--hardware", "rtx4090", "--model", "qwen3-8b",
                 "--out", str(out)]) == 0  # fmt: skip
    said = [line for line in capsys.readouterr().err.splitlines() if "--model" in line]
    assert len(said) == 1 and said[0].startswith("calibrate_vllm: note: "), said
    assert "qwen3-8b" in said[0] and "meta-llama/Llama-3.1-8B" in said[0]
    notes = json.loads((out / "errors.json").read_text())["notes"]
    assert any("--model qwen3-8b" in n for n in notes)
    model_dir = tmp_path / "same-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(get_model("llama-3.1-8b").to_hf_config()))
    result = run_calibration(run, "rtx4090", str(model_dir), plot=False)
    assert not [n for n in result["notes"] if "--model" in n]


def test_the_fitted_constants_are_read_against_their_bounds() -> None:
    # the printout gave "1/memory efficiency 1.0" alone, read as a model faster than the
    # roofline, and did not say the fit had left it (and the constant) at a bound
    from experiments.lib.vllm_fit import bounds_line

    line = bounds_line({"constant": 0.0, "linear_flop_time": 1.1757, "attn_flop_time": 1.1757,
                        "byte_time": 20.0})  # fmt: skip
    assert "per-step constant 0 ms (in [0, 100], at its lower bound)" in line
    assert "compute time scale 1.176 (in [1, 20])" in line
    assert "memory time scale 20 (in [1, 20], at its upper bound)" in line
    assert "a scale of 1 is not a faster model than the roofline" in line
