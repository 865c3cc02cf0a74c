"""Fig. 12 (a)-(f) and the seed-aware capacity search: the search's properties on fake
runners (the rate returned passes on every seed, the next evaluated rate above it does not,
seeds aggregate as documented), the interval logic, the report section, and a tiny
reproduce run of two panels."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pandas as pd
import pytest
from hypothesis import given, settings

from experiments.report import fig12_rates
from experiments.report.rate_search import (
    BACKLOG_MIN_REQUESTS,
    Search,
    at_max_rate,
    capacity_table,
    curve_table,
    max_rate,
    passes,
    run_search,
    seed_rates,
)


def capacity_runner(capacity: dict[int | None, float], calls: list | None = None):
    """Each seed has its own capacity: latency 0.5 s/token at or under it, 5 above."""

    def run(label: str, overrides: list[str]) -> dict:
        rate = float(next(o.split("=")[1] for o in overrides if o.startswith("workload.rate=")))
        seed = next((int(o.split("=")[1]) for o in overrides if o.startswith("seed=")), None)
        if calls is not None:
            calls.append((label, rate, seed))
        ok = rate <= capacity[seed]
        return {"num_requests": 200, "completed": 200, "normalized_latency": 0.5 if ok else 5.0,
                "unfinished_at_last_arrival": 0.02 if ok else 0.3}  # fmt: skip

    return run


RATES = (0.5, 1.0, 2.0, 4.0, 8.0)


@settings(max_examples=40, deadline=None)
@given(
    caps=st.lists(st.floats(0.1, 20.0), min_size=1, max_size=4),
    stop_after=st.integers(1, 2),
    bisect=st.integers(0, 4),
)
def test_search_returns_a_rate_every_seed_passes_and_the_next_one_fails(
    caps: list[float], stop_after: int, bisect: int
) -> None:
    seeds = tuple(range(len(caps)))
    search = Search("t", "s", "vllm", ("system=vllm",), RATES, seeds=seeds,
                    bisect_evals=bisect, stop_after=stop_after)  # fmt: skip
    rows = run_search(capacity_runner(dict(zip(seeds, caps, strict=True))), search, 1.0)
    best = max_rate(rows)
    # Every rate is evaluated on every seed.
    for rate in {r["rate"] for r in rows}:
        assert sorted(r["seed"] for r in rows if r["rate"] == rate) == list(seeds)
    if best > 0:
        assert best <= min(caps)
        assert all(r["passes"] for r in rows if r["rate"] == best)
    above = sorted(r["rate"] for r in rows if r["rate"] > best)
    if above:  # the next evaluated rate above the answer fails on some seed
        assert not all(r["passes"] for r in rows if r["rate"] == above[0])
        assert above[0] > min(caps)
    # Each seed's own rate is what its runs alone give, and the interval spans them.
    per_seed = seed_rates(rows)
    assert set(per_seed) == set(seeds)
    assert min(per_seed.values()) >= best
    for seed, cap in zip(seeds, caps, strict=True):
        assert per_seed[seed] <= cap


def test_bisection_narrows_the_bracket_and_the_grid_stops_at_the_first_failure() -> None:
    calls: list = []
    search = Search("t", "s", "vllm", (), RATES, seeds=(0, 1), bisect_evals=2, stop_after=1)
    rows = run_search(capacity_runner({0: 3.0, 1: 5.0}, calls), search, 1.0)
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    assert rates == [0.5, 1.0, 2.0, 4.0, 3.0, 3.5]  # 4 fails on seed 0: grid stops; bisect
    assert max_rate(rows) == 3.0
    assert seed_rates(rows) == {0: 3.0, 1: 4.0}  # seed 1 never failed: its highest rate
    assert {label for label, _, _ in calls} >= {"t_s_vllm_rate3_seed0", "t_s_vllm_rate3_seed1"}
    cap = {c["system"]: c for c in capacity_table(rows, "vllm")}["vllm"]
    assert (cap["max_rate"], cap["rate_lo"], cap["rate_hi"], cap["seeds"]) == (3.0, 3.0, 4.0, 2)
    assert cap["first_failing_rate"] == 3.5


@pytest.mark.parametrize("tol", [0.03, 0.01, 0.002])
def test_bisection_stops_once_the_rate_is_bracketed_within_the_tolerance(tol: float) -> None:
    search = Search("t", "s", "vllm", (), RATES, seeds=(0,), bisect_evals=20, stop_after=1,
                    rate_tol=tol)  # fmt: skip
    rows = run_search(capacity_runner({0: 3.1}), search, 1.0)
    best = max_rate(rows)
    failing = min(r["rate"] for r in rows if r["rate"] > best)
    assert best <= 3.1 < failing
    assert failing - best <= tol * failing
    bisected = [r["rate"] for r in rows if r["rate"] not in RATES]
    # it stopped at the first bracket within the tolerance: the one before was wider
    before = sorted({*RATES, *bisected[:-1]})
    lo = max(r for r in before if r <= 3.1)
    hi = min(r for r in before if r > 3.1)
    assert hi - lo > tol * hi


def test_capacity_ratios_carry_the_seed_intervals() -> None:
    def rows(system: str, per_seed: dict[int, float]) -> list[dict]:
        out = []
        for seed, cap in per_seed.items():
            for rate in (1.0, 2.0, 3.0, 4.0):
                out.append({"setting": "a", "system": system, "seed": seed, "rate": rate,
                            "passes": rate <= cap, "normalized_latency": rate / 4})  # fmt: skip
        return out

    table = capacity_table(rows("vllm", {0: 4.0, 1: 3.0}) + rows("orca_max", {0: 1.0, 1: 2.0}),
                           "vllm")  # fmt: skip
    o = {c["system"]: c for c in table}["orca_max"]
    assert (o["max_rate"], o["rate_lo"], o["rate_hi"]) == (1.0, 1.0, 2.0)
    assert o["vllm_ratio"] == 3.0  # all-seed rates: 3 / 1
    assert (o["ratio_lo"], o["ratio_hi"]) == (1.5, 4.0)  # 3 / 2 and 4 / 1
    curves = curve_table(rows("vllm", {0: 4.0, 1: 3.0}))
    curve = {(c["system"], c["rate"]): c for c in curves}
    c4 = curve[("vllm", 4.0)]
    assert (c4["seeds"], c4["passes"], c4["normalized_latency_mean"]) == (2, False, 1.0)


def test_at_max_rate_averages_the_seeds_runs() -> None:
    rows = [{"rate": 2.0, "seed": s, "passes": True, "kv_sharing_saving_pct": v}
            for s, v in ((0, 10.0), (1, 20.0))]  # fmt: skip
    rows.append({"rate": 3.0, "seed": 0, "passes": False, "kv_sharing_saving_pct": 0.0})
    best = at_max_rate(rows)
    assert best is not None and best["kv_sharing_saving_pct"] == 15.0 and best["seeds"] == 2


def test_the_curve_table_does_not_depend_on_the_order_of_its_runs() -> None:
    # reproduce hands the runs over in submission order, `fig12_rates DIR` in panel order:
    # both must write the same fig12_curves.csv
    rows = [{"setting": p, "system": s, "rate": r, "seed": 0, "passes": True,
             "normalized_latency": r / 10, "num_requests": 10}
            for p in ("b", "a") for s in ("vllm", "orca_max") for r in (2.0, 1.0)]  # fmt: skip
    table = curve_table(rows)
    assert curve_table(rows[::-1]) == table
    keys = [(c["rate"], c["setting"], c["system"]) for c in table]
    assert keys == sorted(keys)


def test_at_max_rate_leaves_out_a_seed_that_could_not_measure() -> None:
    # a seed whose run held no block has no saving (NaN); the others still give the mean
    rows = [{"rate": 2.0, "seed": s, "passes": True, "kv_sharing_saving_pct": v}
            for s, v in ((0, 10.0), (1, math.nan), (2, 20.0), (3, None))]  # fmt: skip
    best = at_max_rate(rows)
    assert best is not None and best["kv_sharing_saving_pct"] == 15.0 and best["seeds"] == 4
    only_nan = [r | {"kv_sharing_saving_pct": math.nan} for r in rows]
    best = at_max_rate(only_nan)
    assert best is not None and best["kv_sharing_saving_pct"] is None


def test_a_run_passes_only_when_it_keeps_up() -> None:
    ok = {"normalized_latency": 0.5, "num_requests": 500, "completed": 500,
          "unfinished_at_last_arrival": 0.05}  # fmt: skip
    assert passes(ok, 1.0, max_backlog=0.1)
    assert not passes(ok | {"unfinished_at_last_arrival": 0.2}, 1.0, max_backlog=0.1)
    assert passes(ok | {"unfinished_at_last_arrival": 0.2}, 1.0)  # no backlog bound given
    # a short trace keeps the allowance of BACKLOG_MIN_REQUESTS x 10% = 10 requests
    n = 50
    few = ok | {"num_requests": n, "completed": n}
    assert BACKLOG_MIN_REQUESTS * 0.1 == 10 and n < BACKLOG_MIN_REQUESTS
    assert passes(few | {"unfinished_at_last_arrival": 10 / n}, 1.0, max_backlog=0.1)
    assert not passes(few | {"unfinished_at_last_arrival": 11 / n}, 1.0, max_backlog=0.1)
    assert not passes(ok | {"completed": 499}, 1.0)
    assert not passes(ok | {"normalized_latency": math.nan}, 1.0)


def test_a_rate_without_requests_is_not_measured() -> None:
    def run(label: str, overrides: list[str]) -> dict:
        rate = float(next(o.split("=")[1] for o in overrides if o.startswith("workload.rate=")))
        n = 0 if rate < 1 else 50
        return {"num_requests": n, "completed": n, "normalized_latency": 0.5 if rate <= 2 else 5}

    rows = run_search(run, Search("t", "s", "vllm", (), RATES, bisect_evals=0), 1.0)
    assert max_rate(rows) == 2.0


def test_panels_follow_the_paper() -> None:
    by = fig12_rates.BY_LETTER
    assert [(p.model, p.workload, p.axis) for p in fig12_rates.PANELS] == [
        ("opt-13b", "sharegpt", 2.0), ("opt-66b", "sharegpt", 1.0), ("opt-175b", "sharegpt", 2.5),
        ("opt-13b", "alpaca", 30.0), ("opt-66b", "alpaca", 20.0), ("opt-175b", "alpaca", 20.0),
    ]  # fmt: skip
    assert by["c"].hardware == "a100-80gb" and by["c"].full_s == 900.0
    assert by["a"].full_s == 3600.0
    for p in fig12_rates.PANELS:  # the grid spans the paper's axis and beyond
        assert p.rates[0] < p.axis / 8 and p.rates[-1] >= 2 * p.axis
    searches = fig12_rates.searches([by["b"]], False, None, (0, 1, 2), bisect_evals=2)
    assert {s.system for s in searches} == set(fig12_rates.SYSTEMS)
    over = searches[0].overrides(0.5, 1)
    assert over[:4] == ["model=opt-66b", "hardware=a100-40gb", "workload=sharegpt",
                        f"workload.duration_s={by['b'].default_s}"]  # fmt: skip
    assert over[-1] == "seed=1" and searches[0].max_backlog == fig12_rates.MAX_BACKLOG


@pytest.mark.parametrize("letter", ["b", "f"])
def test_panel_configs_compose(letter: str) -> None:
    from experiments.lib.setup import as_dict, build_setup
    from experiments.reproduce import COSTS, compose_config

    s = fig12_rates.searches([fig12_rates.BY_LETTER[letter]], False, 30.0, (0,), 1)[0]
    setup = build_setup(as_dict(compose_config([*s.overrides(1.0, 0), *COSTS["paper-a100"]])))
    assert setup.tp == fig12_rates.BY_LETTER[letter].gpus


def test_section_has_a_table_and_a_gap_line_per_panel(tmp_path) -> None:
    caps = {"vllm": 2.0, "orca_oracle": 1.0, "orca_max": 0.5, "orca_pow2": 0.75,
            "fastertransformer": 0.125}  # fmt: skip
    rows = []
    for letter in ("a", "d"):
        panel = fig12_rates.BY_LETTER[letter]
        scale = 1.0 if letter == "a" else 10.0
        for system, cap in caps.items():
            for seed in (0, 1, 2):
                for rate in panel.rates:
                    ok = rate <= cap * scale
                    rows.append({
                        "setting": letter, "system": system, "seed": seed, "rate": rate,
                        "passes": ok, "trace_s": 600.0, "normalized_latency": 0.1 if ok else 3.0,
                        "num_requests": 100, "mean_e2el_ms": 1000.0,
                        "unfinished_at_last_arrival": 0.01,
                    })  # fmt: skip
    from experiments.report.figures import pyplot

    text = fig12_rates.write(rows, tmp_path, pyplot(headless=True), 1.0)
    for stem in ("fig12a_opt13b_sharegpt", "fig12d_opt13b_alpaca", "fig12_all_panels"):
        assert (tmp_path / f"{stem}.png").stat().st_size > 0
        assert (tmp_path / f"{stem}.pdf").stat().st_size > 0
    assert (tmp_path / "fig12a_opt13b_sharegpt.csv").exists()
    cap = pd.read_csv(tmp_path / "fig12_capacity.csv")
    assert set(cap["panel"]) == {"a", "d"} and (cap["trace_s"] == 600.0).all()
    assert "Gap (a): vLLM sustains 2 req/s, inside the paper's axis (0–2)" in text
    # the grid's coarse steps leave both verdicts undecided (the rates passed and failed)
    assert (
        "vLLM / Orca (Oracle) = 2.00× (paper 1.7–2.7×: not decided: the search's resolution "
        "puts the ratio in [1.33, 3.00], across the paper's bound)"
    ) in text
    assert "vLLM / Orca (Max) = 4.00× (paper 2.7–8×: not decided: the search's resolution" in text
    assert "vLLM / FasterTransformer = 16.00× (paper up to 22×: not decided: the search" in text
    assert "Gap (d): vLLM sustains 15 req/s" in text and "| not stated |" in text
    # (d): FasterTransformer (0.125 x 10) fails even the grid's lowest rate, 1.875 req/s
    assert "| FasterTransformer | < 1.88 (none of the rates tried passed) |" in text
    assert (
        "passes none of the rates tried (from 1.88 req/s), so vLLM / FasterTransformer > 8.00×"
        in text
    )
    assert "| Orca (Oracle) | 1 [1, 1] | 100 | 1.0 | 0.01 | 2.00× [2.00, 2.00] | 1.7–2.7× |" in text
    short = [r | {"num_requests": 50} for r in rows if r["setting"] == "a"]
    text = fig12_rates.write(short, tmp_path, pyplot(headless=True), 1.0)
    assert "| 50 | 1.0 | 0.01 (< 100 requests: at most 10 unfinished) |" in text


@pytest.mark.slow
def test_reproduce_runs_two_panels_with_seeds(tmp_path) -> None:
    from experiments.reproduce import main

    main(["--figures", "fig12", "--duration", "15", "--seeds", "2", "--fig12-panels", "ad",
          "--workers", "1", "--out", str(tmp_path)])  # fmt: skip
    runs = pd.read_csv(tmp_path / "fig12d_opt13b_alpaca.csv")
    assert set(runs["seed"]) == {0, 1} and set(runs["system"]) == set(fig12_rates.SYSTEMS)
    assert (runs["trace_s"] == 15.0).all()
    cap = pd.read_csv(tmp_path / "fig12_capacity.csv")
    assert set(cap["panel"]) == {"a", "d"} and (cap["seeds"] == 2).all()
    assert (cap["rate_lo"] <= cap["rate_hi"]).all()
    report = (tmp_path / "report.md").read_text()
    assert "Gap (a):" in report and "Gap (d):" in report
    assert (tmp_path / "fig12_all_panels.png").exists()
    mix = pd.read_csv(tmp_path / "fig12_step_mix.csv")  # (d) only: (a) is ShareGPT
    assert sorted(zip(mix["panel"], mix["system"], strict=True)) == [
        ("d", "orca_oracle"), ("d", "vllm")]  # fmt: skip
    assert (tmp_path / "runs" / "fig12_d_steps_vllm" / "steps.csv").is_file()
    assert "Why the Alpaca ratio moves" in report and "- (d) memory, at the" in report


def _capacity(rates: dict[str, tuple[float, float]]) -> pd.DataFrame:
    """A panel's capacity rows: system -> (highest rate passed, lowest rate failed)."""
    v_pass = rates["vllm"][0]
    rows = [
        {"system": s, "max_rate": p, "first_failing_rate": f, "vllm_ratio": v_pass / p}
        for s, (p, f) in rates.items()
    ]
    return pd.DataFrame(rows).set_index("system")


def test_resolution_bracket_is_passed_over_failed_and_back() -> None:
    c = _capacity({"vllm": (2.1875, 2.25), "orca_max": (0.8125, 0.84375)})
    lo, hi = fig12_rates.resolution_bracket(c, "orca_max")
    assert lo == pytest.approx(2.1875 / 0.84375) and hi == pytest.approx(2.25 / 0.8125)
    top_passed = _capacity({"vllm": (2.0, float("nan")), "orca_max": (1.0, 1.1)})
    assert fig12_rates.resolution_bracket(top_passed, "orca_max") is None


def test_gap_line_says_undecided_when_the_resolution_straddles_the_paper_bound() -> None:
    panel = fig12_rates.BY_LETTER["a"]
    straddles = _capacity({"vllm": (2.1875, 2.25), "orca_max": (0.8125, 0.84375)})
    line = fig12_rates.gap_line(panel, straddles)
    # the point ratio lies below 2.7, but the bracket crosses it: neither inside nor outside
    assert "vLLM / Orca (Max) = 2.69× (paper 2.7–8×: not decided: the search's resolution" in line
    assert "[2.59, 2.77], across the paper's bound)" in line and "outside" not in line
    clear = _capacity({"vllm": (2.0, 2.05), "orca_max": (0.5, 0.52)})
    line = fig12_rates.gap_line(panel, clear)
    assert "vLLM / Orca (Max) = 4.00× (paper 2.7–8×: inside)" in line
    assert "not decided" not in line


def test_a_rejected_request_is_not_counted_as_unfinished() -> None:
    import pandas as pd

    from experiments.simulate import unfinished_at_last_arrival

    requests = pd.DataFrame({
        "arrival_s": [0.0, 1.0, 2.0, 3.0], "finish_s": [0.5, None, 9.0, 3.5],
        "status": ["finished", "rejected", "finished", "finished"],
    })  # fmt: skip
    # at t=3 requests 2 and 3 are still running; request 1 was rejected, not waiting
    assert unfinished_at_last_arrival(requests) == 0.5
