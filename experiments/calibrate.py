"""``python -m experiments.calibrate RUN_DIR [--out FILE] [--weighting absolute|relative]
[--profile PROFILE]``: fit the simulator's step-time model to an engine run.

``RUN_DIR`` is a directory written by ``experiments.serve`` (or ``experiments.bench.engine_gpu``):
``config.yaml`` names the model, the hardware label, the dtype and the block size;
``steps.csv`` holds every step's shape and measured ``duration_s``. The fit is
:meth:`sim.cost.CalibratedCostModel.fit` (non-negative least squares on roofline basis
terms of the named hardware: on another device the coefficients absorb the difference;
``--weighting relative`` fits relative step errors, so short decode steps weigh as much as
long prefills; ``--profile`` takes the operators' times from an operator profile of the same
model measured on the same device, ``experiments.bench.profile_gpu``, and fits only the
per-step and per-sequence terms on top).
Prints the coefficients, R² and MAPE and writes ``calibration.json`` (default: in
``RUN_DIR``; the profile's path in it is relative to the file, so the two can move
together), which ``experiments.validate`` and a simulate config's ``cost`` group
(``kind: calibrated``) read. A plain argparse CLI (the input is a run directory, not a
config tree).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from core.systems import SystemConfigError, load_plugin
from experiments.lib.args import OneLineParser
from experiments.lib.checks import DTYPE_BYTES, ConfigError, check_values
from experiments.lib.cli import check_out_file, plain_cli
from experiments.lib.inputs import read_json, read_run_steps, reading
from experiments.lib.results import write_json
from experiments.lib.setup import block_size
from sim.catalog import GPUSpec, model_from_config, resolve_gpu
from sim.cost import CalibratedCostModel
from sim.cost.calibrated import TARGETS, WEIGHTINGS
from sim.cost.profile import read_profile
from sim.cost.profiled import ProfiledCostModel


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The resolved ``config.yaml`` of an engine run directory, as a plain dict; a value
    that breaks its key's rule (:func:`experiments.lib.checks.check_values`, as ``serve``
    checked it) is a ConfigError on that key naming the file. A run of a policy plugin
    (``system.plugin``) has it imported, so its system is known here as it was to
    ``serve``."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError("run_dir", "not a run directory: no config.yaml", str(run_dir))
    with reading(path, "run_dir"):
        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(cfg, dict) or not {"model", "system"} <= set(cfg):
        raise ConfigError("run_dir", "config.yaml lacks the model and system groups", str(path))
    try:
        check_values(cfg, "serve")
    except ConfigError as err:
        raise ConfigError(err.key, f"{path}: {err.problem}", err.got, err.expected) from None
    try:
        load_plugin(cfg["system"].get("plugin"))
    except SystemConfigError as exc:
        raise ConfigError("system.plugin", f"{path}: {exc}") from None
    return cfg  # type: ignore[return-value]


def run_identity(cfg: dict[str, Any]) -> tuple[Any, GPUSpec, int]:
    """The run's model spec, GPU (its config's hardware group: a catalog entry, or the
    numbers the run carried for a GPU of the user's own) and tensor-parallel size; one-line
    errors naming the key."""
    group = cfg.get("hardware") or {}
    if group.get("name") is None:
        raise ConfigError("hardware.name", "the run's config.yaml names no hardware", None)
    try:
        hardware = resolve_gpu(group)
    except (KeyError, ValueError) as exc:
        raise ConfigError("hardware", f"the run's config.yaml: {exc.args[0]}") from None
    try:
        model = model_from_config(cfg["model"])
    except (KeyError, ValueError) as exc:  # a KeyError's str() is quoted: take its message
        raise ConfigError("model", f"the run's config.yaml: {exc.args[0]}") from None
    try:
        tp = int(cfg["model"].get("tp", 1))
    except (TypeError, ValueError):
        raise ConfigError("model.tp", "not a GPU count", cfg["model"].get("tp")) from None
    return model, hardware, tp


def dtype_bytes(cfg: dict[str, Any]) -> int:
    name = str(cfg.get("dtype", "float32"))
    if name not in DTYPE_BYTES:
        raise ValueError(f"run dtype {name!r} is not one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def calibrate(
    run_dir: Path, weighting: str = "absolute", profile: str | None = None, target: str = "step"
) -> CalibratedCostModel:
    """The calibrated cost model fitted to ``run_dir``'s ``steps.csv`` (``weighting``: one
    of :data:`sim.cost.calibrated.WEIGHTINGS`; ``profile``: an operator profile of the
    run's model on its device; ``target``: one of :data:`sim.cost.calibrated.TARGETS`; see
    :meth:`sim.cost.CalibratedCostModel.fit`)."""
    cfg = read_run_config(run_dir)
    steps_path = Path(run_dir) / "steps.csv"
    if not steps_path.is_file():
        raise ConfigError("run_dir", "no steps.csv to fit", str(run_dir))
    if read_engine_json(run_dir) is None:
        raise ConfigError(
            "run_dir", "no engine.json: not an engine run (a simulator run's step times are "
            "its own cost model's, nothing to fit)", str(run_dir),
        )  # fmt: skip
    model, hardware, tp = run_identity(cfg)
    blocks, width = block_size(cfg["system"]), dtype_bytes(cfg)
    if profile is not None:
        check_profile_fits_run(profile, cfg, model, hardware, tp, width, blocks)
    steps = read_run_steps(run_dir)
    if "duration_s" not in steps.columns:
        raise ConfigError("run_dir", f"{steps_path}: no column duration_s")
    if target == "host" and "forward_s" not in steps.columns:
        raise ConfigError(
            "--target", "host needs each step's forward_s (the engine's phase timing), which "
            "this run's steps.csv lacks", str(steps_path),
        )  # fmt: skip
    try:
        return CalibratedCostModel.fit(
            steps,
            model,
            hardware,
            tp=tp,
            dtype_bytes=width,
            block_size=blocks,
            weighting=weighting,
            profile=profile,
            target=target,
        )
    except ValueError as exc:  # too few steps, missing columns: this run cannot be fitted
        raise ConfigError("run_dir", f"{steps_path}: {exc}") from None


def check_profile_fits_run(
    profile: str, cfg: dict[str, Any], model: Any, hardware: GPUSpec, tp: int, width: int,
    blocks: int,
) -> None:  # fmt: skip
    """Refuse, in one line naming ``--profile``, a profile that is not of this run: another
    model, tp or device (:class:`ProfiledCostModel`), dtype or block size, or another clock
    (a CPU profile times one thread's CPU time, so the run must be served with
    ``threads=1 step_timer=thread_cpu``)."""
    try:
        prof = read_profile(profile, tp)
        # priced at its own width here, so that a dtype of another name is said below
        own = DTYPE_BYTES.get(str(prof.meta.get("dtype")), width)
        ops = ProfiledCostModel(prof, model, hardware, tp, own, blocks, as_measured=True)
    except ValueError as err:  # unreadable, malformed, of another model or device
        raise ConfigError("--profile", str(err)) from None
    prof, src = ops.profile, ops.profile.source
    run_dtype = str(cfg.get("dtype", "float32"))
    if prof.meta.get("dtype") not in (None, run_dtype):
        raise ConfigError(
            "--profile", f"{src} was measured in {prof.meta['dtype']}, the run in {run_dtype}"
        )
    if prof.block_size not in (None, blocks):
        raise ConfigError(
            "--profile", f"{src} was measured at block size {prof.block_size}, the run at {blocks}"
        )
    timer = (cfg.get("step_timer") or "wall", cfg.get("threads"))
    if prof.gpu == "cpu" and timer != ("thread_cpu", 1):
        raise ConfigError(
            "--profile",
            f"{src} times one thread's CPU time; the run was served with step_timer="
            f"{timer[0]}, threads={timer[1]} (serve with threads=1 step_timer=thread_cpu)",
        )


def read_engine_json(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``engine.json`` (None without one); an unreadable one is a ConfigError."""
    path = Path(run_dir) / "engine.json"
    if not path.is_file():
        return None
    doc = read_json(path, "run_dir")
    if not isinstance(doc, dict):
        raise ConfigError("run_dir", f"{path}: not a JSON object")
    return doc


def calibration_doc(model: CalibratedCostModel, run_dir: Path) -> dict[str, Any]:
    """``model.to_dict()`` plus where the measurements came from."""
    doc = model.to_dict()
    doc["source_run"] = Path(run_dir).name
    engine = read_engine_json(run_dir)
    if engine is not None:
        doc["measured_on"] = engine.get("device")
        doc["step_timer"] = engine.get("step_timer", "wall")
    return doc


# a fit that misses the steps by more than this on average (a round choice, not fitted; the
# CPU engine's fits in docs/validation/cpu-engine.md miss by 3.7-11.9% in-sample)
SCATTERED_MAPE = 0.5


def scatter_warning(mape: Any, doc: Mapping[str, Any]) -> str | None:
    """A warning line when the fit's mean relative error exceeds :data:`SCATTERED_MAPE`:
    step times that scatter so much are another process's time in the run's steps (a
    shared CPU, torch's threads competing), which no step-time terms express; for a CPU run
    timed by the wall clock, how to time it instead. None for a closer fit."""
    if not isinstance(mape, float) or not mape > SCATTERED_MAPE:
        return None
    how = "run it again on an idle machine"
    if doc.get("measured_on") == "cpu" and doc.get("step_timer", "wall") == "wall":
        how = ("serve it again with threads=1 step_timer=thread_cpu (the engine thread's CPU "
               "time, which other processes do not inflate)")  # fmt: skip
    return (
        f"warning: the fit misses the run's steps by {mape:.0%} on average: its step times "
        f"scatter more than step-time terms can express, as when other work shares the "
        f"machine; {how}"
    )


def check_measured_alike(calibration: Mapping[str, Any], run_dir: Path, key: str) -> None:
    """A calibration fitted on steps measured on another device, or with another step
    timer, than the run ``run_dir`` is a ConfigError under ``key``: its constants are
    another machine's (or clock's) times. Nothing is checked where either side does not
    record it (a calibration from before the timer was recorded, a run without
    ``engine.json``)."""
    engine = read_engine_json(run_dir)
    if engine is None:
        return
    ours = {"measured_on": engine.get("device"), "step_timer": engine.get("step_timer", "wall")}
    for field, what in (("measured_on", "device"), ("step_timer", "step timer")):
        theirs = calibration.get(field)
        if theirs is not None and ours[field] is not None and theirs != ours[field]:
            raise ConfigError(
                key, f"fitted on steps of another {what} ({theirs}); this run's is "
                f"{ours[field]}", theirs, "a calibration measured as this run was",
            )  # fmt: skip


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.calibrate", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="an engine run directory")
    parser.add_argument("--out", type=Path, default=None, help="default RUN_DIR/calibration.json")
    parser.add_argument(
        "--weighting",
        choices=WEIGHTINGS,
        default="absolute",
        help="absolute: squared error in seconds (long steps dominate); relative: squared "
        "relative error (every step counts alike)",
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="an operator profile (directory or operator_profile.csv) of the run's model on "
        "the run's device: operator times from it, per-step terms fitted on top",
    )
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="step",
        help="with --profile: step fits the per-step terms to what the profile leaves of each "
        "step's time; host fits them to the time outside the forward (the engine's phase "
        "timing), the framework overhead they stand for",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.target == "host" and args.profile is None:
        parser.error("--target host fits on top of an operator profile; give --profile")
    if not args.run_dir.is_dir():  # else a file here is named as --out, its default's parent
        raise ConfigError("run_dir", "not a run directory (no such folder)", str(args.run_dir))
    check_out_file(args.out or args.run_dir / "calibration.json")
    model = calibrate(args.run_dir, args.weighting, args.profile, args.target)
    print(model.describe())
    r2 = model.fit_stats.get("r2")
    if isinstance(r2, float) and r2 < 0:
        print(f"warning: R² = {r2:.3f} < 0: the fitted steps are priced worse than by their "
              "mean; this run's steps are not what these terms can express (try --weighting, "
              "--target host, or a run with more varied batches)", file=sys.stderr)  # fmt: skip
    out = args.out or args.run_dir / "calibration.json"
    doc = calibration_doc(model, args.run_dir)
    scatter = scatter_warning(model.fit_stats.get("mape"), doc)
    if scatter is not None:
        print(scatter, file=sys.stderr)
    if doc.get("profile"):  # relative to the file: the folder can move to another machine
        doc["profile"] = os.path.relpath(Path(doc["profile"]).resolve(), out.resolve().parent)
    write_json(out, doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
