"""What every Hydra entry point does around its run: the command-line pre-checks (of
``experiments.lib.compose``), the one-line config errors, ``error.txt`` for failures, the
runs index and the end-of-run table.

- A :class:`~experiments.lib.checks.ConfigError` prints ``error: <key>: ...`` on stderr and
  exits with status 2, no traceback, when the process is a command line
  (:func:`main_with_checks`); ``HYDRA_FULL_ERROR=1`` re-raises it instead, and so does a
  job launched from Python.
- A result file that cannot be written (:class:`~experiments.lib.results.WriteError`: a
  full disk) is one line naming it on stderr, exit status 1; its traceback in ``error.txt``
  where that can still be written.
- Any other exception is a runtime failure: its traceback goes to ``error.txt`` in the run
  directory and it propagates (Hydra prints it; exit status 1).
- Ctrl-C marks the run directory as partial (``error.txt``, index status ``interrupted``)
  and ends the command with one line and status 130, a sweep included; SIGTERM (``timeout``,
  ``kill``, Slurm) likewise, with status 143. One arriving while a finished run writes its
  index row waits for the row.
- Every run, finished or not, appends a row to ``index`` (``outputs/index.csv``).
- In a ``-m`` sweep from the command line a failed job does not stop the others: its line
  is printed, ``summary.csv`` lists it with its status and error, and the process exits
  after the sweep with status 2 when every failed job failed on its config, else 1. A
  sweep stopped early keeps its summary and marks its jobs in flight
  (:mod:`experiments.lib.sweep_stop`).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from core.workload.trace_io import TraceFormatError
from experiments.lib.args import out_dir_problem
from experiments.lib.checks import CONFIG_DIR, ConfigError
from experiments.lib.compose import (
    SOURCE_FLAGS,
    check_group_overrides,
    check_overrides_compose,
    check_own_yamls,
    override_args,
)
from experiments.lib.results import (
    INDEX_COLUMNS,
    WriteError,
    append_index,
    clear_run,
    index_header_columns,
    write_error,
)
from experiments.lib.signals import (
    TERMINATED_STATUS,
    Terminated,
    full_errors_asked,
    interrupted_why,
    interrupts_deferred,
    quiet_resource_trackers,
    sigterm_as_interrupt,
)
from experiments.lib.sweep_stop import resume_hint, sweep_stops_kept
from experiments.lib.table import result_table
from sim.catalog import forget_warnings
from sim.cost.profile import ProfileError
from sim.driver import StepPriceError


def run_model_label(name: Any, hf_config: Any = None) -> str:
    """The simulated model's name for a run directory, "/" made "--" (an HF id's would nest
    it): with ``model.hf_config`` the name :func:`sim.catalog.model_from_config` gives the
    model (the default group's ``name`` labels another model); a config that cannot be read
    keeps ``name`` (its error is the config check's)."""
    label = str(name)
    if hf_config:
        from sim.catalog import model_from_config

        with contextlib.suppress(KeyError, OSError, TypeError, ValueError):
            label = model_from_config({"name": name, "hf_config": hf_config}).name
    return label.replace("/", "--")


def run_system_label(name: Any, choice: Any = None) -> str:
    """The system in a run directory's name: the ``system=`` option's file name where it is
    a system YAML of one's own (a setting of a shipped system keeps its ``name``, and its
    file's name labels its runs), else ``name`` (a shipped option, under a plugin's
    ``system.name`` too)."""
    if choice and not (CONFIG_DIR / "system" / f"{choice}.yaml").is_file():
        return str(choice)
    return str(name)


def system_label(cfg: Any) -> str:
    """The run's system label: ``system.label`` where the config holds one (written by
    :func:`settle_run_config`, so a run again from a run folder's ``config.yaml`` keeps it),
    else :func:`run_system_label` of a Hydra job's config (``system.name`` outside a Hydra
    app)."""
    saved = OmegaConf.select(cfg, "system.label")
    if saved:
        return str(saved)
    return run_system_label(OmegaConf.select(cfg, "system.name"), _system_choice(()))


def _system_choice(overrides: Sequence[str]) -> str | None:
    """The ``system=`` option chosen: the last of ``overrides`` that sets it, else the
    Hydra job's choice (None outside a Hydra app)."""
    from hydra.core.hydra_config import HydraConfig

    given = [v for k, _, v in (o.partition("=") for o in overrides) if k.lstrip("+~") == "system"]
    if given:
        return given[-1]
    if HydraConfig.initialized():
        return HydraConfig.get().runtime.choices.get("system")
    return None


# ``${run_model:${model.name},${oc.select:model.hf_config,null}}`` in a run directory's name
OmegaConf.register_new_resolver("run_model", run_model_label, replace=True)
# ``${run_system:${system.name},${hydra:runtime.choices.system}}`` likewise
OmegaConf.register_new_resolver("run_system", run_system_label, replace=True)
# ``${path_safe:${model.name}}``: an HF id's "/" would nest a directory (older configs)
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
# set by SweepDirRecorder: the folder of the sweep just run (its summary.csv)
SWEEP_DIRS: list[Path] = []
SWEEP_DIR_CALLBACK = f"+hydra.callbacks.kvlab_sweep_dir._target_={__name__}.SweepDirRecorder"
RUNTIME_FAILURE_STATUS = 1
DEFAULT_INDEX = Path("outputs/index.csv")

# Keys that describe one quantity in two ways: giving one (not null) on the command line
# makes the other null.
EXCLUSIVE_KEYS = (("workload.num_requests", "workload.duration_s"),)


# Set by main_with_checks: the process is a command line, so a config error ends it with
# one line. Jobs run from Python (experiments.lib.jobs) get the ConfigError instead.
_COMMAND_LINE = False


def full_errors() -> bool:
    return full_errors_asked()


def report_config_error(err: ConfigError) -> None:
    """Print the one line, or raise with ``HYDRA_FULL_ERROR=1``; then exit 2."""
    if full_errors():
        raise err
    print(err.line(), file=sys.stderr)
    sys.exit(CONFIG_ERROR_STATUS)


# Errors of reading an input file whose message names the file and row, and a step the
# cost model priced out of range: one line too.
INPUT_ERRORS = (ProfileError, TraceFormatError, StepPriceError)


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


def task_overrides(hc: Any) -> list[str]:
    """The run's command-line overrides as typed: iterating Hydra's list would resolve an
    interpolation inside one (``seed=${oc.env:UNSET}``) and raise before the checks."""
    task = hc.overrides.task
    listed = OmegaConf.to_container(task, resolve=False) if OmegaConf.is_config(task) else task
    return [str(o) for o in listed]


def check_out_file(path: Path, key: str = "--out") -> None:
    """Refuse, before any work, a result file that cannot be written: a folder, a path
    under a file, or a folder the system will not make or write in (tried with a scratch
    file that is removed at once)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(key, f"{path} is a folder; give the file to write")
    check_out_dir(path.parent, key)
    if not path.parent.exists():
        _try_making(path.parent, key)
        return
    try:
        fd, scratch = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise ConfigError(key, f"cannot write there ({exc.strerror})", str(path)) from None
    os.close(fd)
    os.unlink(scratch)


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


def settle_run_config(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """Make ``cfg``, in place, the config the run uses and saves as ``config.yaml``: the
    :func:`exclusive_nulls` applied, and with ``model.hf_config`` ``model.name`` the name
    the run gives the model (:func:`sim.catalog.model_from_config`: the default group's
    name labels another model), and ``system.label`` the file's name of a system YAML of
    one's own (:func:`run_system_label`; none for a shipped option), so that a run again
    from its ``config.yaml``, which chooses no ``system=``, keeps its label. A model config
    that cannot be read is left as it is (its error is the config check's)."""
    with open_dict(cfg):
        for key, value in exclusive_nulls(overrides).items():
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if node is not None and leaf in node:
                node[leaf] = value
    model = cfg.get("model")
    if isinstance(model, DictConfig) and model.get("hf_config"):
        from sim.catalog import model_from_config

        with contextlib.suppress(KeyError, OSError, TypeError, ValueError):
            model.name = model_from_config(OmegaConf.to_container(model, resolve=True)).name
    system = cfg.get("system")
    if isinstance(system, DictConfig):
        label = run_system_label(system.get("name"), _system_choice(overrides))
        if label != str(system.get("name")):
            with open_dict(system):
                system.label = label


def on_command_line() -> bool:
    """This process, or the command-line sweep that launched it, is a command line."""
    return _COMMAND_LINE or os.environ.get(COMMAND_LINE_ENV) == "1"


def check_index_writable(index: Path) -> None:
    """The runs index can be appended to (its folder made if missing) and, if it exists, is
    a runs index (its header: today's, or one begun before ``offered_rate`` joined it),
    before the run."""
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("index", f"cannot make its folder ({exc.strerror})", str(index)) from None
    if index.is_dir() or not os.access(index if index.exists() else index.parent, os.W_OK):
        raise ConfigError("index", "cannot write the runs index there", str(index), "a CSV path")
    try:  # os.access says yes to root even where no file can be made (/proc, a read-only mount)
        with index.open("a", encoding="utf-8"):
            pass  # an empty index gets its header with its first row
    except OSError as exc:
        raise ConfigError(
            "index", f"cannot write the runs index there ({exc.strerror})", str(index), "a CSV path"
        ) from None
    if index.is_file() and index.stat().st_size > 0 and index_header_columns(index) is None:
        raise ConfigError(
            "index", "the file is not a kvlab runs index (its header differs)", str(index),
            f"a runs index (header {','.join(INDEX_COLUMNS[:3])},...), a new path or null",
        )  # fmt: skip


@sigterm_as_interrupt()  # a contextmanager decorates: a fresh one for every call
def run_app(
    app: str,
    cfg: DictConfig,
    run: Callable[[DictConfig, Path], Mapping[str, Any]],
    describe: Callable[[Mapping[str, Any]], str],
) -> Mapping[str, Any]:
    """Run ``run(cfg, out_dir)`` inside a Hydra job with the error handling, index row and
    results table described in the module doc. ``describe`` makes the summary log line.
    SIGTERM is handled as Ctrl-C is (:mod:`experiments.lib.signals`)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    overrides = task_overrides(hc)
    index_key = cfg.get("index", str(DEFAULT_INDEX))
    index = Path(str(index_key)) if index_key else None
    # a sweep from the command line goes on past a failed job (its summary lists it)
    sweep_job = on_command_line() and hc.mode == RunMode.MULTIRUN and not full_errors()

    def record(status: str, metrics: Mapping[str, Any] | None = None, error: str = "") -> None:
        if index is not None and index_writable:
            append_index(index, app, status, out_dir, overrides, metrics, error)

    index_writable = True
    interrupted: KeyboardInterrupt | None = None
    # its log gets its own warnings, though an earlier job in this process logged them
    forget_warnings()
    try:
        # this directory's earlier result or error, if any, is not this run's (a rerun job);
        # cleared whole before an interrupt could take the earlier run for this one
        with interrupts_deferred():
            clear_run(out_dir)
        if index is not None:
            index_writable = False
            check_index_writable(index)
            index_writable = True
        settle_run_config(cfg, overrides)
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
    except KeyboardInterrupt as exc:
        whole = _whole_run(out_dir)
        if whole is None:
            line = f"{interrupted_why(exc)} before the run finished: the files here are partial"
            write_error(out_dir, line)
            record("interrupted", error=line)
            if not _COMMAND_LINE or full_errors():
                raise
            # a sweep's folder is new each time unless named: the finished jobs are kept there
            again = (f"{resume_hint(hc.sweep.dir)} to run it and the jobs not started"
                     if hc.mode == RunMode.MULTIRUN
                     else "run the same command again to redo it")  # fmt: skip
            print(f"interrupted: {out_dir} holds a partial run (no metrics.json); {again}",
                  file=sys.stderr)  # fmt: skip
            sys.exit(_interrupted_status(exc))
        metrics, interrupted = whole, exc  # it came once the run's files were whole
    except WriteError as exc:  # a full disk, say: one line, as for a config error
        line = f"{exc.line()}: the run's results are not saved"
        with contextlib.suppress(OSError):  # the same full disk may refuse these too
            write_error(out_dir, traceback.format_exc())
        with contextlib.suppress(OSError):
            record("failed", error=line)
        if sweep_job:
            print(f"job {out_dir.name} failed: {line}", file=sys.stderr)
            return {"status": "failed", "error": line}
        if not _COMMAND_LINE or full_errors():
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:
        write_error(out_dir, traceback.format_exc())
        line = f"{type(exc).__name__}: {exc}".splitlines()[0]
        record("failed", error=line)
        if sweep_job:
            print(f"job {out_dir.name} failed: {line} (traceback: {out_dir}/error.txt)",
                  file=sys.stderr)  # fmt: skip
            return {"status": "failed", "error": line}
        raise
    try:
        with interrupts_deferred():  # the run is whole: its row is written whole
            record("ok", metrics)
    except KeyboardInterrupt as exc:
        interrupted = exc
    if interrupted is not None:
        if not _COMMAND_LINE or full_errors():
            raise interrupted
        print(f"interrupted after the run finished: {out_dir} is complete", file=sys.stderr)
        sys.exit(_interrupted_status(interrupted))
    print(result_table(metrics, f"{app}: {system_label(cfg)} {metrics.get('model')}"))
    print(f"{describe(metrics)} -> {out_dir}")
    return metrics


def _whole_run(out_dir: Path) -> dict[str, Any] | None:
    """The metrics of the run in ``out_dir`` when its files are whole (``metrics.json``,
    written last, reads), else None."""
    try:
        return json.loads((out_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return None


def _interrupted_status(exc: KeyboardInterrupt) -> int:
    return TERMINATED_STATUS if isinstance(exc, Terminated) else INTERRUPTED_STATUS


def multirun_first(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``-m`` / ``--multirun`` moved first: Hydra takes the flag anywhere but
    refuses the overrides after it as a second run (``x=1 -m y=1,2``)."""
    flags = [a for a in argv[1:] if a in ("-m", "--multirun")]
    return [*argv[:1], *flags[:1], *(a for a in argv[1:] if a not in ("-m", "--multirun"))]


def with_overrides(argv: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``argv`` (``-m`` first: :func:`multirun_first`) with ``extra`` overrides placed right
    after its last override, so that they join its run of overrides: Hydra's parser takes
    one run of positional overrides, and after a flag (``... --cfg job``) a second run is
    refused as unrecognized arguments."""
    argv = multirun_first(argv)
    last = max((i for i, a in enumerate(argv[1:], 1) if override_args([a])), default=len(argv) - 1)
    return [*argv[: last + 1], *extra, *argv[last + 1 :]]


def main_with_checks(
    main: Callable[[], Any], argv: Sequence[str] | None = None, config_name: str | None = None
) -> None:
    """Call a ``@hydra.main`` function after the command-line checks Hydra cannot phrase
    as one line (an unknown option of a config group; with ``config_name``, any override
    that does not compose, every job of a sweep included). A refused command exits with
    status 2. After a ``-m`` sweep with failed jobs it exits with status 2 when every one
    failed on its config, else 1 (:func:`sweep_failure_status`)."""
    global _COMMAND_LINE
    _COMMAND_LINE = True
    quiet_resource_trackers()  # a launcher's workers stopped by a signal: one line, not three
    SWEEP_DIRS.clear()  # one left by an earlier sweep in this process is not this one's
    args = sys.argv[1:] if argv is None else list(argv)
    saved_argv = sys.argv
    # every launcher sets hydra.job.env_set in the job's process (Ray and Slurm workers
    # included), so a job knows it belongs to a command-line sweep
    extra = [f"+hydra.job.env_set.{COMMAND_LINE_ENV}=1", SWEEP_DIR_CALLBACK]
    if _inspects(args):  # the config shown is the one a run would use
        extra += [f"{key}=null" for key in exclusive_nulls(override_args(args))]
    sys.argv = with_overrides(sys.argv, extra)
    try:
        try:
            check_inspection(args)
            check_group_overrides(args)
            check_output_dirs(args)
            if config_name is not None:
                check_own_yamls(config_name, args)
                check_overrides_compose(config_name, args)
                index = _index_of(args)
                # once, not as each job of a sweep starts; a command that only shows the
                # config or help writes no row, so it neither needs nor makes the index
                if index is not None and not _inspects(args):
                    check_index_writable(index)
        except ConfigError as err:
            _index_refused(config_name, args, err)
            report_config_error(err)
        # SIGTERM to the command ends it as Ctrl-C does here too, not only inside a job:
        # a launcher that runs jobs in worker processes (joblib) then stops its workers
        # instead of leaving them to finish and overwrite a later run's files
        with sigterm_as_interrupt(), sweep_stops_kept(args):
            main()
    finally:
        _COMMAND_LINE = False
        sys.argv = saved_argv
    if SWEEP_FAILURES:
        failed = SWEEP_FAILURES.pop()
        status = sweep_failure_status(SWEEP_DIRS.pop() if SWEEP_DIRS else None)
        what = "failed on bad config" if status == CONFIG_ERROR_STATUS else "failed"
        print(f"error: {failed} sweep job(s) {what} (their rows in summary.csv and "
              "error.txt say why)", file=sys.stderr)  # fmt: skip
        sys.exit(status)


class SweepDirRecorder(Callback):
    """Hydra callback that records the folder of a sweep when it ends (:data:`SWEEP_DIRS`),
    for :func:`main_with_checks` to read its jobs' statuses in ``summary.csv``."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        SWEEP_DIRS.append(Path(str(config.hydra.sweep.dir)))


def sweep_failure_status(sweep_dir: Path | None) -> int:
    """The exit status of a sweep with failed jobs: :data:`CONFIG_ERROR_STATUS` (2) when
    every job ``sweep_dir/summary.csv`` lists as not ok is a ``config error``, else
    :data:`RUNTIME_FAILURE_STATUS` (1), also when the summary cannot be read."""
    if sweep_dir is None:
        return RUNTIME_FAILURE_STATUS
    try:
        with (sweep_dir / "summary.csv").open(encoding="utf-8", newline="") as f:
            statuses = [row.get("status") for row in csv.DictReader(f)]
    except (OSError, UnicodeDecodeError, csv.Error):
        return RUNTIME_FAILURE_STATUS
    failed = [s for s in statuses if s != "ok"]
    if failed and all(s == "config error" for s in failed):
        return CONFIG_ERROR_STATUS
    return RUNTIME_FAILURE_STATUS


def check_output_dirs(args: Sequence[str]) -> None:
    """``hydra.run.dir`` and ``hydra.sweep.dir`` given as plain paths are folders a run can
    be written in; one the system will not make (a read-only or virtual file system, where
    ``os.access`` may still say yes) is found by making it and removing what was made, so
    that it is one line too (Hydra's own error is a traceback)."""
    for arg in args:
        key, _, value = arg.lstrip("+").partition("=")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and value and "$" not in value:
            check_out_dir(Path(value), key)
            _try_making(Path(value), key)


def _try_making(folder: Path, key: str) -> None:
    missing = [folder, *folder.parents]
    missing = missing[: next(i for i, p in enumerate(missing) if p.exists())]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(key, f"cannot make the folder ({exc.strerror})", str(folder)) from None
    for made in missing:  # deepest first: Hydra makes them when the run starts
        with contextlib.suppress(OSError):  # another run began writing there meanwhile
            made.rmdir()


def _index_of(args: Sequence[str]) -> Path | None:
    """The runs index a command line writes to: its ``index=...`` (the last), else the
    default; None for ``index=null`` or a value only Hydra can read (a sweep over
    indexes, an interpolation, or the default of a config a flag of :data:`SOURCE_FLAGS`
    picks, such as a run folder's ``--config-dir D --config-name config``: the run checks
    that config's index as it starts)."""
    values = [a.partition("=")[2] for a in args if a.lstrip("+").startswith("index=")]
    if not values and any(a.split("=")[0] in SOURCE_FLAGS for a in args if a.startswith("-")):
        return None
    index = values[-1] if values else str(DEFAULT_INDEX)
    if index in ("null", "None", "~", "") or "," in index or "$" in index:
        return None
    return Path(index)


# Hydra's flags that show the config, its sources or the help instead of running
INSPECTION_FLAGS = frozenset({
    "-c", "--cfg", "-i", "--info", "-h", "--help", "-hh", "--hydra-help", "--resolve",
})  # fmt: skip


def _inspects(args: Sequence[str]) -> bool:
    return any(a.split("=")[0] in INSPECTION_FLAGS for a in args)


def check_inspection(args: Sequence[str]) -> None:
    """``--cfg`` / ``--info`` show one job's config, so they do not go with ``-m`` (Hydra's
    own refusal is a traceback)."""
    shows = [a for a in args if a.split("=")[0] in ("-c", "--cfg", "-i", "--info")]
    if shows and any(a in ("-m", "--multirun") for a in args):
        raise ConfigError(
            shows[0], "shows one job's config and does not go with -m",
            " ".join(args), "the command without -m, one value per swept key",
        )  # fmt: skip


def _index_refused(config_name: str | None, args: Sequence[str], err: ConfigError) -> None:
    """A command line refused before Hydra starts still gets its index row (no run
    directory): in ``index=...`` of the arguments, else the default index; best effort. A
    command that only shows the config or help (``--cfg``, ``--help``, ``--info`` ...) would
    run nothing, and gets none."""
    index = _index_of(args) if config_name is not None else None
    if index is None or config_name is None:
        return
    if _inspects(args):
        return
    try:
        check_index_writable(index)
        append_index(index, config_name, "config error", None, args, None, err.line())
    except (ConfigError, OSError):
        pass  # the command's own error is the one to report
