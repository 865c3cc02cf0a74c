"""``experiments.bench.speed_by_op``: whether a sitting's speed moved alike for every
operator, and its runs priced with decode attention at its own speed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.plan import BatchShape
from experiments.bench.speed_by_op import main, sitting_rows
from sim.cost import ProfiledCostModel
from tests.test_cpu_error_parts import C0, PER_SEQ, make_sitting

# per sweep: decode attention at half its price, then at 1.5 times; everything else at it
ATTENTION, REST = (0.5, 1.5), (1.0, 1.0)


def drifting_sitting(root: Path) -> Path:
    """Runs s, a and b, served on a machine that slowed only decode attention, three-fold
    from the sitting's first half to its second, as the profile's two sweeps measured it."""
    sitting = make_sitting(root, {"s": 1.0, "a": 1.0, "b": 1.0}, host_scale=1.0)
    path = sitting / "operator_profile" / "operator_profile.csv"
    table = pd.read_csv(path)
    attention = (table["op"] == "attn_decode").to_numpy()
    # every stretch holds both kinds of point: attention at every third unit
    order = [*np.flatnonzero(attention), *np.flatnonzero(~attention)]
    spaced = [*range(0, 3 * attention.sum(), 3)]
    spaced += [u for u in range(len(table)) if u not in spaced]
    unit = np.empty(len(table), dtype=int)
    unit[order] = spaced
    table["sweeps_ms"] = [
        ";".join(str(t * speeds[j]) for j in range(2))
        for t, speeds in zip(
            table["time_ms"], np.where(attention[:, None], ATTENTION, REST), strict=True
        )
    ]
    table["sweep_units"] = [f"{u};{u}" for u in unit]
    table.to_csv(path, index=False)
    ops = ProfiledCostModel(sitting / "operator_profile", "opt-125m", "h200", as_measured=True)
    expected = {}
    for run in ("s", "a", "b"):
        steps_path = sitting / f"run_{run}" / "steps.csv"
        steps = pd.read_csv(steps_path)
        n = expected[run] = len(steps)
        late = (np.arange(n) + 0.5) / n >= 0.5
        counts = steps.iloc[:, :6].itertuples(index=False)  # BatchShape's first six fields
        shapes = [BatchShape(*(int(x) for x in row)) for row in counts]
        attn = np.array([ops.decode_attention_seconds(s) for s in shapes])
        gpu = np.array([ops.gpu_seconds(s) for s in shapes])
        speed = np.where(late, ATTENTION[1], ATTENTION[0])
        steps["forward_s"] = gpu - attn + attn * speed
        host = C0 + PER_SEQ * (steps["prefill_seqs"] + steps["decode_seqs"])
        steps["transfer_s"] = 0.0  # the open-loop sums count the step's whole time
        steps["duration_s"] = steps["forward_s"] + host
        steps.to_csv(steps_path, index=False)
    record = {"participants": [{"participant": r, "expected": n} for r, n in expected.items()]}
    (sitting / "sitting.json").write_text(json.dumps(record))
    return sitting


def test_decode_attention_at_its_own_speed_prices_such_a_machine_exactly(tmp_path: Path) -> None:
    spreads, pricing = sitting_rows(drifting_sitting(tmp_path / "sit"), "s")
    by_split = {r["split"]: r for r in spreads}
    attention = by_split["decode attention / the rest"]
    assert attention["sweeps"] == 2
    assert (attention["least"], attention["most"]) == pytest.approx((-0.5, 0.5))
    assert attention["sd"] == pytest.approx(0.5)
    matmuls = by_split["matmuls of 1-8 rows / of 32-512 rows"]
    assert matmuls["sd"] == pytest.approx(0.0, abs=1e-12)  # they moved alike
    by_run = {r["run"]: r for r in pricing}
    assert list(by_run) == ["a", "b", "s", "gap"]
    for run in ("a", "b", "s"):
        assert by_run[run]["split"] == pytest.approx(0.0, abs=1e-9)
        assert abs(by_run[run]["timed"]) > 0.01  # one speed for all: off
    assert by_run["gap"]["split"] == pytest.approx(0.0, abs=1e-9)


def test_the_script_writes_both_tables_and_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sitting = drifting_sitting(tmp_path / "sit")
    out = tmp_path / "out"
    assert main([str(sitting), "--out", str(out)]) == 0
    assert len(pd.read_csv(out / "spread.csv")) == 2
    assert list(pd.read_csv(out / "pricing.csv")["run"]) == ["a", "b", "s", "gap"]
    (sitting / "sitting.json").unlink()
    for argv in ([str(sitting)], [str(tmp_path / "nowhere")]):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--out", str(out)])
        assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: SITTING_DIR: holds no sitting.json")
    assert err[1].startswith("error: SITTING_DIR: not a directory")


@pytest.mark.parametrize(
    ("damage", "phrase"),
    [
        (lambda s: (s / "sitting.json").write_text('{"participants": ['), "sitting.json"),
        (
            lambda s: _edit_csv(s / "run_a" / "steps.csv", "duration_s", "fast"),
            "column duration_s, row 1: 'fast' is not a finite number",
        ),
        (
            lambda s: _edit_csv(s / "operator_profile" / "operator_profile.csv", "time_ms", "nan"),
            "operator_profile.csv",
        ),
    ],
    ids=["truncated_sitting_json", "text_in_a_step_time", "nan_in_the_profile"],
)
def test_a_damaged_sitting_is_one_line(
    damage, phrase: str, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    sitting = drifting_sitting(tmp_path / "sit")
    damage(sitting)
    with pytest.raises(SystemExit) as exit_:
        main([str(sitting), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and phrase in err and "Traceback" not in err


def _edit_csv(path: Path, column: str, value: str) -> None:
    table = pd.read_csv(path)
    table[column] = table[column].astype(object)
    table.loc[0, column] = value
    table.to_csv(path, index=False)
