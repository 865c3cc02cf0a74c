"""Same config and seed, same files: what a determinism study of the apps found.

- a figure's PDF carried its creation date (matplotlib's default), so two runs of
  ``capacity`` or ``reproduce`` wrote different ``.pdf`` bytes for the same figure;
- the warning on an implausible hardware number was logged once a process, so in a sweep
  whose jobs share a process (Hydra's basic launcher) only the first job's ``simulate.log``
  had it, while the same job run alone, or on a parallel launcher, logged it;
- and a guard: ``requests.csv`` / ``steps.csv`` do not depend on ``PYTHONHASHSEED`` (string
  hashing), on a run with prefix caching, parallel sampling, swapping and preemptions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IMPLAUSIBLE = "outside what GPUs have"


def _simulate(args: list[str], tmp: Path, hash_seed: str = "0") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "experiments.simulate", *args, "index=null"],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_figure_pdf_has_the_same_bytes_whenever_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same figure saved at two moments (``SOURCE_DATE_EPOCH``, which matplotlib
    dates a PDF by when set) gives the same PDF and PNG bytes."""
    from experiments.report.figures import pyplot, save

    plt = pyplot(headless=True)
    written = []
    for i, epoch in enumerate(("1700000000", "1800000000")):
        monkeypatch.setenv("SOURCE_DATE_EPOCH", epoch)
        fig, ax = plt.subplots()
        ax.plot([0, 1, 2], [1, 3, 2])
        out = tmp_path / str(i)
        out.mkdir()
        save(fig, out, "f")
        plt.close(fig)
        written.append(out)
    first, second = written
    assert (first / "f.png").read_bytes() == (second / "f.png").read_bytes()
    assert (first / "f.pdf").read_bytes() == (second / "f.pdf").read_bytes()


def test_every_job_of_a_one_process_sweep_logs_its_hardware_warning(tmp_path: Path) -> None:
    """A sweep on the basic launcher runs its jobs in one process: each job's
    ``simulate.log`` still has the warning its config earns, as the job run alone does."""
    done = _simulate(
        ["-m", "system=vllm,orca_max", "hardware.mem_bandwidth_gbs=90000",
         "workload.num_requests=5", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    logs = sorted((tmp_path / "sweep").glob("*/simulate.log"))
    assert len(logs) == 2
    for log in logs:
        text = log.read_text()
        assert text.count(IMPLAUSIBLE) == 1, f"{log.parent.name}: {text}"
        assert "mem_bandwidth_gbs=90000" in text


def test_results_do_not_depend_on_the_string_hash_seed(tmp_path: Path) -> None:
    """Two runs of one config under different ``PYTHONHASHSEED`` values write
    byte-identical ``requests.csv`` and ``steps.csv`` (prefix caching, n > 1, swap)."""
    args = [
        "system=vllm", "workload=shared_prefix", "workload.num_requests=40", "workload.rate=20",
        "workload.n=2", "workload.output_len_mean=200", "system.enable_prefix_caching=true",
        "system.preemption_mode=swap", "kv_cache_gb=1", "system.max_model_len=1024", "seed=3",
    ]  # fmt: skip
    runs = []
    for hash_seed in ("0", "12345"):
        out = tmp_path / f"h{hash_seed}"
        done = _simulate([*args, f"hydra.run.dir={out}"], tmp_path, hash_seed)
        assert done.returncode == 0, done.stderr
        runs.append(out)
    first, second = runs
    m = json.loads((first / "metrics.json").read_text())
    assert m["num_preemptions"] > 0 and m["prefix_cache_hit_tokens"] > 0  # the paths ran
    for name in ("requests.csv", "steps.csv"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
