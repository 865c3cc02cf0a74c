"""Where two runs' schedules part: the engine's ``steps.csv`` and ``requests.csv`` against
the simulator's replay of the run (``experiments.validate --recorded``).

On a ``clock: virtual`` run the simulator replaying the engine's measured step times runs
the same policy objects on the same clock, so every scheduling column of every step, and
every request's first-token and finish steps, are the engine's (one policy, two bodies). A
policy that decides otherwise in the two bodies (it reads the wall clock, an unseeded
random draw, a global or something only one body has) shows here first, often long before
it moves a mean metric."""

from __future__ import annotations

from typing import Any

import pandas as pd

# what a step's plan and its KV decide; not the clock (start_s, duration_s: replayed) and
# not the engine's phase timings, which the simulator has no counterpart of
TIMES = ("step", "start_s", "duration_s")
# what the schedule decides for each request (its times follow from these and the clock)
REQUEST_STEPS = ("status", "first_token_step", "finish_step", "num_preemptions")


def compare_schedules(
    engine_steps: pd.DataFrame,
    simulator_steps: pd.DataFrame,
    engine_requests: pd.DataFrame,
    simulator_requests: pd.DataFrame,
) -> dict[str, Any]:
    """``steps``: the steps compared (the shorter table's); ``first_divergence``: None
    when every compared step column agrees in every step and both tables are as long, else
    the first step that differs (``step``, 0-based) with each differing column's two values
    (``columns``: ``{name: {"engine": e, "simulator": s}}``; empty when the tables agree as
    far as the shorter goes, ``engine_steps`` and ``simulator_steps`` then give their
    lengths); ``first_request_divergence``: None, or the lowest request id whose
    :data:`REQUEST_STEPS` differ (``request_id`` and ``columns`` likewise)."""
    columns = [c for c in simulator_steps.columns if c in engine_steps.columns and c not in TIMES]
    n = min(len(engine_steps), len(simulator_steps))
    eng = engine_steps[columns].iloc[:n].reset_index(drop=True)
    sim = simulator_steps[columns].iloc[:n].reset_index(drop=True)
    out: dict[str, Any] = {"steps": n, "columns": columns, "first_divergence": None}
    e, s = eng.to_numpy(), sim.to_numpy()
    differs = ((e != s) & ~(pd.isna(e) & pd.isna(s))).any(axis=1)  # two missing: alike
    if differs.any():
        i = int(differs.argmax())
        out["first_divergence"] = {"step": i, "columns": _differing(eng.loc[i], sim.loc[i])}
    elif len(engine_steps) != len(simulator_steps):
        out["first_divergence"] = {
            "step": n,
            "columns": {},
            "engine_steps": len(engine_steps),
            "simulator_steps": len(simulator_steps),
        }
    out["first_request_divergence"] = _request_divergence(engine_requests, simulator_requests)
    return out


def _request_divergence(engine: pd.DataFrame, simulator: pd.DataFrame) -> dict[str, Any] | None:
    cols = [c for c in REQUEST_STEPS if c in engine.columns and c in simulator.columns]
    eng = engine.set_index("request_id")[cols]
    sim = simulator.set_index("request_id")[cols]
    for rid in sorted(set(eng.index) | set(sim.index)):
        if rid not in eng.index or rid not in sim.index:
            return {"request_id": int(rid), "columns": {}, "in_engine": rid in eng.index}
        e, s = eng.loc[rid], sim.loc[rid]
        found = _differing(e, s)
        if found:
            return {"request_id": int(rid), "columns": found}
    return None


def _differing(engine_row: pd.Series, simulator_row: pd.Series) -> dict[str, dict[str, Any]]:
    """Each column whose two values differ (two missing values are alike)."""
    out = {}
    for c in engine_row.index:
        e, s = engine_row[c], simulator_row[c]
        if not (e == s or (pd.isna(e) and pd.isna(s))):
            out[c] = {"engine": _plain(e), "simulator": _plain(s)}
    return out


def describe(result: dict[str, Any], rest: str = " in validation.json") -> list[str]:
    """Lines: the schedules agree in every step and request, or where and how they part
    (beyond three differing columns, how many more there are, and ``rest``: where)."""
    where, req = result["first_divergence"], result["first_request_divergence"]
    if where is None and req is None:
        return [f"schedule: the engine's in all {result['steps']} steps and every request"]
    lines = []
    if where is not None and not where["columns"]:
        lines.append(
            f"schedule: the engine's for {result['steps']} steps, then the engine ran "
            f"{where['engine_steps']} steps and the simulator {where['simulator_steps']}"
        )
    elif where is not None:
        lines.append(f"schedule: departs from the engine's at step {where['step']} "
                     f"({_values(where['columns'], rest)})")  # fmt: skip
    if req is not None and not req["columns"]:
        body = "engine" if req["in_engine"] else "simulator"
        lines.append(f"requests: request {req['request_id']} is in the {body}'s table only")
    elif req is not None:
        lines.append(f"requests: request {req['request_id']} is served otherwise "
                     f"({_values(req['columns'], rest)})")  # fmt: skip
    return lines


def _values(columns: dict[str, dict[str, Any]], rest: str) -> str:
    items = list(columns.items())
    text = "; ".join(f"{c}: engine {v['engine']}, simulator {v['simulator']}" for c, v in items[:3])
    if len(items) > 3:
        text += f"; {len(items) - 3} more column(s){rest}"
    return text


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number JSON writes; a missing value as None."""
    if pd.isna(value):
        return None
    return value.item() if hasattr(value, "item") else value
