"""Simulations as Hydra jobs on a Hydra launcher (joblib, Ray, Slurm), with resume.

A job is one ``experiments.simulate`` run: a label (its directory name under the sweep
directory) and its config overrides. :func:`launch` runs a list of jobs through any
installed Hydra launcher, the same way ``python -m experiments.simulate -m`` does, and
returns each job's metrics. A job whose directory already holds a complete run of the
same config (``experiments.lib.results.finished_metrics``) is not run again, neither
here nor inside the job, so an interrupted sweep resumes where it stopped.
:class:`LaunchQueue` lets many threads ask for single jobs (e.g. the capacity searches of
``reproduce``) and launches whatever is pending as one batch, one launch at a time.

Launchers (``hydra/launcher=<name>``): the plugins' own ``joblib``, ``ray``,
``submitit_slurm`` and ``submitit_local``, and kvlab's presets in
``configs/hydra/launcher/`` (``local``, ``ray_cluster``, ``slurm``), each built on one of
them. The plugins come with ``pip install -e '.[cluster]'``.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
EXTRA = "pip install -e '.[cluster]'"
PLUGINS: dict[str, tuple[str, str]] = {  # launcher -> (plugin module, PyPI package)
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher"),
    "ray": ("hydra_plugins.hydra_ray_launcher", "hydra-ray-launcher"),
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
}


@dataclass(frozen=True)
class Job:
    label: str  # the job's directory name under the sweep directory
    overrides: tuple[str, ...]


def plugin_of(launcher: str) -> str | None:
    """The plugin launcher behind ``launcher``: itself, or the base a kvlab preset in
    ``configs/hydra/launcher/`` names first in its defaults list; None when unknown."""
    if launcher in PLUGINS:
        return launcher
    preset = CONFIG_DIR / "hydra" / "launcher" / f"{launcher}.yaml"
    if not preset.is_file():
        return None
    defaults = OmegaConf.load(preset).get("defaults") or []
    base = next((str(d) for d in defaults if str(d) != "_self_"), None)
    return base if base in PLUGINS else None


def known_launchers() -> list[str]:
    """Every ``hydra/launcher`` option: Hydra's ``basic``, the plugins kvlab knows and
    kvlab's presets in ``configs/hydra/launcher/``."""
    presets = (p.stem for p in (CONFIG_DIR / "hydra" / "launcher").glob("*.yaml"))
    return sorted({"basic", *PLUGINS, *presets})


def launcher_exists(name: str) -> bool:
    """``name`` is a known launcher or another installed Hydra launcher plugin
    (``hydra_plugins.hydra_<name>_launcher``, e.g. ``rq``)."""
    if name in known_launchers():
        return True
    try:
        return importlib.util.find_spec(f"hydra_plugins.hydra_{name}_launcher") is not None
    except (ImportError, ValueError):
        return False


def missing_launcher(overrides: Sequence[str]) -> str | None:
    """One line naming the package and extra to install when ``overrides`` choose a
    launcher whose plugin is not installed, or listing the known launchers when they choose
    none; None otherwise."""
    for item in overrides:
        key, _, value = item.lstrip("+").partition("=")
        if key != "hydra/launcher":
            continue
        plugin = plugin_of(value)
        if plugin is None:
            if launcher_exists(value) or on_search_path(value, overrides):
                return None  # another plugin, or a user's preset: Hydra takes it from here
            return (
                f"hydra/launcher={value}: unknown launcher; known: {', '.join(known_launchers())}"
            )
        module, package = PLUGINS[plugin]
        if importlib.util.find_spec(module.split(".")[0]) is None or (
            importlib.util.find_spec(module) is None
        ):
            return f"hydra/launcher={value} needs {package}: {EXTRA}"
    return None


def on_search_path(launcher: str, overrides: Sequence[str]) -> bool:
    """``hydra/launcher/<launcher>.yaml`` is in a ``hydra.searchpath`` folder of
    ``overrides`` (or the search path has entries this check cannot list)."""
    from experiments.lib.compose import search_dirs

    dirs = search_dirs(overrides)
    return dirs is None or any((d / "hydra" / "launcher" / f"{launcher}.yaml").is_file()
                               for d in dirs)  # fmt: skip


def exit_if_launcher_missing(argv: Sequence[str]) -> None:
    """For entry points: exit with status 2 (a config error's) and
    :func:`missing_launcher`'s line, no traceback."""
    problem = missing_launcher(argv)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)


def _job_config(overrides: Sequence[str]) -> Any:
    """The job's config as its run will save it: composed, with the partner of a
    ``workload.num_requests`` / ``workload.duration_s`` it sets nulled, as the app does
    (:func:`experiments.lib.cli.settle_run_config`), so a finished job is recognised."""
    from experiments.lib.cli import settle_run_config
    from experiments.lib.compose import compose_config

    cfg = compose_config("simulate", overrides)
    settle_run_config(cfg, overrides)
    return cfg


def launch(
    jobs: Sequence[Job],
    launcher: str,
    sweep_dir: Path,
    launcher_overrides: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Run ``jobs`` on ``launcher`` (a ``hydra/launcher`` option) into
    ``sweep_dir/<label>/``; returns their metrics in order. Finished jobs are read back,
    not run. Each job's index row goes to ``sweep_dir/index.csv`` unless the job gives
    ``index=``. Raises RuntimeError naming the extra when the launcher is not installed,
    :class:`experiments.lib.sweep_stop.LauncherStopped` when a worker process died."""
    from hydra import initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.plugins import Plugins
    from hydra.types import HydraContext, RunMode

    from experiments.lib.results import finished_metrics
    from experiments.lib.sweep_stop import LauncherStopped, dead_worker
    from experiments.simulate import simulate_job

    problem = missing_launcher([f"hydra/launcher={launcher}", *launcher_overrides])
    if problem:
        raise RuntimeError(problem)
    sweep_dir = Path(sweep_dir).resolve()
    # each job's row goes to the sweep's own index, beside its results, unless it names one
    index = f"index={sweep_dir / 'index.csv'}"
    jobs = [
        j if any(o.startswith("index=") for o in j.overrides)
        else Job(j.label, (*j.overrides, index))
        for j in jobs
    ]  # fmt: skip
    results: list[dict[str, Any] | None] = [
        finished_metrics(sweep_dir / j.label, _job_config(j.overrides)) for j in jobs
    ]
    pending = [i for i, r in enumerate(results) if r is None]
    if pending:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            hydra = GlobalHydra.instance().hydra
            assert hydra is not None
            cfg = hydra.compose_config(
                "simulate",
                [f"hydra/launcher={launcher}", f"hydra.sweep.dir={sweep_dir}",
                 "hydra.job.name=simulate", *launcher_overrides],
                run_mode=RunMode.MULTIRUN,
                with_log_configuration=False,
            )  # fmt: skip
            HydraConfig.instance().set_config(cfg)
            context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(cfg))
            runner = Plugins.instance().instantiate_launcher(
                hydra_context=context, task_function=simulate_job, config=cfg
            )
            try:
                returns = runner.launch(
                    [[*jobs[i].overrides, f"hydra.sweep.subdir={jobs[i].label}"]
                     for i in pending],
                    initial_job_idx=0,
                )  # fmt: skip
            except Exception as exc:
                why = dead_worker(exc)
                if why is None:
                    raise
                raise LauncherStopped(
                    f"{why} and the {launcher} launcher stopped; the runs finished so far "
                    f"are kept under {sweep_dir}: run the same command again to resume"
                ) from exc
        for i, ret in zip(pending, returns, strict=True):
            results[i] = dict(ret.return_value)  # re-raises a failed job's exception
    return [r for r in results if r is not None]


class LaunchQueue:
    """Thread-safe single-job front of :func:`launch`: :meth:`run` blocks until its job is
    done; jobs asked for while a launch runs go out together in the next one."""

    def __init__(
        self,
        launcher: str,
        sweep_dir: Path,
        launcher_overrides: Sequence[str] = (),
        gather_s: float = 0.5,
    ) -> None:
        self.launcher = launcher
        self.sweep_dir = Path(sweep_dir)
        self.launcher_overrides = list(launcher_overrides)
        self.gather_s = gather_s
        self._pending: list[tuple[Job, Future]] = []
        self._in_flight: list[tuple[Job, Future]] = []
        self._stopped: BaseException | None = None  # a launcher that stopped: no more batches
        self._lock = threading.Lock()
        self._wake = threading.Event()
        threading.Thread(target=self._loop, daemon=True, name="kvlab-launch").start()

    def run(self, label: str, overrides: Sequence[str]) -> dict[str, Any]:
        """The job's metrics, once its batch is done. After a launch raised
        :class:`experiments.lib.sweep_stop.LauncherStopped`, every later call raises it at
        once (the caller ends; the jobs finished so far are kept)."""
        future: Future = Future()
        with self._lock:
            if self._stopped is not None:
                raise self._stopped
            self._pending.append((Job(label, tuple(overrides)), future))
        self._wake.set()
        return future.result()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(self.gather_s)  # let the other threads' requests arrive
            with self._lock:
                batch, self._pending = self._pending, []
                self._in_flight = batch
                self._wake.clear()
            if not batch:
                continue
            try:
                if self._stopped is not None:
                    raise self._stopped
                metrics = launch(
                    [j for j, _ in batch], self.launcher, self.sweep_dir, self.launcher_overrides
                )
            except BaseException as e:  # handed to every waiting caller
                if type(e).__name__ == "LauncherStopped":
                    self._stopped = e
                _settle(batch, [e] * len(batch))
                continue
            _settle(batch, metrics)

    def abandon(self, why: BaseException) -> None:
        """Fail every job waiting or in flight with ``why`` now, so that their callers
        return, and take no more. The launch in flight is left to the daemon thread: the
        caller stops its processes first (:func:`experiments.lib.pool.launch_threads`).
        On an interrupt, each job of the launch in flight that started and did not mark
        itself is marked ``interrupted`` here (a joblib launcher kills the other workers as
        soon as one job's interrupt comes back, before they can mark theirs)."""
        from experiments.lib.signals import interrupted_why
        from experiments.lib.sweep_stop import mark_stopped

        with self._lock:
            self._stopped = why
            in_flight = list(self._in_flight)
            dropped, self._pending = [*in_flight, *self._pending], []
        if isinstance(why, KeyboardInterrupt):
            line = (f"{interrupted_why(why)} before the run finished: the files here are "
                    "partial; run the same command again to redo it")  # fmt: skip
            mark_stopped([self.sweep_dir / job.label for job, _ in in_flight], line)
        _settle(dropped, [why] * len(dropped))


def _settle(batch: Sequence[tuple[Job, Future]], outcomes: Sequence[Any]) -> None:
    """Each job's future gets its outcome (an exception is raised by its caller), unless
    :meth:`LaunchQueue.abandon` settled it first."""
    for (_, future), outcome in zip(batch, outcomes, strict=True):
        try:
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        except InvalidStateError:  # abandoned: the caller has gone on
            pass
