"""Hydra callback: after a ``-m`` sweep, gather every job's metrics into ``summary.csv``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from experiments.lib.results import HEADLINE_METRICS, read_metrics, write_csv

log = logging.getLogger(__name__)


def collect_summary(sweep_dir: Path) -> pd.DataFrame:
    """One row per finished job under ``sweep_dir`` (one with a ``metrics.json``): the
    job, its overrides as columns, the headline metrics, then every other metric."""
    rows: list[dict[str, Any]] = []
    override_keys: list[str] = []
    for metrics_file in sorted(sweep_dir.glob("*/metrics.json")):
        job_dir = metrics_file.parent
        row: dict[str, Any] = {"job": job_dir.name}
        overrides = job_dir / ".hydra" / "overrides.yaml"
        if overrides.exists():
            for item in OmegaConf.load(overrides):
                key, _, value = str(item).partition("=")
                key = key.lstrip("+~")
                row[key] = value
                if key not in override_keys:
                    override_keys.append(key)
        row.update(read_metrics(job_dir))
        rows.append(row)
    df = pd.DataFrame(rows)
    first = ["job", *override_keys, *(k for k in HEADLINE_METRICS if k not in override_keys)]
    df = df[[c for c in first if c in df] + [c for c in df if c not in first]]
    if "job" in df:
        df = df.sort_values("job", key=lambda s: s.map(_job_key)).reset_index(drop=True)
    return df


def _job_key(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        df = collect_summary(sweep_dir)
        if df.empty:
            log.warning("no metrics.json under %s; no summary.csv written", sweep_dir)
            return
        write_csv(sweep_dir / "summary.csv", df)
        log.info("wrote %s (%d runs)", sweep_dir / "summary.csv", len(df))
