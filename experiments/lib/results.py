"""Writing a run's result directory: the same files for the simulator and the engine.

``config.yaml`` (resolved), ``metrics.json``, ``requests.csv``, ``steps.csv`` and, where
given, extra JSON documents (e.g. the cost model's description). Every file is written
atomically (a temporary file renamed into place) and ``metrics.json`` last, so a directory
whose ``metrics.json`` exists holds a complete run (what resuming a sweep relies on,
:func:`finished_metrics`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
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


def write_atomic(path: Path, write: str | Callable[[Path], Any]) -> None:
    """Write ``path`` (text, or a function that writes a given path) through a temporary
    file in the same directory and a rename: readers see the old file or the whole new
    one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(write, str):
        tmp.write_text(write)
    else:
        write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON atomically (a temporary file renamed over ``path``)."""
    write_atomic(Path(path), json.dumps(_clean(dict(data)), indent=2, sort_keys=True) + "\n")


def write_csv(path: Path, df: pd.DataFrame) -> None:
    write_atomic(path, lambda tmp: df.to_csv(tmp, index=False))


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
    write_atomic(out_dir / "config.yaml", OmegaConf.to_yaml(conf, resolve=True))
    write_csv(out_dir / "requests.csv", requests)
    write_csv(out_dir / "steps.csv", steps)
    for name, doc in (extra or {}).items():
        write_json(out_dir / f"{name}.json", doc)
    write_json(out_dir / "metrics.json", metrics)  # last: marks the run complete
    return out_dir


def finished_metrics(out_dir: Path, cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any] | None:
    """The metrics of a complete run of ``cfg`` in ``out_dir`` (its ``metrics.json`` exists
    and its ``config.yaml`` is ``cfg`` resolved), else None: a finished job is not run
    again, and a directory holding another config's run is not mistaken for this one."""
    metrics, config = out_dir / "metrics.json", out_dir / "config.yaml"
    if not (metrics.is_file() and config.is_file()):
        return None
    conf = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    if config.read_text() != OmegaConf.to_yaml(conf, resolve=True):
        return None
    return read_metrics(out_dir)


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
