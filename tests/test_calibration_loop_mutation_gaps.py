"""The calibration loop (experiments.calibrate, validate, calibrate_overhead) on small inputs:
a shipped engine run copied to tmp_path, edited where a test needs another identity, and
synthetic phase-timed steps for the overhead fit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from core.metrics.phases import CPU_PHASES, PHASE_COLUMNS
from core.request import Request
from experiments import calibrate, calibrate_overhead, validate
from experiments.lib.checks import ConfigError
from sim.cost.stack_file import fit_measured_overhead, split_steps

ENGINE = Path(__file__).resolve().parents[1] / "docs/validation/h200/first-run/engine"


def _run(tmp: Path) -> Path:
    """A copy of a finished OPT-13B engine run (and the trace it names)."""
    shutil.copy(ENGINE / "trace_opt-13b.csv", tmp)
    run = tmp / "run"
    shutil.copytree(ENGINE / "opt-13b_vllm_offline", run)
    return run


def _edit_config(run: Path, **changes: Any) -> None:
    """Set dotted keys of the run's config.yaml (a value None deletes the key)."""
    cfg = OmegaConf.load(run / "config.yaml")
    for key, value in changes.items():
        group, _, leaf = key.rpartition(".")
        node = cfg if not group else OmegaConf.select(cfg, group)
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    OmegaConf.save(cfg, run / "config.yaml")


def _edit_engine(run: Path, **changes: Any) -> None:
    doc = json.loads((run / "engine.json").read_text())
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    (run / "engine.json").write_text(json.dumps(doc))


def _calibration(run: Path) -> dict[str, Any]:
    return calibrate.calibration_doc(calibrate.calibrate(run), run)


# ------------------------------------------------------------------ experiments.calibrate


def test_a_config_without_the_system_group_is_refused_naming_both_groups(
    tmp_path: Path,
) -> None:
    """A config.yaml that has a model but no system group is not a run's config: one
    ConfigError on run_dir, not a KeyError later when the block size is read."""
    run = _run(tmp_path)
    _edit_config(run, system=None)
    with pytest.raises(ConfigError, match="lacks the model and system groups"):
        calibrate.calibrate(run)


def test_the_calibration_carries_the_runs_tp_block_size_and_name(tmp_path: Path) -> None:
    """The fit is made at the run's tensor-parallel size and KV block size (config.yaml),
    and the file names the run directory it came from (its name, not its path)."""
    run = _run(tmp_path)
    _edit_config(run, **{"model.tp": 2, "system.block_size": 32})
    doc = _calibration(run)
    assert doc["tp"] == 2 and doc["block_size"] == 32
    assert doc["source_run"] == "run"


def test_a_run_without_a_dtype_is_priced_in_float32() -> None:
    """The engine's default dtype is float32: a config without one is 4 bytes a value."""
    assert calibrate.dtype_bytes({}) == 4
    assert calibrate.dtype_bytes({"dtype": "float16"}) == 2
    with pytest.raises(ValueError, match="not one of"):
        calibrate.dtype_bytes({"dtype": "int3"})


def test_a_run_without_a_recorded_step_timer_was_timed_on_the_wall_clock(
    tmp_path: Path,
) -> None:
    """engine.json from before the timer was recorded means the wall clock: the
    calibration says so, and a thread-CPU calibration is refused for such a run."""
    run = _run(tmp_path)
    _edit_engine(run, step_timer=None)
    assert _calibration(run)["step_timer"] == "wall"
    with pytest.raises(ConfigError, match="another step timer \\(thread_cpu\\)"):
        calibrate.check_measured_alike({"step_timer": "thread_cpu"}, run, "--calibration")
    calibrate.check_measured_alike({"step_timer": "wall"}, run, "--calibration")


def test_a_negative_r2_is_warned_about(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fit whose R² is below 0 (worse than the mean) gets a warning on stderr; one at or
    above 0 does not. The file is written either way."""
    run = _run(tmp_path)
    model = calibrate.calibrate(run)
    for r2, warned in ((-0.5, True), (0.0, False), (0.9, False)):
        model.fit_stats["r2"] = r2
        monkeypatch.setattr(calibrate, "calibrate", lambda *a, **k: model)
        assert calibrate.main([str(run), "--out", str(tmp_path / "c.json")]) == 0
        assert ("warning: R²" in capsys.readouterr().err) is warned, r2


# ------------------------------------------------------------------ experiments.validate


def test_a_calibration_of_another_tp_or_gpu_is_refused(tmp_path: Path) -> None:
    """validate refuses a calibration fitted at another tensor-parallel size or for
    another GPU than the run's, naming the field."""
    run = _run(tmp_path)
    doc = _calibration(run)
    for field, other in (("tp", 2), ("gpu", "a100-80gb"), ("model", "opt-1.3b")):
        with pytest.raises(ConfigError, match=f"--calibration: fitted for another {field}"):
            validate.validate(run, {**doc, field: other})


def test_a_calibration_measured_on_another_device_is_refused_by_validate(
    tmp_path: Path,
) -> None:
    """validate checks the calibration was measured on the run's device and timer."""
    run = _run(tmp_path)
    doc = _calibration(run)
    with pytest.raises(ConfigError, match="another device"):
        validate.validate(run, {**doc, "measured_on": "CPU"})


def test_relative_errors_are_signed_simulator_minus_engine_over_engine() -> None:
    """rel_err is (simulator − engine) / |engine|: positive when the simulator is high;
    0 when both are equal (zero included), None when the engine's value is 0 alone or a
    side is missing or not finite."""
    rows = validate.compare(
        {"output_throughput": 100.0, "mean_ttft_ms": 0.0, "mean_tpot_ms": 0.0},
        {"output_throughput": 150.0, "mean_ttft_ms": 0.0, "mean_tpot_ms": 2.0},
    )
    by = {r["metric"]: r for r in rows}
    assert [r["metric"] for r in rows] == list(validate.METRICS)
    assert by["output_throughput"]["rel_err"] == pytest.approx(0.5)
    assert by["output_throughput"]["engine"] == 100.0
    assert by["output_throughput"]["simulator"] == 150.0
    assert by["mean_ttft_ms"]["rel_err"] == 0.0
    assert by["mean_tpot_ms"]["rel_err"] is None
    assert by["mean_e2el_ms"]["rel_err"] is None
    assert validate.rel_err(50.0, 100.0) == pytest.approx(-0.5)
    assert validate.rel_err(float("nan"), 1.0) is None


def test_the_printed_table_shows_signed_errors(capsys) -> None:
    rows = validate.compare({"output_throughput": 100.0}, {"output_throughput": 90.0})
    validate.print_comparison(rows)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("output_throughput"))
    assert "-10.00%" in line and "100" in line and "90" in line
    assert "n/a" in next(x for x in out.splitlines() if x.startswith("mean_ttft_ms"))


def test_offline_runs_put_every_arrival_at_zero() -> None:
    """An offline run's requests all arrive at 0 in the simulation; online keeps them."""
    reqs = [
        Request(request_id=i, arrival_time=1.5 * i, prompt_len=4, output_len=2) for i in range(3)
    ]
    assert [r.arrival_time for r in validate.as_served({"mode": "offline"}, reqs)] == [0.0] * 3
    assert [r.arrival_time for r in validate.as_served({"mode": "online"}, reqs)] == [
        0.0, 1.5, 3.0,
    ]  # fmt: skip
    assert [r.arrival_time for r in validate.as_served({}, reqs)] == [0.0, 1.5, 3.0]


def test_the_simulation_takes_the_batch_limit_the_engine_served_with(tmp_path: Path) -> None:
    """engine.json's max_num_seqs (the limit served) overrides the config's: a run served
    two sequences at a time is simulated two at a time."""
    run = _run(tmp_path)
    _edit_engine(run, max_num_seqs=2)
    simulated, _ = validate.simulate_run(run, calibrate.calibrate(run))
    assert simulated["mean_batch_size"] <= 2.0
    assert simulated["completed"] == 50


def test_the_simulation_takes_the_seed_the_run_was_served_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's seed reaches the simulator (beam search's stand-in and the prompt ids drawn
    for prefix caching depend on it), not a fixed one."""
    seen: dict[str, Any] = {}

    class Simulated(Exception):
        pass

    def simulate(*args: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise Simulated

    monkeypatch.setattr(validate, "simulate", simulate)
    run = _run(tmp_path)
    calibration = calibrate.calibrate(run)
    for seed in (0, 7):
        _edit_config(run, seed=seed)
        with pytest.raises(Simulated):
            validate.simulate_run(run, calibration)
        assert seen["seed"] == seed


def test_engine_batch_limits_of_zero_are_refused(tmp_path: Path) -> None:
    """A served batch limit in engine.json must be a positive whole number."""
    run = _run(tmp_path)
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        _edit_engine(run, **{key: 0})
        with pytest.raises(ConfigError, match=f"{key}: expected a positive whole number"):
            validate.read_engine_kv(run)
        _edit_engine(run, **{key: None})
    _edit_engine(run, block_size=24)
    with pytest.raises(ConfigError, match="block_size: expected a power of two"):
        validate.read_engine_kv(run)


def test_a_wall_clock_run_is_not_expected_to_replay_exactly(tmp_path: Path) -> None:
    """Replaying a clock: wall run's step times need not reproduce it (arrivals are wall
    times): validation.json says so, while a virtual-clock run is expected to match."""
    run = _run(tmp_path)
    assert validate.validate(run, recorded=True)["exact_replay_expected"] is True
    _edit_config(run, clock="wall")
    doc = validate.validate(run, recorded=True)
    assert doc["clock"] == "wall" and doc["exact_replay_expected"] is False


def test_a_non_numeric_engine_metric_is_refused(tmp_path: Path) -> None:
    run = _run(tmp_path)
    metrics = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**metrics, "mean_ttft_ms": "fast"}))
    with pytest.raises(ConfigError, match="mean_ttft_ms is 'fast', not a number"):
        validate.validate(run, recorded=True)


def test_read_calibration_checks_a_calibration_document(tmp_path: Path) -> None:
    """A calibration file with a malformed field is refused when read, naming the file;
    another kind of document is returned for validate to refuse."""
    run = _run(tmp_path)
    doc = _calibration(run)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**doc, "coefficients": "none"}))
    with pytest.raises(ConfigError, match="malformed calibration file"):
        validate.read_calibration(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"kind": "roofline"}))
    assert validate.read_calibration(other) == {"kind": "roofline"}


# --------------------------------------------------------- experiments.calibrate_overhead


def _steps(seqs: list[int], a: float, b: float) -> pd.DataFrame:
    """Steps whose four CPU phases sum exactly to ``a + b x seqs``."""
    total = a + b * np.asarray(seqs, float)
    frame = pd.DataFrame({"prefill_seqs": 0, "decode_seqs": seqs})
    for col in PHASE_COLUMNS:
        frame[col] = total / len(CPU_PHASES) if col in CPU_PHASES else 0.5
    return frame


def test_point_rows_report_each_points_fit_and_error() -> None:
    """Each train and held-out point: milliseconds measured and fitted, and the relative
    error |fit − measured| / measured."""
    doc = {
        "cpu": {"per_step_s": 0.001, "per_seq_s": 0.0001},
        "fit": {"points": {"train": [[2, 0.0015, 5]], "heldout": [[10, 0.004, 7]]}},
    }
    rows = calibrate_overhead.point_rows(doc)
    assert [(r["part"], r["seqs"], r["steps"]) for r in rows] == [
        ("train", 2, 5), ("heldout", 10, 7),
    ]  # fmt: skip
    assert rows[0]["measured_ms"] == pytest.approx(1.5)
    assert rows[0]["fit_ms"] == pytest.approx(1.2)
    assert rows[0]["rel_err"] == pytest.approx(0.3 / 1.5)
    assert rows[1]["fit_ms"] == pytest.approx(2.0)
    assert rows[1]["rel_err"] == pytest.approx(0.5)


def _phase_run(path: Path, steps: pd.DataFrame, engine: dict[str, Any] | None) -> Path:
    path.mkdir(parents=True)
    steps.to_csv(path / "steps.csv", index=False)
    if engine is not None:
        (path / "engine.json").write_text(json.dumps(engine))
    return path


def test_the_stack_file_names_the_device_and_timer_measured_on(tmp_path: Path) -> None:
    """The fit records the runs' device (and a non-wall timer) and the base preset."""
    steps = _steps([1, 2, 3, 4] * 10, 1e-3, 1e-4)
    run = _phase_run(tmp_path / "r", steps, {"device": "CPU", "step_timer": "thread_cpu"})
    doc = calibrate_overhead.calibrate_overhead([run])
    assert doc["measured_on"] == "CPU (thread_cpu timer)"
    assert "on CPU (thread_cpu timer)" in doc["fit"]["source"]
    assert doc["cpu"]["per_step_s"] == pytest.approx(1e-3)
    assert doc["cpu"]["per_seq_s"] == pytest.approx(1e-4)
    for base in ("no-such-stack", "none"):  # "none" is a preset, without CPU costs
        with pytest.raises(ConfigError, match="--base: not a stack preset with CPU costs"):
            calibrate_overhead.calibrate_overhead([run], base=base)


def test_min_steps_zero_is_refused_and_one_is_taken(tmp_path: Path, capsys) -> None:
    steps = _steps([1, 2, 3, 4] * 2, 1e-3, 1e-4)
    run = _phase_run(tmp_path / "r", steps, None)
    out = tmp_path / "s.json"
    with pytest.raises(SystemExit) as exc:
        calibrate_overhead.main([str(run), "--out", str(out), "--min-steps", "0"])
    assert exc.value.code == 2
    assert calibrate_overhead.main([str(run), "--out", str(out), "--min-steps", "1"]) == 0
    assert json.loads(out.read_text())["fit"]["min_steps"] == 1


def test_dry_still_fails_on_a_run_without_phase_columns(tmp_path: Path) -> None:
    """--dry forgives a fit the timings cannot support, not a run that lacks the phases."""
    steps = _steps([1, 2, 3, 4] * 10, 1e-3, 1e-4).drop(columns=["sample_s"])
    run = _phase_run(tmp_path / "r", steps, None)
    with pytest.raises(SystemExit) as exc:
        calibrate_overhead.main([str(run), "--out", str(tmp_path / "s.json"), "--dry"])
    assert exc.value.code == 2


def test_half_split_trains_on_the_first_floor_half_of_each_run() -> None:
    """split half: each run's first len // 2 steps train, the rest (the middle step of an
    odd run included) is held out; split runs holds out the last run whole."""
    a = pd.DataFrame({"x": range(5)})
    b = pd.DataFrame({"x": range(10, 13)})
    train, held = split_steps([("a", a), ("b", b)], "half")
    assert train["x"].tolist() == [0, 1, 10]
    assert held["x"].tolist() == [2, 3, 4, 11, 12]
    train, held = split_steps([("a", a), ("b", b)], "runs")
    assert train["x"].tolist() == [0, 1, 2, 3, 4] and held["x"].tolist() == [10, 11, 12]


def test_points_count_prefill_and_decode_sequences_and_need_min_steps() -> None:
    """A step's sequences are prefill + decode; a count with exactly min_steps steps is a
    point; the point is the median (not the mean) CPU time."""
    steps = _steps([1, 2, 3] * 4, 1e-3, 1e-4)
    steps.loc[0:3, "prefill_seqs"] = 1  # steps 0..3: one of their sequences prefills
    steps.loc[0:3, "decode_seqs"] -= 1
    doc = fit_measured_overhead([("r", steps), ("r2", steps)], "runs", min_steps=4)
    points = doc["fit"]["points"]["heldout"]
    assert [p[0] for p in points] == [1, 2, 3]
    assert [p[2] for p in points] == [4, 4, 4]
    spiky = _steps([1] * 5 + [2] * 5, 1e-3, 1e-4)
    spiky.loc[0, "schedule_s"] = 1.0  # one outlier: the median ignores it
    doc = fit_measured_overhead([("r", spiky), ("r2", spiky)], "runs", min_steps=5)
    assert doc["fit"]["points"]["train"][0][1] == pytest.approx(1.1e-3)


def test_a_fit_with_a_negative_per_sequence_term_is_unsupported() -> None:
    from sim.cost.stack_file import UnsupportedFit

    steps = _steps([1, 2, 3, 4] * 5, 1e-3, 1e-4)
    steps["schedule_s"] = 0.01 - 0.002 * (steps["decode_seqs"])  # CPU time falls with seqs
    with pytest.raises(UnsupportedFit, match="negative term"):
        fit_measured_overhead([("r", steps)], "half", 1)


def test_the_max_errors_are_maxima_not_means() -> None:
    """train_max_err / heldout_max_err are the largest point errors."""
    seqs = [1, 2, 3, 4] * 6
    steps = _steps(seqs, 1e-3, 1e-4)
    steps.loc[steps["decode_seqs"] == 3, "schedule_s"] += 5e-4  # one point off the line
    doc = fit_measured_overhead([("r", steps), ("r2", steps)], "runs", 1)
    cpu = doc["cpu"]
    assert cpu["train_max_err"] > cpu["train_mape"] > 0
    assert cpu["heldout_max_err"] > cpu["heldout_mape"] > 0


def test_a_config_without_a_hardware_name_is_refused_naming_the_key(tmp_path: Path) -> None:
    """A run's config.yaml with no hardware.name: a ConfigError on hardware.name."""
    run = _run(tmp_path)
    _edit_config(run, **{"hardware.name": None})
    cfg = calibrate.read_run_config(run)
    with pytest.raises(
        ConfigError, match=r"hardware\.name: the run's config\.yaml names no hardware"
    ):
        calibrate.run_identity(cfg)


def _cpu_profile(out: Path, **meta: Any) -> Path:
    from tests.test_cost_profiled import synthetic_rows, write_profile

    return write_profile(out, synthetic_rows(), **{"gpu": "cpu", "model": "opt-13b", **meta})


@pytest.mark.parametrize(
    ("timer", "fits"),
    [
        ({"step_timer": "thread_cpu", "threads": 1}, True),
        ({"step_timer": "thread_cpu", "threads": 4}, False),
        ({"step_timer": "wall", "threads": 1}, False),
        ({"threads": 1}, False),  # no step_timer recorded: the wall clock
    ],
)
def test_a_cpu_profile_fits_only_a_one_thread_cpu_timed_run(
    tmp_path: Path, timer: dict[str, Any], fits: bool
) -> None:
    """A CPU operator profile times one thread's CPU time: a run not served with
    threads=1 step_timer=thread_cpu is refused under --profile."""
    from sim.catalog import get_model, resolve_gpu

    prof = _cpu_profile(tmp_path / "p")
    cfg = {"dtype": "float16", **timer}
    args = (cfg, get_model("opt-13b"), resolve_gpu({"name": "h200"}), 1, 2, 16)
    if fits:
        calibrate.check_profile_fits_run(str(prof), *args)
    else:
        with pytest.raises(ConfigError, match=r"--profile: .*times one thread's CPU time"):
            calibrate.check_profile_fits_run(str(prof), *args)


def test_a_profile_at_another_block_size_or_dtype_is_refused(tmp_path: Path) -> None:
    """The profile's block size and dtype must be the run's."""
    from sim.catalog import get_model, resolve_gpu

    cfg = {"dtype": "float16", "step_timer": "thread_cpu", "threads": 1}
    model, gpu = get_model("opt-13b"), resolve_gpu({"name": "h200"})
    prof = _cpu_profile(tmp_path / "p", block_size=32)
    with pytest.raises(ConfigError, match="measured at block size 32, the run at 16"):
        calibrate.check_profile_fits_run(str(prof), cfg, model, gpu, 1, 2, 16)
    prof = _cpu_profile(tmp_path / "q", dtype="float32")
    with pytest.raises(ConfigError, match="measured in float32, the run in float16"):
        calibrate.check_profile_fits_run(str(prof), cfg, model, gpu, 1, 2, 16)


def test_a_recorded_replay_of_a_header_only_steps_file_is_refused(tmp_path: Path) -> None:
    """No steps to replay: one ConfigError on --recorded saying so."""
    run = _run(tmp_path)
    header = (run / "steps.csv").read_text().splitlines()[0]
    (run / "steps.csv").write_text(header + "\n")
    metrics = json.loads((run / "metrics.json").read_text())
    del metrics["num_steps"]
    (run / "metrics.json").write_text(json.dumps(metrics))
    with pytest.raises(ConfigError, match=r"--recorded: .*no steps \(duration_s\) to replay"):
        validate.validate(run, recorded=True)


BEAM_WORKLOAD = {
    "kind": "synthetic", "dataset": "alpaca", "rate": 10.0, "duration_s": None,
    "num_requests": 6, "arrival": "poisson", "burstiness": 1.0, "n": 1, "beam_width": 2,
    "sigma_input": None, "sigma_output": None, "with_token_ids": False,
}  # fmt: skip


def test_a_calibrated_validation_neither_reads_beams_csv_nor_explains_a_replay(
    tmp_path: Path,
) -> None:
    """beams.csv is the recorded replay's: validating with a calibration draws the
    simulator's own beams (an unreadable beams.csv is not read) and validation.json has
    no not_exact_because (that explains an inexact replay)."""
    run = _run(tmp_path)
    doc = _calibration(run)
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.workload = BEAM_WORKLOAD
    OmegaConf.save(cfg, run / "config.yaml")
    (run / "beams.csv").write_text("not,a,beams,file\n1,2\n")
    result = validate.validate(run, doc)
    assert "not_exact_because" not in result
    assert result["exact_replay_expected"] is False
    assert result["simulator"]["completed"] == 6


def test_one_train_point_is_not_a_line() -> None:
    """The fit needs two sequence counts among the train points."""
    from sim.cost.stack_file import UnsupportedFit

    steps = _steps([3] * 10, 1e-3, 1e-4)
    with pytest.raises(UnsupportedFit, match="hold 1 sequence count"):
        fit_measured_overhead([("r", steps)], "half", 1)


def test_target_host_without_a_profile_is_a_usage_error_before_the_fit(
    tmp_path: Path, capsys
) -> None:
    """--target host without --profile: the parser's usage error naming --profile (exit 2),
    before the run is read; nothing is written."""
    run = _run(tmp_path)
    (run / "steps.csv").unlink()  # the run is not read: its steps are not needed to refuse
    out = tmp_path / "c.json"
    with pytest.raises(SystemExit) as exc:
        calibrate.main([str(run), "--target", "host", "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--target host fits on top of an operator profile; give --profile" in err
    assert not out.exists()
