"""Time added to every step on the profiled clock, and the reproduction's appendix that
asks what such unmodelled time would do to vLLM (on the report's clock and the roofline)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from core.plan import BatchShape
from experiments.lib.checks import ConfigError
from experiments.lib.setup import make_cost_model
from experiments.report.clock import gap_lines
from experiments.report.figures import overhead_sensitivity as draw_sensitivity
from experiments.report.markdown import _sensitivity_clock
from experiments.reproduce import CLOCK_OVERHEADS_S, COSTS, OVERHEADS_S, overhead_sensitivity
from sim.catalog import get_gpu, get_model
from sim.cost.profiled import ProfiledCostModel

PROFILE = str(Path(__file__).resolve().parents[1] / "sim/cost/profiles/vidur-a100-llama-2-7b")
SHAPES = (
    BatchShape(decode_seqs=1, decode_ctx_tokens=100),
    BatchShape(decode_seqs=24, decode_ctx_tokens=24 * 400),
    BatchShape(prefill_seqs=2, prefill_tokens=900, prefill_attn_pairs=2 * 450 * 451 // 2),
    BatchShape(decode_seqs=4, decode_ctx_tokens=2000, swap_out_blocks=8),
)


def _profiled(stack: str, **cost: object) -> Any:
    cost = {"kind": "profiled", "profile": PROFILE, "stack": stack, **cost}
    config = {"cost": cost, "system": {"block_size": 16}}
    return make_cost_model(config, get_model("opt-13b"), get_gpu("a100-40gb"))


@pytest.mark.parametrize("stack", ["vllm-2023", "none"])
def test_added_time_lands_on_every_non_empty_step_and_names_its_source(stack: str) -> None:
    base, added = _profiled(stack), _profiled(stack, per_step_overhead_s=0.003)
    for shape in SHAPES:
        assert added.step_time(shape) == pytest.approx(base.step_time(shape) + 0.003)
    assert added.step_time(BatchShape()) == 0.0
    eff = added.roofline.efficiency
    assert eff.per_step_overhead_s == 0.003
    assert "set in the run's config" in eff.source["per_step_overhead_s"]
    assert "per_step_overhead_s       0.003" in added.describe()


def test_added_time_is_checked_and_other_overrides_still_refused() -> None:
    with pytest.raises(ConfigError) as err:
        _profiled("none", per_step_overhead_s=-0.001)
    assert err.value.key == "cost.per_step_overhead_s"
    with pytest.raises(ValueError, match=r"no efficiency override 'compute'.*per_step_overhead_s"):
        ProfiledCostModel(
            PROFILE, "opt-13b", "a100-40gb",
            efficiency_overrides={"compute": 0.5},
        )  # fmt: skip


class _Recorder:
    """A pool that records what it is given and runs nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        self.calls.append(args)
        return Future()


def test_the_appendix_runs_the_reports_clock_then_the_roofline() -> None:
    pool = _Recorder()
    jobs = overhead_sensitivity(pool, ["seed=0"], "paper-a100")  # type: ignore[arg-type]
    keys = [key for key, _ in jobs]
    assert [k["clock"] for k in keys] == ["paper-a100"] * len(CLOCK_OVERHEADS_S) + [
        "roofline"
    ] * len(OVERHEADS_S)
    assert [k["report_clock"] for k in keys] == [k["clock"] == "paper-a100" for k in keys]
    labels = [label for label, _, _ in pool.calls]
    assert len(set(labels)) == len(labels)  # no run overwrites another's
    for key, (_, overrides, _) in zip(keys, pool.calls, strict=True):
        assert set(COSTS[key["clock"]]) <= set(overrides)
        seconds = key["per_step_overhead_ms"] / 1e3
        assert f"cost.per_step_overhead_s={seconds}" in overrides
        assert "system=vllm" in overrides and "workload.rate=2.0" in overrides
    only = overhead_sensitivity(_Recorder(), [], "roofline")  # type: ignore[arg-type]
    assert [k["clock"] for k, _ in only] == ["roofline"] * len(OVERHEADS_S)
    assert all(k["report_clock"] for k, _ in only)


def _sensitivity() -> pd.DataFrame:
    rows = [("paper-a100", True, ms, 86.0 + ms, 27.0 + ms / 10) for ms in (0.0, 5.0, 1.0)]
    rows += [("roofline", False, ms, 50.0 + ms, 17.0) for ms in (0.0, 10.0)]
    return pd.DataFrame(
        rows,
        columns=["clock", "report_clock", "per_step_overhead_ms", "kv_token_states_pct",
                 "mean_batch_size"],
    )  # fmt: skip


def _fig2_runs() -> pd.DataFrame:
    return pd.DataFrame([
        {"system": "vllm", "kv_token_states_pct": 86.0, "kv_free_pct": 11.0,
         "mean_batch_size": 27.0},
        {"system": "orca_oracle", "kv_token_states_pct": 39.0, "kv_free_pct": 1.0,
         "mean_batch_size": 12.0},
    ])  # fmt: skip


def test_the_gap_lines_say_what_added_time_gives_on_the_reports_clock_only() -> None:
    lines = gap_lines(_fig2_runs(), ("fig2", "fig13"), _sensitivity())
    assert lines[-1].startswith("- Time per step the clock does not model")
    assert lines[-1].endswith("+1 ms: 87.0%, batch 27.10; +5 ms: 91.0%, batch 27.50.")
    assert "roofline" not in lines[-1] and "+10 ms" not in lines[-1]
    plain = gap_lines(_fig2_runs(), ("fig2", "fig13"))
    assert lines[:-1] == plain and len(plain) == 2
    old_csv = _sensitivity().drop(columns=["clock", "report_clock"])
    assert gap_lines(_fig2_runs(), ("fig2",), old_csv) == gap_lines(_fig2_runs(), ("fig2",))
    assert gap_lines(_fig2_runs(), ("fig12",), _sensitivity()) == []


def test_a_sensitivity_csv_from_before_the_clock_column_reads_as_the_roofline() -> None:
    old = _sensitivity().drop(columns=["clock", "report_clock"])
    assert _sensitivity_clock(old.iloc[0]) == "bare roofline"
    new = _sensitivity()
    assert _sensitivity_clock(new.iloc[0]) == "the report's (paper-a100)"
    assert _sensitivity_clock(new.iloc[3]) == "bare roofline"
    old["normalized_latency"] = 0.1
    new["normalized_latency"] = 0.1
    lines_old = overhead_sensitivity_lines(old)
    lines_new = overhead_sensitivity_lines(new)
    assert lines_old == ["kvlab vLLM, bare roofline"]
    assert lines_new == ["kvlab vLLM, paper-a100", "kvlab vLLM, bare roofline"]


def overhead_sensitivity_lines(sens: pd.DataFrame) -> list[str]:
    """The labels of the kvlab lines in the appendix figure's first panel."""
    from experiments.report.figures import pyplot

    fig = draw_sensitivity(sens)
    try:
        return [
            line.get_label()
            for line in fig.axes[0].get_lines()
            if line.get_label().startswith("kvlab")
        ]
    finally:
        pyplot().close(fig)
