"""``experiments.serve``: the engine body writes the simulator's result files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from experiments.lib.checks import ConfigError
from experiments.lib.malloc import malloc_state
from experiments.serve import CPU_DEFAULT_CAP_BYTES, device_name, kv_budget_bytes, run
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


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_serve_offers_its_windows_rate_online_and_none_offline(mode: str) -> None:
    """Online, the requests drawn over a 0.4-s window are offered over it; offline they all
    arrive at t = 0, whatever window drew them: no rate (null in metrics.json)."""
    window = ["workload.num_requests=null", "workload.duration_s=0.4", f"mode={mode}"]
    metrics = run(_cfg(window))
    if mode == "online":
        assert metrics["offered_rate"] == pytest.approx(metrics["num_requests"] / 0.4)
    else:
        assert math.isnan(metrics["offered_rate"])


def test_serve_rejects_a_fraction_budget_on_cpu(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kv_budget_fraction: .*needs a CUDA device"):
        run(_cfg(["kv_budget_fraction=0.5"]), tmp_path)


def test_serve_records_the_real_device_threads_and_torch(tmp_path: Path) -> None:
    metrics = run(_cfg(["threads=1"]), tmp_path)
    engine = json.loads((tmp_path / "engine.json").read_text())
    saved = json.loads((tmp_path / "metrics.json").read_text())
    for doc in (engine, saved, metrics):
        assert doc["threads"] == 1
        assert doc["torch_version"] == torch.__version__
        assert doc["hardware"] == device_name(torch.device("cpu"))
        assert "H200" not in doc["hardware"]
        assert doc["malloc"] == malloc_state() != "default"  # pinned before the engine is built
    assert engine["device"] == saved["hardware"]


def test_default_kv_budget_fits_the_model_and_max_num_seqs() -> None:
    """Room for max_num_seqs sequences of max_model_len, at most the CPU cap, never less
    than one sequence (the old 0.01 GiB default held 144 slots of OPT-125M)."""
    from sim.catalog import get_model

    tiny, opt = get_model("tiny-opt"), get_model("opt-125m")
    per_token = 2 * 2 * 64 * 4  # tiny-opt: 2 layers x K,V x hidden 64 x fp32
    c = {"device": "cpu", "system": {"max_num_seqs": 8}}
    assert kv_budget_bytes(c, tiny, torch.float32, 256) == 8 * 256 * per_token
    big = kv_budget_bytes({**c, "system": {"max_num_seqs": 256}}, opt, torch.float32, 2048)
    assert big == CPU_DEFAULT_CAP_BYTES
    assert big // (2 * 12 * 768 * 4) >= 2048
    assert kv_budget_bytes({**c, "kv_cache_gb": 0.5}, opt, torch.float32, 2048) == 1 << 29


def test_a_cuda_budget_fraction_is_of_the_memory_left_after_the_weights(monkeypatch) -> None:
    """The weights load before the cache: a fraction of the memory free before them (the old
    rule) overcommitted the device (OPT-13B fp16 at the default 0.5 on a 40 GB A100)."""
    from engine.kv_cache import KVBudgetError
    from sim.catalog import get_model

    opt = get_model("opt-13b")
    weights = opt.num_params() * 2
    free = 39 * 1024**3
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 40 * 1024**3))
    c = {"device": "cuda", "system": {}}
    assert kv_budget_bytes(c, opt, torch.float16, 2048) == (free - weights) // 2
    assert kv_budget_bytes({**c, "kv_budget_fraction": 0.8}, opt, torch.float16, 2048) == int(
        (free - weights) * 0.8
    )
    free = weights - 1  # the weights alone do not fit
    with pytest.raises(KVBudgetError, match="leave no room for a KV cache"):
        kv_budget_bytes(c, opt, torch.float16, 2048)


def test_old_budget_key_is_an_alias_that_warns(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match="kv_budget_gb is an old name of kv_cache_gb"):
        metrics = run(_cfg(["kv_budget_gb=0.002"]), tmp_path)
    assert metrics["kv_cache_gib"] <= 0.002
    with pytest.raises(ConfigError, match="kv_budget_gb: an old name"):
        run(_cfg(["kv_budget_gb=0.002", "kv_cache_gb=0.002"]), tmp_path)


def test_serve_counts_rejections_and_survives_a_rejected_last_request(tmp_path: Path) -> None:
    """The issue's crash: the last requests rejected (here: longer than tiny-opt's 256
    tokens). The run finishes the others and counts each rejection by reason."""
    from core.request import Request
    from core.workload.trace_io import write_trace

    trace = tmp_path / "trace.csv"
    ok = [Request(i, 0.01 * i, 8, 4) for i in range(3)]
    write_trace(trace, [*ok, Request(3, 0.05, 250, 20), Request(4, 0.06, 300, 4)])
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        cfg = compose(
            config_name="serve",
            overrides=[
                "model=tiny-opt",
                "progress=false",
                "workload=trace",
                f"workload.path={trace}",
            ],
        )
    metrics = run(cfg, tmp_path / "run")
    assert metrics["completed"] == 3 and metrics["rejected"] == 2
    assert metrics["rejected_max_model_len"] == 2
    assert metrics["rejected_kv_cache"] == metrics["rejected_other"] == 0


@pytest.mark.parametrize(
    ("system", "unused"), [("vllm", False), ("vllm_v1", True), ("orca_max", True)]
)
def test_the_log_says_when_the_swap_pool_goes_unused(
    system: str, unused: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # vllm_v1 and the contiguous systems never swap: their pool line said nothing of it
    with caplog.at_level("INFO", logger="experiments.serve"):
        run(_cfg([f"system={system}", "workload.num_requests=1"]), tmp_path)
    line = next(r.getMessage() for r in caplog.records if "CPU swap pool" in r.getMessage())
    assert line.endswith(f"(unused: {system} never swaps)") == unused
