"""Gaps a mutation audit of the CPU cross-run tools found (``cross_run_summary``,
``cpu_error_parts``, ``speed_by_op``, ``fill_sweep_units``, ``cold_sweep``, ``interleave``,
``speed_timeline``): the numbers ``docs/validation/cpu-engine.md`` shows (relative errors'
denominators and weights, worst-over-pairs, the 5% boundary, medians, the A-B gap, the
turn clock) and the one-line errors on bad input. Small hand-built inputs only."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Generator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from experiments.bench import cold_sweep, cpu_error_parts, fill_sweep_units, interleave, speed_by_op
from experiments.bench import cross_run_summary as crs
from experiments.bench.cpu_cross_run import STRETCHES_PER_SWEEP
from experiments.bench.interleave import Participant, spread, take_turns
from experiments.bench.speed_timeline import shrink_to_price, stretches
from experiments.lib.checks import ConfigError
from tests.test_cost_profiled import synthetic_rows, write_profile
from tests.test_cpu_error_parts import make_sitting
from tests.test_speed_by_op import drifting_sitting

METRICS = ("request_throughput", "mean_tpot_ms", "mean_e2el_ms")


# --- cross_run_summary ---------------------------------------------------------------------


def _pair(fit: str, on: str, errs: tuple[float, float, float]) -> list[dict]:
    return [
        {"calibrated_on": fit, "validated_on": on, "role": "other run", "metric": m,
         "rel_err": e}
        for m, e in zip(METRICS, errs, strict=True)
    ]  # fmt: skip


def test_an_error_of_exactly_the_target_meets_it() -> None:
    doc = {"rows": _pair("S", "A", (0.05, -0.05, 0.0)) + _pair("S", "B", (0.0, 0.0, 0.0625))}
    (row,) = crs.summarise(doc, "s", 0.05)
    assert (row["pairs_met"], row["pairs"]) == (1, 2)  # |err| <= 5% meets it; 6.25% does not


def test_the_engine_against_itself_is_its_worst_difference_on_the_targets() -> None:
    doc = {
        "rows": _pair("S", "A", (0.01, 0.01, 0.01)),
        "repeatability": [{"metric": "request_throughput", "rel_diff": 0.01},
                          {"metric": "mean_e2el_ms", "rel_diff": -0.03},
                          {"metric": "mean_tpot_ms", "rel_diff": None}],
    }  # fmt: skip
    assert crs.summarise(doc, "s", 0.05)[0]["engine_vs_itself"] == pytest.approx(0.03)


def test_a_sitting_file_may_be_named_and_bad_summary_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sitting = tmp_path / "sit"
    sitting.mkdir()
    doc = {"rows": _pair("S", "A", (0.01, 0.02, 0.03))}
    (sitting / "cross_run.json").write_text(json.dumps(doc))
    assert crs.main([str(sitting / "cross_run.json")]) == 0  # the file itself, not its folder
    with pytest.raises(SystemExit) as exit_:
        crs.main([str(sitting), "--within", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().startswith("error: --within: must lie between 0")
    with pytest.raises(ConfigError, match=r"'speed_shrinkage' is not an object"):
        crs.check_sitting({**doc, "speed_shrinkage": [0.02]}, "f.json")


# --- cpu_error_parts -----------------------------------------------------------------------


class PriceColumns:
    """A stand-in model: the forward's price is the steps' ``fwd_price`` column, the whole
    step's ``fwd_price + host_price``, decode attention's ``attn_price``."""

    def profile_seconds(self, steps: pd.DataFrame) -> np.ndarray:
        return steps["fwd_price"].to_numpy(dtype=float)

    def predict_steps(self, steps: pd.DataFrame) -> np.ndarray:
        return (steps["fwd_price"] + steps["host_price"]).to_numpy(dtype=float)

    def profile_decode_attention(self, steps: pd.DataFrame) -> np.ndarray:
        return steps["attn_price"].to_numpy(dtype=float)


def _steps(rows: list[tuple]) -> pd.DataFrame:
    cols = ["prefill_tokens", "prefill_seqs", "decode_seqs", "forward_s", "transfer_s",
            "duration_s", "fwd_price", "host_price", "attn_price"]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


# an idle step, a prefill of two sequences, a one-sequence and a three-sequence decode
PARTS = _steps([
    (0, 0, 0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0),
    (10, 2, 0, 1.0, 0.5, 2.5, 2.0, 1.0, 0.0),
    (0, 0, 1, 1.0, 0.0, 1.5, 1.0, 1.0, 0.0),
    (0, 0, 3, 2.0, 0.0, 3.0, 2.0, 1.0, 0.0),
])  # fmt: skip


def test_each_part_is_price_over_measured_less_one_weighted_by_all_sequences() -> None:
    r = cpu_error_parts.run_parts(PriceColumns(), PARTS)  # type: ignore[arg-type]
    assert r["steps"] == 3  # the idle step is left out
    assert r["host_share"] == pytest.approx(2.5 / 7.0)  # of the step's whole measured time
    assert r["forward"] == pytest.approx(5 / 4 - 1)
    assert r["forward_per_seq"] == pytest.approx(11 / 9 - 1)  # prefill sequences count too
    assert r["host"] == pytest.approx(3 / 2.5 - 1)
    assert r["host_per_seq"] == pytest.approx(6 / 5.5 - 1)
    assert r["step"] == pytest.approx(8 / 6.5 - 1)
    assert r["step_per_seq"] == pytest.approx(17 / 14.5 - 1)


def test_a_run_without_one_sequence_decodes_has_nan_there() -> None:
    r = cpu_error_parts.run_parts(PriceColumns(), PARTS.drop(index=2))  # type: ignore[arg-type]
    assert math.isnan(r["forward_decode_one"]) and math.isnan(r["one_at"])
    assert r["forward_decode_many"] == pytest.approx(0.0)


def test_decode_steps_are_placed_at_their_median_middle() -> None:
    one, many = (0, 0, 1, 1.0, 0.0, 1.5, 1.0, 0.5, 0.0), (0, 0, 2, 1.0, 0.0, 1.5, 1.0, 0.5, 0.0)
    steps = _steps([one, one, many, many, one])
    r = cpu_error_parts.run_parts(PriceColumns(), steps, expected=10)  # type: ignore[arg-type]
    assert r["one_at"] == pytest.approx(0.15)  # places 0.05, 0.15, 0.45: the median
    assert r["many_at"] == pytest.approx(0.3)  # 0.25, 0.35
    # timed: the step's place is i / expected, not i / the run's length (all in stretch 1)
    timed = cpu_error_parts.run_parts(
        PriceColumns(),  # type: ignore[arg-type]
        steps,
        expected=10,
        timeline=[1.0, 3.0],
    )
    assert timed["forward"] == pytest.approx(r["forward"])


def test_pooled_profiles_must_hold_the_same_points_and_keep_the_firsts_sidecar(
    tmp_path: Path,
) -> None:
    first = write_profile(tmp_path / "p1", synthetic_rows(), gpu="cpu", model="opt-125m")
    other = write_profile(tmp_path / "p2", synthetic_rows(), gpu="cpu", model="tiny-opt")
    out = cpu_error_parts.pooled_profile([first, other], tmp_path / "pool")
    assert (out / "operator_profile.json").read_text() == (
        first / "operator_profile.json"
    ).read_text()
    table = pd.read_csv(other / "operator_profile.csv")
    table.loc[0, "num_tokens"] += 1  # same count of points, one of them another
    table.to_csv(other / "operator_profile.csv", index=False)
    with pytest.raises(ConfigError, match=r"its points differ"):
        cpu_error_parts.pooled_profile([first, other], tmp_path / "pool2")


def test_the_pooled_tables_default_name_says_pooled(tmp_path: Path) -> None:
    sitting = make_sitting(tmp_path / "sit", {"s": 1.0, "a": 1.1}, host_scale=1.0)
    own = str(sitting / "operator_profile")
    assert cpu_error_parts.main([str(sitting), "--profile-from", own]) == 0
    assert (sitting / "error_parts_pooled.csv").is_file()


def _sitting_with_sweeps(root: Path) -> Path:
    sitting = make_sitting(root, {"s": 1.0, "a": 1.0}, host_scale=1.0)
    path = sitting / "operator_profile" / "operator_profile.csv"
    table = pd.read_csv(path)
    table["sweeps_ms"] = [f"{t};{t}" for t in table["time_ms"]]
    table.to_csv(path, index=False)
    return sitting


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda s: [(p / "steps.csv").unlink() for p in s.glob("run_*")], r"no run_\*/steps"),
        (lambda s: (s / "operator_profile" / "operator_profile.csv").unlink(),
         r"holds no operator_profile.csv"),
        (lambda s: (s / "sitting.json").write_text("[]"), r"sitting.json: not a JSON object"),
    ],
    ids=["no_steps", "no_profile", "sitting_json_a_list"],
)  # fmt: skip
def test_a_broken_sitting_is_named(damage, match: str, tmp_path: Path) -> None:
    sitting = _sitting_with_sweeps(tmp_path / "sit")
    damage(sitting)
    with pytest.raises(ConfigError, match=match):
        cpu_error_parts.error_parts(sitting)


def test_fit_on_a_run_without_calibration_and_timed_without_a_record_are_refused(
    tmp_path: Path,
) -> None:
    sitting = _sitting_with_sweeps(tmp_path / "sit")  # sweeps, but no sitting.json
    with pytest.raises(ConfigError, match=r"^error: --fit-on: .*calibration.json does not"):
        cpu_error_parts.error_parts(sitting, "a")
    with pytest.raises(ConfigError, match=r"--timed: needs an interleaved sitting"):
        cpu_error_parts.error_parts(sitting, timed=True)


# --- speed_by_op ---------------------------------------------------------------------------


def test_the_matmul_classes_hold_their_bounds() -> None:
    table = pd.DataFrame({
        "op": ["linear", "linear", "lm_head", "linear", "linear", "attn_decode"],
        "num_tokens": [8, 9, 32, 512, 513, 8],
    })  # fmt: skip
    few, many = speed_by_op.SPLITS["matmuls of 1-8 rows / of 32-512 rows"]
    assert few(table).tolist() == [True, False, False, False, False, False]
    assert many(table).tolist() == [False, False, True, True, False, False]


def test_a_class_of_one_point_per_sweep_has_no_measured_spread(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    pd.DataFrame({
        "op": ["attn_decode", "linear", "linear"], "num_tokens": [1, 1, 2],
        "context_tokens": [64, 0, 0], "time_ms": [1.0, 2.0, 3.0],
        "sweeps_ms": ["1;2", "2;2", "3;3"], "sweep_units": ["0;0", "1;1", "2;2"],
    }).to_csv(folder / "operator_profile.csv", index=False)  # fmt: skip
    first, second = speed_by_op.SPLITS["decode attention / the rest"]
    got = speed_by_op.spread(folder, first, second)
    assert got["sweeps"] == 0 and all(math.isnan(got[k]) for k in ("sd", "least", "most"))


def test_each_way_of_pricing_takes_its_own_timelines(tmp_path: Path) -> None:
    profile = drifting_sitting(tmp_path / "sit") / "operator_profile"
    ways = speed_by_op.timelines(profile)
    whole = stretches(profile, STRETCHES_PER_SWEEP)
    attention = stretches(profile, STRETCHES_PER_SWEEP, speed_by_op._decode_attention)
    rest = stretches(profile, STRETCHES_PER_SWEEP, speed_by_op._not_decode_attention)
    assert whole is not None and attention is not None and rest is not None
    shrunk = shrink_to_price(whole).speeds
    assert ways["shrunk"] == (shrunk, shrunk)
    assert ways["shrunk_split"] == (
        shrink_to_price(attention).speeds,
        shrink_to_price(rest).speeds,
    )


def test_decode_errors_leave_idle_steps_out_and_place_steps_by_the_expectation() -> None:
    decode = (0, 0, 2, 1.0, 0.0, 2.0, 1.0, 0.5, 0.5)
    steps = _steps([decode, (0, 0, 0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0), decode, decode])
    flat = {"w": ([1.0], [1.0])}
    model = PriceColumns()
    got = speed_by_op.decode_errors(model, steps, 4, flat)  # type: ignore[arg-type]
    assert got == {"w": pytest.approx(3 * 1.5 / 6.0 - 1)}  # the idle 4 s is not measured
    # expected twice the run's steps: every step falls in the first half, at speed 1
    halves = {"w": ([1.0, 3.0], [1.0, 3.0])}
    again = speed_by_op.decode_errors(model, steps, 8, halves)  # type: ignore[arg-type]
    assert again == pytest.approx(got)


def test_the_gap_is_sharegpt_runs_mean_less_alpacas(tmp_path: Path) -> None:
    sitting = drifting_sitting(tmp_path / "sit")
    shutil.copytree(sitting / "run_b", sitting / "run_a2")  # a repeat of a, served as b was
    record = json.loads((sitting / "sitting.json").read_text())
    b = next(p for p in record["participants"] if p["participant"] == "b")
    record["participants"].append({**b, "participant": "a2"})
    (sitting / "sitting.json").write_text(json.dumps(record))
    _, pricing = speed_by_op.sitting_rows(sitting, "s")
    by_run = {r["run"]: r for r in pricing}
    assert by_run["a"]["timed"] != pytest.approx(by_run["b"]["timed"])
    want = (by_run["a"]["timed"] + by_run["a2"]["timed"]) / 2 - by_run["b"]["timed"]
    assert by_run["gap"]["timed"] == pytest.approx(want)
    shutil.rmtree(sitting / "run_b")  # no Alpaca run: no gap row
    _, pricing = speed_by_op.sitting_rows(sitting, "s")
    assert [r["run"] for r in pricing] == ["a", "a2", "s"]


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda s: shutil.copytree(s / "run_a", s / "run_c"), r"no expected steps for c"),
        (lambda s: [(p / "steps.csv").unlink() for p in s.glob("run_*")], r"no run_\*/steps"),
    ],
    ids=["run_not_in_record", "no_steps"],
)  # fmt: skip
def test_a_sitting_speed_by_op_cannot_use_is_named(damage, match: str, tmp_path: Path) -> None:
    sitting = drifting_sitting(tmp_path / "sit")
    damage(sitting)
    with pytest.raises(ConfigError, match=match):
        speed_by_op.sitting_rows(sitting, "s")


# --- fill_sweep_units, cold_sweep, speed_timeline -------------------------------------------


def test_fill_refuses_a_negative_size_and_a_bad_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "op,num_tokens,context_tokens,time_ms,sweeps_ms\nlinear,-2,0,2.5,2.4;2.6\n"
    (tmp_path / "operator_profile.csv").write_text(text)
    with pytest.raises(ConfigError, match=r"line 2, column num_tokens: not a whole number"):
        fill_sweep_units.read_profile(tmp_path / "operator_profile.csv")
    with pytest.raises(SystemExit) as exit_:
        fill_sweep_units.main([str(tmp_path), "--order", "random"])
    assert exit_.value.code == 2
    assert "--order must be 'sorted' or a seed" in capsys.readouterr().err
    assert (tmp_path / "operator_profile.csv").read_text() == text


def _cold_profile(path: Path, sweeps: list[str], meta: dict) -> Path:
    path.mkdir()
    rows = {"op": ["linear"] * len(sweeps), "num_tokens": list(range(1, len(sweeps) + 1)),
            "context_tokens": 0, "time_ms": 1.0, "sweeps_ms": sweeps}  # fmt: skip
    pd.DataFrame(rows).to_csv(path / "operator_profile.csv", index=False)
    (path / "operator_profile.json").write_text(json.dumps(meta))
    return path


def test_cold_sweep_refuses_what_it_cannot_set_aside(tmp_path: Path) -> None:
    ragged = _cold_profile(tmp_path / "r", ["1;2;3", "1;2"], {"method": "mean of 3"})
    with pytest.raises(ConfigError, match=r"different numbers of sweeps"):
        cold_sweep.set_aside(ragged, tmp_path / "o1", 1)
    none = tmp_path / "n"
    none.mkdir()
    pd.DataFrame({"op": ["linear"], "time_ms": [1.0]}).to_csv(none / "operator_profile.csv")
    (none / "operator_profile.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"records no sweeps_ms"):
        cold_sweep.set_aside(none, tmp_path / "o2", 1)
    for bad in ("1", 1.5, None, True):  # a JSON true is not a count
        with pytest.raises(ConfigError, match=r"cold_sweeps: must be a whole number"):
            cold_sweep.cold_sweeps({"cold_sweeps": bad})


def test_setting_aside_more_sweeps_records_the_total(tmp_path: Path) -> None:
    src = _cold_profile(tmp_path / "p", ["9;5;1;2"], {"method": "mean of 4"})
    once = cold_sweep.set_aside(src, tmp_path / "once", 1)
    twice = cold_sweep.set_aside(once, tmp_path / "twice", 2)
    meta = json.loads((twice / "operator_profile.json").read_text())
    assert meta["cold_sweeps"] == 2
    assert pd.read_csv(twice / "operator_profile.csv")["time_ms"].tolist() == [1.5]


def test_a_profile_whose_every_sweep_is_cold_has_no_timeline(tmp_path: Path) -> None:
    src = _cold_profile(tmp_path / "p", ["9;5", "3;4"], {"cold_sweeps": 2})
    assert stretches(src) is None


# --- interleave ----------------------------------------------------------------------------


def _units(n: int) -> Generator[None, None, int]:
    """``n`` units of work, then ``n``."""
    for _ in range(n):
        yield
    return n


def test_turns_are_timed_on_the_sittings_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(float(t) for t in range(100))
    monkeypatch.setattr(interleave, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    p = Participant("a", _units(4), 4)
    lines: list[str] = []
    take_turns([p], log=lines.append, log_every_s=2.5)
    # t0 = 0; unit k begins at 2k - 1 and ends at 2k
    assert p.turn_times == [2.0, 4.0, 6.0, 8.0]
    assert p.busy_s == pytest.approx(4.0)
    assert len(lines) == 2  # at 4 s and at 8 s: every 2.5 s, from the last line


def test_spread_gives_each_participants_quartiles_of_the_whole_sitting() -> None:
    early = Participant("early", _units(0), 4, done=4, turn_times=[1.0, 2.0, 3.0, 4.0])
    late = Participant("late", _units(0), 2, done=2, turn_times=[2.0, 8.0])
    rows = spread([early, late])
    assert [(r["first"], r["median"], r["last"]) for r in rows] == [
        (0.125, 0.312, 0.5),
        (0.25, 0.625, 1.0),
    ]
    assert rows[0]["q75"] == pytest.approx(0.406)
