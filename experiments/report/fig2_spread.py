"""How Fig. 2's shares depend on the assumed length spread: ``python -m
experiments.report.fig2_spread --out DIR [--duration S] [--workers N]``.

The paper gives ShareGPT's mean prompt and output lengths but not their spread, so kvlab's
synthetic ShareGPT assumes log-space sigmas (1.2 for prompts, 1.0 for outputs;
``core/workload/lengths.py``) and refits the mus to the published means. This study reruns
Fig. 2's four systems (OPT-13B, one A100-40GB, ShareGPT at 2 req/s, reproduce's paper-era
clock) on a grid of sigmas (``workload.sigma_input`` / ``workload.sigma_output``) and writes
``DIR/fig2_spread.csv`` (one row per system and grid point) and ``DIR/fig2_spread.md``
(each share's range over the grid beside the paper's value). It answers one question: is a
gap between kvlab's Fig. 2 and the paper's inside what the unknown spread can move?
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pandas as pd

from experiments.lib.args import OneLineParser, out_dir_problem
from experiments.lib.pool import worker_pool
from experiments.lib.results import write_atomic, write_csv, write_json
from experiments.report.paper import FIG2_BREAKDOWN, SYSTEM_LABELS

SIGMA_INPUT = (1.0, 1.2, 1.4)
SIGMA_OUTPUT = (0.8, 1.0, 1.2)
SYSTEMS = ("orca_max", "orca_pow2", "orca_oracle", "vllm")
SHARES = {  # metric -> (label, FIG2_BREAKDOWN key)
    "kv_token_states_pct": ("token states", "token_states"),
    "kv_reserved_pct": ("reservation", "reserved"),
    "kv_internal_frag_pct": ("internal frag.", "internal_frag"),
    "kv_external_frag_pct": ("external frag. & other", "external_frag"),
}


def run_point(system: str, sigma_in: float, sigma_out: float, duration: float, seed: int) -> dict:
    """One Fig. 2 run at one grid point (in a worker process)."""
    from experiments.reproduce import COSTS, compose_config
    from experiments.simulate import run

    logging.getLogger("experiments.simulate").setLevel(logging.WARNING)
    overrides = [
        "model=opt-13b", "hardware=a100-40gb", "workload=sharegpt", f"system={system}",
        "workload.rate=2.0", f"workload.duration_s={duration}", f"seed={seed}",
        f"workload.sigma_input={sigma_in}", f"workload.sigma_output={sigma_out}",
        *COSTS["paper-a100"],
    ]  # fmt: skip
    m = run(compose_config(overrides), None)
    return {
        "system": system, "sigma_input": sigma_in, "sigma_output": sigma_out,
        "mean_batch_size": m["mean_batch_size"], **{k: m[k] for k in SHARES},
    }  # fmt: skip


def summary(rows: pd.DataFrame) -> str:
    """Markdown: per system and share, kvlab's min-max over the grid, the assumed point's
    value and the paper's."""
    lines = [
        "| system | share | kvlab at the assumed sigmas | kvlab over the grid | paper |",
        "|---|---|---:|---:|---:|",
    ]
    assumed = rows[(rows["sigma_input"] == 1.2) & (rows["sigma_output"] == 1.0)]
    for system in SYSTEMS:
        sub = rows[rows["system"] == system]
        here = assumed[assumed["system"] == system]
        for key, (name, paper_key) in SHARES.items():
            paper = FIG2_BREAKDOWN[system][paper_key]
            lo, hi = sub[key].min(), sub[key].max()
            at = here[key].iloc[0] if len(here) else float("nan")
            shown = "—" if paper is None else f"{paper:.1f}"
            lines.append(
                f"| {SYSTEM_LABELS[system]} | {name} | {at:.1f} | {lo:.1f}–{hi:.1f} | {shown} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m experiments.report.fig2_spread")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--duration", type=float, default=600.0, help="trace seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.duration > 0 or args.seed < 0 or args.workers < 1:
        p.error("--duration must be > 0, --seed >= 0 and --workers >= 1")
    problem = out_dir_problem(args.out)
    if problem is not None:
        p.error(f"--out {args.out}: {problem}")
    args.out.mkdir(parents=True, exist_ok=True)
    grid = [(s, a, b) for a in SIGMA_INPUT for b in SIGMA_OUTPUT for s in SYSTEMS]
    with worker_pool(args.workers) as pool:
        jobs = [pool.submit(run_point, s, a, b, args.duration, args.seed) for s, a, b in grid]
        rows = pd.DataFrame([j.result() for j in jobs])
    write_csv(args.out / "fig2_spread.csv", rows)
    text = (
        f"Fig. 2 shares (% of KV slots) over log-space length sigmas "
        f"{SIGMA_INPUT} (prompts) x {SIGMA_OUTPUT} (outputs), {args.duration:g}-s ShareGPT "
        f"traces at 2 req/s, seed {args.seed}, paper-era A100 clock.\n\n" + summary(rows)
    )
    write_atomic(args.out / "fig2_spread.md", text)
    write_json(args.out / "fig2_spread.json", {"rows": rows.to_dict("records")})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
