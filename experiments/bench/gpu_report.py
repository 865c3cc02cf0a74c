"""What one ``experiments/gpu_all.sh`` call measured, read back on any machine:
``python -m experiments.bench.gpu_report GPU_DIR --out DIR``.

``GPU_DIR`` is the call's output directory (``kvlab-gpu.tar.gz`` unpacked: ``profile/``,
``engine/``). Nothing here needs a GPU. Writes into ``DIR`` (printed as tables too):

- ``operators.csv``: GPU seconds of prefill steps (one sequence of N tokens) and decode
  steps (B sequences of C tokens of context) of the profile's model on the profile's GPU,
  priced three ways, no framework cost (``stack=none``): ``measured`` (``cost=profiled``
  on this profile, as measured); ``transferred`` (``cost=profiled`` on the profile kvlab
  ships, Vidur's A100 Llama-2-7B operators, carried to this model and GPU by the roofline
  ratio: its default, which never saw this GPU); ``roofline`` (datasheet peaks at the
  efficiency factors of ``cost=roofline``). Each with its error against ``measured``.
- ``forward_gap.csv``: per engine run of the profile's model, its decode-only steps by
  sequences in the step: medians of the measured forward (``forward_s``), of the profile's
  price of the step, of the gap between them, of the time outside the forward, and of the
  host's time in the forward call (``forward_issue_s``, where the run recorded it). The
  profile times operators with launch overhead hidden, so a forward far above its price and
  flat in the batch was bound by something on the host (``experiments.bench.sync_check``
  tells launches from waits inside the call). ``outside_forward_ms`` is the rest of the
  step's ``duration_s``: transfers, input preparation and the sampler (schedule and output
  processing run between steps and are not in it).
- ``speed.csv``: per run, each decode-only step's measured time over the profile's price
  (:func:`experiments.bench.cpu_cross_run.speed_drift`), median and the range of its
  100-step windows: how far the step time moved within a run at one batch shape.
- ``stalls.csv``: per engine run (every model), steps that took over ``STALL_FACTOR`` times
  the run's median step: how many, and the seconds they took beyond the median, against
  the run's whole time (a Triton compile, a pause of the host). Runs with no steps are
  left out of every table.
- ``cross_run.csv``: the calibrated model (operator times from the profile, per-step terms
  fitted on top, relative weighting: ``experiments.calibrate --profile --weighting
  relative``) fitted on each run of the profile's model and simulated on each run
  (``experiments.validate``); a row whose ``fit_run`` is its ``run`` is in-sample.
- ``sync_sites.csv`` and ``sync_slept.csv``, when the call ran ``sync``
  (``sync/sync_check.json``, :mod:`experiments.bench.sync_check`): the synchronizing
  operations torch reported inside the forward, by kvlab source line; and per step served
  behind a GPU sleep, the sleep, the host's return from the forward call and the device's
  end, in milliseconds. ``waited`` is whether the forward call returned only after the
  sleep had ended: the host waited for the device inside the call (a host that only queues
  the kernels returns in its launch time, a few ms).
- ``host_time.csv``, when the call ran ``host`` (``host/host_time.csv``,
  :mod:`experiments.bench.host_time`): the host's time inside the forward by part, medians
  by run and step kind, with the steps whose linear calls took extra time and the stalls.
- ``report.json``: all of the above, with the sources.

The GPU the profile is priced on is the catalog's entry for the device the sidecar names
(``gpu``, as ``torch.cuda.get_device_name`` reported it; a hardware YAML's
``device_names``), or ``--hardware NAME``: for a device no YAML names, whose profile is then
used as measured on that GPU, and for a dry run's output (its sidecar's ``gpu`` is the CPU;
without ``--hardware`` it is priced as the dry engine runs were served,
``experiments.bench.engine_gpu.NOMINAL_GPU``: its numbers mean nothing either way). The
width of an element is the sidecar's ``dtype``'s; a profile of another width than the
shipped one (fp16) has no ``transferred`` prices. A call without a profile, or whose profile
its time limit cut short (``complete`` false in the sidecar), gets the tables that do not
price with it (stalls, sync, host time); the others (``PROFILE_TABLES``) are empty, and a
printed note says why.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from core.plan import BatchShape
from experiments.bench.cpu_cross_run import KEYS, metric_rows, speed_drift
from experiments.bench.tables import print_table, write_csv
from experiments.lib.args import OneLineParser
from experiments.lib.checks import DTYPE_BYTES, ConfigError
from experiments.lib.cli import check_out_dir, plain_cli
from experiments.lib.inputs import read_run_steps
from experiments.lib.results import write_json

REPO = Path(__file__).resolve().parents[2]
SHIPPED_PROFILE = "sim/cost/profiles/vidur-a100-llama-2-7b"  # from the repository root
PREFILL_TOKENS = (16, 128, 512, 1024, 2048)
DECODE_SHAPES = tuple((b, c) for b in (1, 8, 32, 128) for c in (256, 1024))
SEQ_BINS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)
# A Triton compile (0.3-0.7 s) is 10-70x the H200 engine's 9-27 ms steps, while its
# largest prefill steps (2,560 batched tokens, ~110 ms in the profile) stay under 10x
# (docs/validation/h200.md).
STALL_FACTOR = 10.0
TABLES = ("operators", "forward_gap", "speed", "stalls", "cross_run", "sync_sites", "sync_slept",
          "host_time")  # fmt: skip
PROFILE_TABLES = ("operators", "forward_gap", "speed", "cross_run")  # they price with it
STEP_COLUMNS = ("duration_s", "prefill_tokens", "decode_seqs")  # what every table reads


@dataclass(frozen=True)
class Pricing:
    """How the profile is priced: its model, the catalog GPU, the element width (bytes),
    the block size, and whether the profile is used as measured on that GPU (its device
    has no catalog entry) rather than carried to it from its own."""

    model: str
    gpu: str
    width: int
    block: int
    as_measured: bool


def pricing(meta: dict[str, Any], hardware: str | None) -> Pricing:
    """The :class:`Pricing` of a profile's sidecar ``meta`` (module doc); ``hardware`` is
    ``--hardware``: a ConfigError on it when it is not a catalog GPU, or another GPU than
    the one the profile's device is."""
    from experiments.bench.engine_gpu import NOMINAL_GPU
    from sim.catalog import get_gpu

    try:
        known: str | None = get_gpu(str(meta["gpu"])).name
    except KeyError:
        known = None
    if hardware is not None:
        try:
            gpu = get_gpu(hardware).name
        except KeyError as exc:
            raise ConfigError("--hardware", str(exc.args[0])) from None
        if known not in (None, gpu):
            raise ConfigError("--hardware", f"the profile was measured on {known}", hardware)
    elif known is not None or meta.get("dry") is True:
        gpu = known or NOMINAL_GPU
    else:
        raise ConfigError(
            "--hardware", f"the profile's device {meta['gpu']!r} is in no hardware YAML's "
            "device_names: name the catalog GPU to price it on",
        )  # fmt: skip
    width = DTYPE_BYTES.get(str(meta.get("dtype")), 2)
    return Pricing(str(meta["model"]), gpu, width, int(meta["block_size"]), known is None)


def operator_rows(profile_dir: Path, p: Pricing) -> list[dict[str, Any]]:
    """GPU milliseconds of each probe shape, measured / transferred / roofline (module doc);
    no transferred prices (None) for a profile of another width than the shipped one."""
    from sim.cost.profile import read_profile
    from sim.cost.profiled import ProfiledCostModel
    from sim.cost.roofline import RooflineCostModel

    args = (p.model, p.gpu, 1, p.width, p.block)
    measured = ProfiledCostModel(str(profile_dir), *args, stack=None, as_measured=p.as_measured)
    shipped = REPO / SHIPPED_PROFILE
    transferred = None
    if DTYPE_BYTES.get(str(read_profile(shipped).meta.get("dtype"))) == p.width:
        transferred = ProfiledCostModel(str(shipped), *args, stack=None)
    roofline = RooflineCostModel(p.model, p.gpu, 1, p.width, block_size=p.block)
    shapes = [("prefill", n, n, BatchShape(prefill_tokens=n, prefill_seqs=1,
                                           prefill_attn_pairs=n * (n + 1) // 2))
              for n in PREFILL_TOKENS]  # fmt: skip
    shapes += [("decode", b, c, BatchShape(decode_seqs=b, decode_ctx_tokens=b * c))
               for b, c in DECODE_SHAPES]  # fmt: skip
    rows = []
    for kind, count, context, shape in shapes:
        m = measured.gpu_seconds(shape) * 1e3
        t = None if transferred is None else transferred.gpu_seconds(shape) * 1e3
        r = roofline.step_time(shape) * 1e3
        rows.append({
            "step": kind, "seqs_or_tokens": count, "context": context, "measured_ms": m,
            "transferred_ms": t, "transferred_err": None if t is None else t / m - 1,
            "roofline_ms": r, "roofline_err": r / m - 1,
        })  # fmt: skip
    return rows


def runs_with_steps(engine_dir: Path) -> dict[Path, pd.DataFrame]:
    """Every engine run under ``engine_dir`` whose ``steps.csv`` holds a step, by name, with
    its steps (read once here for every table); a ConfigError naming the file for one
    without a column of ``STEP_COLUMNS``."""
    found = {}
    for run in sorted(engine_dir.iterdir()):
        if (run / "steps.csv").is_file():
            steps = read_run_steps(run, "engine")
            missing = [c for c in STEP_COLUMNS if c not in steps]
            if missing:
                raise ConfigError("engine", f"{run / 'steps.csv'}: no column {missing[0]}")
            if len(steps):
                found[run] = steps
    return found


def model_runs(steps: dict[Path, pd.DataFrame], model: str) -> list[Path]:
    """The finished runs (a ``metrics.json``) among ``steps``' of ``model``, by name."""
    from experiments.calibrate import read_run_config

    return [run for run in steps if (run / "metrics.json").is_file()
            and read_run_config(run).get("model", {}).get("name") == model]  # fmt: skip


def forward_gap_rows(run: Path, steps: pd.DataFrame, priced: Any) -> list[dict[str, Any]]:
    """Decode-only steps of ``run`` by sequence bin: forward against the profile's price."""
    decode = steps[(steps["prefill_tokens"] == 0) & (steps["decode_seqs"] > 0)].copy()
    if decode.empty or "forward_s" not in decode:
        return []
    decode["profile_s"] = priced.profile_seconds(decode)
    decode["host_s"] = decode["duration_s"] - decode["forward_s"]
    decode["bin"] = pd.cut(decode["decode_seqs"], SEQ_BINS)
    rows = []
    for interval, g in decode.groupby("bin", observed=True):
        row = {
            "run": run.name, "seqs": f"{interval.left + 1}-{interval.right}", "steps": len(g),
            "forward_ms": g["forward_s"].median() * 1e3,
            "profile_ms": g["profile_s"].median() * 1e3,
            "gap_ms": (g["forward_s"] - g["profile_s"]).median() * 1e3,
            "outside_forward_ms": g["host_s"].median() * 1e3,
        }  # fmt: skip
        if "forward_issue_s" in g:
            row["forward_issue_ms"] = g["forward_issue_s"].median() * 1e3
        rows.append(row)
    return rows


def stall_row(run: Path, steps: pd.DataFrame) -> dict[str, Any]:
    """Steps of ``run`` over ``STALL_FACTOR`` times its median step (module doc)."""
    d = steps["duration_s"]
    median = float(d.median())
    over = d[d > STALL_FACTOR * median]
    excess = float((over - median).sum())
    return {
        "run": run.name, "steps": len(d), "median_step_ms": median * 1e3, "stalls": len(over),
        "stall_excess_s": excess, "run_s": float(d.sum()), "share": excess / float(d.sum()),
    }  # fmt: skip


def cross_run_rows(fitted: dict[Path, Any]) -> list[dict[str, Any]]:
    """Each run's calibrated model (``fitted``: run -> model) simulated on each run: the
    ``KEYS`` errors."""
    from experiments.calibrate import calibration_doc
    from experiments.validate import validate

    runs = list(fitted)
    rows = []
    for fit, model in fitted.items():
        doc = calibration_doc(model, fit)
        for run in runs:
            res = validate(run, doc)
            row: dict[str, Any] = {"fit_run": fit.name, "run": run.name}
            row.update({r["metric"]: r["rel_err"] for r in metric_rows(res)})
            rows.append(row)
    return rows


def sync_tables(gpu_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The sync check's sites and slept steps (module doc); empty when it did not run."""
    path = gpu_dir / "sync" / "sync_check.json"
    if not path.is_file():
        return [], []
    try:
        doc = json.loads(path.read_text())
        sites = [{"site": str(k), "count": int(v)} for k, v in doc["sync_sites"].items()]
        slept = [
            {"tokens": int(s["tokens"]), "sleep_ms": float(s["sleep_ms"]),
             "issue_ms": float(s["issue_ms"]), "total_ms": float(s["total_ms"]),
             "waited": float(s["issue_ms"]) >= float(s["sleep_ms"])}
            for s in doc["slept_steps"]
        ]  # fmt: skip
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # JSONDecodeError too
        raise ValueError(f"{path}: not a sync_check.json ({type(exc).__name__}: {exc})") from None
    return sites, slept


def host_time_rows(gpu_dir: Path) -> list[dict[str, Any]]:
    """The host-time summary (module doc); empty when the call did not run ``host``."""
    from experiments.bench.host_time import UNREADABLE, summarize

    path = gpu_dir / "host" / "host_time.csv"
    if not path.is_file():
        return []
    try:
        return summarize(pd.read_csv(path)).to_dict("records")
    except UNREADABLE as exc:
        raise ValueError(f"{path}: not a host_time.csv ({type(exc).__name__}: {exc})") from None


def _complete(sidecar: Any) -> Any:
    """A sidecar's ``complete`` (None when it has none, or is not a JSON object: its
    reader then says what is wrong with it)."""
    return sidecar.get("complete") if isinstance(sidecar, dict) else None


def profile_problem(profile_dir: Path) -> str | None:
    """Why the call's profile cannot price the tables (none written, or its time limit cut
    it short: ``complete`` false in its sidecar), or None: it can (module doc)."""
    from experiments.lib.inputs import read_json

    side = profile_dir / "operator_profile.json"
    if not side.is_file() and not (profile_dir / "operator_profile.csv").is_file():
        return f"no {profile_dir.name}/operator_profile.json (the profile part wrote none)"
    if side.is_file() and _complete(read_json(side, "profile")) is False:
        return f"{profile_dir.name}/operator_profile.json says complete: false (cut short)"
    return None


def profile_tables(
    profile_dir: Path, steps: dict[Path, pd.DataFrame], hardware: str | None
) -> dict[str, Any]:
    """The profile's sidecar, pricing and runs, and the ``PROFILE_TABLES`` (module doc)."""
    from experiments.calibrate import calibrate
    from sim.cost.profile import read_kvlab_profile

    meta = read_kvlab_profile(profile_dir / "operator_profile.csv").meta
    p = pricing(meta, hardware)
    runs = model_runs(steps, p.model)
    doc: dict[str, Any] = {
        "profile": meta, "hardware": p.gpu, "profile_as_measured": p.as_measured,
        "runs": [r.name for r in runs], "operators": operator_rows(profile_dir, p),
        "forward_gap": [], "speed": [],
    }  # fmt: skip
    fitted = {run: calibrate(run, weighting="relative", profile=str(profile_dir)) for run in runs}
    for run, priced in fitted.items():
        doc["forward_gap"] += forward_gap_rows(run, steps[run], priced)
        drift = speed_drift(priced, steps[run])
        doc["speed"].append({"run": run.name, **{k: v for k, v in drift.items() if k != "windows"}})
    doc["cross_run"] = cross_run_rows(fitted)
    return doc


def report(gpu_dir: Path, out: Path, hardware: str | None = None) -> dict[str, Any]:
    """Every table of the module doc for ``gpu_dir``, written into ``out``; ``hardware`` is
    ``--hardware`` (:func:`pricing`). Without a usable profile (:func:`profile_problem`)
    the ``PROFILE_TABLES`` are empty and ``skipped`` says why; without ``engine/`` there
    are no runs. A ConfigError when there is neither: not a gpu_all.sh output."""
    profile_dir, engine_dir = gpu_dir / "profile", gpu_dir / "engine"
    problem = profile_problem(profile_dir)
    if problem is not None and not engine_dir.is_dir():
        raise ConfigError("gpu_dir", "neither a profile nor engine/: not a gpu_all.sh output",
                          str(gpu_dir))  # fmt: skip
    steps = runs_with_steps(engine_dir) if engine_dir.is_dir() else {}
    doc: dict[str, Any] = {"gpu_dir": gpu_dir.name, "transferred_from": SHIPPED_PROFILE}
    if problem is None:
        doc.update(profile_tables(profile_dir, steps, hardware))
    else:
        doc.update({"profile": None, "hardware": hardware, "runs": []})
        doc.update({name: [] for name in PROFILE_TABLES})
    doc["skipped"] = None if problem is None else {"tables": PROFILE_TABLES, "why": problem}
    doc["stalls"] = [stall_row(run, frame) for run, frame in steps.items()]
    doc["sync_sites"], doc["sync_slept"] = sync_tables(gpu_dir)
    doc["host_time"] = host_time_rows(gpu_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        write_csv(out / f"{name}.csv", doc[name])
    write_json(out / "report.json", doc)
    return doc


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.bench.gpu_report",
                                     description=__doc__)  # fmt: skip
    parser.add_argument("gpu_dir", type=Path, help="gpu_all.sh's output directory")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--hardware", help="catalog GPU to price the profile on (module doc)")
    args = parser.parse_args(argv)
    check_out_dir(args.out)
    try:
        doc = report(args.gpu_dir, args.out, args.hardware)
    except ConfigError:
        raise  # one line of its own (plain_cli)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {args.gpu_dir}: {exc}", file=sys.stderr)
        return 2
    if doc["skipped"]:
        print(f"note: {doc['skipped']['why']}: tables {', '.join(PROFILE_TABLES)} skipped")
    else:
        model = doc["profile"]["model"]
        dry = " (dry run on CPU: meaningless)" if doc["profile"].get("dry") is True else ""
        print_table(f"step GPU time, {model} on {doc['hardware']}{dry}", doc["operators"])
    print_table("decode forward against the profile's price", doc["forward_gap"])
    print_table("step time over the profile's price (decode-only steps)", doc["speed"])
    print_table(f"steps over {STALL_FACTOR:g}x the run's median step", doc["stalls"])
    print_table(f"calibrated on one run, simulated on each ({', '.join(KEYS)})", doc["cross_run"])
    print_table("synchronizing operations inside the forward (sync check)", doc["sync_sites"])
    print_table("forward behind a GPU sleep: did the host wait? (sync check)", doc["sync_slept"])
    print_table("host ms inside the forward by part (host_time)", doc["host_time"])
    print(f"wrote {args.out}/{{{','.join(TABLES)}}}.csv, report.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
