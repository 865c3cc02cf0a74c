"""Fig. 12's Alpaca step mix (experiments.report.fig12_mix): the counts, the runs it asks
for, the report lines, and the iteration rule it explains, on real simulator runs."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.report import fig12_mix, fig12_rates


def _steps(rows: list[tuple[int, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["prefill_seqs", "decode_seqs", "duration_s"])


def test_step_mix_counts_each_kind_and_the_prompt_only_share_of_busy_time() -> None:
    steps = _steps([(2, 0, 0.03), (0, 5, 0.01), (1, 4, 0.02), (0, 3, 0.03), (0, 0, 0.01)])
    mix = fig12_mix.step_mix(steps)
    assert mix["steps"] == 5
    assert (mix["prompt_only_steps"], mix["mixed_steps"], mix["decode_only_steps"]) == (1, 1, 2)
    assert mix["decode_only_step_ms"] == pytest.approx(20.0)
    assert mix["prompt_only_busy_pct"] == pytest.approx(30.0)
    none = fig12_mix.step_mix(_steps([(1, 0, 0.0)]))
    assert math.isnan(none["decode_only_step_ms"]) and math.isnan(none["prompt_only_busy_pct"])


def test_mix_runs_cover_the_alpaca_panels_at_half_the_axis() -> None:
    runs = fig12_mix.mix_runs(fig12_rates.PANELS, lambda p: 60.0, seed=3)
    assert [(r.letter, r.system) for r in runs] == [
        ("d", "vllm"), ("d", "orca_oracle"), ("f", "vllm"), ("f", "orca_oracle"),
    ]  # fmt: skip
    f_vllm = runs[2]
    assert f_vllm.rate == fig12_rates.BY_LETTER["f"].axis / 2 == 10.0
    assert {"model=opt-175b", "workload=alpaca", "workload.rate=10", "seed=3",
            "workload.duration_s=60.0", "system=vllm"} <= set(f_vllm.overrides)  # fmt: skip
    assert f_vllm.label == "fig12_f_steps_vllm"
    assert fig12_mix.mix_runs([fig12_rates.BY_LETTER["a"]], lambda p: 60.0, 0) == []


def _panel_runs(letter: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs and a capacity table: vLLM sustains 20 req/s, Orca (Oracle) 10, two seeds."""
    runs, cap = [], []
    for system, rate, batch, free_at_limit, free in (
        ("vllm", 20.0, 100.0, 40.0, 10.0), ("orca_oracle", 10.0, 50.0, 2.0, 1.0),
    ):  # fmt: skip
        for seed in (0, 1):
            runs.append({"setting": letter, "system": system, "rate": rate, "seed": seed,
                         "mean_batch_size": batch + seed, "num_preemptions": 10 * seed,
                         "kv_free_at_limit_pct": free_at_limit, "kv_free_pct": free})  # fmt: skip
            runs.append({"setting": letter, "system": system, "rate": 2 * rate, "seed": seed,
                         "mean_batch_size": 999.0, "num_preemptions": 999,
                         "kv_free_at_limit_pct": 0.0, "kv_free_pct": 0.0})  # fmt: skip
        cap.append({"panel": letter, "system": system, "max_rate": rate})
    return pd.DataFrame(runs), pd.DataFrame(cap)


def test_lines_give_memory_at_the_sustainable_rate_and_the_step_mix() -> None:
    runs, cap = _panel_runs("f")
    mix = fig12_mix.mix_table([
        {"panel": "f", "system": s, "rate": 10.0, "seed": 0, "trace_s": 60.0, "steps": n,
         "prompt_only_steps": p, "mixed_steps": m, "decode_only_steps": n - p - m,
         "decode_only_step_ms": ms, "prompt_only_busy_pct": busy, "mean_tpot_ms": tpot}
        for s, n, p, m, ms, busy, tpot in (("vllm", 1678, 471, 0, 53.26, 26.6, 93.8),
                                          ("orca_oracle", 1589, 1, 473, 50.69, 0.06, 54.3))
    ])  # fmt: skip
    lines = fig12_mix.lines(runs, cap, mix)
    text = "\n".join(lines)
    assert lines[0].startswith("Why the Alpaca ratio moves (computed;")
    # the runs at each system's own sustainable rate, not the failing ones above it
    assert "at the sustainable rates (20 and 10 req/s, mean over seeds)" in text
    assert "vLLM batches 100 requests against Orca (Oracle)'s 50" in text  # 100.5, 50.5
    assert "with 50.0% of its KV free (40.0% while requests wait on a scheduler limit" in text
    assert "Orca (Oracle): 3.0% and 2.0%) and 5 preemptions" in text
    assert "471 of vLLM's 1,678 steps are prompt-only (27% of its busy time)" in text
    assert "against 1 of Orca (Oracle)'s 1,589, whose prompts ride in 473 decode steps" in text
    assert "a decode-only step takes 53.3 ms against 50.7" in text
    assert "mean TPOT is 93.8 against 54.3 ms" in text
    memory_only = "\n".join(fig12_mix.lines(runs, cap, None))
    assert "memory, at the sustainable rates" in memory_only and "prompt-only (" not in memory_only


def test_the_free_memory_at_a_limit_is_named_by_its_limit() -> None:
    runs, cap = _panel_runs("f")
    # vLLM's 40% at a limit: 31 max_num_seqs, 9 the token budget; Orca's 2% the token budget;
    # a limit's 0.04 prints as 0.0 and is left out
    split = {"max_num_seqs": (31.0, 0.0), "token_budget": (8.96, 2.0),
             "batch_in_flight": (0.0, 0.0), "policy_limit": (0.04, 0.0)}  # fmt: skip
    for key, (v, o) in split.items():
        runs[f"kv_free_at_{key}_pct"] = runs["system"].map({"vllm": v, "orca_oracle": o})
    text = "\n".join(fig12_mix.lines(runs, cap, None))
    assert ("(40.0% while requests wait on a scheduler limit (max_num_seqs 31.0%, "
            "max_num_batched_tokens 9.0%); Orca (Oracle): 3.0% and 2.0% "
            "(max_num_batched_tokens 2.0%)) and") in text  # fmt: skip
    # a CSV written before the split: the total alone, as before
    plain = "\n".join(fig12_mix.lines(_panel_runs("f")[0], cap, None))
    assert "limit; Orca (Oracle): 3.0% and 2.0%) and" in plain


def test_no_split_where_a_run_at_the_rate_does_not_record_it() -> None:
    """A run resumed from before the split (no ``kv_free_at_<limit>_pct``) beside one that
    has it: a mean over the runs that record it is not the total's split, so none is shown."""
    runs, cap = _panel_runs("f")
    seed1 = (runs["system"] == "vllm") & (runs["seed"] == 1)
    runs.loc[seed1, "kv_free_at_limit_pct"] = 20.0  # vLLM's total: (40 + 20) / 2 = 30
    for key in ("max_num_seqs", "token_budget", "batch_in_flight", "policy_limit"):
        # all of each total on max_num_seqs: vLLM's seed 0 40%, Orca (Oracle)'s 2%
        runs[f"kv_free_at_{key}_pct"] = runs["kv_free_at_limit_pct"] * (key == "max_num_seqs")
        runs.loc[seed1, f"kv_free_at_{key}_pct"] = float("nan")
    text = "\n".join(fig12_mix.lines(runs, cap, None))
    assert "(30.0% while requests wait on a scheduler limit; Orca (Oracle): 3.0% and" in text
    assert fig12_mix.memory_at_rate(runs, cap, "f", "vllm")["by_limit"] == {}
    assert fig12_mix.memory_at_rate(runs, cap, "f", "orca_oracle")["by_limit"] == {
        "max_num_seqs": 2.0, "max_num_batched_tokens": 0.0,
        "the batch in flight": 0.0, "the policy's own limit": 0.0,
    }  # fmt: skip


def test_no_lines_without_an_alpaca_panel_or_the_memory_columns() -> None:
    runs, cap = _panel_runs("a")
    assert fig12_mix.lines(runs, cap, None) == []
    runs, cap = _panel_runs("d")
    assert fig12_mix.lines(runs.drop(columns=["kv_free_pct"]), cap, None) == []
    assert fig12_mix.lines(runs, cap[cap["system"] == "vllm"], None) == []


def test_vllm_runs_prompts_alone_and_orca_inside_decode_steps(tmp_path) -> None:
    """The rule the lines explain, on the simulator: vLLM (v0.1's scheduler) gives each
    admitted prompt a prompt-only step; Orca batches prompts into decode steps."""
    from experiments.reproduce import compose_config
    from experiments.simulate import run

    panel = fig12_rates.BY_LETTER["d"]
    mixes = {}
    for r in fig12_mix.mix_runs([panel], lambda p: 8.0, seed=0):
        metrics = run(compose_config(list(r.overrides)), tmp_path / r.label)
        mixes[r.system] = fig12_mix.mix_row(r, tmp_path / r.label, metrics)
    vllm, orca = mixes["vllm"], mixes["orca_oracle"]
    assert vllm["prompt_only_steps"] > 0 and vllm["mixed_steps"] == 0
    assert orca["mixed_steps"] > 0 and orca["prompt_only_steps"] <= 1  # the first prompt
    assert vllm["prompt_only_busy_pct"] > orca["prompt_only_busy_pct"]


def _mix(**change: float) -> pd.DataFrame:
    """A step mix of panel (f), vLLM against Orca (Oracle), with ``change`` on both rows."""
    return fig12_mix.mix_table([
        {"panel": "f", "system": s, "rate": 10.0, "seed": 0, "trace_s": 60.0, "steps": 100,
         "prompt_only_steps": p, "mixed_steps": m, "decode_only_steps": 100 - p - m,
         "decode_only_step_ms": 50.0, "prompt_only_busy_pct": busy, "mean_tpot_ms": 60.0}
        | change
        for s, p, m, busy in (("vllm", 30, 0, 25.0), ("orca_oracle", 1, 30, 0.1))
    ])  # fmt: skip


def test_a_mix_run_without_a_step_or_a_number_prints_no_nan() -> None:
    """Before: a trace too short for a request (``--duration 0.2``) printed "0 of vLLM's 0
    steps are prompt-only (nan% of its busy time)" and "nan ms"."""
    runs, cap = _panel_runs("f")
    empty = _mix(steps=0, prompt_only_steps=0, mixed_steps=0, decode_only_steps=0,
                 decode_only_step_ms=math.nan, prompt_only_busy_pct=math.nan,
                 mean_tpot_ms=math.nan)  # fmt: skip
    text = "\n".join(fig12_mix.lines(runs, cap, empty))
    assert "nan" not in text.lower()
    assert "steps, one run each at 10 req/s (seed 0, 60-s trace): neither system ran a step" in text
    no_decode_only = "\n".join(fig12_mix.lines(runs, cap, _mix(decode_only_step_ms=math.nan)))
    assert "nan" not in no_decode_only.lower()
    assert "a decode-only step takes — ms against —" in no_decode_only


def test_a_resumed_mix_run_without_a_tpot_gives_a_row(tmp_path) -> None:
    """Before: with ``--launcher`` a finished run is read back from its ``metrics.json``,
    which writes NaN as null, so a rerun of the command raised TypeError in ``mix_row``."""
    run = fig12_mix.mix_runs([fig12_rates.BY_LETTER["f"]], lambda p: 60.0, 0)[0]
    _steps([(1, 0, 0.02), (0, 1, 0.01)]).to_csv(tmp_path / "steps.csv", index=False)
    row = fig12_mix.mix_row(run, tmp_path, {"mean_tpot_ms": None})
    assert math.isnan(row["mean_tpot_ms"]) and row["steps"] == 2


def test_memory_at_a_rate_that_is_only_a_lower_bound_is_marked() -> None:
    """A system that passed every rate tried has no sustainable rate, only ≥ the highest
    tried: the line says so instead of "at the sustainable rates (20 and 10 req/s"."""
    runs, cap = _panel_runs("f")
    cap["rate_open"] = cap["system"] == "vllm"
    text = "\n".join(fig12_mix.lines(runs, cap, None))
    assert "(≥ 20 and 10 req/s" in text


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "empty: no step-mix rows"),
        ("panel,system,rate\nf,vllm,10\n", "missing column(s) seed, trace_s, steps"),
        (None, "line 4: panel f, system vllm a second time"),
    ],
)
def test_a_bad_step_mix_file_is_one_line(tmp_path, capsys, content, problem) -> None:
    """Before: ``python -m experiments.report.fig12_rates DIR`` with an empty or cut
    ``fig12_step_mix.csv`` ended in a pandas traceback."""
    from experiments.report.figures import pyplot
    from tests.test_fig12_censoring import panel_rows

    fig12_rates.write(panel_rows({"vllm": 1.0, "orca_oracle": 0.5}), tmp_path,
                      pyplot(headless=True), 1.0)  # fmt: skip
    path = tmp_path / fig12_rates.MIX_FILE
    if content is None:  # one system's row twice
        mix = _mix()
        pd.concat([mix, mix[mix["system"] == "vllm"]]).to_csv(path, index=False)
    else:
        path.write_text(content)
    with pytest.raises(SystemExit) as ended:
        fig12_rates.main([str(tmp_path)])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ") and problem in err, err
