"""Decode attention on a fine grid of contexts, against the profile's interpolation:
``python -m experiments.bench.cpu_decode_grid [--seqs 4 8 16 32] [--contexts 16 24 ...]
[--sweeps 16] [--knots powers|N] [--out DIR]``.

A sitting's operator profile times decode attention at per-sequence contexts that are powers
of two, every sequence of a batch at the same context, and ``cost=profiled`` prices the
contexts between by a straight line through the two around them
(:class:`sim.cost.profiled.ProfiledCostModel`). The engine's batches fall between those
points, and their contexts are spread. This times kvlab's OPT-125M decode forward on this
CPU as a sitting's profile does (inside the whole model,
:meth:`experiments.bench.profile_gpu.Profiler.in_model`: one torch thread, thread CPU time,
torch attention, malloc pinned), for each sequence count and per-sequence mean context of
the grid, twice: every context equal, and spread (pairs ``mean - x``, ``mean + x``, ``x``
uniform in ``[0, mean - 1]``, drawn afresh each sweep; the same sum). Every sweep is one call
per point in a seeded random order, so the machine's drift falls on all points alike; a
point's time is the mean over the sweeps.

Per sequence count and context it reports:

- ``price_vs_equal``: the price from the grid's powers of two alone, as ``cost=profiled``
  draws it (piecewise linear in per-sequence context through the running maximum), over the
  measured equal batch, less 1: the interpolation's error (``--knots 16``: drawn through
  the multiples of 16 instead, so at contexts between them it is what a half-filled last
  block costs beyond the line through full ones);
- ``spread_vs_equal``: the spread batch over the equal one, less 1;
- ``price_vs_spread``: the price over the spread batch, less 1: what an engine's batch of
  this size and sum meets;
- ``attn_share``: attention's share of the whole forward (the layers' linear, other and
  attention, and the LM head), which turns an attention error into a step's;
- ``step_vs_spread``: ``price_vs_spread × attn_share``, the whole forward's error from it.

Writes ``DIR/decode_grid.csv`` (every point and kind: the mean and standard error over the
sweeps), ``DIR/decode_grid_summary.csv`` (the table above) and ``DIR/decode_grid.json`` (the
machine, malloc's state, the arguments). About 20 s a sweep at the defaults on a 2-core VM.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.bench.cpu_malloc import spread_contexts as malloc_spread
from experiments.bench.cpu_malloc import whole_forward_ms
from experiments.bench.sim import machine_info
from experiments.bench.tables import print_table, write_csv
from experiments.lib.args import OneLineParser, out_dir_problem
from experiments.lib.cli import plain_cli
from experiments.lib.malloc import pin_malloc
from experiments.lib.results import write_json
from sim.cost.profiled import interp_points

SEQS = (4, 8, 16, 32)
CONTEXTS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
KINDS = ("equal", "spread")


def spread_contexts(seqs: int, mean: int, rng: random.Random) -> list[int]:
    """``seqs`` contexts summing to ``seqs × mean``, each at least 1
    (:func:`experiments.bench.cpu_malloc.spread_contexts`)."""
    return malloc_spread(seqs, mean, rng, shortest=1)


def is_knot(context: int, every: int | None = None) -> bool:
    """Whether the price is drawn through ``context``: a power of two (the profile's points;
    ``every`` None), else a multiple of ``every`` (e.g. the block size: full last blocks)."""
    if every is None:
        return context > 0 and context & (context - 1) == 0
    return context % every == 0


def price_from_knots(
    contexts: list[int], equal_ms: list[float], every: int | None = None
) -> list[float]:
    """The price at every context from the knots alone (:func:`is_knot`), as
    ``cost=profiled`` draws decode attention along one sequence count: piecewise linear
    through the running maximum, extrapolated linearly past the ends."""
    pairs = zip(contexts, equal_ms, strict=True)
    knots = [(c, t) for c, t in pairs if is_knot(c, every)]
    if len(knots) < 2:
        raise ValueError(f"--contexts {contexts} hold fewer than two knots")
    xs = np.array([c for c, _ in knots], dtype=float)
    ys = np.maximum.accumulate(np.array([t for _, t in knots]))
    return interp_points(np.array(contexts, dtype=float), xs, ys).tolist()


def measure(
    seqs: list[int], contexts: list[int], sweeps: int, seed: int, log: Any = print
) -> list[dict[str, Any]]:
    """Time every (sequence count, context, kind) once per sweep, in each sweep's seeded
    random order; one row per point with the mean and standard error over the sweeps of its
    attention per layer and its whole forward, in milliseconds."""
    import torch

    from experiments.bench import profile_gpu

    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    plan = profile_gpu.make_plan(False, "opt-125m", cpu=True, passes=1, single_calls=True)
    profiler = profile_gpu.Profiler(plan)
    assert profiler.whole is not None
    layers = profiler.whole.layers
    points = [(n, c, k) for n in seqs for c in contexts for k in KINDS]
    attn: dict[tuple[int, int, str], list[float]] = {p: [] for p in points}
    forward: dict[tuple[int, int, str], list[float]] = {p: [] for p in points}
    start = time.monotonic()
    for sweep in range(sweeps):
        order = random.Random(seed * 1_000_003 + sweep).sample(points, len(points))
        for n, c, kind in order:
            rng = random.Random(f"{seed}-{n}-{c}-{sweep}")
            ctx = [c] * n if kind == "equal" else spread_contexts(n, c, rng)
            ms = profiler.in_model([1] * n, ctx)
            attn[n, c, kind].append(ms["attn"])
            forward[n, c, kind].append(whole_forward_ms(ms, layers))
        log(f"sweep {sweep + 1}/{sweeps} done ({time.monotonic() - start:.0f} s)")

    def se(xs: list[float]) -> float:
        return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")

    return [
        {"seqs": n, "context": c, "contexts": k, "sweeps": len(attn[n, c, k]), "layers": layers,
         "attn_ms": statistics.fmean(attn[n, c, k]), "attn_se_ms": se(attn[n, c, k]),
         "forward_ms": statistics.fmean(forward[n, c, k]),
         "forward_se_ms": se(forward[n, c, k])}
        for n, c, k in points
    ]  # fmt: skip


def summarize(rows: list[dict[str, Any]], every: int | None = None) -> list[dict[str, Any]]:
    """Per sequence count and context, the comparisons of the module doc (fractions), the
    price drawn through the knots of ``every`` (:func:`is_knot`)."""
    by = {(r["seqs"], r["context"], r["contexts"]): r for r in rows}
    out = []
    for n in sorted({r["seqs"] for r in rows}):
        contexts = sorted({c for s, c, _ in by if s == n})
        equal = [by[n, c, "equal"]["attn_ms"] for c in contexts]
        prices = price_from_knots(contexts, equal, every)
        for c, eq, price in zip(contexts, equal, prices, strict=True):
            spread = by[n, c, "spread"]
            share = spread["layers"] * spread["attn_ms"] / spread["forward_ms"]
            out.append({
                "seqs": n, "context": c, "knot": is_knot(c, every),
                "equal_ms": eq, "spread_ms": spread["attn_ms"], "price_ms": price,
                "price_vs_equal": price / eq - 1, "spread_vs_equal": spread["attn_ms"] / eq - 1,
                "price_vs_spread": price / spread["attn_ms"] - 1, "attn_share": share,
                "step_vs_spread": (price / spread["attn_ms"] - 1) * share,
            })  # fmt: skip
    return out


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m experiments.bench.cpu_decode_grid", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seqs", type=int, nargs="+", default=list(SEQS))
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS),
                        help="per-sequence mean contexts; at least two knots")  # fmt: skip
    parser.add_argument("--sweeps", type=int, default=16, help="calls per point (default 16)")
    parser.add_argument("--knots", default="powers",
                        help="contexts the price is drawn through: 'powers' (of two, the "
                        "profile's) or N (multiples of N)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/cpu_decode_grid"))
    args = parser.parse_args(argv)
    if args.sweeps < 1 or min(args.seqs) < 1 or min(args.contexts) < 1:
        parser.error("--sweeps, --seqs and --contexts must be >= 1")
    if args.knots != "powers" and not (args.knots.isdigit() and int(args.knots) > 0):
        parser.error(f"--knots must be 'powers' or a whole number > 0, got {args.knots!r}")
    every = None if args.knots == "powers" else int(args.knots)
    if sum(is_knot(c, every) for c in set(args.contexts)) < 2:
        parser.error(f"--contexts {args.contexts} hold fewer than two knots (--knots)")
    problem = out_dir_problem(args.out)
    if problem is not None:  # before minutes of measuring, not after them
        parser.error(f"--out {args.out}: {problem}")
    import torch

    from experiments.serve import device_name

    malloc = pin_malloc()
    rows = measure(args.seqs, sorted(set(args.contexts)), args.sweeps, args.seed)
    summary = summarize(rows, every)
    print_table("decode attention per layer: equal and spread contexts, the profile's price",
                summary)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "decode_grid.csv", rows)
    write_csv(args.out / "decode_grid_summary.csv", summary)
    write_json(args.out / "decode_grid.json", {
        "machine": {**machine_info(), "cpu": device_name(torch.device("cpu"))},
        "malloc": malloc, "argv": sys.argv[1:],
        "seqs": args.seqs, "contexts": sorted(set(args.contexts)), "sweeps": args.sweeps,
        "seed": args.seed, "knots": args.knots,
    })  # fmt: skip
    print(f"wrote {args.out}/decode_grid.csv, decode_grid_summary.csv, decode_grid.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
