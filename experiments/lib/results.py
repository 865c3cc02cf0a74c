"""A run's result directory: the same files for the simulator and the engine.

``config.yaml`` (resolved), ``requests.csv``, ``steps.csv``, extra JSON documents (e.g. the
cost model's description) and, LAST, ``metrics.json``. Every file is written atomically (a
temporary file in the same directory, then a rename), and ``metrics.json`` only after all
the others: a directory with a ``metrics.json`` holds a whole run, one without it a run
that did not finish (a failed run has ``error.txt`` instead). Readers go by
``metrics.json`` (:func:`read_metrics`, :func:`is_complete`).

A job of a resumed sweep whose directory holds a complete run of its config is not run
again (:func:`finished_metrics`). ``outputs/index.csv`` (:func:`append_index`) gets one row
per run: time, app, status, run directory, overrides and the headline metrics.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments.lib.input_stamps import input_stamps
from experiments.lib.provenance import provenance

log = logging.getLogger(__name__)

# The metrics a reader looks at first: summary.csv and index.csv put them after the
# overrides, the end-of-run line and table lead with them.
HEADLINE_METRICS = (
    "completed",
    "num_requests",
    "rejected",
    "offered_rate",
    "request_throughput",
    "output_throughput",
    "normalized_latency",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_e2el_ms",
    "mean_batch_size",
    "mean_step_batch",
)
INDEX_COLUMNS = ("time", "app", "status", "run_dir", "overrides", *HEADLINE_METRICS, "error")
# the header of a runs index begun before offered_rate joined the headline metrics: such an
# index is still one, and its rows keep its columns
EARLIER_INDEX_COLUMNS = tuple(c for c in INDEX_COLUMNS if c != "offered_rate")


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


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # once, at import: reading it sets it for a moment


class WriteError(OSError):
    """A result file could not be written (a full disk, a quota, a folder made read-only):
    its ``filename`` is the file meant, never the temporary file beside it, and its
    ``strerror`` the system's reason."""

    def line(self) -> str:
        """What went wrong in words: the file meant and the system's reason."""
        return f"cannot write {self.filename} ({self.strerror})"


def write_atomic(path: Path, write: str | Callable[[Path], Any]) -> None:
    """Write ``path`` (text, or a function that writes a given path) so that a reader sees
    the old file or the whole new one, never a part: a temporary file in the same
    directory, fsync, rename. The directory is made if missing; one that cannot be, and a
    write that fails midway (a full disk), is a :class:`WriteError` naming ``path``."""
    path = Path(path)
    if path.is_dir():
        raise WriteError(errno.EISDIR, "is a folder, not a file", str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        blocker = next((a for a in path.parents if a.exists() and not a.is_dir()), None)
        why = f"{blocker} is a file, not a folder" if blocker else exc.strerror
        raise WriteError(exc.errno, f"cannot write here ({why})", str(path)) from None
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a result is as any new file
        if isinstance(write, str):
            tmp.write_text(write, encoding="utf-8")
        else:
            write(tmp)
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            # a write's own error (ENOSPC) names no file, or the temporary one
            raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    write_atomic(path, json.dumps(_clean(dict(data)), indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class RowTable:
    """A table kept as row tuples (in ``columns`` order) of Python ints and floats, no NaN:
    what a recorder holds before it builds a frame. :func:`write_csv` writes it as the frame
    of those rows (integer and float64 columns) would be written, without building it,
    iterating ``rows`` once."""

    columns: tuple[str, ...]
    rows: Iterable[tuple[int | float, ...]]


def write_csv(path: Path, frame: pd.DataFrame | RowTable) -> None:
    """``frame.to_csv(path, index=False)``, atomically. A frame of integer and float columns
    only, without NaN (``steps.csv``), is formatted row by row: the same bytes (pandas
    writes floats in their shortest round-trip form, as ``repr``) in about half the time;
    a :class:`RowTable` likewise, straight from its rows."""
    if isinstance(frame, RowTable):
        write_atomic(path, lambda tmp: _rows_to_csv(frame.columns, frame.rows, tmp))
    else:
        write_atomic(path, lambda tmp: _to_csv(frame, tmp))


def _to_csv(df: pd.DataFrame, path: Path) -> None:
    floats = [dtype == "float64" for dtype in df.dtypes]
    numeric = all(f or dtype.kind in "iu" for f, dtype in zip(floats, df.dtypes, strict=True))
    names = all(isinstance(c, str) and c.isidentifier() for c in df.columns)
    columns = [df.iloc[:, i] for i in range(df.shape[1])]
    nan = any(f and col.isna().any() for f, col in zip(floats, columns, strict=True))
    if not (len(columns) and names and numeric) or nan or not df.columns.is_unique:
        df.to_csv(path, index=False)
        return
    _rows_to_csv(list(df.columns), zip(*[col.tolist() for col in columns], strict=True), path)


def _rows_to_csv(names: Sequence[str], rows: Iterable[tuple[Any, ...]], path: Path) -> None:
    row = ",".join(["%s"] * len(names)) + os.linesep  # str(float) is repr(float)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(",".join(names) + os.linesep)
        f.writelines(map(row.__mod__, rows))


def write_run(
    out_dir: Path,
    cfg: DictConfig | Mapping[str, Any],
    metrics: Mapping[str, Any],
    requests: pd.DataFrame,
    steps: pd.DataFrame | RowTable,
    extra: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """Write the run's files into ``out_dir`` (created): ``config.yaml``, the tables, the
    ``extra`` documents, ``inputs.json`` (the stamps of the input files ``cfg`` names),
    ``provenance.json`` (the code's git commit, the packages, the input files' digests:
    :mod:`experiments.lib.provenance`) and ``metrics.json`` last; return it. An earlier
    run's ``metrics.json`` there goes first, so a write stopped midway never leaves a folder
    complete with two runs' files, and so do the temporary files of a write that was
    killed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").unlink(missing_ok=True)
    remove_stale_temps(out_dir)
    conf = write_config(out_dir, cfg)
    # step indices stay whole numbers in the file where a rejected request leaves them empty
    steps_of = {c: "Int64" for c in ("first_token_step", "finish_step") if c in requests}
    write_csv(out_dir / "requests.csv", requests.astype(steps_of))
    write_csv(out_dir / "steps.csv", steps)
    for name, doc in (extra or {}).items():
        write_json(out_dir / f"{name}.json", doc)
    write_json(out_dir / "inputs.json", input_stamps(conf))
    write_json(out_dir / "provenance.json", provenance(conf))
    write_json(out_dir / "metrics.json", metrics)
    return out_dir


def write_config(out_dir: Path, cfg: DictConfig | Mapping[str, Any]) -> DictConfig:
    """Write ``config.yaml`` into ``out_dir`` (which exists): ``cfg`` resolved, the config
    to run it again from (``--config-dir <out_dir> --config-name config``); return it as a
    DictConfig."""
    conf = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    write_atomic(out_dir / "config.yaml", OmegaConf.to_yaml(conf, resolve=True))
    return conf


# every file a run of simulate or serve writes into its folder (write_run, serve's beam
# log, write_error): what an earlier run there leaves for a rerun to clear
RUN_FILES = (
    "metrics.json", "error.txt", "config.yaml", "requests.csv", "steps.csv",
    "cost_model.json", "engine.json", "beams.csv", "inputs.json", "provenance.json",
)  # fmt: skip


def clear_run(run_dir: Path) -> None:
    """Remove an earlier run's :data:`RUN_FILES` from ``run_dir`` (``metrics.json`` first,
    so a folder is never complete with another run's tables) and the temporary files of
    its killed writes, leaving other files. One that cannot be removed (a folder of that
    name, say) is a :class:`WriteError` naming it."""
    for name in RUN_FILES:
        path = Path(run_dir) / name
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            why = "is a folder, not a file" if path.is_dir() else (exc.strerror or str(exc))
            raise WriteError(exc.errno, why, str(path)) from None
    remove_stale_temps(Path(run_dir))


def temp_pattern(name: str) -> str:
    """The glob of the temporary files :func:`write_atomic` makes beside a file ``name``."""
    return f".{name}.*.tmp"


def remove_stale_temps(run_dir: Path) -> None:
    """Remove the temporary files a killed :func:`write_atomic` of a :data:`RUN_FILES` file
    left in ``run_dir`` (one run writes a folder at a time, so none is in use)."""
    for name in RUN_FILES:
        for temp in run_dir.glob(temp_pattern(name)):
            temp.unlink(missing_ok=True)


def is_complete(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished run (its ``metrics.json`` exists)."""
    return (Path(run_dir) / "metrics.json").is_file()


def finished_metrics(out_dir: Path, cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any] | None:
    """The metrics of a complete run of ``cfg`` in ``out_dir`` (its ``metrics.json`` exists,
    its ``config.yaml`` is ``cfg`` resolved, ``index`` aside, and the input files it names
    are as the run found them: ``inputs.json``, :mod:`experiments.lib.input_stamps`), else
    None: a finished job is not run again, and a directory holding another config's run, a
    run of an input since edited, or a ``metrics.json`` damaged since, is not mistaken for
    this one."""
    metrics, config = out_dir / "metrics.json", out_dir / "config.yaml"
    if not (metrics.is_file() and config.is_file()):
        return None
    conf = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    try:
        ours = OmegaConf.create(OmegaConf.to_yaml(conf, resolve=True))
    except OmegaConfBaseException:  # e.g. an unset ${oc.env:...}: the run's checks say so
        return None
    try:
        saved = OmegaConf.create(config.read_text())
    except Exception:  # a damaged config.yaml is not this run's
        return None
    for doc in (ours, saved):  # where the run's index row went is not part of the run
        if isinstance(doc, DictConfig):
            doc.pop("index", None)
    if OmegaConf.to_yaml(saved) != OmegaConf.to_yaml(ours):
        return None
    if _saved_stamps(out_dir) != input_stamps(conf):  # an input file edited since
        return None
    try:
        return read_metrics(out_dir)
    except (OSError, ValueError) as exc:  # damaged since it was written whole: run it again
        log.warning("%s: unreadable (%s): the run is done again", metrics, exc)
        return None


def _saved_stamps(out_dir: Path) -> dict[str, Any] | None:
    """The run's ``inputs.json`` ({} when it has none and read no input file: None, so a
    run of older code that named an input file is done again)."""
    path = out_dir / "inputs.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def read_metrics(run_dir: Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def write_error(run_dir: Path, text: str) -> None:
    """Record why a run failed (``error.txt``); a run directory never stays unexplained."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(run_dir) / "error.txt", text if text.endswith("\n") else text + "\n")


def append_index(
    index: Path,
    app: str,
    status: str,
    run_dir: Path | None,
    overrides: Sequence[str],
    metrics: Mapping[str, Any] | None = None,
    error: str = "",
) -> None:
    """Append one row to the runs index (header written with the first row; ``run_dir``
    None: a command refused before it had one). One locked ``write`` per row, so
    concurrent runs do not interleave. An index begun under :data:`EARLIER_INDEX_COLUMNS`
    gets its rows in those columns."""
    index = Path(index)
    index.parent.mkdir(parents=True, exist_ok=True)
    row = {
        "time": datetime.now().isoformat(timespec="milliseconds"),
        "app": app,
        "status": status,
        "run_dir": "" if run_dir is None else str(run_dir),
        "overrides": " ".join(overrides),
        "error": error,
    }
    for key in HEADLINE_METRICS:
        value = _clean((metrics or {}).get(key))
        row[key] = "" if value is None else (f"{value:.6g}" if isinstance(value, float) else value)
    buf = io.StringIO()
    with index.open("a", encoding="utf-8") as f:
        _lock(f)
        # the size now, under the lock: tell() is where the file ended when it was opened,
        # before another process's first row (and header) went in
        empty = os.fstat(f.fileno()).st_size == 0
        columns = INDEX_COLUMNS if empty else index_header_columns(index) or INDEX_COLUMNS
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n",
                                extrasaction="ignore")  # fmt: skip
        if empty:
            writer.writeheader()
        writer.writerow(row)
        f.write(buf.getvalue())
        f.flush()


def index_header_columns(index: Path) -> tuple[str, ...] | None:
    """The columns of the runs index at ``index`` by its header line: :data:`INDEX_COLUMNS`
    or :data:`EARLIER_INDEX_COLUMNS`; None for another header (not a runs index) or an
    unreadable file."""
    try:
        with Path(index).open(encoding="utf-8", errors="replace") as f:
            header = f.readline().strip()
    except OSError:
        return None
    for columns in (INDEX_COLUMNS, EARLIER_INDEX_COLUMNS):
        if header == ",".join(columns):
            return columns
    return None


def _lock(f: Any) -> None:
    try:
        import fcntl
    except ImportError:  # not POSIX: rows are short single writes
        return
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)


def rejection_text(metrics: Mapping[str, Any]) -> str:
    """``"; rejected: 3 over max_model_len, 1 too big for the KV cache"`` (empty if none)."""
    parts = [
        f"{int(n)} {label}"
        for key, label in REJECT_LABELS.items()
        if (n := metrics.get(key)) not in (None, 0)
    ]
    return f"; rejected: {', '.join(parts)}" if parts else ""


REJECT_LABELS = {
    "rejected_max_model_len": "over max_model_len",
    "rejected_max_num_seqs": "wider than max_num_seqs",
    "rejected_kv_cache": "too big for the KV cache",
    "rejected_other": "for other reasons (requests.csv)",
}


def swap_fallbacks(count: int, preemptions: int) -> int:
    """``count``, a run's preemptions that would have swapped and were recomputed because
    the CPU swap pool could not take the group (``BaseScheduler.swap_fallbacks``), with a
    warning when there are any: vLLM v0.1 aborts the run there, and a swap run's numbers
    then mix the two modes."""
    if count:
        log.warning(
            "%d of the run's %d preemptions were recomputed: the CPU swap pool (swap_space_gb) "
            "could not take the group (vLLM v0.1 aborts the run there)",
            count, preemptions,
        )  # fmt: skip
    return count


def summary_line(metrics: Mapping[str, Any], where: str, system: str | None = None) -> str:
    """One log line for a finished run: who ran (``system``: the run's label, where not
    the metrics' system), how many finished (and why the others did not), the headline
    metrics."""
    return (
        f"{system or metrics['system']} {metrics['model']} {where}: {metrics['completed']}/"
        f"{metrics['num_requests']} done{rejection_text(metrics)}, normalized latency "
        f"{_fmt(metrics['normalized_latency'], '.3f')} s/token, "
        f"{_fmt(metrics['request_throughput'], '.2f')} req/s "
        f"(offered {_fmt(metrics.get('offered_rate'), '.3g')})"
    )


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)
