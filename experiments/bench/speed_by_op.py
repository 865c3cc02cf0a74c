"""Does a sitting's speed move alike for every operator? ::

    python -m experiments.bench.speed_by_op SITTING_DIR [SITTING_DIR ...] [--fit-on s]
        [--out DIR]

``cpu_cross_run``'s timed validation prices every step of a stretch at one speed: the
stretch's summed time over the summed price of all the profile's points timed there
(:mod:`experiments.bench.speed_timeline`). That is right if the machine slows every operator
alike. For each ``SITTING_DIR`` (an interleaved ``cpu_cross_run --out`` directory: its
``operator_profile``, ``sitting.json`` and ``run_*/steps.csv``) this asks whether it did.

- ``spread.csv``: for each split of the profile's points into two classes
  (:data:`SPLITS`), the speed of the first class over the second's in each measured sweep
  (one stretch a sweep, cut as for the whole profile), and that ratio's standard deviation
  and range over the sweeps. On a machine that holds its speed it is the points' scatter
  alone.
- ``pricing.csv``: each run's decode-only steps, open loop (the run's own batches), with the
  model fitted on ``--fit-on`` (its ``run_<name>/calibration.json``, on the sitting's
  profile: :func:`experiments.bench.cpu_error_parts.sitting_model`):
  the summed price over the summed measured time, less 1, with every step at one speed
  (``timed``; ``shrunk``: :func:`~experiments.bench.speed_timeline.shrink_to_price`) and
  with the step's decode attention at the decode-attention points' speed and the rest at
  the other points' (``split``, ``shrunk_split``). ``gap`` rows: the ShareGPT runs' mean
  (``a``, ``a2``) less the Alpaca runs' (``b``, ``b2``), where both are there.

Nothing is fitted here beyond ``cpu_cross_run``'s own terms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from experiments.bench.cpu_cross_run import REPEATS, STRETCHES_PER_SWEEP
from experiments.bench.cpu_error_parts import expected_steps, sitting_model
from experiments.bench.speed_timeline import Stretch, UnknownScatter, shrink_to_price, stretches
from experiments.bench.tables import print_table, write_csv
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import plain_cli
from experiments.lib.inputs import read_run_steps
from sim.cost import CalibratedCostModel
from sim.cost.drifting import DriftingCostModel

Rows = Callable[[pd.DataFrame], pd.Series]


def _decode_attention(t: pd.DataFrame) -> pd.Series:
    return t["op"] == "attn_decode"


def _not_decode_attention(t: pd.DataFrame) -> pd.Series:
    return t["op"] != "attn_decode"


def _matmuls_of_few_rows(t: pd.DataFrame) -> pd.Series:
    return t["op"].isin(["linear", "lm_head"]) & (t["num_tokens"] <= 8)


def _matmuls_of_many_rows(t: pd.DataFrame) -> pd.Series:
    return t["op"].isin(["linear", "lm_head"]) & t["num_tokens"].between(32, 512)


# name → (first class, second class); the spread is the first's speed over the second's
SPLITS: dict[str, tuple[Rows, Rows]] = {
    "decode attention / the rest": (_decode_attention, _not_decode_attention),
    "matmuls of 1-8 rows / of 32-512 rows": (_matmuls_of_few_rows, _matmuls_of_many_rows),
}


def _measured(s: Stretch) -> bool:
    return s.copies is None and bool(np.isfinite(s.variance))


def spread(profile: Path, first: Rows, second: Rows) -> dict[str, Any]:
    """The first class's speed over the second's in every sweep both measured (neither cold
    nor empty): ``sweeps``, and the ratio less 1: its standard deviation, least and most."""
    one, other = stretches(profile, 1, first), stretches(profile, 1, second)
    if one is None or other is None:
        raise ConfigError("SITTING_DIR", "its profile has no sweeps to follow", str(profile))
    pairs = zip(one, other, strict=True)
    ratio = np.array([a.speed / b.speed - 1.0 for a, b in pairs if _measured(a) and _measured(b)])
    if not len(ratio):
        return {"sweeps": 0, "sd": float("nan"), "least": float("nan"), "most": float("nan")}
    return {
        "sweeps": len(ratio), "sd": float(ratio.std()),
        "least": float(ratio.min()), "most": float(ratio.max()),
    }  # fmt: skip


def timelines(profile: Path) -> dict[str, tuple[list[float], list[float]]]:
    """Per way of pricing, the speeds of (decode attention, the rest) per stretch."""
    whole = stretches(profile, STRETCHES_PER_SWEEP)
    attention = stretches(profile, STRETCHES_PER_SWEEP, _decode_attention)
    rest = stretches(profile, STRETCHES_PER_SWEEP, _not_decode_attention)
    if whole is None or attention is None or rest is None:
        raise ConfigError("SITTING_DIR", "its profile has no sweeps to follow", str(profile))
    timed = [s.speed for s in whole]
    try:
        shrunk = shrink_to_price(whole).speeds
        shrunk_split = (shrink_to_price(attention).speeds, shrink_to_price(rest).speeds)
    except UnknownScatter as exc:
        raise ConfigError("SITTING_DIR", str(exc), str(profile)) from None
    return {
        "timed": (timed, timed),
        "shrunk": (shrunk, shrunk),
        "split": ([s.speed for s in attention], [s.speed for s in rest]),
        "shrunk_split": shrunk_split,
    }


def decode_errors(
    model: CalibratedCostModel,
    steps: pd.DataFrame,
    expected: int,
    ways: dict[str, tuple[list[float], list[float]]],
) -> dict[str, float]:
    """Per way of pricing, the decode-only steps' summed price over their summed measured
    time, less 1; the i-th step at the speeds of the stretch it fell in
    (:meth:`DriftingCostModel.speed_at`)."""
    work = ((steps["prefill_tokens"] + steps["decode_seqs"]) > 0).to_numpy()
    decode = work & (steps["prefill_tokens"] == 0).to_numpy()
    chosen = steps[decode]
    price = model.predict_steps(chosen)
    attention = model.profile_decode_attention(chosen)
    measured = chosen["duration_s"].to_numpy(dtype=float).sum()
    out = {}
    for way, (attention_speeds, rest_speeds) in ways.items():
        at = DriftingCostModel(model, attention_speeds, expected).speeds_of(len(steps))[decode]
        rest = DriftingCostModel(model, rest_speeds, expected).speeds_of(len(steps))[decode]
        out[way] = float((((price - attention) * rest + attention * at).sum()) / measured - 1.0)
    return out


def sitting_rows(sitting: Path, fit_on: str) -> tuple[list[dict], list[dict]]:
    """``sitting``'s rows of ``spread.csv`` and of ``pricing.csv``."""
    profile = sitting / "operator_profile"
    model = sitting_model(sitting, fit_on)
    expected = expected_steps(sitting)
    if not expected:
        raise ConfigError(
            "SITTING_DIR", "holds no sitting.json (not an interleaved sitting)", str(sitting)
        )
    if not _decode_attention(pd.read_csv(profile / "operator_profile.csv")).any():
        raise ConfigError("SITTING_DIR", "its profile has no attn_decode rows", str(sitting))
    name = sitting.name
    spreads = [
        {"sitting": name, "split": split, **spread(profile, *classes)}
        for split, classes in SPLITS.items()
    ]
    ways = timelines(profile)
    runs = sorted(p for p in sitting.glob("run_*") if (p / "steps.csv").is_file())
    if not runs:
        raise ConfigError("SITTING_DIR", "no run_*/steps.csv in it", str(sitting))
    pricing, by_run = [], {}
    for run in runs:
        run_name = run.name.removeprefix("run_")
        if run_name not in expected:
            raise ConfigError(
                "SITTING_DIR", f"sitting.json has no expected steps for {run_name}", str(sitting)
            )
        steps = read_run_steps(run, "sitting")
        errors = decode_errors(model, steps, expected[run_name], ways)
        by_run[run_name] = errors
        pricing.append({"sitting": name, "run": run_name, **errors})
    groups: dict[str, list[dict[str, float]]] = {}
    for run_name, errors in by_run.items():
        groups.setdefault(REPEATS.get(run_name, run_name), []).append(errors)
    if "a" in groups and "b" in groups:
        mean = {g: {w: float(np.mean([e[w] for e in groups[g]])) for w in ways} for g in "ab"}
        pricing.append(
            {"sitting": name, "run": "gap", **{w: mean["a"][w] - mean["b"][w] for w in ways}}
        )
    return spreads, pricing


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m experiments.bench.speed_by_op", description=__doc__.split("\n")[0]
    )
    parser.add_argument("sittings", type=Path, nargs="+", metavar="SITTING_DIR",
                        help="cpu_cross_run --out directories of interleaved sittings")  # fmt: skip
    parser.add_argument("--fit-on", default="s", help="the run whose model prices (default s)")
    parser.add_argument("--out", type=Path, default=Path("results/speed_by_op"),
                        help="directory for spread.csv and pricing.csv")  # fmt: skip
    args = parser.parse_args(argv)
    spreads, pricing = [], []
    for sitting in args.sittings:
        if not sitting.is_dir():
            raise ConfigError("SITTING_DIR", "not a directory", str(sitting))
        print(f"{sitting.name}: ...", flush=True)
        more_spreads, more_pricing = sitting_rows(sitting, args.fit_on)
        spreads += more_spreads
        pricing += more_pricing
    print_table("each sweep's speed, one class over the other, less 1", spreads)
    print_table("decode-only steps, summed price over measured, less 1", pricing)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "spread.csv", spreads)
    write_csv(args.out / "pricing.csv", pricing)
    print(f"wrote {args.out / 'spread.csv'}, {args.out / 'pricing.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
