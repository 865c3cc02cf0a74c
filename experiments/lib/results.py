"""Writing a run's result directory: the same files for the simulator and the engine.

``config.yaml`` (resolved), ``metrics.json``, ``requests.csv``, ``steps.csv`` and, where
given, extra JSON documents (e.g. the cost model's description).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON atomically (a temporary file renamed over ``path``)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(dict(data)), indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def write_run(
    out_dir: Path,
    cfg: DictConfig | Mapping[str, Any],
    metrics: Mapping[str, Any],
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    extra: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """Write the run's files into ``out_dir`` (created) and return it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    conf = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(conf, resolve=True))
    write_json(out_dir / "metrics.json", metrics)
    requests.to_csv(out_dir / "requests.csv", index=False)
    steps.to_csv(out_dir / "steps.csv", index=False)
    for name, doc in (extra or {}).items():
        write_json(out_dir / f"{name}.json", doc)
    return out_dir


def read_metrics(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "metrics.json").read_text())


def summary_line(metrics: Mapping[str, Any], where: str) -> str:
    """One log line for a finished run: who ran, how many finished, the headline metrics."""
    return (
        f"{metrics['system']} {metrics['model']} {where}: {metrics['completed']}/"
        f"{metrics['num_requests']} done, normalized latency "
        f"{metrics['normalized_latency']:.3f} s/token, "
        f"{metrics['request_throughput']:.2f} req/s"
    )
