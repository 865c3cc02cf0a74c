"""The sharing figures (Fig. 14–17): capacity searches on a fake runner, and each figure's
files and report section from their rows."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest

from experiments.report import fig14_sampling, fig16_prefix, fig17_chatbot, sharing
from experiments.report.rate_search import capacity_table, max_rate, run_search

matplotlib.use("Agg")
CAPACITY = {"vllm": 9.0, "orca_oracle": 4.0, "orca_max": 2.0, "orca_pow2": 3.0}


def fake_runner(calls: list[tuple[str, list[str]]]):
    """Normalized latency 0.5 s/token under the system's capacity, 5 above it."""

    def run(label: str, overrides: list[str]) -> dict:
        calls.append((label, overrides))
        system = next(o.split("=")[1] for o in overrides if o.startswith("system="))
        rate = float(next(o.split("=")[1] for o in overrides if o.startswith("workload.rate=")))
        saving = 40.0 if any("beam_width" in o for o in overrides) else 8.0
        return {"num_requests": 10, "completed": 10, "kv_sharing_saving_pct": saving,
                "normalized_latency": 0.5 if rate <= CAPACITY[system] else 5.0}  # fmt: skip

    return run


def test_search_brackets_then_bisects_and_stops_after_two_failures() -> None:
    calls: list = []
    search = fig14_sampling.searches(60.0, 0)[1]  # parallel n=2, vllm
    rows = run_search(fake_runner(calls), search, threshold=1.0)
    rates = [r["rate"] for r in rows]
    assert rates == [2, 4, 8, 12, 16, 10, 9, 9.5]  # two failures end the grid; bisect 8-12
    assert max_rate(rows) == 9.0
    assert all(r["setting"] == "n 2" and r["system"] == "vllm" for r in rows)
    assert calls[0][1][:3] == ["model=opt-13b", "hardware=a100-40gb", "workload=alpaca"]
    assert "workload.n=2" in calls[0][1]


def test_fig14_runs_every_rate_on_its_seeds() -> None:
    calls: list = []
    search = fig14_sampling.searches(60.0, 5, seeds=3)[1]
    assert search.seeds == (5, 6, 7) and not any(o.startswith("seed=") for o in search.fixed)
    rows = run_search(fake_runner(calls), search, threshold=1.0)
    assert {o for _, over in calls for o in over if o.startswith("seed=")} == {
        "seed=5", "seed=6", "seed=7"}  # fmt: skip
    cap = capacity_table(rows, "orca_oracle")[0]
    assert cap["seeds"] == 3 and cap["rate_lo"] == cap["rate_hi"] == cap["max_rate"] == 9.0


def test_chatbot_trace_length_follows_the_rate() -> None:
    search = fig17_chatbot.searches(600.0, 0)[0]
    assert search.overrides(2.0)[-2:] == ["workload.rate=2.0", "workload.num_conversations=300"]


def test_capacity_table_ratios() -> None:
    rows = [
        {"setting": "s", "system": "vllm", "rate": 4.0, "passes": True},
        {"setting": "s", "system": "orca_oracle", "rate": 2.0, "passes": True},
        {"setting": "s", "system": "orca_oracle", "rate": 3.0, "passes": False},
    ]
    cap = {r["system"]: r for r in capacity_table(rows, "orca_oracle")}
    assert cap["orca_oracle"]["vllm_ratio"] == 2.0 and cap["vllm"]["vllm_ratio"] == 1.0


def test_every_figure_writes_files_and_a_section(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(fig14_sampling, "RATES", (2.0, 4.0, 8.0, 12.0))
    runner = fake_runner([])
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        jobs = sharing.submit(pool, runner, 60.0, 0, 1.0)
        text = sharing.write(jobs, tmp_path, sharing._plt(), 60.0)
    for stem in ("fig14_sampling", "fig15_sharing", "fig16_prefix", "fig17_chatbot"):
        for ext in ("csv", "png", "pdf"):
            assert (tmp_path / f"{stem}.{ext}").stat().st_size > 0
    assert "| beam 6 | 4.00 [4.00, 4.00] | 9.00 [9.00, 9.00] | 2.25× [2.25, 2.25] | 2.3× |" in text
    # the coarse grid's bracket, [8/12, 12/4], holds the paper's 2.3: not decided
    assert "Gap at beam width 6: kvlab − paper = not decided (-0.05× at the rates found)" in text
    assert "| n 2 | 9.00 | 8.0 | 8.0–8.0 | 6.1–9.8 |" in text
    assert "| beam 4 | 9.00 | 40.0 | 40.0–40.0 | 37.6–55.2 |" in text
    assert "| 1-shot | 4.00 | 9.00 | 2.25× | 1.67× | +0.58× |" in text
    # Fig. 17's grid ends at 3 req/s: the searches go on above it in steps of 1.5x.
    assert "| Orca (Max) | 2.00 | 4.43× | 2.0× | +2.43× |" in text
    assert "| Orca (Oracle) | 3.94 |" in text and "| vLLM | 8.86 | 1.00× | — | — |" in text


@pytest.mark.parametrize("module", [fig14_sampling, fig16_prefix, fig17_chatbot])
def test_searches_compose_as_configs(module) -> None:
    from experiments.reproduce import compose_config

    for s in module.searches(30.0, 0):
        compose_config(s.overrides(s.rates[0]))


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--threshold", "nan"], "error: --threshold: not a number > 0 (got nan)"),
        (["--duration", "-1"], "error: --duration: not a number > 0 (got -1.0)"),
        (["--workers", "0"], "error: --workers: not a count >= 1 (got 0)"),
        (["--seeds", "0"], "error: --seeds: not a count >= 1 (got 0)"),
    ],
)
def test_bad_numbers_are_one_line_before_any_run(args, line, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as ended:
        sharing.main([*args, "--out", str(out)])
    assert ended.value.code == 2
    assert capsys.readouterr().err == line + "\n"
    assert not out.exists()  # nothing ran


def test_an_out_that_is_a_file_is_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "taken"
    out.write_text("")
    with pytest.raises(SystemExit) as ended:
        sharing.main(["--out", str(out)])
    assert ended.value.code == 2
    assert capsys.readouterr().err == f"error: --out: {out} is a file, not a folder\n"


def test_fig15_range_leaves_out_runs_that_held_no_block() -> None:
    from experiments.report.fig15_sharing import table

    rows = [{"setting": "n 2", "system": "vllm", "rate": rate, "seed": 0, "passes": True,
             "kv_sharing_saving_pct": pct}
            for rate, pct in ((1.0, float("nan")), (2.0, 8.0), (3.0, 6.0))]  # fmt: skip
    row = table(rows).iloc[0]
    assert (row["min_saving_pct"], row["max_saving_pct"]) == (6.0, 8.0)
