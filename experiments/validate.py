"""``python -m experiments.validate RUN_DIR [--calibration FILE] [--recorded] [--out FILE]``:
the simulator's prediction of an engine run beside the engine's measurement.

The simulator runs the run's workload (rebuilt from its ``config.yaml`` exactly as
``experiments.serve`` built it: same model vocabulary, ``max_model_len`` and seed; offline
runs put every arrival at 0) on the same policy with the engine's KV cache (slots and CPU
swap slots from ``engine.json``), priced by a cost model:

- default: the calibrated model in ``calibration.json`` (``experiments.calibrate``);
- ``--recorded``: the engine's own step times replayed in order. For a ``clock: virtual``
  run this reproduces the engine exactly (one policy, two bodies: the simulator and the
  engine run the same scheduler objects on the same step times), so every relative error
  is 0 (with beam search, the engine's choices are replayed from the run's ``beams.csv``,
  :mod:`core.beam_log`; a run without one gets the simulator's own, and
  ``validation.json`` says in ``not_exact_because`` that the replay need not match, as it
  does for prefix caching over requests that repeat a prompt sampled alike,
  :func:`repeated_streams`); a wall-clock run has no such identity.

Prints throughput, mean TTFT / TPOT / e2e latency, normalized latency, mean batch size, the
KV cache's token-state share, the preemptions and the prefix cache's hit share of both with
relative errors ``(simulator − engine) / engine`` (n/a where the engine's is 0 and the
simulator's not), and writes
``validation.json`` (default: in ``RUN_DIR``). A plain argparse CLI.

With ``--recorded`` it also compares the schedules (``validation.json``'s ``schedule``,
:mod:`experiments.lib.step_compare`): every step's columns of ``steps.csv`` (batch, queues,
KV; not the clock) and every request's status, first-token and finish steps and
preemptions, and prints the first step and request where they part. Where the replay
should be exact and is not, it says so on stderr and exits with status 1: the policy
decided otherwise in the two bodies. A replay that runs out of recorded steps stops with
one line (status 2) that names where it had parted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from core.beam_log import BeamReplayError, RecordedBeams
from core.kv.block_pool import MAX_BLOCKS
from core.metrics.summary import summarize_recorder
from core.request import Request
from core.seeding import with_drawn_prompt_ids
from core.workload.spec import Workload
from experiments.calibrate import check_measured_alike, read_run_config, run_identity
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError, power_of_two
from experiments.lib.cli import check_out_file, plain_cli
from experiments.lib.inputs import first_line, read_json, read_run_steps, reading
from experiments.lib.provenance import code_version, code_words
from experiments.lib.results import read_metrics, write_csv, write_json
from experiments.lib.setup import (
    build_run_workload,
    check_calibration_fits,
    checked_calibration,
    scheduler_factory,
    served_max_model_len,
)
from experiments.lib.step_compare import compare_schedules, describe
from sim.catalog import model_from_config
from sim.cost import CalibratedCostModel, CostModel, RecordedCostModel
from sim.cost.calibrated import check_step_numbers
from sim.cost.recorded import RecordedStepsExhausted
from sim.driver import SimResult, simulate

METRICS = (
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_e2el_ms",
    "normalized_latency",
    "mean_batch_size",
    # the memory side: what the policy did with the KV cache
    "kv_token_states_pct",
    "num_preemptions",
    "prefix_cache_hit_pct",
)


def run_requests(cfg: Mapping[str, Any], run_dir: Path) -> tuple[list[Request], int]:
    """The run's requests as the engine received them, and the scheduler's max_model_len.
    A trace file that is no longer at its recorded path is looked for, by name, beside the
    run directory (results copied from another machine)."""
    workload, mml = run_workload(cfg, run_dir)
    return workload.requests, mml


def run_workload(cfg: Mapping[str, Any], run_dir: Path) -> tuple[Workload, int]:
    """:func:`run_requests`, with the arrival window the engine's ``offered_rate`` is over
    (the workload's configured window online, None offline, as ``experiments.serve``)."""
    spec = model_from_config(cfg["model"])
    mml = served_max_model_len(cfg["system"], spec)
    workload = dict(cfg["workload"])
    path = workload.get("path")
    if path is not None and not Path(path).exists():
        moved = Path(run_dir).parent / Path(path).name
        if not moved.is_file():
            raise ConfigError(
                "workload.path", "trace not found, nor beside the run", path, str(moved)
            )
        workload["path"] = str(moved)
    loaded = build_run_workload({**cfg, "workload": workload}, mml, vocab_size=spec.vocab_size)
    online = cfg.get("mode", "online") != "offline"
    return Workload(as_served(cfg, loaded.requests), loaded.window_s if online else None), mml


def as_served(cfg: Mapping[str, Any], requests: list[Request]) -> list[Request]:
    """``requests`` as the engine serves them: every arrival at 0 in an offline run."""
    if cfg.get("mode", "online") == "offline":
        return [dataclasses.replace(r, arrival_time=0.0) for r in requests]
    return requests


def simulate_served(
    cfg: Mapping[str, Any],
    requests: list[Request],
    kv: Mapping[str, Any],
    max_model_len: int,
    cost_model: CostModel,
    recorded_beams: RecordedBeams | None = None,
) -> SimResult:
    """Simulate ``requests`` (as served) on the run's policy and on a KV cache of
    ``kv["num_blocks"]`` device and ``kv["num_cpu_blocks"]`` CPU blocks of
    ``kv["block_size"]`` slots (``engine.json``'s keys). With prefix caching on, a request
    without prompt token ids gets the ids the engine drew for it
    (:func:`core.seeding.with_drawn_prompt_ids`): a request preempted by recompute hits its
    own blocks in the engine, and so in the simulation. ``recorded_beams``: the engine's
    beam choices, taken instead of the simulator's stand-in (:mod:`core.beam_log`)."""
    block = int(kv["block_size"])
    # the batch limits the engine served with (engine.json; a limit the config left null
    # was taken for the engine's device)
    served = {k: kv[k] for k in ("max_num_seqs", "max_num_batched_tokens") if kv.get(k) is not None}
    system = {**cfg["system"], **served, "block_size": block}
    vocab = model_from_config(cfg["model"]).vocab_size
    seed = int(cfg.get("seed", 0))
    if system.get("enable_prefix_caching"):
        requests = [with_drawn_prompt_ids(r, vocab, seed) for r in requests]
    slots, cpu_slots = int(kv["num_blocks"]) * block, int(kv["num_cpu_blocks"]) * block
    make_scheduler = scheduler_factory(system, slots, cpu_slots, max_model_len)
    return simulate(
        requests, make_scheduler, cost_model, seed=seed, vocab_size=vocab,
        recorded_beams=recorded_beams,
    )  # fmt: skip


# engine.json's KV-cache keys and their bounds: a pool holds at most MAX_BLOCKS blocks; the
# block size has no such limit, MAX_BLOCKS only bounds it (it must be a power of two too)
ENGINE_KV_BOUNDS = {"block_size": (1, MAX_BLOCKS), "num_blocks": (1, MAX_BLOCKS),
                    "num_cpu_blocks": (0, MAX_BLOCKS)}  # fmt: skip


def read_engine_kv(run_dir: Path) -> dict[str, Any]:
    """The run's ``engine.json``: ``block_size`` a power of two and ``num_blocks`` and
    ``num_cpu_blocks`` whole numbers within :data:`ENGINE_KV_BOUNDS`, and the batch limits
    served, where recorded, positive; else a ConfigError on ``run_dir`` naming the file and
    the key."""
    path = Path(run_dir) / "engine.json"
    if not path.is_file():
        raise ConfigError("run_dir", "no engine.json (KV cache size of the run)", str(run_dir))
    kv = read_json(path, "run_dir")
    need = tuple(ENGINE_KV_BOUNDS)
    if not isinstance(kv, dict) or not all(k in kv for k in need):
        raise ConfigError(
            "run_dir", f"{path}: not an engine.json with whole numbers {', '.join(need)}"
        )
    for key, (low, high) in ENGINE_KV_BOUNDS.items():
        value = kv[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError("run_dir", f"{path}: {key}: expected a whole number in "
                              f"[{low}, {high}], got {value!r}")  # fmt: skip
    for key in ("max_num_seqs", "max_num_batched_tokens"):  # the limits served (optional)
        value = kv.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):  # fmt: skip
            raise ConfigError("run_dir", f"{path}: {key}: expected a positive whole number, "
                              f"got {value!r}")  # fmt: skip
    if not power_of_two(kv["block_size"]):
        raise ConfigError("run_dir", f"{path}: block_size: expected a power of two, "
                          f"got {kv['block_size']}")  # fmt: skip
    return kv


def simulate_run(
    run_dir: Path, cost_model: CostModel, replay_beams: bool = False
) -> tuple[dict[str, Any], int]:
    """Simulate ``run_dir``'s workload on its policy and KV cache: the summary metrics, and
    how many beam-search requests had the simulator's own beam choices (0 when
    ``replay_beams`` took the engine's from the run's ``beams.csv``)."""
    cfg = read_run_config(run_dir)
    rec, own_beams, window = _simulate_run(run_dir, cost_model, replay_beams)
    return summarize_recorder(rec, cfg.get("slo_ms"), window), own_beams


def _simulate_run(
    run_dir: Path, cost_model: CostModel, replay_beams: bool
) -> tuple[Any, int, float | None]:
    """:func:`simulate_run`'s simulation: its recorder, the beams chosen by the simulator and
    the arrival window its ``offered_rate`` is over (:func:`run_workload`)."""
    cfg = read_run_config(run_dir)
    kv = read_engine_kv(run_dir)
    workload, mml = run_workload(cfg, run_dir)
    requests = workload.requests
    beams_path = Path(run_dir) / "beams.csv"
    recorded = None
    if replay_beams and beams_path.is_file():
        try:
            recorded = RecordedBeams.read(beams_path)
        except ValueError as exc:
            raise ConfigError("run_dir", str(exc)) from None
    rec = simulate_served(cfg, requests, kv, mml, cost_model, recorded).recorder
    own_beams = 0 if recorded is not None else sum(r.sampling.use_beam_search for r in requests)
    return rec, own_beams, workload.window_s


def rel_err(sim: Any, eng: Any) -> float | None:
    """``(sim − eng) / |eng|``; 0 when both are equal, None when undefined."""
    if sim is None or eng is None or not (math.isfinite(sim) and math.isfinite(eng)):
        return None
    if sim == eng:
        return 0.0
    return (sim - eng) / abs(eng) if eng != 0 else None


def compare(engine: Mapping[str, Any], simulator: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per metric in ``METRICS``: engine, simulator, relative error."""
    rows = []
    for key in METRICS:
        e, s = engine.get(key), simulator.get(key)
        rows.append({"metric": key, "engine": e, "simulator": s, "rel_err": rel_err(s, e)})
    return rows


def validate(
    run_dir: Path,
    calibration: Mapping[str, Any] | None = None,
    recorded: bool = False,
    wrap: Callable[[CostModel], CostModel] | None = None,
    tables_out: Path | None = None,
) -> dict[str, Any]:
    """Simulate ``run_dir`` with the calibrated model ``calibration`` (a ``to_dict``
    document) or, with ``recorded``, with the engine's step times; both sets of metrics and
    the comparison rows. ``wrap`` (for a calibration): the cost model the simulator uses is
    ``wrap(model)`` (e.g. :class:`sim.cost.drifting.DriftingCostModel`). ``tables_out``: a
    directory the simulator's ``steps.csv`` and ``requests.csv`` are written into (the
    run's own columns less the engine's timings of its phases, to set beside them)."""
    run_dir = Path(run_dir)
    if recorded == (calibration is not None):
        raise ValueError("give exactly one of a calibration document and recorded=True")
    cfg = read_run_config(run_dir)
    model, hardware, tp = run_identity(cfg)
    if recorded:
        steps_path = run_dir / "steps.csv"
        if not steps_path.is_file():
            raise ConfigError("--recorded", "no steps.csv to replay", str(run_dir))
        steps = read_run_steps(run_dir, "--recorded")
        if "duration_s" not in steps.columns or steps.empty:
            raise ConfigError("--recorded", f"{steps_path}: no steps (duration_s) to replay")
        try:
            check_step_numbers(steps[["duration_s"]])
        except ValueError as exc:
            raise ConfigError("--recorded", f"{steps_path}: {exc}") from None
        cost: CostModel = RecordedCostModel(steps["duration_s"].astype(float).tolist())
    else:
        assert calibration is not None
        if calibration.get("kind") != "calibrated":
            raise ConfigError(
                "--calibration", "not a calibration document", calibration.get("kind"),
                "kind 'calibrated' (experiments.calibrate writes one)",
            )  # fmt: skip
        check_calibration_fits(calibration, "--calibration", model.name, hardware.name, tp)
        check_measured_alike(calibration, run_dir, "--calibration")
        try:
            cost = CalibratedCostModel.from_dict(calibration, hardware)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError("--calibration", f"malformed ({first_line(exc)})") from None
        if wrap is not None:
            cost = wrap(cost)
    if not (run_dir / "metrics.json").is_file():
        raise ConfigError("run_dir", "no metrics.json: the run did not finish", str(run_dir))
    with reading(run_dir / "metrics.json", "run_dir"):
        metrics = read_metrics(run_dir)
    if not isinstance(metrics, dict):
        raise ConfigError("run_dir", f"{run_dir / 'metrics.json'}: not a JSON object")
    for key in METRICS:
        value = metrics.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(
                "run_dir", f"{run_dir / 'metrics.json'}: {key} is {value!r}, not a number"
            )
    repeated = 0
    if recorded and cfg["system"].get("enable_prefix_caching"):
        repeated = repeated_streams(run_requests(cfg, run_dir)[0])
    try:
        rec, beams, window = _simulate_run(run_dir, cost, replay_beams=recorded)
    except RecordedStepsExhausted as exc:
        why = f" (as it may: {STREAMS_REPEAT.format(repeated=repeated)})" if repeated else ""
        where = departure(run_dir, steps)
        raise ConfigError("--recorded", f"{run_dir / 'steps.csv'}: {exc}{why}{where}") from None
    except BeamReplayError as exc:
        raise ConfigError("--recorded", f"{run_dir}/{exc}; the replay diverged") from None
    simulated = summarize_recorder(rec, cfg.get("slo_ms"), window)
    if tables_out is not None:
        tables_out.mkdir(parents=True, exist_ok=True)
        write_csv(tables_out / "steps.csv", rec.steps_frame())
        write_csv(tables_out / "requests.csv", rec.requests_frame())
    result: dict[str, Any] = {
        "run": run_dir.name,
        "cost_model": cost.describe(),
        "clock": cfg.get("clock", "virtual"),
        "exact_replay_expected": (
            recorded and cfg.get("clock", "virtual") == "virtual" and beams == 0 and not repeated
        ),
        "engine": metrics,
        "simulator": simulated,
        "comparison": compare(metrics, simulated),
    }
    why = []
    if beams and recorded:
        why.append(BEAMS_DIFFER.format(beams=beams))
    if repeated:
        why.append(STREAMS_REPEAT.format(repeated=repeated))
    if why:
        result["not_exact_because"] = "; ".join(why)
    if isinstance(cost, RecordedCostModel):
        result["recorded_steps_left"] = cost.steps_left  # 0 when the replay took every step
        with reading(run_dir / "requests.csv", "run_dir"):
            engine_requests = pd.read_csv(run_dir / "requests.csv")
        result["schedule"] = compare_schedules(
            steps, rec.steps_frame(), engine_requests, rec.requests_frame()
        )
    return result


def departure(run_dir: Path, steps: pd.DataFrame) -> str:
    """For a replay that outran the engine's recorded steps: ``"; "`` and where its schedule
    parted from the engine's (:func:`~experiments.lib.step_compare.describe`), from a
    replay that prices the steps past the recording at the last recorded time; "" where
    that replay fails too."""
    times = steps["duration_s"].astype(float).tolist()
    try:
        rec, _, _ = _simulate_run(run_dir, RecordedCostModel(times, then=times[-1]), True)
        with reading(run_dir / "requests.csv", "run_dir"):
            engine_requests = pd.read_csv(run_dir / "requests.csv")
    except Exception:  # only a hint on the error being raised: never a second error
        return ""
    found = compare_schedules(steps, rec.steps_frame(), engine_requests, rec.requests_frame())
    return "; " + "; ".join(describe(found, rest=""))


BEAMS_DIFFER = (
    "{beams} beam-search request(s) and no beams.csv (the engine's choices, written since "
    "2026-12-05): the engine keeps the beams its model's log-probabilities rank highest, the "
    "simulator those of seeded scores (sim.beams), so their forks, copy-on-write copies and "
    "memory differ and the replay need not match"
)


STREAMS_REPEAT = (
    "prefix caching and {repeated} request(s) whose prompt token ids and sampling (greedy, "
    "beams of one width, or one seed) another request repeats, or whose parallel samples are "
    "alike (top-k 1): the engine generates the same tokens for them and its prefix cache can "
    "share those blocks, the simulator, which samples no tokens, cannot "
    "(core.sched.base.stand_in_token_id), so the replay need not match"
)


def repeated_streams(requests: list[Request]) -> int:
    """How many of ``requests`` have a sample whose tokens the engine also generates for
    another request: the same prompt token ids and both greedy (or top-k 1), both beam
    searches of one width, or both drawn with one sample seed and the same sampling options
    (sample ``i`` of a request with seed ``s`` draws with ``s + i``, :mod:`engine.sampler`; a
    request without a seed draws with one of its own); or ``n > 1`` samples drawn with top-k
    1, which are one stream (whatever the prompt). Under prefix caching the engine can share
    their generated blocks (a group preempted by recompute finds one sample's blocks for
    all); the simulator gives each sequence stand-in ids of its own."""
    owners: dict[tuple[Any, ...], set[int]] = {}
    alike: set[int] = set()
    for r in requests:
        s = r.sampling
        if s.n > 1 and s.top_k == 1:  # greedy n > 1 is refused (SamplingParams)
            alike.add(r.request_id)
        if r.prompt_token_ids is None:
            continue
        if s.beam_width > 1:
            keys: list[tuple[Any, ...]] = [("beams", s.beam_width)]
        elif s.greedy or s.top_k == 1:
            keys = [("greedy",)]
        elif s.seed is not None:
            keys = [("seed", s.temperature, s.top_p, s.top_k, s.seed + i) for i in range(s.n)]
        else:
            continue
        for key in keys:
            owners.setdefault((tuple(r.prompt_token_ids), *key), set()).add(r.request_id)
    return len(alike.union(*(ids for ids in owners.values() if len(ids) > 1)))


def print_comparison(rows: list[dict[str, Any]]) -> None:
    print(f"{'metric':<20} {'engine':>14} {'simulator':>14} {'rel. error':>11}")
    for r in rows:
        err = "n/a" if r["rel_err"] is None else f"{r['rel_err']:+.2%}"
        print(f"{r['metric']:<20} {_num(r['engine']):>14} {_num(r['simulator']):>14} {err:>11}")


def read_calibration(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; a calibration document is checked and its profile found
    (:func:`~experiments.lib.setup.checked_calibration`), any other kind is left for
    :func:`validate` to refuse. A file that is not an object is a ConfigError on
    ``--calibration`` naming it."""
    doc = read_json(path, "--calibration")
    if not isinstance(doc, dict):
        raise ConfigError("--calibration", f"{path}: not a JSON object")
    if doc.get("kind") != "calibrated":
        return doc
    return checked_calibration(doc, path, "--calibration")


def _num(x: Any) -> str:
    return "n/a" if x is None else f"{x:.4g}"


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.validate", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="an engine run directory")
    parser.add_argument("--calibration", type=Path, default=None, help="RUN_DIR/calibration.json")
    parser.add_argument("--recorded", action="store_true", help="replay measured step times")
    parser.add_argument("--out", type=Path, default=None, help="default RUN_DIR/validation.json")
    parser.add_argument(
        "--tables-out", type=Path, default=None, metavar="DIR",
        help="also write the simulator's steps.csv and requests.csv into DIR (not RUN_DIR), "
        "in the run's own columns less the engine's timings of its phases, to diff them",
    )  # fmt: skip
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.run_dir.is_dir():
        raise ConfigError("run_dir", "no such directory", str(args.run_dir))
    check_out_file(args.out or args.run_dir / "validation.json")
    if args.tables_out is not None:
        check_tables_out(args.tables_out, args.run_dir)
    calibration = None
    if not args.recorded:
        path = args.calibration or args.run_dir / "calibration.json"
        if not path.is_file():
            raise ConfigError(
                "--calibration", "no such file", str(path),
                "a calibration.json (python -m experiments.calibrate RUN_DIR), or --recorded",
            )  # fmt: skip
        calibration = read_calibration(path)
    result = validate(args.run_dir, calibration, args.recorded, tables_out=args.tables_out)
    print(result["cost_model"])
    print_comparison(result["comparison"])
    if "not_exact_because" in result and args.recorded:
        print(f"not an exact replay: {result['not_exact_because']}")
    status = 0
    if "schedule" in result:
        print("\n".join(describe(result["schedule"])))
        schedule = result["schedule"]
        parted = schedule["first_divergence"] or schedule["first_request_divergence"]
        if result["exact_replay_expected"] and parted:
            system = read_run_config(args.run_dir)["system"]["name"]
            print(SCHEDULE_DIFFERS.format(system=system) + recording_code(args.run_dir),
                  file=sys.stderr)  # fmt: skip
            status = 1
    out = args.out or args.run_dir / "validation.json"
    write_json(out, result)
    print(f"wrote {out}")
    if args.tables_out is not None:
        print(f"wrote the simulator's steps.csv and requests.csv into {args.tables_out}")
    return status


def check_tables_out(tables_out: Path, run_dir: Path) -> None:
    """``--tables-out`` must be a directory (or not yet exist) other than ``run_dir``, whose
    own tables it would overwrite."""
    if tables_out.exists() and not tables_out.is_dir():
        raise ConfigError("--tables-out", "not a directory", str(tables_out))
    if tables_out.resolve() == run_dir.resolve():
        raise ConfigError(
            "--tables-out", "is the run directory: the engine's own steps.csv and "
            "requests.csv would be overwritten", str(tables_out), "another directory",
        )  # fmt: skip


SCHEDULE_DIFFERS = (
    "error: the simulator replaying the engine's own step times scheduled otherwise: "
    "{system} decided otherwise in the two bodies (a policy that reads the wall clock, an "
    "unseeded random draw, a global or anything but its queues, the KV manager and the "
    "`now` it is given), or one body has a bug; validation.json's schedule names the "
    "first step and request that differ"
)


def recording_code(run_dir: Path) -> str:
    """A clause for :data:`SCHEDULE_DIFFERS` where the run may have been recorded by other
    code than this process runs (its ``provenance.json``'s ``code_sha256``, a digest of the
    project's sources, differs, or the file is missing): a policy changed since then
    replays otherwise with no body at fault; "" where the code is the same."""
    try:
        code = json.loads((Path(run_dir) / "provenance.json").read_text())["code"]
        recorded = str(code["code_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return (
            "; the run has no readable provenance.json, so it may have been recorded by "
            "other code than this: serve it again with this code to tell"
        )
    if recorded == code_version()["code_sha256"]:
        return ""
    commit = code.get("git_commit")
    was = f"git {commit[:12]}, " if isinstance(commit, str) else ""
    return (
        f"; the run was recorded by other code ({was}sources sha256 {recorded[:12]}; this is "
        f"{code_words()}): a policy changed since then replays otherwise, so serve it again "
        "with this code to tell"
    )


if __name__ == "__main__":
    sys.exit(main())
