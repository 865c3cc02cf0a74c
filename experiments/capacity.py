"""``python -m experiments.capacity``: the highest request rate each system sustains for one
model, GPU and traffic, the question of the paper's Fig. 12 asked of any configuration::

    python -m experiments.capacity model=qwen3-8b hardware=l40s cost=profiled \\
        --systems vllm,orca_max --seeds 2 --out results/capacity

The positional arguments are ``experiments.simulate`` overrides (every run composes the
same configs); ``system``, ``seed``, ``workload.rate`` and ``workload.time_scale`` are the
search's own. A workload that draws arrivals (``sharegpt``, ``alpaca``, ``shared_prefix``,
``multi_turn``, ``vllm_bench``) is searched by ``workload.rate``; a trace file (``azure_conv``,
``azure_code``, Mooncake, Vidur) by ``workload.time_scale``: rate r replays it at time_scale
trace_rate / r, trace_rate its mean rate at time_scale 1 over its window (``num_requests``
requests over their span, or those in ``duration_s`` over it), with ``duration_s`` scaled
alike, so that every rate replays the same requests, on one seed (a trace is the same on
every seed). A vLLM log's arrivals are not rescaled and are refused.

Each system is searched as the report's Fig. 12 panels are
(:mod:`experiments.report.rate_search`): a rate passes when, on every seed, the normalized
latency (s/token) is at or under ``--threshold`` (the rule named ``latency``), every
request completes (``incomplete``), and at most 10% of the trace (of 100 requests on a
shorter one) is unfinished when its last request arrives (``backlog``). The ``--rates``
grid is walked up until a rate fails, grown 1.5x past its top while it passes (up to 64x
the top), and the rate is then bisected until bracketed within ``--rate-tol``. A system
that passed every rate tried has only a lower bound (``rate_open``), one that passed none
only an upper bound (its rate is 0).

With ``--slo-attainment A`` a rate must also meet an SLO, goodput-style (DistServe): on
every seed, at least the share A of the requests meets every limit of the ``slo_ms``
override (e.g. ``'slo_ms={ttft: 2000, tpot: 200}'``; a rejected request misses them), the
rule named ``slo``. ``--threshold`` stays the latency rule: ``--threshold inf`` (only with
``--slo-attainment``) judges a rate by the SLO, completion and backlog alone.

Writes into ``--out`` (an earlier search there is replaced, unless ``--resume``):
``capacity.csv`` (per system: its setting (:data:`SETTING_COLUMNS`: model, hardware, tp, cost,
cost_stack), the sustainable rate, its interval over seeds, the lowest failing rate and the
rules failed there, ``first_failing_rules``, its rate over the first system's, and the
metrics of its runs at that rate, averaged over seeds), ``runs.csv`` (every run, after its
system its setting; ``fails_on``: the rules it failed; ``trace_s``: the replayed trace's
length, empty where a request count ends it), ``curves.csv`` (normalized latency per rate,
mean/min/max over seeds), ``capacity.png/.pdf``, ``runs/<label>/config.yaml``,
``inputs.json`` and ``metrics.json`` (``simulate`` runs a run again from its
``config.yaml``, with every table), and first ``provenance.json`` (the
command, its options, the setting, the first system's resolved config and cost model, the
code's git commit and the input files' digests: :func:`search_provenance`); every file
whole or not at all.
With ``--resume`` the runs of an earlier (stopped) search in ``--out`` stay, and each
finished one of the same config on inputs and code unchanged is read back, not run
(:func:`run_kept`, a resumed sweep's rule); the tables are those of a search never stopped.
It prints the table (its "fails at" column: the lowest failing rate and its rules), and a
warning for a system whose lowest failing rate failed on the backlog rule alone at a
normalized latency well under the threshold (the trace may end in a burst of arrivals).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FuturesTimeout
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from core.workload.spec import USES
from core.workload.trace_io import drop_log
from experiments.lib.args import OneLineParser, out_dir_problem
from experiments.lib.batch_log import batch_logging, heard
from experiments.lib.checks import ConfigError, policy_hint
from experiments.lib.cli import full_errors, report_config_error
from experiments.lib.compose import (
    check_group_overrides,
    check_override_args,
    check_overrides_compose,
    check_own_yamls,
)
from experiments.lib.pool import worker_pool
from experiments.lib.provenance import command_line, options_of, provenance
from experiments.lib.results import WriteError, temp_pattern, write_csv, write_json
from experiments.report.rate_search import (
    BACKLOG_MIN_REQUESTS,
    RATE_TOL,
    Search,
    at_max_rate,
    capacity_table,
    curve_table,
    first_failing_rate,
    rules_failed_at,
    run_search,
)

log = logging.getLogger("kvlab.capacity")

DEFAULT_SYSTEMS = "vllm,orca_oracle,orca_pow2,orca_max"
DEFAULT_RATES = "0.25,0.5,1,2,4"
GROW_TO = 64.0  # a rate passing at the grid's top grows 1.5x up to this multiple of it
MAX_BACKLOG = 0.1  # as Fig. 12's searches (experiments.report.fig12_rates.MAX_BACKLOG)
# the keys each search sets itself, and the flag that sets them
SEARCH_KEYS = {
    "system": "--systems names the systems",
    "seed": "--seed/--seeds the seeds",
    "workload.rate": "--rates the rates",
    "workload.time_scale": "--rates the rates",
}
# the logger of the rows a trace's length filter or cap dropped
DROPPED_ROWS = drop_log.name
# keys that would run another system than the one a row names
PLUGIN_KEYS = ("system.name", "system.plugin")
OWN_SYSTEM = (
    "a policy plugin is searched as a system YAML of its own, <dir>/system/<name>.yaml "
    "setting name and plugin, named in --systems beside hydra.searchpath=[file://<dir>] "
    "(README, A policy of your own)"
)
# the metrics of capacity.csv's runs at the sustainable rate (means over seeds)
AT_RATE = (
    "offered_rate", "request_throughput", "output_throughput", "normalized_latency",
    "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_e2el_ms",
    "mean_batch_size", "num_preemptions",
    "kv_token_states_pct", "kv_reserved_pct", "kv_internal_frag_pct", "kv_external_frag_pct",
    "kv_free_at_limit_pct", "kv_free_pct", "num_requests", "slo_attainment",
)  # fmt: skip
# the setting of a system's runs, after ``system`` in capacity.csv and runs.csv, so that the
# tables of searches on other GPUs, models or clocks can be concatenated: the model, the GPU
# and its count (``metrics.json``'s names), the cost model's kind and the serving stack it
# prices steps in (``metrics.json``'s ``cost_stack``: none for bare operators, null under
# cost=calibrated)
SETTING_COLUMNS = ("model", "hardware", "tp", "cost", "cost_stack")


def _numbers(flag: str, text: str) -> tuple[float, ...]:
    """A comma-separated list of rates > 0, ascending."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(flag, "not a comma-separated list of numbers", text) from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise ConfigError(flag, "rates must be numbers > 0", text)
    if list(values) != sorted(set(values)):
        raise ConfigError(flag, "rates must ascend without repeats", text)
    return values


def check_overrides(overrides: Sequence[str], systems: Sequence[str]) -> None:
    """A ConfigError for an argument that is not an override, for a key the search sets
    itself, for an unknown option of a group (``systems`` included) or for overrides that
    do not compose (:func:`check_overrides_compose`)."""
    check_override_args(overrides)
    keys = [arg.lstrip("+~").partition("=")[0] for arg in overrides]
    plugin_keys = [k for k in keys if k in PLUGIN_KEYS]
    if plugin_keys:  # each row would be labelled with the --systems name, not the plugin's
        raise ConfigError(
            plugin_keys[0],
            f"capacity searches the systems named by --systems; {OWN_SYSTEM}",
        )
    searched = list(dict.fromkeys(k for k in keys if k in SEARCH_KEYS))
    if searched:  # all at once: `simulate`'s overrides pasted here often hold two
        flags = "; ".join(dict.fromkeys(SEARCH_KEYS[k] for k in searched))
        them = "it" if len(searched) == 1 else "them"
        raise ConfigError(", ".join(searched), f"set by the search: leave {them} out ({flags})")
    check_group_overrides(list(overrides))
    try:
        # a system of one's own (a plugin's YAML) lies on the search path the overrides give
        search = [a for a in overrides if a.lstrip("+").startswith("hydra.searchpath=")]
        check_group_overrides([*search, *(f"system={s}" for s in systems)])
    except ConfigError as err:  # the flag that named it, and how to name a plugin there
        expected = (err.expected or "").replace(policy_hint(err.got), OWN_SYSTEM)
        raise ConfigError("--systems", err.problem, err.got, expected) from None
    check_own_yamls("simulate", list(overrides))
    several = "several values: capacity searches one setting, run it once per value"
    check_overrides_compose("simulate", list(overrides), several)


@dataclass(frozen=True)
class Plan:
    """What the search varies: ``workload.rate``, or for a trace file ``workload.time_scale``
    (``trace_rate``: the trace's mean rate at time_scale 1 over its window, so rate r
    replays it at time_scale trace_rate / r; ``window``: the ``duration_s`` that cuts the
    trace, if any, and ``start``: its ``start_s``, if any, scaled alike: the trace is cut
    after it is scaled, and an unscaled window would hold other requests at each rate, at
    another rate than named); ``setting``: the setting in words; ``slo_ms``: the runs' SLO
    limits (ms per key), if any; ``requests``: a trace file's requests in its window;
    ``duration_s``: a drawn workload's fixed length (None where a count of requests ends it);
    ``config``: the first system's resolved config at the grid's first rate,
    ``cost_text``: its cost model's constants with their sources (``provenance.json``), and
    ``columns``: per system, its :data:`SETTING_COLUMNS` as its runs' ``metrics.json``
    names them."""

    setting: str
    trace_rate: float | None = None
    window: float | None = None
    slo_ms: tuple[tuple[str, float], ...] = ()
    start: float | None = None
    requests: int | None = None
    duration_s: float | None = None
    config: dict[str, Any] | None = None
    cost_text: str = ""
    columns: dict[str, dict[str, Any]] = field(default_factory=dict)

    def trace_s(self, rate: float) -> float | None:
        """The replayed trace's length (s) at ``rate``: a trace file's window, scaled, holds
        its ``requests`` at ``rate`` (``requests / rate``); a drawn workload's is its
        ``duration_s`` at every rate; None where neither fixes it."""
        if self.trace_rate is not None and self.requests and rate > 0:
            return self.requests / rate
        return self.duration_s

    def rate_overrides(self) -> Callable[[float], list[str]] | None:
        if self.trace_rate is None:
            return None
        return partial(_time_scale, self.trace_rate, self.window, self.start)


def _time_scale(
    trace_rate: float, window: float | None, start: float | None, rate: float
) -> list[str]:
    scale = trace_rate / rate
    cut = [] if window is None else [f"workload.duration_s={window * scale!r}"]
    if start is not None:
        cut.append(f"workload.start_s={start * scale!r}")
    return [f"++workload.time_scale={scale!r}", *cut]  # ++: a group may not name it


def trace_rate(requests: Sequence[Any], duration_s: float | None, counted: bool) -> float:
    """A windowed trace's mean arrival rate at time_scale 1 (its requests start at 0): their
    number over ``duration_s``, or over the span to the last arrival where there is no
    duration or ``counted`` (``workload.num_requests`` cut the window first)."""
    times = [r.arrival_time for r in requests]
    span = duration_s if duration_s is not None and not counted else max(times, default=0.0)
    if not times or span <= 0:
        raise ConfigError("workload", "the trace's window holds no span of arrivals to scale")
    return len(times) / span


def check_configs(overrides: Sequence[str], systems: Sequence[str], rate: float) -> Plan:
    """Every system's first run builds (its config errors, one line, before any run), and
    the workload draws arrivals at ``workload.rate`` or replays a trace whose
    ``workload.time_scale`` can set its rate."""
    from experiments.lib.checks import check_config
    from experiments.lib.setup import as_dict, build_setup, resolve_aliases
    from experiments.reproduce import compose_config
    from experiments.simulate import setting_metrics

    first = None
    stacks: dict[str, str] = {}  # each system's clock stack (cost=profiled picks it by system)
    columns: dict[str, dict[str, Any]] = {}
    for system in systems:
        cfg = compose_config([*overrides, f"system={system}"])
        kind = str(cfg.workload.kind)
        if "rate" in USES.get(kind, ()):
            cfg = compose_config([*overrides, f"system={system}", f"workload.rate={rate}"])
        elif "time_scale" not in USES.get(kind, ()):
            raise ConfigError(
                "workload", f"kind {kind!r} replays logged arrivals that no key rescales: "
                "there is no rate to search", kind,
                "a workload that draws arrivals at workload.rate (sharegpt, alpaca, ...) or "
                "a trace file (azure, mooncake, vidur)",
            )  # fmt: skip
        c = resolve_aliases(as_dict(cfg))
        check_config(c, "simulate")
        setup = build_setup(c)
        stacks[system] = _stack_name(setup)
        named = setting_metrics(c, setup) | {"cost": c["cost"].get("kind")}
        columns[system] = {k: named[k] for k in SETTING_COLUMNS}
        if first is None:
            slo = tuple((str(k), float(v)) for k, v in (c.get("slo_ms") or {}).items())
            first = (cfg, setup, slo, c)
    assert first is not None
    cfg, setup, slo, c = first
    return replace(_plan(cfg, setup, stacks), slo_ms=slo, config=c,
                   cost_text=setup.cost_model.describe(), columns=columns)  # fmt: skip


def _stack_name(setup: Any) -> str:
    return str(getattr(getattr(setup.cost_model, "stack", None), "name", "none"))


def _workload_label(w: Any) -> str:
    """The workload in the heading: its dataset, else its kind, and the file it reads, if
    any (``azure`` is either Azure trace, ``trace`` any file)."""
    label = str(w.get("dataset") or w.kind)
    path = w.get("path")
    return f"{label} {Path(str(path)).name}" if path else label


def _plan(cfg: Any, setup: Any, stacks: dict[str, str] | None = None) -> Plan:
    """``stacks``: each searched system's clock stack; where they differ (``cost=profiled``
    gives ``vllm_v1`` the vllm-v1 stack and the paper's systems vllm-2023) the heading
    names each, not the first system's alone."""
    w = cfg.workload
    if stacks and len(set(stacks.values())) > 1:
        stack = "stacks " + ", ".join(f"{s} for {n}" for n, s in stacks.items())
    else:
        stack = f"stack {_stack_name(setup)}"
    setting = (
        f"{setup.model.name} on {setup.tp} x {setup.gpu.name}, "
        f"{_workload_label(w)}, cost={cfg.cost.get('kind', '?')} ({stack})"
    )
    if "rate" in USES[str(w.kind)]:
        fixed = w.get("duration_s") if w.get("num_requests") is None else None
        return Plan(setting, duration_s=None if fixed is None else float(fixed))
    if float(w.get("time_scale") or 1.0) != 1.0:
        raise ConfigError(
            "workload.time_scale", "set by the search: leave it out (--rates the rates)",
            w.time_scale,
        )  # fmt: skip
    window, count = w.get("duration_s"), w.get("num_requests")
    counted = count is not None and len(setup.requests) == int(count)
    # a window past the trace's last arrival cuts nothing: the trace's own span counts (the
    # window is still scaled with the trace, so that no rate's window cuts it)
    cuts = window is not None and not counted and _window_cuts(cfg, setup)
    base = trace_rate(setup.requests, window if cuts else None, counted)
    start = float(w.get("start_s") or 0.0)
    where = "its first" if cuts or counted else "all"
    after = f" from {start:g} s on" if start > 0 else ""
    return Plan(
        f"{setting}; the trace ({where} {len(setup.requests)} requests{after}) runs at "
        f"{base:.3g} req/s: rate r replays it at time_scale {base:.3g}/r",
        base,
        None if window is None else float(window),
        start=start if start > 0 else None,
        requests=len(setup.requests),
    )


def _window_cuts(cfg: Any, setup: Any) -> bool:
    """Whether the trace holds an arrival after ``workload.duration_s`` (from its
    ``start_s``): a window past its last arrival cuts nothing, and counting its length would
    rate the requests at their number over an empty tail, not at the rate they arrive."""
    from experiments.lib.setup import as_dict, build_requests, resolve_aliases

    c = resolve_aliases(as_dict(cfg))
    c["workload"] = {**c["workload"], "duration_s": None, "num_requests": None}
    dropped = logging.getLogger(DROPPED_ROWS)
    level = dropped.level
    dropped.setLevel(logging.ERROR)  # the system's setup counted the dropped rows already
    try:
        return len(build_requests(c, setup.max_model_len)) > len(setup.requests)
    finally:
        dropped.setLevel(level)


# "well under the threshold" (burst_warnings): a normalized latency at most this share of it
WELL_UNDER = 0.5


def burst_warnings(
    rows: Sequence[dict[str, Any]], systems: Sequence[str], threshold: float
) -> list[str]:
    """One line per system whose lowest failing rate failed on the backlog rule alone while
    every run there had a normalized latency of at most :data:`WELL_UNDER` x ``threshold``:
    its requests were served fast, yet more than the allowance was unfinished when the last
    one arrived, as when the trace's window ends in a burst of arrivals or is too short for
    the queue to drain."""
    lines = []
    for system in systems:
        mine = [r for r in rows if r["system"] == system]
        fail = first_failing_rate(mine)
        if fail is None or rules_failed_at(mine, fail) != ("backlog",):
            continue
        lat = [r.get("normalized_latency") for r in mine if r["rate"] == fail]
        worst = max((v for v in lat if v is not None and v == v), default=math.nan)
        if not worst <= WELL_UNDER * threshold:
            continue
        lines.append(
            f"{system}: at {fail:.3g} req/s, its lowest failing rate, the runs failed the "
            f"backlog rule alone, with a normalized latency of at most {worst:.3g} s/token "
            f"(threshold {threshold:g}): more than {MAX_BACKLOG:.0%} of the trace was unfinished "
            "when its last request arrived though requests were served well under the "
            "threshold; the trace may end in a burst of arrivals or be too short: search a "
            "trace file whole (leave workload.duration_s and workload.num_requests out) or a "
            "longer window, or check the arrivals at the window's end"
        )
    return lines


# what write_outputs writes into --out, from the runs in runs/
OUTPUT_FILES = ("runs.csv", "curves.csv", "capacity.csv", "capacity.png", "capacity.pdf")


# what a search keeps of each run (run_kept; a search of older code kept no inputs.json)
RECORDED = {"config.yaml", "inputs.json", "metrics.json"}


def _recorded(name: str) -> bool:
    """Whether a file of a run folder is one a search keeps (:data:`RECORDED`) or the
    temporary file of a killed write of one (``write_atomic``'s ``.<name>.*.tmp``)."""
    return name in RECORDED or any(fnmatchcase(name, temp_pattern(kept)) for kept in RECORDED)


def clear_earlier_runs(runs_dir: Path, keep: Collection[str] = ()) -> int:
    """Remove the runs an earlier search left in ``runs_dir`` (``capacity_*`` folders that
    hold only :data:`RECORDED` files and the temporary files of their killed writes:
    :func:`_recorded`), those named in ``keep`` aside, so that the folder holds this
    search's runs alone, and the :data:`OUTPUT_FILES` made from them beside ``runs_dir``
    (a search stopped midway left them describing runs that were gone); how many runs
    were removed."""
    stale = [d for d in runs_dir.glob("capacity_*")
             if d.name not in keep and d.is_dir()
             and all(_recorded(f.name) for f in d.iterdir())]  # fmt: skip
    for run in stale:
        shutil.rmtree(run)
    for name in OUTPUT_FILES:
        (runs_dir.parent / name).unlink(missing_ok=True)
    return len(stale)


def run_kept(runs_dir: Path, resume: bool, label: str, overrides: list[str]) -> dict[str, Any]:
    """One run of the search, kept in ``runs_dir/<label>/``: its resolved ``config.yaml``
    (``simulate`` runs it again from there with every table) and ``inputs.json`` (the
    stamps of its input files and code), written first, and its ``metrics.json``, last;
    returns the metrics as ``metrics.json`` holds them (a NaN as None), with ``label``.
    With ``resume``, a folder that holds a finished run of the same config on inputs and
    code unchanged (:func:`experiments.lib.results.finished_metrics`, the rule of a resumed
    sweep) is read back, not run; any other run there (another config's, of inputs or code
    changed since, unfinished or damaged) is removed first."""
    from experiments.lib.input_stamps import input_stamps
    from experiments.lib.results import clear_run, finished_metrics, read_metrics, write_config
    from experiments.lib.setup import as_dict, resolve_aliases
    from experiments.reproduce import compose_config
    from experiments.simulate import run

    folder = runs_dir / label
    cfg = compose_config(overrides)
    resolved = resolve_aliases(as_dict(cfg))
    if resume:
        done = finished_metrics(folder, resolved)
        if done is not None:
            return {**done, "label": label}
        clear_run(folder)  # metrics.json first: never a folder complete with another's files
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "inputs.json", input_stamps(write_config(folder, resolved)))
    write_json(folder / "metrics.json", run(cfg, None))
    return {**read_metrics(folder), "label": label}  # as a resumed search reads it


def finished_before(runs_dir: Path) -> dict[str, tuple[int, int]]:
    """Per run folder in ``runs_dir``, the identity of its ``metrics.json`` (inode, time):
    a run whose file is the same after the search was reused, not run."""
    out = {}
    for path in runs_dir.glob("capacity_*/metrics.json"):
        with suppress(OSError):
            st = path.stat()
            out[path.parent.name] = (st.st_ino, st.st_mtime_ns)
    return out


def reused_runs(
    runs_dir: Path, before: dict[str, tuple[int, int]], rows: Sequence[dict[str, Any]]
) -> int:
    """How many runs of ``rows`` kept the ``metrics.json`` they had before the search
    (:func:`finished_before`): read back, not run again."""
    after = finished_before(runs_dir)
    labels = {r["label"] for r in rows}
    return sum(1 for label in labels if label in before and after.get(label) == before[label])


@contextmanager
def resume_hint(out: Path) -> Iterator[None]:
    """A warning, on Ctrl-C or SIGTERM in the block, that the runs finished so far stay in
    ``out/runs`` and how to reuse them; the interrupt goes on."""
    try:
        yield
    except KeyboardInterrupt:
        log.warning("the runs finished so far stay in %s: run the same command with --resume "
                    "to reuse them", out / "runs")  # fmt: skip
        raise


def earlier_options(path: Path, options: dict[str, Any]) -> list[str]:
    """The options of the earlier search whose ``provenance.json`` is at ``path`` that
    differ from ``options`` (those that define the search: not ``--workers``, ``--out`` nor
    ``--resume``; an inf is compared as the file holds it, null); empty without a readable
    one."""
    try:
        theirs = json.loads(path.read_text())["options"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(theirs, dict):
        return []
    ours = {k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in options.items()}  # fmt: skip
    ignored = {"workers", "out", "resume"}
    keys = dict.fromkeys([*ours, *theirs])
    return [k for k in keys if k not in ignored and ours.get(k) != theirs.get(k)]


def searches(
    overrides: Sequence[str], systems: Sequence[str], rates: tuple[float, ...],
    seeds: tuple[int, ...], bisect_evals: int, rate_tol: float, plan: Plan,
    min_slo_attainment: float | None = None,
) -> list[Search]:  # fmt: skip
    """One search per system, in ``systems``' order (``min_slo_attainment``: the ``slo``
    rule's share, None for none)."""
    return [
        Search("capacity", "search", system, (*overrides, f"system={system}"), rates,
               rate_overrides=plan.rate_overrides(), seeds=seeds, bisect_evals=bisect_evals,
               grow_to=GROW_TO, max_backlog=MAX_BACKLOG, stop_after=1, rate_tol=rate_tol,
               min_slo_attainment=min_slo_attainment)
        for system in systems
    ]  # fmt: skip


def capacity_frame(rows: Sequence[dict[str, Any]], systems: Sequence[str]) -> pd.DataFrame:
    """``capacity.csv``: per system (``systems``' order) the search's columns
    (:func:`capacity_table`; its vLLM-ratio columns left out), after ``system`` the
    :data:`SETTING_COLUMNS` its rows hold, ``first_failing_rules``: the
    rules its runs failed at ``first_failing_rate``, the union over seeds joined by "+"
    (:func:`rules_failed_at`; "" when no rate failed), ``over_<first>``: its rate
    over the first system's (a bound where either is), and the mean of :data:`AT_RATE`
    over the seeds at its sustainable rate."""
    table = pd.DataFrame(capacity_table(rows, systems[0])).set_index("system")
    table = table.drop(columns=[c for c in table.columns if c.startswith(("vllm_", "ratio_"))])
    table = table.loc[list(systems)].reset_index().drop(columns=["setting"])
    named = [k for k in SETTING_COLUMNS if any(k in r for r in rows)]
    for where, key in enumerate(named, start=1):  # after system, as runs.csv has them
        table.insert(where, key, [next((r[key] for r in rows if r["system"] == s), None)
                                  for s in table["system"]])  # fmt: skip
    failing = [
        rules_failed_at([r for r in rows if r["system"] == s], f)
        for s, f in zip(table["system"], table["first_failing_rate"], strict=True)
    ]
    where = table.columns.get_loc("first_failing_rate") + 1
    table.insert(where, "first_failing_rules", ["+".join(f) for f in failing])
    first = table.iloc[0]
    open_ = first["rate_open"] or first["max_rate"] == 0
    table[f"over_{systems[0]}"] = [
        (r / first["max_rate"] if first["max_rate"] > 0 else math.nan) for r in table["max_rate"]
    ]
    table[f"over_{systems[0]}_bound"] = [
        "exact" if not (open_ or o or r == 0) else "bound"
        for o, r in zip(table["rate_open"], table["max_rate"], strict=True)
    ]
    for key in AT_RATE:
        table[f"{key}_at_rate"] = [
            (at_max_rate([r for r in rows if r["system"] == s]) or {}).get(key, math.nan)
            for s in table["system"]
        ]
    return table


@dataclass(frozen=True)
class SloRule:
    """The ``slo`` rule (``--slo-attainment``): at least ``attainment`` of a run's requests
    meet every limit of ``slo_ms`` (ms per key, as the runs' ``slo_ms`` override)."""

    attainment: float
    slo_ms: tuple[tuple[str, float], ...]

    def words(self) -> str:
        limits = ", ".join(f"{k} <= {v:g} ms" for k, v in self.slo_ms)
        return f"at least {self.attainment:.4g} of the requests meet every SLO ({limits})"


def slo_rule(attainment: float | None, plan: Plan) -> SloRule | None:
    """The ``slo`` rule of ``--slo-attainment`` (None without it); a ConfigError for a
    share outside (0, 1] or a search without an ``slo_ms`` override to judge it by."""
    if attainment is None:
        return None
    if not (math.isfinite(attainment) and 0 < attainment <= 1):
        raise ConfigError("--slo-attainment", "not a share in (0, 1]", attainment)
    if not plan.slo_ms:
        raise ConfigError(
            "--slo-attainment", "needs the SLOs it judges: pass slo_ms, e.g. "
            "'slo_ms={ttft: 2000, tpot: 200}'",
        )  # fmt: skip
    return SloRule(attainment, plan.slo_ms)


def rules_lines(
    threshold: float, max_backlog: float | None = MAX_BACKLOG, slo: SloRule | None = None
) -> list[str]:
    """The pass rules in words, one line each, named as ``fails_on`` names them (``slo``:
    the ``slo`` rule, if the search has it)."""
    latency = (f"normalized latency <= {threshold:g} s/token" if math.isfinite(threshold)
               else "normalized latency measured (--threshold inf: no limit)")  # fmt: skip
    lines = [f"  latency: {latency}", "  incomplete: every request completes"]
    if max_backlog is not None:
        lines.append(f"  backlog: at most {max_backlog:.0%} of the trace (of "
                     f"{BACKLOG_MIN_REQUESTS} requests on a shorter one) unfinished when its "
                     "last request arrives")  # fmt: skip
    if slo is not None:
        lines.append(f"  slo: {slo.words()}")
    return lines


def _fails_at(r: Any) -> str:
    """The "fails at" cell: the lowest failing rate and the rules failed there."""
    fail = r["first_failing_rate"]
    if fail is None or fail != fail:
        return "—"
    return f"{fail:.3g} {r['first_failing_rules']}"


def print_table(
    cap: pd.DataFrame,
    threshold: float,
    max_backlog: float | None = MAX_BACKLOG,
    slo: SloRule | None = None,
) -> str:
    """The table the command prints: its heading names the rules a rate passes on every seed
    (:func:`rules_lines`), the "fails at" column the lowest failing rate and the rules failed
    there (``first_failing_rules``)."""
    ref = next(c for c in cap.columns if c.startswith("over_") and not c.endswith("_bound"))
    fails = [_fails_at(r) for _, r in cap.iterrows()]
    width = max(len("fails at"), *map(len, fails)) + 2
    lines = ["sustainable rate: the highest where every seed's run fails no rule "
             "(\"fails at\": the lowest rate failed, and the rules failed there):",
             *rules_lines(threshold, max_backlog, slo),
             f"{'system':<20}{'req/s':>9}{'seed range':>17}{'fails at':>{width}}{ref:>20}"
             f"{'tok/s out':>11}{'TTFT ms':>9}{'TPOT ms':>9}{'batch':>7}"]  # fmt: skip
    for (_, r), fails_at in zip(cap.iterrows(), fails, strict=True):
        rate = f"{'>=' if r['rate_open'] else ''}{r['max_rate']:.3g}"
        if r["max_rate"] == 0 and r["first_failing_rate"] == r["first_failing_rate"]:
            rate = f"<{r['first_failing_rate']:.3g}"
        ratio, first = r[ref], cap.iloc[0]
        ratio_text = "—" if ratio != ratio else f"{ratio:.2f}x"
        if r["max_rate"] == 0 and first["max_rate"] > 0 and rate.startswith("<"):
            ratio_text = f"<{r['first_failing_rate'] / first['max_rate']:.2f}x"
        elif r[f"{ref}_bound"] == "bound" and ratio == ratio:
            ratio_text += " (bound)"
        spread = "—" if r["max_rate"] == 0 else f"{r.rate_lo:.3g}–{r.rate_hi:.3g}"
        if r["rate_open"] and r["max_rate"] > 0:
            spread = f">={spread}"  # each seed's rate is a floor too
        lines.append(
            f"{r['system']:<20}{rate:>9}{spread:>17}{fails_at:>{width}}"
            f"{ratio_text:>20}{r['output_throughput_at_rate']:>11.0f}"
            f"{r['mean_ttft_ms_at_rate']:>9.0f}{r['mean_tpot_ms_at_rate']:>9.1f}"
            f"{r['mean_batch_size_at_rate']:>7.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> Path:
    """The search (:func:`_main`); a result file that cannot be written (a full disk, in the
    search's process or a worker's) is one line naming it and status 1, not a traceback."""
    try:
        return _main(argv)
    except WriteError as err:
        if full_errors():
            raise
        print(f"error: {err.line()}", file=sys.stderr)
        sys.exit(1)


def _main(argv: list[str] | None) -> Path:
    # the whole docstring: its first paragraph introduces the example (a reST literal block)
    p = OneLineParser(prog="python -m experiments.capacity",
                      description=__doc__.replace("::\n", ":\n"))  # fmt: skip
    p.add_argument("overrides", nargs="*", help="experiments.simulate overrides (key=value)")
    p.add_argument("--systems", default=DEFAULT_SYSTEMS, help="systems to search, the first "
                   f"the reference of the ratio column (default {DEFAULT_SYSTEMS})")  # fmt: skip
    p.add_argument("--threshold", type=float, default=1.0,
                   help="normalized latency (s/token) a sustained rate stays under (inf, "
                   "with --slo-attainment: no latency limit)")  # fmt: skip
    p.add_argument("--slo-attainment", type=float, default=None, metavar="A",
                   help="also require, on every seed, at least this share (0 < A <= 1) of "
                   "the requests to meet every limit of the slo_ms override")  # fmt: skip
    p.add_argument(
        "--rates",
        default=DEFAULT_RATES,
        help=f"the ascending grid walked first, req/s (default {DEFAULT_RATES})",
    )
    p.add_argument("--seeds", type=int, default=2, help="seeds per rate (default 2)")
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument(
        "--rate-tol",
        type=float,
        default=RATE_TOL,
        help=f"bisect until bracketed within this share (default {RATE_TOL})",
    )
    p.add_argument("--bisect-evals", type=int, default=4, help="bisection steps at most")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="processes searching systems at once, at most one per system "
                   f"(default: the cores, {os.cpu_count() or 1} here)")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("results/capacity"),
                   help="the folder written (default results/capacity); an earlier search "
                   "there is replaced: its runs and outputs are removed first, unless "
                   "--resume")  # fmt: skip
    p.add_argument("--resume", action="store_true",
                   help="keep the runs of an earlier (e.g. interrupted) search in --out and "
                   "reuse each finished one of the same config on inputs and code unchanged, "
                   "as a resumed sweep does; the rest run again")  # fmt: skip
    args = p.parse_intermixed_args(argv)  # overrides may follow the options too
    from experiments.reproduce import check_run_numbers

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    try:
        rates = _numbers("--rates", args.rates)
        if args.threshold == math.inf and args.slo_attainment is None:
            raise ConfigError("--threshold", "inf (no latency limit) needs --slo-attainment",
                              args.threshold)  # fmt: skip
        slo_only = args.slo_attainment is not None and args.threshold == math.inf
        # --threshold, --workers, --seeds, --seed (inf: no latency limit, beside an SLO)
        check_run_numbers(argparse.Namespace(**{**vars(args), "threshold": 1.0})
                          if slo_only else args)  # fmt: skip
        if not (math.isfinite(args.rate_tol) and 0 < args.rate_tol < 1):
            raise ConfigError("--rate-tol", "not a number in (0, 1)", args.rate_tol)
        if args.bisect_evals < 1:
            raise ConfigError("--bisect-evals", "not a count >= 1", args.bisect_evals)
        if not systems or len(set(systems)) != len(systems):
            raise ConfigError("--systems", "name each system once", args.systems)
        problem = out_dir_problem(args.out)
        if problem:
            raise ConfigError("--out", problem, str(args.out))
        check_overrides(args.overrides, systems)
        with heard(DROPPED_ROWS):  # said here, once a system; silent in the runs
            plan = check_configs(args.overrides, systems, rates[0])
        slo = slo_rule(args.slo_attainment, plan)
    except ConfigError as err:
        report_config_error(err)
    batch_logging()
    seeds = tuple(range(args.seed, args.seed + args.seeds))
    if plan.trace_rate is not None and len(seeds) > 1:
        log.info("a trace replays the same requests on every seed: one seed (%d)", args.seed)
        seeds = seeds[:1]
    runs_dir = args.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    before = finished_before(runs_dir) if args.resume else {}
    if args.resume:
        for name in OUTPUT_FILES:  # made from runs this search may run again
            (args.out / name).unlink(missing_ok=True)
        changed = earlier_options(args.out / "provenance.json", options_of(args))
        if changed:
            log.info("the earlier search in %s had other options (%s): of its runs, only "
                     "those of the same config on inputs and code unchanged are reused",
                     args.out, ", ".join(f"--{k.replace('_', '-')}" if k != "overrides"
                                         else k for k in changed))  # fmt: skip
    else:
        stale = clear_earlier_runs(runs_dir)
        if stale:
            log.info("removed the %d runs of an earlier search from %s", stale, runs_dir)
    write_json(args.out / "provenance.json",
               search_provenance(sys.argv[1:] if argv is None else argv, args, plan))  # fmt: skip
    from experiments.reproduce import unmeasured_run

    t0 = time.perf_counter()
    todo = searches(args.overrides, systems, rates, seeds, args.bisect_evals, args.rate_tol, plan,
                    args.slo_attainment)  # fmt: skip
    rows: list[dict[str, Any]] = []
    log.info("%s", plan.setting)
    log.info("searching %d system(s) on %d seed(s) each: %s", len(todo), len(seeds),
             ", ".join(systems))  # fmt: skip
    with resume_hint(args.out), worker_pool(min(args.workers, len(todo))) as pool:
        runner = partial(run_kept, runs_dir, args.resume)
        jobs = [pool.submit(run_search, runner, s, args.threshold) for s in todo]
        for search, job in zip(todo, jobs, strict=True):
            try:
                found = _result_with_heartbeat(job, runs_dir, t0, before)
            except ConfigError as err:  # a rate's run cannot run (a step priced out of range)
                report_config_error(err)
            if unmeasured_run([], [found]):
                report_config_error(ConfigError(
                    "--rates", f"{search.system}'s traces held no request at any rate tried",
                    args.rates, "rates (or a workload.duration_s) that bring requests",
                ))  # fmt: skip
            named = {"setting": None, "system": None, **plan.columns.get(search.system, {})}
            rows += [named | r | {"trace_s": plan.trace_s(r["rate"])} for r in found]
            rejected = max((r.get("rejected") or 0 for r in found), default=0)
            if rejected:
                log.warning(
                    "%s: up to %d request(s) of a run were rejected at admission (never "
                    "servable here: runs/<label>/metrics.json says why) and fail their rate "
                    "at any load; raise the limit that rejects them (system.max_model_len up "
                    "to the model's context), drop the rows over it before the run "
                    "(workload.max_total_tokens=auto) or replay a window without them "
                    "(workload.start_s, workload.duration_s); workload.apply_filter=true "
                    "is vLLM's 2023 ShareGPT filter (prompts of 4-1024 tokens) and drops "
                    "every longer prompt too (half or more of an Azure trace)",
                    search.system, rejected,
                )  # fmt: skip
            best = capacity_table(found, search.system)[0]
            note = " (a lower bound: every rate tried passed)" if best["rate_open"] else ""
            if best["max_rate"] == 0:
                note = (
                    " (no rate passed: its rejected requests fail every rate)"
                    if all(r.get("rejected") for r in found)
                    else f" (no rate passed, down to {rates[0]:g}: lower --rates to bracket it)"
                )
            log.info("%s: %.3g req/s%s after %d runs (%.0f s)", search.system, best["max_rate"],
                     note, len(found), time.perf_counter() - t0)  # fmt: skip
    with resume_hint(args.out):  # the tables take a while: every run is kept meanwhile
        if args.resume:
            log.info("reused %d of the %d runs from the earlier search in %s",
                     reused_runs(runs_dir, before, rows), len(rows), runs_dir)  # fmt: skip
            unused = clear_earlier_runs(runs_dir, keep={r["label"] for r in rows})
            if unused:
                log.info("removed the %d runs of the earlier search that this one does not "
                         "hold from %s", unused, runs_dir)  # fmt: skip
        return write_outputs(rows, systems, args.threshold, args.out, plan.setting, slo)


def search_provenance(argv: Sequence[str], args: argparse.Namespace, plan: Plan) -> dict:
    """``provenance.json`` of a search: the command and its options, the setting, the first
    system's resolved config and cost model, and :func:`experiments.lib.provenance.provenance`
    (the code's commit, the packages, the input files' digests), so that the folder says
    what made its tables and how to make them again."""
    return {
        "command": command_line("experiments.capacity", argv),
        "options": options_of(args),
        "setting": plan.setting,
        "config_note": "the first system's config at the first rate: the search sets "
        "system, seed and workload.rate (or workload.time_scale) per run",
        "config": plan.config,
        "cost_model": plan.cost_text,
        **provenance(plan.config),
    }


HEARTBEAT_S = 30.0  # a line at least this often while a search runs


def _result_with_heartbeat(
    job: Future, runs_dir: Path, t0: float, before: dict[str, tuple[int, int]] | None = None
) -> Any:
    """``job.result()``, logging every :data:`HEARTBEAT_S` while it runs how many runs
    of the search (every system's) have written their ``metrics.json`` so far; with
    ``--resume`` (``before``: :func:`finished_before`) not those the earlier search left,
    which this one may reuse or run again (they were counted as done at its start)."""
    while True:
        try:
            return job.result(timeout=HEARTBEAT_S)
        except FuturesTimeout:
            done = 0
            for path in runs_dir.glob("*/metrics.json"):
                with suppress(OSError):  # a run's file replaced meanwhile
                    st = path.stat()
                    done += (before or {}).get(path.parent.name) != (st.st_ino, st.st_mtime_ns)
            note = " (the earlier search's runs aside)" if before else ""
            log.info("... %d run(s) done so far%s (%.0f s)", done, note,
                     time.perf_counter() - t0)  # fmt: skip


def write_outputs(
    rows: Sequence[dict[str, Any]], systems: Sequence[str], threshold: float, out: Path,
    setting: str = "", slo: SloRule | None = None,
) -> Path:  # fmt: skip
    """Write ``runs.csv``, ``curves.csv``, ``capacity.csv`` and ``capacity.png/.pdf`` into
    ``out`` and print the table (``setting``: its heading and the figure's; ``slo``: the
    ``slo`` rule, named in the heading, the figure's title and ``capacity.csv``'s
    ``min_slo_attainment`` column), after a warning per :func:`burst_warnings` line; return
    ``out``."""
    from experiments.report.figures import capacity_curves, pyplot, save

    runs = pd.DataFrame(rows).drop(columns=["setting"])
    curves = pd.DataFrame(curve_table(rows)).drop(columns=["setting"])
    cap = capacity_frame(rows, systems)
    cap["threshold"] = threshold
    if slo is not None:
        cap["min_slo_attainment"] = slo.attainment
    write_csv(out / "runs.csv", runs)
    write_csv(out / "curves.csv", curves)
    write_csv(out / "capacity.csv", cap)
    plt = pyplot(headless=True)
    fig = capacity_curves(curves, cap, threshold, list(systems), setting,
                          None if slo is None else slo.words())  # fmt: skip
    save(fig, out, "capacity")
    plt.close(fig)
    for line in burst_warnings(rows, systems, threshold):
        log.warning("%s", line)
    print(setting)
    print(print_table(cap, threshold, slo=slo))
    print(f"-> {out}/capacity.csv, curves.csv, runs.csv, capacity.png")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
