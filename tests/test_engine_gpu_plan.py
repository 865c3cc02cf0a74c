"""experiments.bench.engine_gpu without serving: the hardware its runs are served as, and
which runs a time cap skips (a fake clock and fake runs; nothing is timed)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from experiments.bench import engine_gpu
from experiments.bench.engine_gpu import NOMINAL_GPU, device_hardware, make_plan, run_specs

H100_NAME = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    ("reported", "hardware"),
    [(H100_NAME, "h100"), ("NVIDIA H200", "h200"), ("NVIDIA B300", NOMINAL_GPU)],
)
def test_runs_are_served_as_the_gpu_torch_reports(
    reported: str, hardware: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: reported)
    assert device_hardware(dry=False) == hardware
    assert ("note:" in capsys.readouterr().err) == (reported == "NVIDIA B300")
    assert device_hardware(dry=True) == NOMINAL_GPU


def test_the_plan_s_hardware_is_in_every_run_s_overrides() -> None:
    plan = replace(make_plan(dry=False), hardware="h100")
    specs = run_specs(plan, {m.model: Path("t.csv") for m in plan.models})
    assert all("hardware=h100" in s.overrides for s in specs)


class FakeClock:
    """Seconds that pass only when a fake run says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _serve_all(
    monkeypatch: pytest.MonkeyPatch, lengths: dict[str, float], max_seconds: float
) -> dict[str, Any]:
    """``serve_all`` over the GPU plan's runs, each taking ``lengths[backend]`` fake seconds
    (no summary written)."""
    plan = make_plan(dry=False)
    specs = run_specs(plan, {m.model: Path("t.csv") for m in plan.models})
    clock = FakeClock()

    def serve(spec: engine_gpu.RunSpec, out: Path) -> dict[str, Any]:
        clock.now += lengths[spec.backend]
        row = {"run": spec.name, "model": spec.model, "system": spec.system, "mode": spec.mode,
               "backend": spec.backend}  # fmt: skip
        return {**row, **dict.fromkeys(engine_gpu.SUMMARY_KEYS, 1.0)}

    doc: dict[str, Any] = {"meta": {}, "rows": [], "errors": {}, "skipped": [],
                           "skip_reasons": {}}  # fmt: skip
    monkeypatch.setattr(engine_gpu, "write_summary", lambda out, doc: None)
    engine_gpu.serve_all(plan, specs, Path("unused"), max_seconds, doc, clock, serve)
    return doc


def test_a_run_that_would_end_past_the_cap_is_skipped_not_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """13 runs of 10 s end at 130 s; the torch cross-check, expected to take 50 s, would end
    at 180 s, past 175: skipped, with why; under a cap of 180 it runs."""
    doc = _serve_all(monkeypatch, {"triton": 10.0, "torch": 40.0}, 175.0)
    assert [r["run"] for r in doc["rows"]][-1] == "opt-1.3b_vllm_offline_xcheck"
    assert doc["skipped"] == ["opt-1.3b_vllm_offline_torch_xcheck"]
    assert "expected to take 50 s" in doc["skip_reasons"]["opt-1.3b_vllm_offline_torch_xcheck"]
    assert _serve_all(monkeypatch, {"triton": 10.0, "torch": 40.0}, 180.0)["skipped"] == []


def test_the_longest_run_so_far_is_the_next_one_s_expected_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs of 30 s under a 100 s cap: three fit (90 s), the fourth would end at 120 s; so
    would every later one (the cap is never passed)."""
    doc = _serve_all(monkeypatch, {"triton": 30.0, "torch": 30.0}, 100.0)
    assert len(doc["rows"]) == 3 and len(doc["skipped"]) == 11
    assert doc["meta"]["elapsed_s"] <= 100.0
