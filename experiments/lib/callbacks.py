"""Hydra callback: after a ``-m`` sweep, gather every job's metrics into ``summary.csv``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from experiments.lib.results import HEADLINE_METRICS, read_metrics, write_csv

# the config groups whose option (a YAML's file name) a sweep's column keeps, the YAML's
# ``name`` in the metrics going beside it where it differs (:func:`named_columns`)
NAMED_GROUPS = ("system", "model", "hardware")

log = logging.getLogger(__name__)


def collect_summary(
    sweep_dir: Path,
    before: dict[Path, tuple[int, int]] | None = None,
    planned: Sequence[Sequence[str]] | None = None,
    not_started: str = "",
) -> pd.DataFrame:
    """One row per job under ``sweep_dir`` that finished (a ``metrics.json``) or failed
    (an ``error.txt``): the job, its overrides as columns, the headline metrics, every
    other metric, then ``status`` (ok, config error, failed, interrupted: stopped by Ctrl-C,
    SIGTERM or its launcher) and ``error``. ``before``
    (:func:`job_records` when the sweep started): only the jobs Hydra started since, whose
    ``.hydra/overrides.yaml`` is new or rewritten, so that a sweep rerun into the folder of
    a wider one leaves the other jobs out. ``planned`` (:func:`planned_jobs`: each job's
    overrides, by job number): a job of it that no folder holds a start of gets a row too,
    status ``interrupted`` and ``not_started`` as its error (a sweep stopped before it began
    that job). Whole-number metrics stay whole numbers beside a failed job's row.

    A group's column holds the option the job chose (``system=vllm_v1_nopc``: the YAML's file
    name, its label), not the metric of the same name (the YAML's ``name``, e.g. the
    registered system ``vllm_v1`` a variant of it runs); where that differs in some row, it
    is kept beside, as ``<group>_name`` (:func:`named_columns`)."""
    rows: list[dict[str, Any]] = []
    override_keys: list[str] = []
    shadowed: list[dict[str, Any]] = []  # per row: the metrics an override's column holds
    job_dirs = {p.parent for p in sweep_dir.glob("*/metrics.json")}
    job_dirs |= {p.parent for p in sweep_dir.glob("*/error.txt")}
    if before is not None:
        now = job_records(sweep_dir)
        job_dirs = {d for d in job_dirs if d in now and now[d] != before.get(d)}
    started: list[list[str]] = []  # each listed job's overrides

    def add_overrides(row: dict[str, Any], items: Sequence[str]) -> None:
        for item in items:
            key, _, value = str(item).partition("=")
            key = key.lstrip("+~")
            row[key] = value
            if key not in override_keys:
                override_keys.append(key)

    for job_dir in sorted(job_dirs):
        row: dict[str, Any] = {"job": job_dir.name}
        overrides = job_dir / ".hydra" / "overrides.yaml"
        if overrides.exists():
            items = [str(item) for item in OmegaConf.load(overrides)]
            started.append(items)
            add_overrides(row, items)
        kept: dict[str, Any] = {}
        if (job_dir / "metrics.json").is_file():
            metrics = read_metrics(job_dir)
            kept = {k: metrics.pop(k) for k in NAMED_GROUPS if k in row and k in metrics}
            row.update(metrics)
            row["status"], row["error"] = "ok", ""  # the column is there in a clean sweep too
        else:
            text = (job_dir / "error.txt").read_text(errors="replace").strip()
            lines = text.splitlines() or [""]
            config_error = lines[0].startswith("error: ")
            stopped = lines[0].startswith("interrupted")  # Ctrl-C, SIGTERM, a dead worker
            row["status"] = "config error" if config_error else (
                "interrupted" if stopped else "failed")  # fmt: skip
            row["error"] = lines[0] if config_error or stopped else lines[-1]
        shadowed.append(kept)
        rows.append(row)
    names = named_columns(rows, shadowed)
    for num, items in enumerate(planned or ()):
        if list(items) in started:
            started.remove(list(items))  # one planned job per start (a value swept twice)
            continue
        row = {"job": str(num)}
        add_overrides(row, items)
        rows.append(row | {"status": "interrupted", "error": not_started})
    df = pd.DataFrame(rows)
    for column in df:
        values = [r[column] for r in rows if r.get(column) is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            df[column] = df[column].astype("Int64")  # NaN in a failed row made them floats
    first = ["job", *override_keys, *names,
             *(k for k in HEADLINE_METRICS if k not in override_keys)]  # fmt: skip
    last = ["status", "error"]
    rest = [c for c in df if c not in first and c not in last]
    df = df[[c for c in first if c in df] + rest + [c for c in last if c in df]]
    if "job" in df:
        df = df.sort_values("job", key=lambda s: s.map(_job_key)).reset_index(drop=True)
    return df


def named_columns(rows: list[dict[str, Any]], shadowed: Sequence[dict[str, Any]]) -> list[str]:
    """Add to ``rows`` (in place) ``<key>_name`` for each metric ``shadowed`` by an override's
    column of the same key (``shadowed[i]``: row i's) whose value differs from the override's
    in some row: a variant's YAML runs under another ``name`` than its file's (system,
    model, hardware). Returns the columns added."""
    added = []
    for key in dict.fromkeys(k for s in shadowed for k in s):
        pairs = zip(rows, shadowed, strict=True)
        if all(str(s.get(key, r.get(key))) == str(r.get(key)) for r, s in pairs):
            continue
        added.append(f"{key}_name")
        for row, metrics in zip(rows, shadowed, strict=True):
            if key in metrics:
                row[f"{key}_name"] = metrics[key]
    return added


def planned_jobs(config: DictConfig) -> list[list[str]] | None:
    """Each job's overrides, by job number, of the ``-m`` sweep ``config`` (a sweep's config at
    its start) as Hydra's basic sweeper splits them; None for another sweeper, or a sweep
    only Hydra's config loader can split (e.g. a ``glob`` of a config group's options)."""
    try:  # Hydra's own splitting (a private module: a Hydra that moved it lists started jobs)
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser
    except ImportError:
        return None
    sweeper = config.hydra.get("sweeper") or {}
    if sweeper.get("_target_") != f"{BasicSweeper.__module__}.{BasicSweeper.__name__}":
        return None
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    try:
        parsed = OverridesParser.create().parse_overrides(
            [*params, *(str(o) for o in config.hydra.overrides.task)]
        )
        return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:  # a stopped sweep's summary then lists the jobs it started only
        return None


def job_records(sweep_dir: Path) -> dict[Path, tuple[int, int]]:
    """Each job folder under ``sweep_dir`` -> (modification time in ns, size) of the
    ``.hydra/overrides.yaml`` Hydra writes when it starts the job."""
    out = {}
    for record in sweep_dir.glob("*/.hydra/overrides.yaml"):
        stat = record.stat()
        out[record.parent.parent] = (stat.st_mtime_ns, stat.st_size)
    return out


def _job_key(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


class SweepSummary(Callback):
    """Writes ``summary.csv`` of this sweep's jobs (not of others left in its folder)."""

    def __init__(self) -> None:
        self.before: dict[Path, tuple[int, int]] | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from experiments.lib.sweep_stop import STARTED

        sweep_dir = Path(config.hydra.sweep.dir)
        self.before = job_records(sweep_dir)
        # for a sweep that stops early
        STARTED.append((sweep_dir, self.before, planned_jobs(config)))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        df = collect_summary(sweep_dir, self.before)
        if df.empty:
            log.warning("no job under %s finished or failed; no summary.csv written", sweep_dir)
            return
        write_csv(sweep_dir / "summary.csv", df)
        failed = int((df["status"] != "ok").sum())
        log.info("wrote %s (%d runs, %d failed)", sweep_dir / "summary.csv", len(df), failed)
        if failed:
            from experiments.lib import cli

            cli.SWEEP_FAILURES.append(failed)
