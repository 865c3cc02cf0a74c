"""``python -m experiments.reproduce``: the vLLM paper's headline results, simulated.

Writes into ``--out`` (default ``results/reproduce``):

- ``table1.csv/.png/.pdf``: KV capacity per model/GPU setup, computed vs the paper's
  Table 1;
- ``fig2_breakdown.csv/.png/.pdf``: KV memory breakdown per system (Fig. 2);
- ``fig13_batch.csv/.png/.pdf``: mean batched requests, (a) ShareGPT at 2 req/s (Fig. 2's
  runs) and (b) Alpaca at :data:`FIG13_ALPACA_RATE` (Fig. 13);
- ``fig12<panel>_<model>_<workload>.csv/.png/.pdf``: Fig. 12 (a)-(f), normalized latency vs
  request rate for the five systems on OPT-13B/66B/175B x ShareGPT/Alpaca, every rate on
  ``--seeds`` seeds; ``fig12_curves.csv`` (mean, min, max over seeds), ``fig12_capacity.csv``
  (each system's sustainable rate, its interval over seeds, its ratio to vLLM's) and
  ``fig12_all_panels.png/.pdf``; see ``experiments.report.fig12_rates``;
  ``fig12_step_mix.csv``: the Alpaca panels' step mix, vLLM against Orca (Oracle), from one
  run each kept in ``runs/fig12_<panel>_steps_<system>/`` (``experiments.report.fig12_mix``);
- ``fig18b_block_size.csv/.png/.pdf``: vLLM's normalized latency against block size on
  ShareGPT and Alpaca (Fig. 18b);
- ``fig19_swap_recompute.csv`` (end to end, swap vs recompute by block size) and
  ``fig19_preemption_cost.csv`` (the cost model's price of one preemption), with a figure;
- ``report.md``: kvlab's numbers next to the paper's, with the cost model's constants;
- ``vllm_overhead_sensitivity.csv/.png/.pdf``: the appendix (vLLM against a time added to
  every step, on the report's clock and on the bare roofline);
- ``fig14_*``, ``fig15_sharing``, ``fig16_*``, ``fig17_*`` (CSV, PNG, PDF): the sharing
  figures (``experiments.report.sharing``), on 30-second traces by default;
- ``runs/<label>/``: Fig. 12's rate-search runs' ``config.yaml`` and ``metrics.json``, every
  other kept run's result files;
- ``provenance.json``, first: the command line, its options, the figures, the code's git
  commit and the package versions (:mod:`experiments.lib.provenance`), and ``earlier``: the
  figures whose files earlier commands left in ``--out``, each with its command
  (:func:`note_earlier_figures`); ``report.md`` names the commit too.

``--figures NAME[,NAME...]`` makes only the named figures and runs only the runs they read
(``experiments.report.selection``); each figure logs a line when its runs are done and when
its files are written.

``--launcher <name>`` runs every simulation as a Hydra job on that launcher (joblib, Ray,
Slurm; ``experiments.lib.jobs``), each in ``runs/<label>/`` with all its result files; a
rerun skips the jobs already finished there.

The default uses 10-minute traces for Fig. 2/13/18b/19, Fig. 12's per-panel default trace
lengths (``fig12_rates.PANELS``: 400 s ShareGPT, 60 s Alpaca) with 2 bisection
steps and ``--seeds`` (3) seeds, and 30-second traces for the sharing figures; ``--full``
uses the paper's traces (1 hour; 15 minutes for OPT-175B) and 4 bisection steps; the
bisection stops once a rate is bracketed within 3% (``--fig12-rate-tol`` narrows it, adding
a bisection step per halving). Every run goes through the same configs as
``experiments.simulate``.

The clock is the paper-era A100 stack by default (``--cost paper-a100``: ``cost=profiled``,
Vidur's measured A100 operator profile transferred to OPT-13B on an A100-40GB, and
``cost.stack=vllm-2023``: eager execution, Python scheduler and sampler, measured CPU time
per step, the paged kernel's per-block cost, per-copy swap latency). ``--cost roofline`` runs
the bare datasheet roofline instead (a lower bound on step time).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
from hydra import compose, initialize_config_dir

from experiments.lib.args import OneLineParser
from experiments.lib.batch_log import batch_logging
from experiments.lib.checks import ConfigError
from experiments.lib.cli import report_config_error, settle_run_config
from experiments.lib.jobs import (
    LaunchQueue,
    exit_if_launcher_missing,
    known_launchers,
    launcher_exists,
    on_search_path,
)
from experiments.lib.pool import launch_threads, worker_pool
from experiments.lib.provenance import code_words, command_line, options_of, provenance
from experiments.lib.results import write_config, write_json
from experiments.lib.setup import as_dict, build_setup, resolve_aliases
from experiments.report import fig12_mix, fig12_rates, selection, sharing
from experiments.report.figures import pyplot
from experiments.report.rate_search import RATE_TOL, run_search

log = logging.getLogger("kvlab.reproduce")
CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")
FIG2_SYSTEMS = ("orca_max", "orca_pow2", "orca_oracle", "vllm")
# Fig. 13 (b), OPT-13B on Alpaca: PAPER.md does not state its rate. 30 req/s is the end of
# the paper's OPT-13B Alpaca axis in Fig. 12 (0-30 req/s), chosen before any result.
FIG13_ALPACA_RATE = 30.0
COSTS = {
    "paper-a100": ["cost=profiled", "cost.stack=vllm-2023"],
    "roofline": ["cost=roofline"],
}
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Fixed inputs, chosen before any result: ShareGPT at Fig. 13's 2 req/s; Alpaca at 25 req/s,
# near the top of the paper's OPT-13B Alpaca axis (0-30 req/s).
BLOCK_STUDY_RATES = {"sharegpt": 2.0, "alpaca": 25.0}


def compose_config(overrides: list[str]) -> Any:
    """The simulate config with ``overrides``, as the command line would make it (giving
    ``workload.num_requests`` nulls ``workload.duration_s`` and vice versa)."""
    if isinstance(overrides, str):  # Hydra would parse its characters as overrides
        raise TypeError(f"overrides must be a list of strings, got the string {overrides!r}")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="simulate", overrides=overrides)
    settle_run_config(cfg, overrides)
    return cfg


def panel_clocks(panels: list[fig12_rates.Panel], clock: list[str], main: str) -> dict[str, str]:
    """Per Fig. 12 panel, the lines of its clock's description (``clock``: the cost
    overrides, on the panel's model and hardware) that ``main``, the report's *Cost model*
    text, does not hold: its model, tp, GPU and CPU fit where they differ."""
    shown = set(main.splitlines())
    out = {}
    for p in panels:
        cfg = compose_config([*clock, f"model={p.model}", f"hardware={p.hardware}", "system=vllm"])
        text = build_setup(cfg).cost_model.describe()
        out[p.letter] = "\n".join(line for line in text.splitlines() if line not in shown)
    return out


_LAUNCH: LaunchQueue | None = None  # set by --launcher: every run is a Hydra job


def run_one(
    label: str, overrides: list[str], out_dir: Path | None, config_out: Path | None = None
) -> dict[str, Any]:
    """One simulation (in a worker process); writes ``out_dir`` if given, else, if
    ``config_out`` is given, only the run's ``config.yaml`` there (made if missing), before
    the run. With ``--launcher`` it is a Hydra job on that launcher, in ``runs/<label>/``
    (resumed), which writes the whole run folder."""
    from experiments.simulate import run

    if _LAUNCH is not None:
        return {**_LAUNCH.run(label, overrides), "label": label}
    cfg = compose_config(overrides)
    if out_dir is None and config_out is not None:
        config_out.mkdir(parents=True, exist_ok=True)
        write_config(config_out, resolve_aliases(as_dict(cfg)))
    metrics = run(cfg, out_dir)
    metrics["label"] = label
    return metrics


def run_on_clock(clock: list[str], label: str, overrides: list[str]) -> dict[str, Any]:
    """:func:`run_one` (no files) with the report's clock overrides appended, so the sharing
    figures run on the same cost model as every other figure of the report."""
    return run_one(label, [*overrides, *clock], None)


def run_recorded(runs_dir: Path, clock: list[str], label: str, overrides: list[str]) -> dict:
    """:func:`run_on_clock`, keeping in ``runs/<label>/`` the run's ``config.yaml`` (its
    resolved config, written first: ``simulate`` runs it again from there with every table)
    and its ``metrics.json``, as ``simulate`` writes it: without the ``label`` the returned
    metrics carry (the folder's name), so that a run again from the folder differs from it in
    the machine's speed alone (``wall_s``, ``sim_steps_per_s``), as a ``--launcher`` run's."""
    m = run_one(label, [*overrides, *clock], None, config_out=runs_dir / label)
    (runs_dir / label).mkdir(parents=True, exist_ok=True)
    write_json(runs_dir / label / "metrics.json", {k: v for k, v in m.items() if k != "label"})
    return m


# no wall time: a figure's CSV is the same on every machine
_KEEP = (
    "label", "num_requests", "normalized_latency", "request_throughput", "output_throughput",
    "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "mean_batch_size",
    "completed", "rejected", "num_preemptions", "kv_token_states_pct", "kv_reserved_pct",
    "kv_internal_frag_pct", "kv_external_frag_pct", "kv_free_at_limit_pct", "kv_free_pct",
    "kv_slots", "num_steps",
)  # fmt: skip


def _keep(m: dict[str, Any]) -> dict[str, Any]:
    return {k: m.get(k) for k in _KEEP}


OVERHEADS_S = (0.0, 0.005, 0.01, 0.02, 0.05)  # added to the bare roofline's steps
CLOCK_OVERHEADS_S = (0.0, 0.001, 0.002, 0.005, 0.01)  # added to the report's clock's steps


def unmeasured_run(
    fixed: Sequence[pd.DataFrame], searches: Sequence[Sequence[dict[str, Any]]]
) -> str | None:
    """What a report cannot be made of, or None: a fixed-rate run (``fixed``: one row per
    run) that completed no request, or a rate search (``searches``: their rows) whose
    traces held no request at any rate, so that it has no rate at all."""
    for frame in fixed:
        for row in frame.to_dict("records"):
            completed = row.get("completed")
            if not completed or completed != completed:  # none, 0 or NaN (not measured)
                return f"run {row['label']} completed no request"
    for rows in searches:
        measured: dict[tuple[Any, Any], bool] = {}
        for r in rows:
            key = (r.get("setting"), r.get("system"))
            measured[key] = measured.get(key, False) or r["passes"] is not None
        for (setting, system), ok in measured.items():
            if not ok:
                return f"{system}'s rate search ({setting}) held no request at any rate"
    return None


def overhead_sensitivity(
    pool: ProcessPoolExecutor, base: list[str], clock: str = "roofline"
) -> list[tuple[dict[str, Any], Any]]:
    """vLLM at 2 req/s with a fixed time added to every step: how strongly step time moves
    vLLM's batch and KV shares (an appendix; nothing in it is measured or fitted). On the
    report's ``clock`` (a key of :data:`COSTS`) with :data:`CLOCK_OVERHEADS_S`, what
    unmodelled time per step would change, and on the bare roofline with
    :data:`OVERHEADS_S`; once if ``clock`` is the roofline. Each job's key: ``clock``,
    ``report_clock`` (the report's own) and ``per_step_overhead_ms``."""
    series = [(clock, CLOCK_OVERHEADS_S)] if clock != "roofline" else []
    series.append(("roofline", OVERHEADS_S))
    return [
        ({"clock": name, "report_clock": name == clock, "per_step_overhead_ms": o * 1e3},
         pool.submit(run_one, f"sens_{'' if name == 'roofline' else name + '_'}"
                              f"overhead{o * 1e3:g}ms",
                     [*base, *COSTS[name], "system=vllm", "workload.rate=2.0",
                      f"cost.per_step_overhead_s={o}"], None))
        for name, overheads in series
        for o in overheads
    ]  # fmt: skip


def block_study(
    pool: ProcessPoolExecutor, base: list[str], figures: tuple[str, ...] = ("fig18b", "fig19")
) -> list[tuple[dict[str, Any], Any]]:
    """Fig. 18b (vLLM, recompute, both workloads) and Fig. 19 (ShareGPT, swap, beside
    Fig. 18b's ShareGPT recompute runs) by block size, for those of ``figures`` selected."""
    jobs = []
    workloads = [w for w in BLOCK_STUDY_RATES if "fig18b" in figures or w == "sharegpt"]
    for bs in BLOCK_SIZES:
        for workload in workloads:
            rate = BLOCK_STUDY_RATES[workload]
            key = {"study": "fig18b", "workload": workload, "rate": rate, "block_size": bs,
                   "preemption_mode": "recompute"}  # fmt: skip
            over = [*base, "system=vllm", f"workload={workload}", f"workload.rate={rate}",
                    f"system.block_size={bs}"]  # fmt: skip
            jobs.append((key, pool.submit(run_one, f"fig18b_{workload}_bs{bs}", over, None)))
        if "fig19" not in figures:
            continue
        rate = BLOCK_STUDY_RATES["sharegpt"]  # beside Fig. 18b's ShareGPT runs
        key = {"study": "fig19", "workload": "sharegpt", "rate": rate, "block_size": bs,
               "preemption_mode": "swap"}  # fmt: skip
        over = [*base, "system=vllm", "workload=sharegpt", f"workload.rate={rate}",
                f"system.block_size={bs}", "system.preemption_mode=swap"]  # fmt: skip
        jobs.append((key, pool.submit(run_one, f"fig19_swap_bs{bs}", over, None)))
    return jobs


def note_earlier_figures(path: Path, figs: Sequence[str]) -> dict[str, str]:
    """The figures whose files earlier commands left in this ``--out`` and this one does not
    make, each with the command that made it: the earlier ``provenance.json`` at ``path``
    (its ``figures``, and the ``earlier`` it carried, so a second narrower rerun still names
    them). Logged, since their files stay beside the new report, which does not describe
    them; empty without a readable earlier record."""
    try:
        doc = json.loads(path.read_text())
        made = {str(f): str(doc["command"]) for f in doc["figures"]}
        carried = {str(f): str(c) for f, c in doc.get("earlier", {}).items()}
        left = {f: c for f, c in (carried | made).items() if f not in figs}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    by_command: dict[str, list[str]] = {}
    for figure, command in left.items():
        by_command.setdefault(command, []).append(figure)
    if by_command:
        named = [f"{', '.join(fs)} from an earlier command ({c})" for c, fs in by_command.items()]
        log.warning(
            "%s holds the files of %s; they stay, and the new report.md covers %s only",
            path.parent,
            " and of ".join(named),
            ", ".join(figs),
        )
    return left


def _panels(parser: argparse.ArgumentParser, letters: str) -> list[fig12_rates.Panel]:
    """The Fig. 12 panels named by ``letters``; an unknown one exits with the valid ones."""
    bad = sorted(set(letters) - set(fig12_rates.BY_LETTER))
    if bad or not letters:
        parser.error(f"--fig12-panels: no panel {''.join(bad) or repr(letters)}; valid: "
                     f"{''.join(fig12_rates.BY_LETTER)}")  # fmt: skip
    return [p for p in fig12_rates.PANELS if p.letter in letters]


def check_run_numbers(args: argparse.Namespace) -> None:
    """A ConfigError for the first of ``--duration`` (where the command has it),
    ``--threshold``, ``--workers``, ``--seeds`` and ``--seed`` that argparse accepts but a
    run cannot use (NaN, inf, zero, negative; a seed may be 0)."""
    positive = {"--duration": getattr(args, "duration", None), "--threshold": args.threshold}
    for flag, value in positive.items():
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(flag, "not a number > 0", value)
    for flag, value in {"--workers": args.workers, "--seeds": args.seeds}.items():
        if value < 1:
            raise ConfigError(flag, "not a count >= 1", value)
    if args.seed < 0:
        raise ConfigError("--seed", "not a seed (an integer >= 0)", args.seed)


def check_arguments(args: argparse.Namespace) -> None:
    """A ConfigError for the first number a run cannot use (:func:`check_run_numbers`), or
    an unknown launcher."""
    check_run_numbers(args)
    known = args.launcher is None or launcher_exists(args.launcher)
    if not known and not on_search_path(args.launcher, args.launcher_override):
        raise ConfigError("--launcher", "unknown launcher", args.launcher,
                          "one of " + ", ".join(known_launchers()))  # fmt: skip


def check_launcher_overrides(launcher: str, overrides: list[str]) -> None:
    """The ``--launcher-override`` values compose with ``hydra/launcher=launcher`` (together:
    a search path and the preset it holds go as a pair); else one line (exit 2) before any
    job runs."""
    from hydra.errors import HydraException

    if not overrides:
        return
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            compose("simulate", [f"hydra/launcher={launcher}", *overrides],
                    return_hydra_config=True)  # fmt: skip
    except HydraException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        report_config_error(ConfigError("--launcher-override", first, " ".join(overrides)))


def main(argv: list[str] | None = None) -> Path:
    p = OneLineParser(prog="python -m experiments.reproduce", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("results/reproduce"))
    p.add_argument("--full", action="store_true", help="the paper's 1-hour traces")
    p.add_argument("--duration", type=float, default=None, help="trace seconds (override)")
    p.add_argument(
        "--threshold",
        type=float,
        default=1.0,
        help="normalized latency (s/token) a sustained rate must stay under",
    )
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--figures",
        metavar="NAME[,NAME...]",
        help=f"make only these figures ({', '.join(selection.FIGURES)}; default: all)",
    )
    p.add_argument("--skip-fig12", action="store_true", help="leave Fig. 12 out of the selection")
    p.add_argument("--seeds", type=int, default=3, help="seeds per Fig. 12 / Fig. 14 rate")
    p.add_argument(
        "--fig12-panels",
        default="abcdef",
        help="Fig. 12 panels to run, e.g. 'ad' (a-c: OPT-13B/66B/175B ShareGPT; d-f: Alpaca)",
    )
    p.add_argument(
        "--fig12-rate-tol",
        type=float,
        default=None,
        help=f"bisect each Fig. 12 rate to this share of it (default {RATE_TOL}); each "
        "halving below the default bisects once more",
    )
    p.add_argument("--skip-sharing", action="store_true", help="no Fig. 14-17")
    p.add_argument(
        "--launcher",
        help="run every simulation as a Hydra job on this hydra/launcher "
        f"({', '.join(known_launchers())})",
    )
    p.add_argument(
        "--launcher-override",
        action="append",
        default=[],
        help="a hydra.launcher.* override, e.g. hydra.launcher.partition=cpu",
    )
    p.add_argument("--skip-blocks", action="store_true", help="no Fig. 18b / Fig. 19 runs")
    p.add_argument(
        "--cost",
        choices=sorted(COSTS),
        default="paper-a100",
        help="the clock: the paper-era A100 stack (default) or the bare roofline",
    )
    args = p.parse_args(argv)  # fmt: skip
    if args.fig12_rate_tol is not None and not 0 < args.fig12_rate_tol < 1:
        p.error(f"--fig12-rate-tol: must be in (0, 1), got {args.fig12_rate_tol}")
    panels = _panels(p, args.fig12_panels)  # before --out is touched
    try:
        check_arguments(args)
        figs = selection.select(args.figures, [k for k in selection.SKIPS if getattr(args, k)])
        if args.launcher_override and not args.launcher:
            raise ConfigError("--launcher-override", "given without --launcher",
                              args.launcher_override[0], "--launcher NAME as well")  # fmt: skip
    except ConfigError as err:
        report_config_error(err)
    if args.launcher:
        exit_if_launcher_missing([f"hydra/launcher={args.launcher}", *args.launcher_override])
        check_launcher_overrides(args.launcher, args.launcher_override)
    batch_logging()

    duration = args.duration or (3600.0 if args.full else 600.0)
    out: Path = args.out
    runs_dir = out / "runs"
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        report_config_error(ConfigError("--out", f"cannot write there ({exc.strerror})", str(out)))
    if (out / "report.md").is_file():  # it describes runs this command rewrites
        (out / "report.md").unlink()
        log.info("removed the earlier %s: this command writes its own when its runs are done",
                 out / "report.md")  # fmt: skip
    command = command_line("experiments.reproduce", sys.argv[1:] if argv is None else argv)
    options = options_of(args)
    earlier = note_earlier_figures(out / "provenance.json", figs)
    write_json(out / "provenance.json", {"command": command, "options": options,
                                         "figures": list(figs), "earlier": earlier,
                                         **provenance()})  # fmt: skip
    scenario = ["model=opt-13b", "hardware=a100-40gb", "workload=sharegpt",
                f"workload.duration_s={duration}"]  # fmt: skip
    common = [*scenario, f"seed={args.seed}"]
    seeds = tuple(range(args.seed, args.seed + max(1, args.seeds)))
    base = [*common, *COSTS[args.cost]]
    t0 = time.perf_counter()
    progress = selection.Progress(log, t0)
    log.info("figures: %s", ", ".join(figs))
    from experiments.report.markdown import write_outputs

    global _LAUNCH
    if args.launcher:
        _LAUNCH = LaunchQueue(args.launcher, runs_dir, args.launcher_override)
    executor = launch_threads(_LAUNCH) if _LAUNCH else worker_pool(max(1, args.workers))
    with executor as pool:
        fig2_jobs = {
            s: pool.submit(run_one, f"fig2_{s}", [*base, f"system={s}", "workload.rate=2.0"],
                           runs_dir / f"fig2_{s}")
            for s in FIG2_SYSTEMS if {"fig2", "fig13"} & set(figs)
        }  # fmt: skip
        sens_jobs = overhead_sensitivity(pool, common, args.cost) if "sensitivity" in figs else []
        block_figs = tuple(f for f in ("fig18b", "fig19") if f in figs)
        block_jobs = block_study(pool, base, block_figs) if block_figs else []
        progress.runs("fig2", list(fig2_jobs.values()) if "fig2" in figs else [])
        fig13_jobs = {
            s: pool.submit(run_one, f"fig13_alpaca_{s}",
                           [*base, f"system={s}", "workload=alpaca",
                            f"workload.rate={FIG13_ALPACA_RATE}"], runs_dir / f"fig13_alpaca_{s}")
            for s in FIG2_SYSTEMS if "fig13" in figs
        }  # fmt: skip
        progress.runs("fig13", [*fig2_jobs.values(), *fig13_jobs.values()] if fig13_jobs else [])
        progress.runs("sensitivity", [job for _, job in sens_jobs])
        for name in block_figs:  # Fig. 19 also reads Fig. 18b's ShareGPT runs
            jobs = [
                job
                for key, job in block_jobs
                if key["study"] == name or (name == "fig19" and key["workload"] == "sharegpt")
            ]
            progress.runs(name, jobs)
        fig12_jobs, mix_jobs = [], []
        if "fig12" in figs:
            recorded = partial(run_recorded, runs_dir, COSTS[args.cost])
            tol = args.fig12_rate_tol or RATE_TOL
            evals = (4 if args.full else 2) + max(0, math.ceil(math.log2(RATE_TOL / tol)))
            searches = fig12_rates.searches(panels, args.full, args.duration, seeds,
                                            bisect_evals=evals, rate_tol=tol)  # fmt: skip
            fig12_jobs = [pool.submit(run_search, recorded, s, args.threshold) for s in searches]
            each = "rate searches (a system's runs over rates and seeds each)"
            for panel in panels:  # a progress line per panel, before the total's
                jobs = [j for j, s in zip(fig12_jobs, searches, strict=True)
                        if s.setting == panel.letter]  # fmt: skip
                progress.runs(f"fig12 ({panel.letter})", jobs, each)
            # registered last, so the job that ends the last panel logs the panel first
            progress.runs("fig12", fig12_jobs, each)
            mix_runs = fig12_mix.mix_runs(
                panels, lambda p: fig12_rates.trace_s(p, args.full, args.duration), args.seed
            )
            mix_jobs = [(r, pool.submit(run_one, r.label, [*r.overrides, *COSTS[args.cost]],
                                        runs_dir / r.label)) for r in mix_runs]  # fmt: skip
            progress.runs("fig12 step mix", [job for _, job in mix_jobs])
        sharing_jobs, sharing_s = {}, 0.0
        sharing_figs = [f for f in sharing.WRITERS if f in figs]
        if sharing_figs:
            sharing_s = args.duration or (sharing.FULL_DURATION_S if args.full
                                          else sharing.DURATION_S)  # fmt: skip
            run = partial(run_on_clock, COSTS[args.cost])
            sharing_jobs = sharing.submit(pool, run, sharing_s, args.seed, args.threshold,
                                          sharing_figs, seeds=args.seeds)  # fmt: skip
            for name, jobs in sharing_jobs.items():
                progress.runs(name, jobs)
        fig2 = pd.DataFrame([_keep(job.result()) | {"system": s} for s, job in fig2_jobs.items()])
        fig13_alpaca = pd.DataFrame(
            [_keep(job.result()) | {"system": s} for s, job in fig13_jobs.items()]
        )
        sens = pd.DataFrame([key | _keep(job.result()) for key, job in sens_jobs])
        blocks = pd.DataFrame([key | _keep(job.result()) for key, job in block_jobs])
        fig12_rows = [row for job in fig12_jobs for row in job.result()]
        mix_rows = [fig12_mix.mix_row(r, runs_dir / r.label, job.result()) for r, job in mix_jobs]
        sharing_rows = [[row for job in jobs for row in job.result()]
                        for jobs in sharing_jobs.values()]  # fmt: skip
    log.info("all runs done (%.0f s)", progress.elapsed())
    short = unmeasured_run([fig2, fig13_alpaca, sens, blocks], [fig12_rows, *sharing_rows])
    if short is not None:
        problem = f"too short for the report: {short}; no figure or report was written"
        expected = "a trace long enough to hold requests at every figure's rate"
        report_config_error(ConfigError("--duration", problem, duration, expected))
    sharing_text = (
        sharing.write(sharing_jobs, out, sharing._plt(), sharing_s, sharing_figs, progress.wrote)
        if sharing_jobs else ""
    )  # fmt: skip
    cfg = compose_config([*base, "system=vllm"])
    fig12_text = ""
    if fig12_rows:
        clocks = panel_clocks(panels, COSTS[args.cost], build_setup(cfg).cost_model.describe())
        fig12_text = fig12_rates.write(
            fig12_rows, out, pyplot(headless=True), args.threshold, clocks, mix_rows
        )
        progress.wrote("fig12", "fig12*.csv/.png/.pdf")
    write_outputs(
        out, fig2, sens, cfg, blocks, duration=duration, wall_s=time.perf_counter() - t0,
        figures=figs, on_written=progress.wrote, fig13_alpaca=fig13_alpaca,
        fig13_alpaca_rate=FIG13_ALPACA_RATE, sections=(fig12_text, sharing_text),
        command=command, code=code_words(),
    )  # fmt: skip
    log.info("wrote %s", out / "report.md")
    return out


if __name__ == "__main__":
    from experiments.lib.sweep_stop import LauncherStopped

    try:
        main()
    except LauncherStopped as stopped:  # --launcher: a worker died; the finished runs stay
        print(f"error: {stopped}", file=sys.stderr)
        sys.exit(1)
