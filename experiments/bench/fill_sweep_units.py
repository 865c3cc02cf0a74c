"""Fill in the ``sweep_units`` column of a CPU operator profile taken before the column was
written (before the seventeenth sitting of ``docs/validation/cpu-engine.md``):
``python -m experiments.bench.fill_sweep_units PROFILE_DIR --order sorted|SEED``.

A sweep's order is a pure function of the profile's plan (:func:`profile_gpu.sweep_points`):
sorted (``--order sorted``, every profile before ``order_seed`` existed) or drawn from
``(SEED, sweep)``. The filled column is therefore what ``measuring`` would have written, so
``speed_timeline.stretches`` can cut those sweeps into stretches. The CSV is rewritten
atomically with every other column as it was.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from experiments.bench import profile_gpu
from experiments.lib.args import OneLineParser


def units_of(plan: profile_gpu.ProfilePlan) -> dict[tuple[str, int, int], list[int]]:
    """Each point's unit position in each of ``plan``'s sweeps, keyed as the CSV's rows
    (op, num_tokens, context_tokens)."""
    units: dict[tuple[str, int, int], list[int]] = {}
    for sweep in range(plan.passes):
        for i, point in enumerate(profile_gpu.sweep_points(plan, sweep)):
            for key in profile_gpu.point_rows(point):
                units.setdefault(key, []).append(i)
    return units


def cpu_plan(profile_dir: Path, order_seed: int | None) -> profile_gpu.ProfilePlan:
    """The ``--cpu --single-calls`` plan of the profile in ``profile_dir`` (its sweeps'
    count from ``sweeps_ms``), with the given order."""
    table = pd.read_csv(profile_dir / "operator_profile.csv", nrows=1)
    passes = len(profile_gpu.parse_sweeps(table["sweeps_ms"].iloc[0]))
    plan = profile_gpu.make_plan(False, None, cpu=True, passes=passes, single_calls=True)
    return replace(plan, order_seed=order_seed)


def fill(profile_dir: Path, plan: profile_gpu.ProfilePlan) -> int:
    """Write ``sweep_units`` into ``profile_dir``'s CSV as ``plan`` orders its sweeps;
    returns the rows filled. Raises ValueError when a row is not a point of the plan."""
    path = profile_dir / "operator_profile.csv"
    table = pd.read_csv(path, dtype={"time_ms": str})
    units = units_of(plan)
    cells = []
    for row in table.itertuples():
        key = (row.op, int(row.num_tokens), int(row.context_tokens))
        if key not in units:
            raise ValueError(f"{path}: row {row.Index + 2} ({key}) is not a point of the plan")
        cells.append(";".join(map(str, units[key])))
    table["sweep_units"] = cells
    tmp = path.with_suffix(".csv.tmp")
    table.to_csv(tmp, index=False)
    tmp.replace(path)
    return len(table)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.bench.fill_sweep_units",
                                     description=__doc__)  # fmt: skip
    parser.add_argument("profile_dir", type=Path)
    parser.add_argument("--order", required=True, help="sorted, or the plan's order seed")
    args = parser.parse_args(argv)
    if args.order != "sorted" and not args.order.isdigit():
        parser.error(f"--order must be 'sorted' or a seed (an integer), got {args.order!r}")
    if not (args.profile_dir / "operator_profile.csv").is_file():
        parser.error(f"{args.profile_dir}: no operator_profile.csv")
    try:
        seed = None if args.order == "sorted" else int(args.order)
        n = fill(args.profile_dir, cpu_plan(args.profile_dir, seed))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"filled sweep_units of {n} rows in {args.profile_dir / 'operator_profile.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
