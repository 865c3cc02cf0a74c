"""Where a CPU cross-run sitting's prediction error lies, part by part::

    python -m experiments.bench.cpu_error_parts SITTING_DIR [--fit-on s] [--out CSV]
        [--timed | --profile-from DIR [DIR ...]]

``experiments.bench.cpu_cross_run`` prices a step as its operator profile's forward plus
three fitted host terms. For every run of a sitting (``SITTING_DIR/run_*`` with a
``steps.csv``), open loop (the run's own measured batches, no queue), this compares with
the model fitted on ``--fit-on`` (its ``run_<name>/calibration.json``, priced on the
sitting's ``operator_profile``):

- ``forward``: the profile's price against the engine's measured ``forward_s``;
- ``host``: the fitted terms against the time outside the forward
  (``duration_s - forward_s - transfer_s``, what they were fitted to);
- ``step``: their sum against the step's time less its transfers (``duration_s -
  transfer_s``; neither the fit nor this price counts transfers, which the simulator
  prices on its own).

Each as the relative error of the sum (price / measured - 1), plain and with each step
weighted by its sequences (prefill + decode); the forward's also over the decode-only steps
of one sequence and of several (``forward_decode_one``, ``forward_decode_many``; NaN where a
run has none). A run's throughput follows the plain sum; its mean TPOT weighs a step by the
sequences it advances, so it follows the weighted one. ``host_share`` is the host time's
share of the measured step time.

Where the sitting's ``sitting.json`` records each run's expected steps (an interleaved
sitting), ``one_at`` and ``many_at`` are the median place in the sitting (0 its start, 1 its
end) of those decode-only steps, the i-th step (from 0) of a run falling at
(i + 0.5) / expected as ``cpu_cross_run`` places it. ``--timed`` prices each step at the
machine's speed where it fell, as ``cpu_cross_run``'s timed validation does
(:func:`experiments.bench.speed_timeline.speed_timeline`).

``--profile-from DIR [DIR ...]`` prices on the geometric mean of other profiles' times instead
of the sitting's own profile (:func:`pooled_profile`): with the other sittings' profiles, it
tells an error that the sitting's profile brought (it goes away) from one that the sitting's
runs brought (it stays).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from experiments.bench.cpu_cross_run import STRETCHES_PER_SWEEP
from experiments.bench.sitting import expected_units
from experiments.bench.speed_timeline import speed_timeline
from experiments.bench.tables import print_table, write_csv
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import plain_cli
from experiments.lib.inputs import read_json, read_run_steps
from sim.cost import CalibratedCostModel
from sim.cost.calibrated import host_seconds
from sim.cost.drifting import DriftingCostModel


def relative(price: np.ndarray, measured: np.ndarray, weight: np.ndarray | None = None) -> float:
    """``sum(weight * price) / sum(weight * measured) - 1`` (weights 1 when None); NaN for
    no values."""
    if len(price) == 0:
        return float("nan")
    w = np.ones(len(price)) if weight is None else weight
    return float((w * price).sum() / (w * measured).sum() - 1.0)


def run_parts(
    model: CalibratedCostModel,
    steps: pd.DataFrame,
    expected: int | None = None,
    timeline: list[float] | None = None,
) -> dict[str, Any]:
    """The parts of ``model``'s open-loop error on one run's ``steps`` (see the module doc);
    steps that do no work (neither prefill nor decode) are left out. With ``expected`` (the
    run's expected steps in its sitting) the places of its one- and many-sequence decode
    steps; with ``timeline`` too, every price at the speed where its step fell."""
    place = (np.arange(len(steps)) + 0.5) / expected if expected else np.full(len(steps), np.nan)
    scale = np.ones(len(steps))
    if timeline is not None and expected:
        scale = DriftingCostModel(model, timeline, expected).speeds_of(len(steps))
    work = ((steps["prefill_tokens"] + steps["decode_seqs"]) > 0).to_numpy()
    steps, place, scale = steps[work], place[work], scale[work]
    forward_price = model.profile_seconds(steps) * scale
    host_price = model.predict_steps(steps) * scale - forward_price
    forward = steps["forward_s"].to_numpy(dtype=float)
    duration = steps["duration_s"].to_numpy(dtype=float)
    host = host_seconds(steps)
    seqs = (steps["prefill_seqs"] + steps["decode_seqs"]).to_numpy(dtype=float)
    step_price = forward_price + host_price
    decode_only = (steps["prefill_tokens"] == 0).to_numpy()
    one = decode_only & (steps["decode_seqs"] == 1).to_numpy()
    many = decode_only & (steps["decode_seqs"] > 1).to_numpy()
    return {
        "steps": len(steps),
        "one_at": float(np.median(place[one])) if one.any() else float("nan"),
        "many_at": float(np.median(place[many])) if many.any() else float("nan"),
        "host_share": float(host.sum() / duration.sum()),
        "forward": relative(forward_price, forward),
        "forward_per_seq": relative(forward_price, forward, seqs),
        "forward_decode_one": relative(forward_price[one], forward[one]),
        "forward_decode_many": relative(forward_price[many], forward[many]),
        "host": relative(host_price, host),
        "host_per_seq": relative(host_price, host, seqs),
        "step": relative(step_price, forward + host),
        "step_per_seq": relative(step_price, forward + host, seqs),
    }


POINT = ["op", "num_tokens", "context_tokens"]


def pooled_profile(profiles: list[Path], out: Path) -> Path:
    """Write into ``out`` (a directory) a profile whose every point's ``time_ms`` is the
    geometric mean of that point's time in ``profiles`` (which must all hold the same
    points), with the first one's sidecar; returns ``out``. Other columns are dropped."""
    tables = []
    for profile in profiles:
        if not (profile / "operator_profile.csv").is_file():
            raise ConfigError("--profile-from", "holds no operator_profile.csv", str(profile))
        table = pd.read_csv(profile / "operator_profile.csv")
        tables.append(table.set_index(POINT)["time_ms"].sort_index())
    for profile, table in zip(profiles[1:], tables[1:], strict=True):
        if not table.index.equals(tables[0].index):
            raise ConfigError(
                "--profile-from", f"its points differ from those of {profiles[0]}", str(profile)
            )
    pooled = np.exp(np.mean([np.log(t.to_numpy(dtype=float)) for t in tables], axis=0))
    out.mkdir(parents=True, exist_ok=True)
    frame = tables[0].index.to_frame(index=False).assign(time_ms=pooled)
    write_csv(out / "operator_profile.csv", frame.to_dict("records"))
    shutil.copy(profiles[0] / "operator_profile.json", out / "operator_profile.json")
    return out


def sitting_model(sitting: Path, fit_on: str, profile: Path | None = None) -> CalibratedCostModel:
    """The model fitted on ``run_<fit_on>`` of ``sitting``, on ``profile`` (default the
    sitting's own, wherever the calibration file says the profile was)."""
    if not sitting.is_dir():
        raise ConfigError("SITTING_DIR", "not a directory", str(sitting))
    if not any(sitting.glob("run_*")):
        raise ConfigError(
            "SITTING_DIR", "holds no run_* folder (not a cpu_cross_run --out folder)", str(sitting)
        )
    path = sitting / f"run_{fit_on}" / "calibration.json"
    if not path.is_file():
        raise ConfigError("--fit-on", f"{path} does not exist", fit_on)
    profile = profile or sitting / "operator_profile"
    if not (profile / "operator_profile.csv").is_file():
        raise ConfigError("SITTING_DIR", f"{profile} holds no operator_profile.csv", str(sitting))
    doc = read_json(path, "--fit-on")
    if not isinstance(doc, dict):
        raise ConfigError("--fit-on", f"{path}: not a calibration document")
    return CalibratedCostModel.from_dict({**doc, "profile": str(profile)})


def expected_steps(sitting: Path) -> dict[str, int]:
    """Each run's expected steps, as ``sitting.json`` records them ({} without it)."""
    record = sitting / "sitting.json"
    if not record.is_file():
        return {}
    doc = read_json(record, "SITTING_DIR")
    if not isinstance(doc, dict):
        raise ConfigError("SITTING_DIR", f"{record}: not a JSON object")
    return expected_units(doc)


def error_parts(
    sitting: Path, fit_on: str = "s", profile: Path | None = None, timed: bool = False
) -> list[dict[str, Any]]:
    """One row per run of ``sitting`` (``run_*`` directories with a ``steps.csv``, in name
    order): the run, then :func:`run_parts` of the model fitted on ``fit_on``, priced on
    ``profile`` (default the sitting's own); ``timed``: at the sitting's speed (its own
    profile only)."""
    model = sitting_model(sitting, fit_on, profile)
    runs = sorted(p for p in sitting.glob("run_*") if (p / "steps.csv").is_file())
    if not runs:
        raise ConfigError("SITTING_DIR", "no run_*/steps.csv in it", str(sitting))
    expected = expected_steps(sitting)
    timeline = None
    if timed:
        if profile is not None:
            raise ConfigError("--timed", "needs the sitting's own profile, not --profile-from")
        timeline = speed_timeline(sitting / "operator_profile", STRETCHES_PER_SWEEP)
        if timeline is None or not expected:
            raise ConfigError("--timed", "needs an interleaved sitting's sweeps and sitting.json")
    rows = []
    for run in runs:
        name = run.name.removeprefix("run_")
        steps = read_run_steps(run, "sitting")
        rows.append({"run": name, **run_parts(model, steps, expected.get(name), timeline)})
    return rows


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m experiments.bench.cpu_error_parts", description=__doc__.split("\n")[0]
    )
    parser.add_argument("sitting", type=Path, help="a cpu_cross_run --out directory")
    parser.add_argument("--fit-on", default="s", help="the run whose model prices (default s)")
    parser.add_argument("--profile-from", type=Path, nargs="+", metavar="DIR",
                        help="price on the geometric mean of these profiles")  # fmt: skip
    parser.add_argument("--timed", action="store_true",
                        help="each step at the machine's speed where it fell")  # fmt: skip
    parser.add_argument("--out", type=Path, help="CSV (default SITTING_DIR/error_parts"
                        "[_timed][_pooled].csv, by --timed and --profile-from)")  # fmt: skip
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            profile = pooled_profile(args.profile_from, Path(tmp)) if args.profile_from else None
            rows = error_parts(args.sitting, args.fit_on, profile, args.timed)
        except ConfigError:
            raise  # its own one line
        except ValueError as exc:  # e.g. a --profile-from of another model than the sitting's
            parser.error(str(exc).splitlines()[0])
    on = f"pooled from {len(args.profile_from)} profiles" if args.profile_from else "its profile"
    speed = "at the sitting's speed" if args.timed else "as is"
    print_table(f"{args.sitting}: model fitted on {args.fit_on}, on {on}, {speed}", rows)
    name = (
        "error_parts" + ("_timed" if args.timed else "") + ("_pooled" if args.profile_from else "")
    )
    out = args.out or args.sitting / f"{name}.csv"
    write_csv(out, rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
