"""Serve several CPU engine runs, and take the operator profile they are priced on, in one
interleaved sitting (:mod:`experiments.bench.interleave`): a step of one run, then of
another, a profile point between, so that a shared machine's drifting speed falls on all of
them alike.

Each run's share of the sitting is its step count as the simulator expects it
(:func:`expected_steps`: the run's own requests, policy and KV cache, priced by a pilot
operator profile of this machine with no per-step terms). The pilot only paces the turns;
nothing is fitted to it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.engine import EngineResult
from experiments.bench import profile_gpu
from experiments.bench.interleave import Participant, spread, take_turns
from experiments.calibrate import dtype_bytes
from experiments.lib.compose import compose_config
from experiments.lib.results import write_json
from experiments.serve import Serving, finish, start
from experiments.validate import as_served, simulate_served
from sim.catalog import model_from_config
from sim.cost import CalibratedCostModel
from sim.cost.calibrated import CORE_TERMS

PROFILE = "profile"  # the participant name of the interleaved profile
print_now = functools.partial(print, flush=True)  # progress lines reach a log file at once


def expected_steps(serving: Serving, pilot_profile: str) -> int:
    """The steps the simulator takes to serve ``serving``'s requests on its policy and KV
    cache, each step priced by ``pilot_profile``'s operator times alone."""
    c, kv = serving.config, serving.engine.kv_cache
    pilot = CalibratedCostModel(
        model_from_config(c["model"]),
        c["hardware"]["name"],
        dict.fromkeys(CORE_TERMS, 0.0),
        dtype_bytes=dtype_bytes(c),
        block_size=kv.block_size,
        profile=pilot_profile,
    )
    blocks = {"block_size": kv.block_size, "num_blocks": kv.num_blocks,
              "num_cpu_blocks": kv.num_cpu_blocks}  # fmt: skip
    requests = as_served(c, serving.requests)
    return max(1, simulate_served(c, requests, blocks, serving.max_model_len, pilot).num_steps)


def expected_units(record: Mapping[str, Any]) -> dict[str, int]:
    """Each participant's expected units, from a sitting's record (``sitting.json``)."""
    return {p["participant"]: int(p["expected"]) for p in record.get("participants", [])}


def serve_together(
    runs: Mapping[str, tuple[Path, Sequence[str]]],
    pilot_profile: str,
    record_path: Path,
    profile_out: Path | None = None,
    profile_model: str = "opt-125m",
    profile_passes: int = 1,
    single_calls: bool = False,
    log: Callable[[str], None] = print_now,
) -> dict[str, Any]:
    """Serve every run of ``runs`` (name → (output directory, ``serve`` overrides)) and,
    with ``profile_out``, take a ``profile_gpu --cpu`` profile of ``profile_model`` there
    (``profile_passes`` sweeps, each spread over the sitting; ``single_calls``: one call per
    point and sweep, the mean over sweeps, ``profile_gpu --single-calls``), all interleaved
    on one torch thread. Each run's files are written as it ends, as ``experiments.serve``
    writes them; the profile's at its end. Returns the sitting's record, also written to
    ``record_path``: each participant's expected and done units and where its units fell in
    the sitting (:func:`spread`).

    For CPU runs of kvlab's engine: every engine is built before the first step (their
    weights and KV caches are all held at once), and all run on one torch thread whatever
    their ``threads`` says."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        servings = {name: start(compose_config("serve", over)) for name, (_, over) in runs.items()}
        torch.set_num_threads(1)  # start() set each run's own ``threads``
        people = [
            Participant(name, s.steps(), expected_steps(s, pilot_profile))
            for name, s in servings.items()
        ]
        plan = None
        if profile_out is not None:
            plan = profile_gpu.make_plan(
                False, profile_model, cpu=True, passes=profile_passes, single_calls=single_calls
            )
            points = profile_gpu.measuring(plan, log=lambda _: None)
            people.append(Participant(PROFILE, points, profile_gpu.num_points(plan)))

        def on_finish(p: Participant) -> None:
            if p.name == PROFILE:
                assert plan is not None and profile_out is not None
                argv = ["--cpu", "--model", profile_model, "--passes", str(profile_passes),
                        *(["--single-calls"] if single_calls else []),
                        "--out", str(profile_out)]  # fmt: skip
                command = (
                    "experiments.bench.sitting.serve_together, measuring as "
                    f"python -m experiments.bench.profile_gpu {' '.join(argv)} would"
                )
                sitting = f"interleaved with the engine runs {', '.join(runs)}"
                meta = {**profile_gpu.sidecar(plan, argv), "complete": True,
                        "command": command, "sitting": sitting}  # fmt: skip
                profile_gpu.write_profile(profile_out, p.result, meta)
            else:
                result: EngineResult = p.result
                finish(servings[p.name], result, p.busy_s, runs[p.name][0])
            log(f"{p.name}: done, {p.done} units ({p.expected} expected)")

        take_turns(people, on_finish, log)
    finally:
        torch.set_num_threads(before)
    record = {"pilot_profile": pilot_profile, "participants": spread(people)}
    write_json(record_path, record)
    log(json.dumps(record["participants"]))
    return record
