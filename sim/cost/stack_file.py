"""A serving-stack preset measured on kvlab's own engine: ``cost.stack=measured
cost.stack_path=FILE``.

The measurement: engine runs (``experiments.serve``) whose ``steps.csv`` holds the per-step
phase seconds (:mod:`core.metrics.phases`). Per step, the CPU time is the sum of the four
CPU phases (schedule, prepare, sample, output: the phases the Vidur table behind
:data:`sim.cost.overhead.A100_CPU_OVERHEAD` sums; forward and transfers excluded) and the
sequences are ``prefill_seqs + decode_seqs``. As in that table, the points are medians by
number of sequences (only sequence counts with at least ``min_steps`` steps), and the fit
is the same form, ``a + b × sequences``, by least squares over the train points.

Splits: ``half``: each run's first half of steps (by step index) trains, its second half
is held out; ``runs``: every run but the last trains, the last is held out. The fit reports
the mean and max absolute relative error at the train points and at the held-out points.

The file (JSON, ``kind: "stack"``) keeps the fit, its errors and points, and the ``base``
preset whose other terms (per-block gather, last-block waste, per-copy latencies) the
measured stack keeps; :func:`load_stack_file` turns it into a :class:`Stack`. kvlab's engine
is synchronous, so the measured stack is serial (step = GPU + CPU). Of those kept terms,
the device-copy one (one copy kernel per step) is what kvlab's engine does; the swap one
is replaced by kvlab's: the engine swaps a step's blocks, in each direction, with one
gather, one transfer and one scatter over all layers' K and V per chunk of at most
:data:`core.defaults.SWAP_CHUNK_BYTES` (``engine.kv_cache``), so the measured stack charges
:data:`KVLAB_SWAP_CALLS` call latencies per direction and chunk instead of a copy per
block, per layer, for K and V.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core.defaults import SWAP_CHUNK_BYTES
from core.metrics.phases import CPU_PHASES
from sim.cost.overhead import STACKS, CPUOverheadFit, Stack, fit_line, relative_errors

SPLITS = ("half", "runs")
# engine.kv_cache swap_out / swap_in (stacked caches, since 34fafdf): one gather, one
# host<->device transfer, one scatter per direction and chunk (core.defaults.SWAP_CHUNK_BYTES)
KVLAB_SWAP_CALLS = 3
FILE_KIND = "stack"
MEASURED = "measured"
# the fit's numbers under ``cpu``; the held-out ones are null when no point was held out
HELDOUT_NUMBERS = ("heldout_mape", "heldout_max_err")
CPU_NUMBERS = ("per_step_s", "per_seq_s", "train_mape", "train_max_err", *HELDOUT_NUMBERS)


class UnsupportedFit(ValueError):
    """The steps hold the phase columns, but too few or too noisy points for the line."""


def cpu_points(steps: pd.DataFrame, min_steps: int, where: str) -> pd.DataFrame:
    """Median CPU seconds per step by sequences: columns ``seqs``, ``cpu_s``, ``steps``
    (sequence counts with fewer than ``min_steps`` steps dropped)."""
    missing = [c for c in (*CPU_PHASES, "prefill_seqs", "decode_seqs") if c not in steps]
    if missing:
        raise ValueError(
            f"{where}: no column {missing[0]} (an engine run's steps.csv with phase timing)"
        )
    frame = pd.DataFrame(
        {
            "seqs": steps["prefill_seqs"] + steps["decode_seqs"],
            "cpu_s": steps[list(CPU_PHASES)].sum(axis=1),
        }
    )
    grouped = frame.groupby("seqs")["cpu_s"].agg(["median", "size"]).reset_index()
    grouped.columns = ["seqs", "cpu_s", "steps"]
    return grouped[grouped["steps"] >= min_steps].reset_index(drop=True)


def split_steps(
    runs: Sequence[tuple[str, pd.DataFrame]], split: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The train and held-out steps of ``runs`` (name, steps frame) under ``split``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known splits: {', '.join(SPLITS)}")
    if split == "runs":
        if len(runs) < 2:
            raise ValueError("split 'runs' needs two runs or more (the last one is held out)")
        train = pd.concat([f for _, f in runs[:-1]], ignore_index=True)
        return train, runs[-1][1]
    halves = [(f.iloc[: len(f) // 2], f.iloc[len(f) // 2 :]) for _, f in runs]
    return (
        pd.concat([a for a, _ in halves], ignore_index=True),
        pd.concat([b for _, b in halves], ignore_index=True),
    )


def fit_measured_overhead(
    runs: Sequence[tuple[str, pd.DataFrame]], split: str = "half", min_steps: int = 5
) -> dict[str, Any]:
    """Fit ``a + b × sequences`` to the runs' CPU phases (see the module doc): the stack
    file's document, without ``base`` and ``measured_on``."""
    if not runs:
        raise ValueError("no runs to fit")
    for name, frame in runs:
        cpu_points(frame, 1, name)  # every run has the columns
    train_steps, held_steps = split_steps(runs, split)
    train = cpu_points(train_steps, min_steps, "train steps")
    held = cpu_points(held_steps, min_steps, "held-out steps")
    for part, frame in (("train", train), ("held-out", held)):
        if (frame["cpu_s"] <= 0).any():
            seqs = int(frame.loc[frame["cpu_s"] <= 0, "seqs"].iloc[0])
            raise UnsupportedFit(
                f"the {part} steps of {seqs} sequence(s) spent no CPU time in the four "
                "phases (their median is 0): the runs' phase timing is missing or broken"
            )
    if len(train) < 2:
        raise UnsupportedFit(
            f"the train steps hold {len(train)} sequence count(s) with >= {min_steps} steps; "
            "the fit needs two (serve more requests, or lower --min-steps)"
        )
    a, b = fit_line(train["seqs"].to_numpy(float), train["cpu_s"].to_numpy(float))
    if a < 0 or b < 0:
        raise UnsupportedFit(
            f"the fit has a negative term ({a:.3g} s + {b:.3g} s x sequences): too few or too "
            "noisy points"
        )
    tr = relative_errors(a, b, train["seqs"], train["cpu_s"])
    he = relative_errors(a, b, held["seqs"], held["cpu_s"])

    def points(p: pd.DataFrame) -> list[list[float]]:
        return [[int(s), float(c), int(n)] for s, c, n in p.itertuples(index=False)]

    return {
        "kind": FILE_KIND,
        "name": MEASURED,
        "overlapped": False,
        "cpu": {
            "per_step_s": a,
            "per_seq_s": b,
            "train_mape": float(np.mean(tr)),
            "train_max_err": float(np.max(tr)),
            "heldout_mape": float(np.mean(he)) if len(he) else None,
            "heldout_max_err": float(np.max(he)) if len(he) else None,
        },
        "fit": {
            "runs": [name for name, _ in runs],
            "split": split,
            "min_steps": min_steps,
            "phases": list(CPU_PHASES),
            "points": {"train": points(train), "heldout": points(held)},
            "point_columns": ["seqs", "median_cpu_s", "steps"],
        },
    }


def fit_source(doc: dict[str, Any]) -> str:
    """One line naming the measurement, the split and the errors."""
    cpu, fit = doc["cpu"], doc["fit"]
    held = (
        "no held-out point"
        if cpu["heldout_mape"] is None
        else f"held out MAPE {cpu['heldout_mape']:.1%}, max {cpu['heldout_max_err']:.1%}"
    )
    where = f" on {doc['measured_on']}" if doc.get("measured_on") else ""
    return (
        f"kvlab engine{where}: {' + '.join(fit['phases'])} medians by sequences, runs "
        f"{', '.join(fit['runs'])}, split {fit['split']}; train MAPE {cpu['train_mape']:.1%}, "
        f"max {cpu['train_max_err']:.1%}; {held}"
    )


def fit_problem(doc: Mapping[str, Any]) -> str | None:
    """What is wrong with a stack document's ``cpu`` and ``fit``, naming the field (e.g.
    ``cpu.per_step_s: not a number (got 'abc')``); None when every field
    :func:`load_stack_file` reads is there with its type: :data:`CPU_NUMBERS` numbers (the
    held-out ones may be null together), ``fit.runs`` and ``fit.phases`` lists of names,
    ``fit.split`` a name."""
    cpu, fit = doc.get("cpu"), doc.get("fit")
    if not isinstance(cpu, Mapping):
        return f"cpu: not a mapping of the fit's numbers (got {cpu!r})"
    for key in CPU_NUMBERS:
        value = cpu.get(key)
        if key not in cpu:
            return f"cpu.{key}: missing"
        if value is None and key in HELDOUT_NUMBERS:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"cpu.{key}: not a number (got {value!r})"
    nulls = [key for key in HELDOUT_NUMBERS if cpu[key] is None]
    if nulls and len(nulls) < len(HELDOUT_NUMBERS):
        given = next(key for key in HELDOUT_NUMBERS if cpu[key] is not None)
        return f"cpu.{nulls[0]}: null while cpu.{given} is {cpu[given]!r} (both or neither)"
    if not isinstance(fit, Mapping):
        return f"fit: not a mapping of what the fit was made on (got {fit!r})"
    for key in ("runs", "phases"):
        names = fit.get(key)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return f"fit.{key}: not a list of names (got {names!r})"
    if not isinstance(fit.get("split"), str):
        return f"fit.split: not a name (got {fit.get('split')!r})"
    return None


def load_stack_file(path: Path) -> Stack:
    """The measured stack in ``path``; a bad file raises ``ValueError`` naming it and, for
    a bad field, the field (:func:`fit_problem`)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the stack file ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != FILE_KIND:
        raise ValueError(
            f"{path}: not a stack file (kind 'stack', from experiments.calibrate_overhead)"
        )
    base_name = str(doc.get("base", "vllm-2023"))
    if base_name not in STACKS:
        raise ValueError(f"{path}: unknown base {base_name!r}; known bases: {', '.join(STACKS)}")
    base = STACKS[base_name]
    overlapped = doc.get("overlapped", False)
    if not isinstance(overlapped, bool):
        raise ValueError(f"{path}: overlapped must be true or false (got {overlapped!r})")
    problem = fit_problem(doc)
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    cpu = doc["cpu"]
    fit = CPUOverheadFit(
        float(cpu["per_step_s"]),
        float(cpu["per_seq_s"]),
        float(cpu["train_mape"]),
        float("nan" if cpu["heldout_mape"] is None else cpu["heldout_mape"]),
        float("nan" if cpu["heldout_max_err"] is None else cpu["heldout_max_err"]),
        fit_source(doc),
    )
    for key, value in (("per_step_s", fit.per_step_s), ("per_seq_s", fit.per_seq_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{path}: cpu.{key} must be a finite time >= 0 (got {value})")
    sources = {k: v for k, v in base.sources.items() if k != "ray_workers"}
    return replace(
        base,
        name=MEASURED,
        cpu=fit,
        overlapped=overlapped,
        ray_workers=False,  # the file's fit is the whole CPU time, at the tp it was measured
        copies_per_block_per_layer=0,
        swap_calls_per_direction=KVLAB_SWAP_CALLS,
        swap_chunk_bytes=float(SWAP_CHUNK_BYTES),
        blocks_for_contiguous=True,
        summary=f"kvlab's engine, measured ({path.name}); other terms as {base.name}: "
        + ("CPU overlapped, step = max(GPU, CPU)" if overlapped else "step = GPU + CPU"),
        sources={**sources, "cpu": fit.source, "overlap": "kvlab's engine is "
                 "synchronous: schedule, prepare, forward, sample, output in turn",
                 "copies_per_block_per_layer": "0: kvlab's engine does not copy per block",
                 "swap_calls_per_direction": "kvlab engine.kv_cache: a swap is one gather, "
                 "one transfer and one scatter per direction and chunk of at most "
                 "core.defaults.SWAP_CHUNK_BYTES (3 calls each), each at copy_latency_s",
                 "blocks_for_contiguous": "kvlab's engine (engine/runner.py) reads every "
                 "manager's KV, a contiguous one's regions too, through block tables"},
    )  # fmt: skip
