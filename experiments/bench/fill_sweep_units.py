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

import math
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from experiments.bench import profile_gpu
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import plain_cli
from experiments.lib.inputs import check_whole, reading
from experiments.lib.results import write_atomic

NEEDED = ("op", "num_tokens", "context_tokens", "time_ms", "sweeps_ms")


def units_of(plan: profile_gpu.ProfilePlan) -> dict[tuple[str, int, int], list[int]]:
    """Each point's unit position in each of ``plan``'s sweeps, keyed as the CSV's rows
    (op, num_tokens, context_tokens)."""
    units: dict[tuple[str, int, int], list[int]] = {}
    for sweep in range(plan.passes):
        for i, point in enumerate(profile_gpu.sweep_points(plan, sweep)):
            for key in profile_gpu.point_rows(point):
                units.setdefault(key, []).append(i)
    return units


def read_profile(path: Path) -> pd.DataFrame:
    """The operator profile CSV at ``path``, ``time_ms`` as written; a :class:`ConfigError`
    naming the file (and line and column, the header being line 1) when it is empty or cut
    short (:func:`~experiments.lib.inputs.check_whole`), lacks a column of
    :data:`NEEDED`, or has a row whose sizes are not whole numbers >= 0, whose ``time_ms``
    is empty or whose ``sweeps_ms`` does not hold as many finite times as the first row's."""
    check_whole(path)
    with reading(path, str(path)):
        table = pd.read_csv(path, dtype={"time_ms": str, "sweeps_ms": str})
    missing = [c for c in NEEDED if c not in table.columns]
    if missing:
        raise ConfigError(str(path), f"no column {', '.join(missing)}: not an operator profile "
                          "with per-sweep times")  # fmt: skip
    passes = None
    for i, row in enumerate(table.itertuples(index=False)):
        line = i + 2
        for col in ("num_tokens", "context_tokens"):
            value = getattr(row, col)
            number = pd.to_numeric(value, errors="coerce")
            if not (math.isfinite(number) and number >= 0 and number == int(number)):
                raise ConfigError(str(path), f"line {line}, column {col}: not a whole number "
                                  ">= 0", value)  # fmt: skip
        if pd.isna(row.time_ms) or not str(row.time_ms).strip():
            raise ConfigError(str(path), f"line {line}, column time_ms: empty")
        try:
            sweeps = profile_gpu.parse_sweeps(row.sweeps_ms)
        except ValueError:
            sweeps = [math.nan]
        if not all(math.isfinite(t) for t in sweeps):
            raise ConfigError(str(path), f"line {line}, column sweeps_ms: not times in ms "
                              "separated by ';'", row.sweeps_ms)  # fmt: skip
        if passes is not None and len(sweeps) != passes:
            raise ConfigError(str(path), f"line {line}, column sweeps_ms: {len(sweeps)} sweeps "
                              f"where line 2 has {passes}")  # fmt: skip
        passes = len(sweeps)
    if passes is None:
        raise ConfigError(str(path), "has a header but no rows")
    return table


def cpu_plan(profile_dir: Path, order_seed: int | None) -> profile_gpu.ProfilePlan:
    """The ``--cpu --single-calls`` plan of the profile in ``profile_dir`` (its sweeps'
    count from ``sweeps_ms``, checked by :func:`read_profile`), with the given order."""
    table = read_profile(profile_dir / "operator_profile.csv")
    passes = len(profile_gpu.parse_sweeps(table["sweeps_ms"].iloc[0]))
    plan = profile_gpu.make_plan(False, None, cpu=True, passes=passes, single_calls=True)
    return replace(plan, order_seed=order_seed)


def fill(profile_dir: Path, plan: profile_gpu.ProfilePlan) -> int:
    """Write ``sweep_units`` into ``profile_dir``'s CSV as ``plan`` orders its sweeps;
    returns the rows filled. Raises a ConfigError (a ValueError) naming the file and line,
    and leaves the file as it was, when it is not a whole profile (:func:`read_profile`)
    or a row is not a point of the plan."""
    path = profile_dir / "operator_profile.csv"
    table = read_profile(path)
    units = units_of(plan)
    cells = []
    for row in table.itertuples():
        key = (row.op, int(row.num_tokens), int(row.context_tokens))
        if key not in units:
            raise ConfigError(str(path), f"line {row.Index + 2} {key} is not a point of the "
                              "plan")  # fmt: skip
        cells.append(";".join(map(str, units[key])))
    table["sweep_units"] = cells
    write_atomic(path, lambda tmp: table.to_csv(tmp, index=False))
    return len(table)


@plain_cli
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
    seed = None if args.order == "sorted" else int(args.order)
    n = fill(args.profile_dir, cpu_plan(args.profile_dir, seed))
    print(f"filled sweep_units of {n} rows in {args.profile_dir / 'operator_profile.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
