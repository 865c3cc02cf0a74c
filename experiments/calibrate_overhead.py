"""``python -m experiments.calibrate_overhead RUN_DIR [RUN_DIR ...] --out FILE``: fit the
framework-overhead model to kvlab's own engine.

Each ``RUN_DIR`` is an engine run (``experiments.serve`` or ``experiments.bench.engine_gpu``)
whose ``steps.csv`` holds the per-step phase columns (phase timing is on by default on CPU;
``time_phases=true`` on CUDA). The fit (:func:`sim.cost.stack_file.fit_measured_overhead`)
is ``a + b × sequences`` over the median CPU seconds per step (schedule + prepare + sample
+ output) by number of sequences, on a stated split: ``--split half`` (default: each run's
first half of steps trains, the second half is held out) or ``--split runs`` (the last
run is held out). Prints the points with the fit and its error, and writes ``FILE``, which
a simulator run takes as ``cost.stack=measured cost.stack_path=FILE`` (with ``cost=roofline``
or ``cost=profiled``); the measured stack keeps ``--base``'s other terms (per-block gather,
per-copy latencies). ``--dry`` (``gpu_all.sh``'s CPU check of itself): the runs' timings
are meaningless, so a fit they cannot support (too few or too noisy points) is reported and
exits 0 without a file; a missing run or phase column still fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.bench.tables import print_table
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import check_out_file, plain_cli
from experiments.lib.inputs import read_run_steps
from experiments.lib.results import write_json
from sim.cost.overhead import STACKS
from sim.cost.stack_file import (
    SPLITS,
    UnsupportedFit,
    fit_measured_overhead,
    fit_source,
    load_stack_file,
)


def read_steps(run_dir: Path) -> pd.DataFrame:
    return read_run_steps(run_dir)


def measured_on(run_dirs: list[Path]) -> str | None:
    """The device the runs' ``engine.json`` names, with the step timer when it is not the
    wall clock; runs measured on different devices or with different timers are a
    ConfigError (one fit of their CPU times would describe no machine)."""
    names = []
    for run_dir in run_dirs:
        doc = Path(run_dir) / "engine.json"
        if doc.is_file():
            try:
                engine = json.loads(doc.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ConfigError(str(doc), f"not a JSON document ({exc})") from None
            if not isinstance(engine, dict):
                raise ConfigError(str(doc), "not a JSON object")
            name = str(engine.get("device") or "?")
            if engine.get("step_timer", "wall") != "wall":
                name += f" ({engine['step_timer']} timer)"
            if name not in names:
                names.append(name)
    if len(names) > 1:
        raise ConfigError(
            "run_dirs", "the runs were measured on different devices or step timers ("
            + ", ".join(names) + "): give runs of one device and timer",
        )  # fmt: skip
    return names[0] if names else None


def calibrate_overhead(
    run_dirs: list[Path], split: str = "half", min_steps: int = 5, base: str = "vllm-2023"
) -> dict[str, Any]:
    """The stack file's document for ``run_dirs`` (see the module doc)."""
    if base not in STACKS or STACKS[base].cpu is None:
        known = ", ".join(k for k, s in STACKS.items() if s.cpu is not None)
        raise ConfigError("--base", "not a stack preset with CPU costs", base, known)
    device = measured_on(run_dirs)  # before the fit: runs of two machines are not fitted
    runs = [(Path(d).name, read_steps(d)) for d in run_dirs]
    got = " ".join(map(str, run_dirs))
    try:
        doc = fit_measured_overhead(runs, split, min_steps)
    except UnsupportedFit as exc:
        raise ConfigError("fit", str(exc), got) from None
    except ValueError as exc:
        raise ConfigError("run_dir", str(exc), got) from None
    doc["base"] = base
    doc["measured_on"] = device
    doc["fit"]["source"] = fit_source(doc)
    return doc


def point_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    cpu = doc["cpu"]
    rows = []
    for part in ("train", "heldout"):
        for seqs, median, steps in doc["fit"]["points"][part]:
            fitted = cpu["per_step_s"] + cpu["per_seq_s"] * seqs
            rows.append({
                "part": part, "seqs": seqs, "steps": steps, "measured_ms": median * 1e3,
                "fit_ms": fitted * 1e3, "rel_err": abs(fitted - median) / median,
            })  # fmt: skip
    return rows


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.calibrate_overhead", description=__doc__)
    parser.add_argument("run_dirs", type=Path, nargs="+", help="engine run directories")
    parser.add_argument("--out", type=Path, required=True, help="the stack file to write")
    parser.add_argument("--split", choices=SPLITS, default="half")
    parser.add_argument("--min-steps", type=int, default=5, help="steps per point, at least")
    parser.add_argument("--base", default="vllm-2023", help="preset whose other terms to keep")
    parser.add_argument("--dry", action="store_true", help="meaningless timings: a failed fit")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.min_steps < 1:
        parser.error(f"--min-steps must be >= 1, got {args.min_steps}")
    check_out_file(args.out)
    try:
        doc = calibrate_overhead(args.run_dirs, args.split, args.min_steps, args.base)
    except ConfigError as exc:
        if not (args.dry and exc.key == "fit"):
            raise
        print(f"dry: no fit on these timings ({exc}); nothing written")
        return 0
    print_table("CPU ms per step (median by sequences) and the fit", point_rows(doc))
    write_json(args.out, doc)
    stack = load_stack_file(args.out)  # what the simulator will read
    cpu = stack.cpu
    assert cpu is not None
    print(f"\ncpu per step = {cpu.per_step_s * 1e3:.4g} ms + {cpu.per_seq_s * 1e6:.4g} us x "
          f"sequences\n{cpu.source}\nwrote {args.out} "
          f"(cost.stack=measured cost.stack_path={args.out})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
