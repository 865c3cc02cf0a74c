"""``python -m experiments.bench.sim``: how fast the simulator runs, per system.

Simulates OPT-13B on one A100-40GB serving a synthetic ShareGPT trace (the vLLM paper's
§6.2 setup; by default its 1-hour trace at 2 req/s), one system at a time, and prints a
table with one row per system and mode:

- ``loop``: ``sim.driver.simulate`` alone, in this process (workload generation,
  cost-model setup, metrics and files are outside the timer);
- ``e2e``: a whole ``python -m experiments.simulate ... hydra.run.dir=<tmp>`` subprocess,
  from its start until it has exited with ``metrics.json`` written (interpreter start,
  imports, config, workload, loop, summary and every result file).

Columns: requests, simulated seconds, engine steps, wall seconds, ``cpu_s`` (CPU time, user
+ system: this process's over the loop, the child's for ``e2e``; less sensitive to other
load on the machine than wall time), simulated requests/s and steps/s (per wall second),
``speed_vs_real`` (simulated seconds / wall seconds), ``speed_vs_real_cpu`` (simulated
seconds / CPU seconds) and, for ``loop``, ``price_cpu_s``: CPU seconds the clock takes to
price every step of the run once (the cost model's own share of the loop). Writes
``bench_sim.csv`` and ``bench_sim.json`` (rows plus the machine: Python version, CPU count,
platform, date) into ``--out``.

A wall-clock number holds only for the machine and the load it ran under; compare
systems or code versions side by side in one invocation. ``--repeat N`` runs every
configuration N times, alternating (all configurations once, then again), and reports
each one's median wall and CPU seconds (every run is kept in ``bench_sim.json`` under
``runs``), so that other load on a shared machine moves the medians less.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from core.metrics.recorder import STEP_COLUMNS
from core.plan import BatchShape
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import check_out_dir, plain_cli
from experiments.lib.results import write_atomic, write_json
from experiments.lib.setup import as_dict, build_setup
from experiments.reproduce import COSTS, compose_config
from sim.driver import simulate

SYSTEMS = ("vllm", "orca_max", "orca_pow2", "orca_oracle", "fastertransformer")
CHOICES = (*SYSTEMS, "vllm_v1")  # today's vLLM rules on request (not in the default table)
MODES = ("loop", "e2e")
COLUMNS = (
    "system",
    "cost",
    "mode",
    "requests",
    "sim_s",
    "steps",
    "wall_s",
    "cpu_s",
    "sim_req_per_s",
    "steps_per_s",
    "speed_vs_real",
    "speed_vs_real_cpu",
    "price_cpu_s",
)


def overrides(system: str, duration_s: float, rate: float, seed: int, cost: str) -> list[str]:
    """The benchmark run's config overrides (``configs/simulate.yaml`` groups); ``cost`` is a
    clock of ``experiments.reproduce`` (``roofline``: simulate's default)."""
    return [
        "model=opt-13b",
        "hardware=a100-40gb",
        "workload=sharegpt",
        f"workload.duration_s={duration_s}",
        f"workload.rate={rate}",
        f"seed={seed}",
        f"system={system}",
        *COSTS[cost],
    ]


def _row(
    system: str, cost: str, mode: str, n: int, sim_s: float, steps: int, wall: float, cpu: float,
    price: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {
        "system": system,
        "cost": cost,
        "mode": mode,
        "requests": n,
        "sim_s": sim_s,
        "steps": steps,
        "wall_s": wall,
        "cpu_s": cpu,
        "sim_req_per_s": n / wall,
        "steps_per_s": steps / wall,
        "speed_vs_real": sim_s / wall,
        "speed_vs_real_cpu": sim_s / cpu,
        "price_cpu_s": price,
    }


def _median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's row from its runs: median wall and CPU seconds (the simulated
    quantities are the same in every run), rates recomputed from them."""
    first = runs[0]
    wall = float(statistics.median(r["wall_s"] for r in runs))
    cpu = float(statistics.median(r["cpu_s"] for r in runs))
    prices = [r["price_cpu_s"] for r in runs if r["price_cpu_s"] is not None]
    price = float(statistics.median(prices)) if prices else None
    return _row(
        first["system"], first["cost"], first["mode"], first["requests"], first["sim_s"],
        first["steps"], wall, cpu, price,
    )  # fmt: skip


def workload_size(duration_s: float, rate: float, seed: int) -> int:
    """Requests in the benchmark trace (every system, mode and clock serves the same one);
    the setup's warning on an empty one is left to the caller's one line."""
    c = as_dict(compose_config(overrides(SYSTEMS[0], duration_s, rate, seed, "roofline")))
    setup_log = logging.getLogger("experiments.lib.setup")
    level = setup_log.level
    setup_log.setLevel(logging.ERROR)
    try:
        return len(build_setup(c).requests)
    finally:
        setup_log.setLevel(level)


def bench_loop(system: str, duration_s: float, rate: float, seed: int, cost: str) -> dict[str, Any]:
    """Simulate one system on the benchmark trace in this process; times the loop alone."""
    c = as_dict(compose_config(overrides(system, duration_s, rate, seed, cost)))
    setup = build_setup(c)
    cost_model = setup.cost_model
    t0, c0 = time.perf_counter(), time.process_time()
    result = simulate(setup.requests, setup.make_scheduler, cost_model, seed=seed)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = len(setup.requests)
    price = price_cpu(cost_model, result.recorder.step_rows())
    return _row(system, cost, "loop", n, result.end_time_s, result.num_steps, wall, cpu, price)


def price_cpu(cost_model: Any, step_rows: list[tuple]) -> float:
    """CPU seconds the cost model takes to price every step of a run once (its share of
    the loop: what a richer clock costs by itself, apart from the different schedule it
    makes)."""
    at = [STEP_COLUMNS.index(f.name) for f in dataclasses.fields(BatchShape)]
    shapes = [BatchShape(*(row[i] for i in at)) for row in step_rows]
    price = cost_model.step_time
    c0 = time.process_time()
    for shape in shapes:
        price(shape)
    return time.process_time() - c0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_e2e(system: str, duration_s: float, rate: float, seed: int, cost: str) -> dict[str, Any]:
    """Run ``python -m experiments.simulate`` for one system in a subprocess (into a
    temporary directory) and time it from start to exit with ``metrics.json`` written."""
    with tempfile.TemporaryDirectory(prefix="bench_sim_") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "experiments.simulate"]
        cmd += [*overrides(system, duration_s, rate, seed, cost), f"hydra.run.dir={run_dir}"]
        cmd.append("index=null")  # a timing run, not a result to list
        c0, t0 = _children_cpu(), time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
        metrics_path = run_dir / "metrics.json"
        if proc.returncode != 0 or not metrics_path.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SystemExit(f"bench_sim: {' '.join(cmd)} failed: {tail[0]}")
        metrics = json.loads(metrics_path.read_text())
        end_s = _last_step_end(run_dir / "steps.csv")
    return _row(
        system,
        cost,
        "e2e",
        int(metrics["num_requests"]),
        end_s,
        int(metrics["num_steps"]),
        wall,
        cpu,
    )


def _last_step_end(steps_csv: Path) -> float:
    """The simulated clock at the end of the run (the last step's start + duration), as
    ``SimResult.end_time_s``, so both modes state the same simulated span."""
    lines = steps_csv.read_text().splitlines()
    header, last = lines[0].split(","), lines[-1].split(",")
    return float(last[header.index("start_s")]) + float(last[header.index("duration_s")])


def run_record(module: str, argv: list[str] | None) -> dict[str, Any]:
    """What a benchmark's JSON names its making by: the ``command`` (``module`` and its
    arguments, ``argv`` or the process's own) and the code's ``git_commit`` and
    ``git_dirty`` (:func:`experiments.lib.provenance.code_version`)."""
    from experiments.lib.provenance import code_version

    args = sys.argv[1:] if argv is None else argv
    code = code_version()
    return {
        "command": " ".join([f"python -m {module}", *args]),
        "git_commit": code["git_commit"],
        "git_dirty": code["git_dirty"],
    }


def machine_info() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        # other load during the run (CPU time is less sensitive to it than wall time)
        "load_avg_1_5_15min": [round(x, 2) for x in os.getloadavg()],
    }


@plain_cli
def main(argv: list[str] | None = None) -> pd.DataFrame:
    p = OneLineParser(prog="python -m experiments.bench.sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=3600.0, help="trace seconds of arrivals")
    p.add_argument("--rate", type=float, default=2.0, help="requests per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=CHOICES)
    p.add_argument(
        "--modes", nargs="+", default=list(MODES), choices=MODES,
        help="loop: simulate() alone in this process; e2e: a whole experiments.simulate run",
    )  # fmt: skip
    p.add_argument(
        "--cost", nargs="+", default=["roofline"], choices=sorted(COSTS),
        help="clocks to time: roofline (simulate's default) and/or paper-a100 (reproduce's)",
    )  # fmt: skip
    p.add_argument(
        "--repeat", type=int, default=1,
        help="runs of each configuration, alternating; the table gives the medians",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("results/bench_sim"))
    args = p.parse_args(argv)
    if not all(math.isfinite(x) and x > 0 for x in (args.duration, args.rate)):
        p.error(f"--duration and --rate must be finite and > 0, got {args.duration}, {args.rate}")
    if args.repeat < 1:
        p.error(f"--repeat must be >= 1, got {args.repeat}")
    if args.seed < 0:
        p.error(f"--seed must be >= 0, got {args.seed}")
    check_out_dir(args.out)
    if workload_size(args.duration, args.rate, args.seed) == 0:
        raise ConfigError(
            "--duration", f"{args.duration:g} s of arrivals at --rate {args.rate:g} req/s draw "
            "no request: nothing to time (give a longer --duration or a higher --rate)",
        )  # fmt: skip

    bench = {"loop": bench_loop, "e2e": bench_e2e}
    configs = [(c, s, m) for c in args.cost for s in args.systems for m in args.modes]
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {k: [] for k in configs}
    for i in range(args.repeat):
        for cost, system, mode in configs:
            row = bench[mode](system, args.duration, args.rate, args.seed, cost)
            runs[cost, system, mode].append(row)
            print(
                f"{system} {cost} {mode} (run {i + 1}/{args.repeat}): {row['wall_s']:.2f} s "
                f"wall, {row['cpu_s']:.2f} s CPU",
                flush=True,
            )
    rows = [_median_row(runs[k]) for k in configs]
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    print(table.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    write_atomic(args.out / "bench_sim.csv", table.to_csv(index=False))
    write_json(
        args.out / "bench_sim.json",
        {
            **run_record("experiments.bench.sim", argv),
            "machine": machine_info(),
            "setup": {
                "model": "opt-13b",
                "hardware": "a100-40gb",
                "workload": "sharegpt",
                "duration_s": args.duration,
                "rate": args.rate,
                "seed": args.seed,
                "cost": args.cost,
                "repeat": args.repeat,
            },
            "rows": rows,
            "runs": [run for k in configs for run in runs[k]],
        },
    )
    return table


if __name__ == "__main__":
    main()
