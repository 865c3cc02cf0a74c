"""The GPU run's environment check (``experiments.bench.gpu_env``), on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments.bench.gpu_env import main, project_modules, third_party_imports


def test_modules_and_third_party_names_come_from_the_source() -> None:
    modules = project_modules()
    for name in ("core", "experiments.bench.profile_gpu", "kernels.paged_attention", "sim.driver"):
        assert name in modules
    names = set(third_party_imports())
    assert {"torch", "triton", "simpy", "hydra", "omegaconf", "numpy", "pandas"} <= names
    assert not names & {"os", "json", "core", "engine", "__future__"}


def test_dry_check_writes_env_json(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    assert main(["--out", str(out), "--dry"]) == 0
    doc = json.loads(out.read_text())
    assert doc["import_failures"] == {} and doc["imports_checked"] > 50
    assert doc["dry"] is True and doc["gpu"]["cuda_available"] == torch.cuda.is_available()
    # a CUDA wheel from PyPI says 2.11.0 in its metadata and 2.11.0+cu130 in torch.__version__
    public = doc["distributions"]["torch"]["version"].split("+")[0]
    assert public == torch.__version__.split("+")[0]
    assert doc["distributions"]["simpy"] is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_no_gpu_fails_outside_dry_mode(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--out", str(tmp_path / "env.json")]) == 1
    assert "no CUDA device" in capsys.readouterr().out
