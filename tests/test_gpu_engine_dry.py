"""The GPU engine script, run in its ``--dry`` mode (CPU, tiny models, Triton interpreter)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from experiments.bench.engine_gpu import SUMMARY_KEYS, SYSTEMS, main, make_plan, run_specs

pytestmark = pytest.mark.slow  # every test here shares one ~1-minute dry run


@pytest.fixture(scope="module")
def dry_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu_engine")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["--out", str(out), "--dry"]) == 0
    finally:
        torch.set_num_threads(before)
    return out


@pytest.mark.parametrize("dry", [True, False])
def test_runs_come_in_priority_order(dry: bool) -> None:
    """The calibration's fit run and held-out run first, so a time cap skips the rest."""
    plan = make_plan(dry=dry)
    specs = run_specs(plan, {m.model: Path("t.csv") for m in plan.models})
    first = plan.models[0].model
    assert [(s.model, s.system, s.mode) for s in specs[:2]] == [
        (first, "vllm", "offline"), (first, "vllm", "online"),
    ]  # fmt: skip
    per_model = 2 * len(SYSTEMS)
    assert {s.model for s in specs[:per_model]} == {first}
    assert [s.backend for s in specs[-2:]] == [plan.backend, "torch"]
    assert {s.model for s in specs[-2:]} == {plan.cross_check_model}


def test_every_planned_run_writes_serve_files(dry_out: Path) -> None:
    plan = make_plan(dry=True)
    names = [s.name for s in run_specs(plan, {m.model: Path("t.csv") for m in plan.models})]
    assert len(names) == len(set(names)) == 2 * len(plan.models) * len(SYSTEMS) + 2
    for name in names:
        for f in ("config.yaml", "metrics.json", "requests.csv", "steps.csv", "engine.json"):
            assert (dry_out / name / f).is_file(), f"{name}/{f}"
    with (dry_out / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == names
    assert set(SUMMARY_KEYS) <= set(rows[0])


def test_summary_has_metadata_ratios_and_no_errors(dry_out: Path) -> None:
    doc = json.loads((dry_out / "summary.json").read_text())
    assert doc["errors"] == {} and doc["skipped"] == []
    meta = doc["meta"]
    assert meta["dry"] is True and "MEANINGLESS" in meta["timings"]
    for key in ("device", "torch", "triton", "date", "command"):
        assert meta[key]
    assert all(r["completed"] == r["num_requests"] for r in doc["rows"])
    baselines = {(r["model"], r["mode"], r["baseline"]) for r in doc["ratios"]}
    assert ("tiny-llama", "online", "orca_oracle") in baselines
    xcheck = [r for r in doc["ratios"] if r["baseline"] == "torch_backend"]
    assert len(xcheck) == 1 and xcheck[0]["same_steps"] is True


def test_runs_use_the_planned_model_system_and_budget(dry_out: Path) -> None:
    engine = json.loads((dry_out / "tiny-llama_orca_max_online" / "engine.json").read_text())
    metrics = json.loads((dry_out / "tiny-llama_orca_max_online" / "metrics.json").read_text())
    assert metrics["model"] == "tiny-llama" and metrics["system"] == "orca_max"
    assert engine["dtype"] == "torch.float32"
    assert engine["kv_bytes"] <= 1024**2  # the dry plan's 1 MiB budget
    torch_run = (dry_out / "tiny-opt_vllm_offline_torch_xcheck" / "config.yaml").read_text()
    assert "backend: torch" in torch_run and "mode: offline" in torch_run


def test_a_moved_run_still_validates_by_recorded_replay(dry_out: Path, tmp_path: Path) -> None:
    from experiments import validate
    from experiments.lib.checks import ConfigError

    run = tmp_path / "tiny-opt_vllm_online"
    shutil.copytree(dry_out / run.name, run)
    shutil.copy(dry_out / "trace_tiny-opt.csv", tmp_path)
    cfg = (run / "config.yaml").read_text()
    old = str((dry_out / "trace_tiny-opt.csv").resolve())
    assert old in cfg
    (run / "config.yaml").write_text(cfg.replace(old, str(tmp_path / "gone" / "trace.csv")))
    with pytest.raises(ConfigError, match=r"workload\.path: trace not found"):
        validate.validate(run, recorded=True)
    (run / "config.yaml").write_text(cfg.replace(old, "elsewhere/trace_tiny-opt.csv"))
    doc = validate.validate(run, recorded=True)
    assert all(r["rel_err"] == 0.0 for r in doc["comparison"])


def test_gpu_report_reads_a_dry_call(
    dry_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A DRY=1 gpu_all.sh output (here: a dry profile and one dry engine run) gets a report:
    the CPU in the sidecar is priced as the nominal GPU the dry runs were served as, at the
    profile's fp32 width, without transferred prices (the shipped profile is fp16); its
    printed heading says the numbers are a dry run's."""
    from experiments.bench import gpu_report, profile_gpu
    from experiments.bench.engine_gpu import NOMINAL_GPU

    call = tmp_path / "call"
    assert profile_gpu.main(["--out", str(call / "profile"), "--dry"]) == 0
    (call / "engine").mkdir()
    shutil.copytree(dry_out / "tiny-opt_vllm_offline", call / "engine" / "tiny-opt_vllm_offline")
    shutil.copy(dry_out / "trace_tiny-opt.csv", call / "engine")
    capsys.readouterr()
    assert gpu_report.main([str(call), "--out", str(tmp_path / "out")]) == 0
    assert f"tiny-opt on {NOMINAL_GPU} (dry run on CPU: meaningless)" in capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["hardware"] == NOMINAL_GPU and doc["profile_as_measured"] is True
    assert doc["runs"] == ["tiny-opt_vllm_offline"] and len(doc["cross_run"]) == 1
    assert all(r["measured_ms"] > 0 and r["transferred_ms"] is None for r in doc["operators"])
