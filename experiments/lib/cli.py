"""What every Hydra entry point does around its run: the command-line pre-checks, the
one-line config errors, ``error.txt`` for failures, the runs index and the end-of-run table.

- A :class:`~experiments.lib.checks.ConfigError` prints ``error: <key>: ...`` on stderr and
  exits with status 2, no traceback, when the process is a command line
  (:func:`main_with_checks`); ``HYDRA_FULL_ERROR=1`` re-raises it instead, and so does a
  job launched from Python.
- Any other exception is a runtime failure: its traceback goes to ``error.txt`` in the run
  directory and it propagates (Hydra prints it; exit status 1).
- Ctrl-C marks the run directory as partial (``error.txt``, index status ``interrupted``)
  and ends the command with one line and status 130, a sweep included.
- Every run, finished or not, appends a row to ``index`` (``outputs/index.csv``).
- In a ``-m`` sweep from the command line a failed job does not stop the others: its line
  is printed, ``summary.csv`` lists it with its status and error, and the process exits
  with status 1 after the sweep.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from core.mapping_file import yaml_error_place
from core.workload.trace_io import TraceFormatError
from experiments.lib.args import out_dir_problem
from experiments.lib.checks import CONFIG_DIR, ConfigError, check_group_overrides, search_dirs
from experiments.lib.results import INDEX_COLUMNS, append_index, write_error
from experiments.lib.table import result_table
from sim.cost.profile import ProfileError

# ``${path_safe:${model.name}}`` in a run directory's name: an HF id's "/" would nest it.
OmegaConf.register_new_resolver("path_safe", lambda v: str(v).replace("/", "--"), replace=True)
# ``${kvlab_root:}``: the repository's folder, for defaults that name files beside it (the
# shared traces), so they resolve from any working directory.
OmegaConf.register_new_resolver("kvlab_root", lambda: str(CONFIG_DIR.parent), replace=True)

CONFIG_ERROR_STATUS = 2
INTERRUPTED_STATUS = 130  # a shell's status for a command ended by SIGINT
# set in a job's environment (hydra.job.env_set) by main_with_checks, so the jobs a
# launcher starts in other processes know they belong to a command-line sweep
COMMAND_LINE_ENV = "KVLAB_COMMAND_LINE"
# set by the sweep-summary callback: how many jobs of the sweep just run failed
SWEEP_FAILURES: list[int] = []
DEFAULT_INDEX = Path("outputs/index.csv")

# Keys that describe one quantity in two ways: giving one (not null) on the command line
# makes the other null.
EXCLUSIVE_KEYS = (("workload.num_requests", "workload.duration_s"),)


# Set by main_with_checks: the process is a command line, so a config error ends it with
# one line. Jobs run from Python (experiments.lib.jobs) get the ConfigError instead.
_COMMAND_LINE = False


def full_errors() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def report_config_error(err: ConfigError) -> None:
    """Print the one line, or raise with ``HYDRA_FULL_ERROR=1``; then exit 2."""
    if full_errors():
        raise err
    print(err.line(), file=sys.stderr)
    sys.exit(CONFIG_ERROR_STATUS)


# Errors of reading an input file whose message names the file and row: one line too.
INPUT_ERRORS = (ProfileError, TraceFormatError)


def plain_cli(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """Decorate an argparse (non-Hydra) ``main(argv)``: a :class:`ConfigError` becomes one
    line on stderr and status 2 (:func:`report_config_error`), and so do an
    :data:`INPUT_ERRORS` error and an ``OSError`` on a named file (an output folder that
    cannot be written, say)."""

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except ConfigError as err:
            report_config_error(err)
            return CONFIG_ERROR_STATUS
        except INPUT_ERRORS as err:
            if full_errors():
                raise
            print(f"error: {str(err).strip().splitlines()[0]}", file=sys.stderr)
            sys.exit(CONFIG_ERROR_STATUS)
        except OSError as err:
            if err.filename is None:
                raise
            report_config_error(ConfigError(str(err.filename), err.strerror or str(err)))
            return CONFIG_ERROR_STATUS

    return wrapped


def check_out_dir(path: Path, key: str = "--out") -> None:
    """Refuse, before any work, an output folder results cannot be written in
    (:func:`experiments.lib.args.out_dir_problem`)."""
    problem = out_dir_problem(Path(path))
    if problem is not None:
        raise ConfigError(key, problem)


def exclusive_nulls(overrides: Sequence[str]) -> dict[str, None]:
    """The keys to set to null because the command line gave their partner a value:
    ``workload.num_requests=32`` alone nulls ``workload.duration_s`` and vice versa."""
    given: dict[str, str] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep:
            given[key.lstrip("+~")] = value
    out: dict[str, None] = {}
    for a, b in EXCLUSIVE_KEYS:
        for key, other in ((a, b), (b, a)):
            if given.get(key, "null") != "null" and other not in given:
                out[other] = None
    return out


def apply_exclusive(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """Apply :func:`exclusive_nulls` to ``cfg`` in place."""
    with open_dict(cfg):
        for key, value in exclusive_nulls(overrides).items():
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if node is not None and leaf in node:
                node[leaf] = value


def on_command_line() -> bool:
    """This process, or the command-line sweep that launched it, is a command line."""
    return _COMMAND_LINE or os.environ.get(COMMAND_LINE_ENV) == "1"


def check_index_writable(index: Path) -> None:
    """The runs index can be appended to (its folder made if missing) and, if it exists, is
    a runs index (its header), before the run."""
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("index", f"cannot make its folder ({exc.strerror})", str(index)) from None
    if index.is_dir() or not os.access(index if index.exists() else index.parent, os.W_OK):
        raise ConfigError("index", "cannot write the runs index there", str(index), "a CSV path")
    if index.is_file() and index.stat().st_size > 0:
        with index.open(encoding="utf-8", errors="replace") as f:
            header = f.readline().strip()
        if header != ",".join(INDEX_COLUMNS):
            raise ConfigError(
                "index", "the file is not a kvlab runs index (its header differs)", str(index),
                f"a runs index (header {','.join(INDEX_COLUMNS[:3])},...), a new path or null",
            )  # fmt: skip


def run_app(
    app: str,
    cfg: DictConfig,
    run: Callable[[DictConfig, Path], Mapping[str, Any]],
    describe: Callable[[Mapping[str, Any]], str],
) -> Mapping[str, Any]:
    """Run ``run(cfg, out_dir)`` inside a Hydra job with the error handling, index row and
    results table described in the module doc. ``describe`` makes the summary log line."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    overrides = list(hc.overrides.task)
    index_key = cfg.get("index", str(DEFAULT_INDEX))
    index = Path(str(index_key)) if index_key else None
    # a sweep from the command line goes on past a failed job (its summary lists it)
    sweep_job = on_command_line() and hc.mode == RunMode.MULTIRUN and not full_errors()

    def record(status: str, metrics: Mapping[str, Any] | None = None, error: str = "") -> None:
        if index is not None and index_writable:
            append_index(index, app, status, out_dir, overrides, metrics, error)

    index_writable = True
    # this directory's earlier result or error, if any, is not this run's (a rerun job)
    (out_dir / "metrics.json").unlink(missing_ok=True)
    (out_dir / "error.txt").unlink(missing_ok=True)
    try:
        if index is not None:
            index_writable = False
            check_index_writable(index)
            index_writable = True
        apply_exclusive(cfg, overrides)
        metrics = run(cfg, out_dir)
    except ConfigError as err:
        write_error(out_dir, err.line())
        record("config error", error=err.line())
        if sweep_job:
            print(f"job {out_dir.name}: {err.line()}", file=sys.stderr)
            return {"status": "config error", "error": err.line()}
        if _COMMAND_LINE:
            report_config_error(err)
        raise
    except KeyboardInterrupt:
        line = "interrupted (Ctrl-C) before the run finished: the files here are partial"
        write_error(out_dir, line)
        record("interrupted", error=line)
        if not _COMMAND_LINE or full_errors():
            raise
        print(f"interrupted: {out_dir} holds a partial run (no metrics.json); run the same "
              "command again to redo it", file=sys.stderr)  # fmt: skip
        sys.exit(INTERRUPTED_STATUS)
    except Exception as exc:
        write_error(out_dir, traceback.format_exc())
        line = f"{type(exc).__name__}: {exc}".splitlines()[0]
        record("failed", error=line)
        if sweep_job:
            print(f"job {out_dir.name} failed: {line} (traceback: {out_dir}/error.txt)",
                  file=sys.stderr)  # fmt: skip
            return {"status": "failed", "error": line}
        raise
    record("ok", metrics)
    print(result_table(metrics, f"{app}: {metrics.get('system')} {metrics.get('model')}"))
    print(f"{describe(metrics)} -> {out_dir}")
    return metrics


def check_overrides_compose(config_name: str, argv: Sequence[str]) -> None:
    """Raise for overrides Hydra cannot compose into ``configs/<config_name>.yaml`` (a key
    the config lacks, a malformed value), in one line where Hydra's spans several. Left to
    Hydra: sweeps, Hydra's own flags (any argument starting with ``-``) and a
    ``hydra.searchpath`` with a ``pkg://`` entry. A config file that is not YAML is named
    with its line and column."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if any(a.startswith("-") for a in argv) or search_dirs(argv) is None:
        return
    try:
        parsed = OverridesParser.create().parse_overrides(list(argv))
        if any(o.is_sweep_override() or o.key_or_group == "hydra.mode" for o in parsed):
            return  # a sweep (hydra.mode=MULTIRUN): each job's config is checked as it runs
        check_added_keys(config_name, [o.key_or_group for o in parsed if o.is_add()
                                       or o.is_force_add()])  # fmt: skip
        compose_config(config_name, argv)
    except HydraException as exc:
        text = str(exc).strip()
        unknown = re.match(r"Could not override '([^']+)'", text)
        if unknown:
            key = unknown.group(1)
            expected = (
                f"a key of configs/{config_name}.yaml or of its groups' options; +{key}=... "
                "adds one under a name the app reads, where the config takes new keys"
            )
            raise ConfigError(key, "no such key in this config", expected=expected) from None
        lines = [text.splitlines()[0] if text else type(exc).__name__]
        if exc.__cause__ is not None and str(exc.__cause__).strip():
            lines.append(str(exc.__cause__).strip().splitlines()[0])
        raise ConfigError("overrides", ": ".join(lines)) from None
    except yaml.MarkedYAMLError as exc:
        place = yaml_error_place(exc)
        where = f"{exc.problem_mark.name}, {place}: " if place else ""
        raise ConfigError("config", f"{where}not YAML ({exc.problem})") from None


def check_added_keys(config_name: str, keys: Sequence[str]) -> None:
    """Raise for a key or group added with ``+`` or ``++`` under a top-level name that the
    composed ``configs/<config_name>.yaml`` does not have: the app never reads it, so a
    mistyped ``+warmpu=true`` would be dropped in silence. Keys under a known name
    (``+slo_ms.ttft=...``) and under ``hydra`` are left to the config's own checks."""
    if not keys:
        return
    known = set(compose_config(config_name))
    for key in keys:
        top = re.split(r"[./@]", key)[0]
        if top not in known and top != "hydra":
            expected = f"a key of configs/{config_name}.yaml: " + ", ".join(sorted(known))
            raise ConfigError(key, "added, but no part of this app reads it", expected=expected)


def main_with_checks(
    main: Callable[[], Any], argv: Sequence[str] | None = None, config_name: str | None = None
) -> None:
    """Call a ``@hydra.main`` function after the command-line checks Hydra cannot phrase
    as one line (an unknown option of a config group; with ``config_name``, any override
    that does not compose)."""
    global _COMMAND_LINE
    _COMMAND_LINE = True
    args = sys.argv[1:] if argv is None else list(argv)
    saved_argv = sys.argv
    # every launcher sets hydra.job.env_set in the job's process (Ray and Slurm workers
    # included), so a job knows it belongs to a command-line sweep
    sys.argv = [*sys.argv, f"+hydra.job.env_set.{COMMAND_LINE_ENV}=1"]
    try:
        try:
            check_group_overrides(args)
            check_output_dirs(args)
            if config_name is not None:
                check_overrides_compose(config_name, args)
        except ConfigError as err:
            _index_refused(config_name, args, err)
            report_config_error(err)
        main()
    finally:
        _COMMAND_LINE = False
        sys.argv = saved_argv
    if SWEEP_FAILURES:
        failed = SWEEP_FAILURES.pop()
        print(f"error: {failed} sweep job(s) failed (their rows in summary.csv and "
              "error.txt say why)", file=sys.stderr)  # fmt: skip
        sys.exit(1)


def check_output_dirs(args: Sequence[str]) -> None:
    """``hydra.run.dir`` and ``hydra.sweep.dir`` given as plain paths are folders a run can
    be written in (Hydra's own error for a file there is a traceback)."""
    for arg in args:
        key, _, value = arg.lstrip("+").partition("=")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and value and "$" not in value:
            check_out_dir(Path(value), key)


def _index_refused(config_name: str | None, args: Sequence[str], err: ConfigError) -> None:
    """A command line refused before Hydra starts still gets its index row (no run
    directory): in ``index=...`` of the arguments, else the default index; best effort."""
    if config_name is None:
        return
    values = [a.partition("=")[2] for a in args if a.lstrip("+").startswith("index=")]
    index = values[-1] if values else str(DEFAULT_INDEX)
    if index in ("null", "None", "~", ""):
        return
    try:
        check_index_writable(Path(index))
        append_index(Path(index), config_name, "config error", None, args, None, err.line())
    except (ConfigError, OSError):
        pass  # the command's own error is the one to report


def compose_config(config_name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """The project's ``configs/<config_name>.yaml`` composed with ``overrides``, outside a
    Hydra app (scripts that run several configs in one process)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))
