"""``python -m experiments.bench.sim``: how fast the simulator runs, per system.

Simulates OPT-13B on one A100-40GB serving a synthetic ShareGPT trace (the vLLM paper's
§6.2 setup; by default its 1-hour trace at 2 req/s), one system at a time in this
process, and prints a table: requests, simulated seconds, engine steps, wall seconds
of ``sim.driver.simulate`` alone (workload generation, cost-model setup and metrics are
outside the timer), simulated requests/s, steps/s and speed against real time
(simulated seconds / wall seconds); ``cpu_s`` is this process's CPU time over the same
span (less sensitive to other load on the machine). Writes ``bench_sim.csv`` and ``bench_sim.json``
(rows plus the machine: Python version, CPU count, platform, date) into ``--out``.

A wall-clock number holds only for the machine and the load it ran under; compare
systems or code versions side by side in one invocation.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.lib.results import write_json
from experiments.lib.setup import as_dict, build_setup
from experiments.reproduce import compose_config
from sim.driver import simulate

SYSTEMS = ("vllm", "orca_max", "orca_pow2", "orca_oracle", "fastertransformer")
COLUMNS = (
    "system",
    "requests",
    "sim_s",
    "steps",
    "wall_s",
    "cpu_s",
    "sim_req_per_s",
    "steps_per_s",
    "speed_vs_real",
)


def bench_one(system: str, duration_s: float, rate: float, seed: int) -> dict[str, Any]:
    """Simulate one system on the benchmark trace; returns one table row."""
    cfg = compose_config(
        [
            "model=opt-13b",
            "hardware=a100-40gb",
            "workload=sharegpt",
            f"workload.duration_s={duration_s}",
            f"workload.rate={rate}",
            f"seed={seed}",
            f"system={system}",
        ]
    )
    c = as_dict(cfg)
    setup = build_setup(c)
    cost_model = setup.cost_model
    t0, c0 = time.perf_counter(), time.process_time()
    result = simulate(setup.requests, setup.make_scheduler, cost_model, seed=seed)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = len(setup.requests)
    return {
        "system": system,
        "requests": n,
        "sim_s": result.end_time_s,
        "steps": result.num_steps,
        "wall_s": wall,
        "cpu_s": cpu,
        "sim_req_per_s": n / wall,
        "steps_per_s": result.num_steps / wall,
        "speed_vs_real": result.end_time_s / wall,
    }


def machine_info() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=3600.0, help="trace seconds of arrivals")
    p.add_argument("--rate", type=float, default=2.0, help="requests per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--out", type=Path, default=Path("results/bench_sim"))
    args = p.parse_args(argv)
    if args.duration <= 0 or args.rate <= 0:
        p.error(f"--duration and --rate must be > 0, got {args.duration}, {args.rate}")

    rows = []
    for system in args.systems:
        rows.append(bench_one(system, args.duration, args.rate, args.seed))
        print(f"{system}: {rows[-1]['wall_s']:.2f} s wall", flush=True)
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    print(table.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "bench_sim.csv", index=False)
    write_json(
        args.out / "bench_sim.json",
        {
            "machine": machine_info(),
            "setup": {
                "model": "opt-13b",
                "hardware": "a100-40gb",
                "workload": "sharegpt",
                "duration_s": args.duration,
                "rate": args.rate,
                "seed": args.seed,
            },
            "rows": rows,
        },
    )
    return table


if __name__ == "__main__":
    main()
