"""``experiments.serve``: the engine body writes the simulator's result files."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from engine.kv_cache import KVBudgetError
from experiments.serve import run
from tests.engine_helpers import one_torch_thread  # noqa: F401 (autouse fixture)

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")
SMALL = ["model=tiny-opt", "workload.num_requests=5", "workload.rate=20", "progress=false"]


def _cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose(config_name="serve", overrides=[*SMALL, *overrides])


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_serve_writes_the_four_files(mode: str, tmp_path: Path) -> None:
    metrics = run(_cfg([f"mode={mode}"]), tmp_path)
    for name in ("config.yaml", "metrics.json", "requests.csv", "steps.csv"):
        assert (tmp_path / name).exists(), name
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["completed"] == 5 == metrics["completed"]
    assert saved["model"] == "tiny-opt" and saved["device"] == "cpu"
    steps = pd.read_csv(tmp_path / "steps.csv")
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert (steps["duration_s"] > 0).all()
    assert (requests["status"] == "finished").all()
    assert (requests["arrival_s"] == 0).all() == (mode == "offline")


def test_serve_rejects_a_fraction_budget_on_cpu(tmp_path: Path) -> None:
    with pytest.raises(KVBudgetError, match="needs a CUDA device"):
        run(_cfg(["kv_budget_gb=null", "kv_budget_fraction=0.5"]), tmp_path)
