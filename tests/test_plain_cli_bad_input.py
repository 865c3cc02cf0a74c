"""The argparse tools (calibrate, validate, calibrate_overhead) on a damaged run directory:
one line naming the key or file, exit status 2, no traceback."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from experiments import calibrate, calibrate_overhead, validate

RUN = Path(__file__).resolve().parents[1] / "docs/validation/h200/first-run/engine"


def _run(tmp: Path) -> Path:
    """A copy of a finished OPT-13B engine run (and the trace it names) with a calibration."""
    shutil.copy(RUN / "trace_opt-13b.csv", tmp)
    run = tmp / "run"
    shutil.copytree(RUN / "opt-13b_vllm_offline", run)
    assert calibrate.main([str(run)]) == 0
    return run


def _write(name: str, text: str) -> Callable[[Path], None]:
    return lambda run: (run / name).write_text(text)


def _steps(edit: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        lines = (run / "steps.csv").read_text().splitlines()
        (run / "steps.csv").write_text("\n".join(edit(lines)) + "\n")

    return apply


def _duration(value: str) -> Callable[[list[str]], list[str]]:
    return _column("duration_s", value)


def _column(name: str, value: str) -> Callable[[list[str]], list[str]]:
    def edit(lines: list[str]) -> list[str]:
        col = lines[0].split(",").index(name)
        row = lines[1].split(",")
        row[col] = value
        return [lines[0], ",".join(row), *lines[2:]]

    return edit


def _metrics(**changes: object) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        doc = json.loads((run / "metrics.json").read_text())
        (run / "metrics.json").write_text(json.dumps({**doc, **changes}))

    return apply


def _uncounted(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """``damage``, in a run whose metrics.json does not count its steps (so the steps.csv's
    own problem is the one reported, not the count)."""

    def apply(run: Path) -> None:
        damage(run)
        metrics = json.loads((run / "metrics.json").read_text())
        del metrics["num_steps"]
        (run / "metrics.json").write_text(json.dumps(metrics))

    return apply


def _cut_mid_line(run: Path) -> None:
    text = (run / "steps.csv").read_text()
    (run / "steps.csv").write_text(text[: text.rindex("\n", 0, len(text) // 2) + 5])


def _calibration(**changes: object) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        doc = json.loads((run / "calibration.json").read_text())
        (run / "calibration.json").write_text(json.dumps({**doc, **changes}))

    return apply


def _engine(**changes: object) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        doc = json.loads((run / "engine.json").read_text())
        (run / "engine.json").write_text(json.dumps({**doc, **changes}))

    return apply


def _edit_config(run: Path, old: str, new: str) -> None:
    text = (run / "config.yaml").read_text()
    assert old in text
    (run / "config.yaml").write_text(text.replace(old, new, 1))


def _config_model(run: Path) -> None:
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text.replace("name: opt-13b", "name: no-such-model", 1))


CASES = [
    # (id, damage, tool, args after the run dir, key or file named, phrase)
    ("empty_steps", _write("steps.csv", ""), calibrate, [], "run_dir", "is empty"),
    ("garbled_steps", _write("steps.csv", 'a,b\n1,"2\n3,4,5,6\n'), calibrate, [], "run_dir",
     "cannot read"),
    ("header_only_steps", _uncounted(_steps(lambda lines: lines[:1])), calibrate, [], "run_dir",
     "non-empty steps"),
    ("text_duration", _steps(_duration("slow")), calibrate, [], "run_dir", "duration_s"),
    ("negative_duration", _steps(_duration("-0.5")), calibrate, [], "run_dir", "duration_s"),
    ("malformed_config", _write("config.yaml", "model: [\n  name: x"), calibrate, [], "run_dir",
     "config.yaml"),
    ("unknown_model", _config_model, calibrate, [], "model", "unknown model"),
    ("overhead_empty_steps", _write("steps.csv", ""), calibrate_overhead, [], "run_dir",
     "is empty"),
    ("truncated_engine_json", _write("engine.json", '{"num_blocks": '), validate, [],
     "run_dir", "engine.json"),
    ("truncated_metrics", _write("metrics.json", "{"), validate, [], "run_dir", "metrics.json"),
    ("truncated_calibration", _write("calibration.json", '{"kind"'), validate, [],
     "--calibration", "cannot read"),
    ("not_a_calibration", _write("calibration.json", json.dumps({"a": 1})), validate, [],
     "--calibration", "not a calibration document"),
    ("no_steps_to_replay", lambda run: (run / "steps.csv").unlink(), validate, ["--recorded"],
     "--recorded", "no steps.csv"),
    ("header_only_replay", _uncounted(_steps(lambda lines: lines[:1])), validate,
     ["--recorded"], "--recorded", "no steps"),
    ("no_duration_column",
     _uncounted(_steps(lambda lines: [",".join(f"c{i}" for i in range(3))] * 3)),
     calibrate, [], "run_dir", "no column duration_s"),
    ("engine_json_without_sizes", _write("engine.json", "{}"), validate, [], "run_dir",
     "whole numbers block_size"),
    ("metrics_not_an_object", _write("metrics.json", "[]"), validate, [], "run_dir",
     "not a JSON object"),
    ("negative_cpu_blocks", _engine(num_cpu_blocks=-1), validate, [], "run_dir",
     "engine.json: num_cpu_blocks: expected a whole number in [0, 67108864], got -1"),
    ("blocks_past_a_pool", _engine(num_blocks=10**12), validate, [], "run_dir",
     "engine.json: num_blocks: expected a whole number in [1, 67108864], got 1000000000000"),
    ("no_blocks", _engine(num_blocks=0), validate, [], "run_dir",
     "engine.json: num_blocks: expected a whole number in [1,"),
    ("block_size_not_a_power_of_two", _engine(block_size=12), validate, [], "run_dir",
     "engine.json: block_size: expected a power of two, got 12"),
    ("num_requests_text", lambda run: _edit_config(run, "num_requests: 50",
     "num_requests: abc"), validate, [], "workload.num_requests",
     "config.yaml: not a positive count (got 'abc'"),
    ("tp_not_a_number", lambda run: _edit_config(run, "tp: 1", "tp: abc"), calibrate, [],
     "model.tp", "config.yaml: not a positive GPU count"),
    ("infinite_duration", _steps(_duration("inf")), calibrate, [], "run_dir",
     "column duration_s, row 1: inf is not a finite number"),
    ("infinite_duration_replay", _steps(_duration("inf")), validate, ["--recorded"],
     "--recorded", "column duration_s, row 1: inf"),
    ("text_in_a_count", _steps(_column("prefill_tokens", "x")), calibrate, [], "run_dir",
     "column prefill_tokens, row 1: 'x' is not a finite number"),
    ("negative_count", _steps(_column("decode_seqs", "-3")), calibrate, [], "run_dir",
     "column decode_seqs, row 1: -3"),
    ("validate_unknown_model", _config_model, validate, ["--recorded"], "model",
     "unknown model"),
    ("calibration_of_another_model", _calibration(model="opt-1.3b"), validate, [],
     "--calibration", "fitted for another model"),
    ("calibration_of_another_gpu", _calibration(gpu="a100-40gb"), validate, [],
     "--calibration", "fitted for another gpu"),
    ("calibration_coefficients_null", _calibration(coefficients=None), validate, [],
     "--calibration", "coefficients: expected a mapping"),
    ("calibration_dtype_null", _calibration(dtype_bytes=None), validate, [],
     "--calibration", "dtype_bytes: expected a whole number"),
    ("calibration_profile_not_a_path", _calibration(profile=5), validate, [],
     "--calibration",
     "calibration.json: malformed calibration file: profile: expected a path or null, got 5"),
    ("calibration_mape_text", _calibration(fit_stats={"mape": "abc"}), validate, [],
     "--calibration",
     "calibration.json: malformed calibration file: fit_stats.mape: expected a number"),
    ("calibration_unknown_width", _calibration(dtype_bytes=1000), validate, [],
     "--calibration", "dtype_bytes: expected one of [2, 4]"),
    ("steps_cut_at_a_line", _steps(lambda lines: lines[: len(lines) // 2]), calibrate, [],
     "run_dir", "but metrics.json counts"),
    ("steps_cut_mid_line", _cut_mid_line, calibrate_overhead, [], "run_dir",
     "has no newline at its end"),
    ("replay_of_cut_steps", _steps(lambda lines: lines[: len(lines) // 2]), validate,
     ["--recorded"], "--recorded", "but metrics.json counts"),
    ("simulator_run", lambda run: (run / "engine.json").unlink(), calibrate, [], "run_dir",
     "no engine.json: not an engine run"),
    ("calibrate_truncated_engine_json", _write("engine.json", '{"num_blocks": '), calibrate,
     [], "run_dir", "engine.json"),
    ("text_in_a_phase_time", _steps(_column("sample_s", "x")), calibrate_overhead, [],
     "run_dir", "column sample_s, row 1: 'x'"),
    ("nan_phase_time", _steps(_column("schedule_s", "nan")), calibrate_overhead, [],
     "run_dir", "column schedule_s, row 1: nan"),
    ("text_metric", _metrics(mean_tpot_ms="fast"), validate, [], "run_dir",
     "mean_tpot_ms is 'fast', not a number"),
]  # fmt: skip


@pytest.mark.parametrize(("damage", "tool", "args", "key", "phrase"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_a_damaged_run_is_one_line(
    damage, tool, args: list[str], key: str, phrase: str, tmp_path: Path, capsys
) -> None:
    run = _run(tmp_path)
    damage(run)
    capsys.readouterr()
    extra = ["--out", str(tmp_path / "out.json")] if tool is calibrate_overhead else []
    with pytest.raises(SystemExit) as exit_:
        tool.main([str(run), *args, *extra])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {key}: "), err
    assert phrase in err and "Traceback" not in err


def test_a_missing_run_or_an_unwritable_output_is_one_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        validate.main([str(tmp_path / "absent")])
    assert exit_.value.code == 2 and "run_dir: no such directory" in capsys.readouterr().err
    run = _run(tmp_path)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # --out inside a regular file
        calibrate.main([str(run), "--out", str(blocked / "calibration.json")])
    said = capsys.readouterr()
    err = said.err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert err == f"error: --out: {blocked} is a file, not a folder", err
    assert said.out == ""  # refused before the fit
    assert calibrate.main([str(run), "--out", str(tmp_path / "new" / "c.json")]) == 0  # made


def test_a_run_on_a_gpu_of_ones_own_calibrates_and_validates(tmp_path: Path) -> None:
    """The run's config.yaml carries its GPU's numbers: a name the catalog does not hold
    is priced on them (it was a KeyError traceback)."""
    run = _run(tmp_path)
    _edit_config(run, "name: h200", "name: my-h200")
    assert calibrate.main([str(run)]) == 0
    assert json.loads((run / "calibration.json").read_text())["gpu"] == "my-h200"
    assert validate.main([str(run), "--out", str(tmp_path / "v.json")]) == 0


def test_validate_refuses_an_output_folder_before_simulating(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    run = _run(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        validate.main([str(run), "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and "engine" not in out
    assert err.strip() == f"error: --out: {tmp_path} is a folder; give the file to write"


@pytest.mark.parametrize(
    ("module", "args", "says"),
    [
        ("experiments.report.fig2_spread", ["--duration", "0"], "--duration must be > 0"),
        ("experiments.report.fig2_spread", ["--workers", "0"], "--workers >= 1"),
        ("experiments.report.fig2_spread", ["--out", "{file}"], "is a file, not a folder"),
        ("experiments.bench.cpu_cache_state", ["--out", "{file}"], "is a file, not a folder"),
        ("experiments.bench.cpu_decode_grid", ["--out", "{file}"], "is a file, not a folder"),
        # a model the catalog lacks, or one the engine cannot build, was a traceback
        ("experiments.bench.cpu_cache_state", ["--model", "nope"], "unknown model 'nope'"),
        ("experiments.bench.cpu_cache_state", ["--model", "qwen3-8b"], "qk_norm=True"),
        ("experiments.bench.profile_gpu", ["--dry", "--model", "qwen3-8b"], "qk_norm=True"),
        # a budget <= 0 skipped every run and exited 1 silently; nan ignored the budget
        ("experiments.bench.engine_gpu", ["--dry", "--max-seconds", "-1"], "--max-seconds"),
        ("experiments.bench.engine_gpu", ["--dry", "--max-seconds", "0"], "--max-seconds"),
        # the sleep that shows where the forward waits was taken at any value
        ("experiments.bench.sync_check", ["--dry", "--sleep-ms", "-1"], "--sleep-ms"),
        ("experiments.bench.sync_check", ["--dry", "--sleep-steps", "0"], "--sleep-steps"),
    ],
)
def test_a_study_refuses_bad_arguments_before_any_work(
    tmp_path: Path, capsys, module: str, args: list[str], says: str
) -> None:
    # these had printed worker tracebacks, or measured for minutes before failing to write
    import importlib

    if module.startswith("experiments.bench"):
        pytest.importorskip("torch")
    file = tmp_path / "a_file"
    file.write_text("")
    argv = [a.format(file=file) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(module).main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and not (tmp_path / "out").exists()
