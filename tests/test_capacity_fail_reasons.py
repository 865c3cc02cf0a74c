"""Which rule failed a rate: ``rate_search.failed_rules`` (the rules ``passes`` applies, named),
each search row's ``fails_on``, ``capacity.csv``'s ``first_failing_rules``, the printed
table's "fails at" column and rule heading, the warning for a backlog failure at a low
latency, and ``experiments.capacity --help``."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from experiments import capacity
from experiments.report import fig12_rates
from experiments.report.rate_search import (
    BACKLOG_MIN_REQUESTS,
    failed_rules,
    passes,
    rules_failed_at,
    search_rate,
)

OK = {"normalized_latency": 0.5, "num_requests": 200, "completed": 200,
      "unfinished_at_last_arrival": 0.05}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "max_backlog", "rules"),
    [
        ({}, 0.1, ()),
        ({"normalized_latency": 1.0}, 0.1, ()),  # at the threshold passes
        ({"normalized_latency": 1.0001}, 0.1, ("latency",)),
        ({"normalized_latency": math.nan}, 0.1, ("latency",)),
        ({"normalized_latency": None}, 0.1, ("latency",)),
        ({"completed": 199}, 0.1, ("incomplete",)),
        ({"num_requests": 0, "completed": 0}, 0.1, ("incomplete",)),
        ({"completed": None}, 0.1, ()),  # not measured: no rule
        ({"unfinished_at_last_arrival": 20 / 200}, 0.1, ()),  # 20 of 200: the allowance
        ({"unfinished_at_last_arrival": 21 / 200}, 0.1, ("backlog",)),
        ({"unfinished_at_last_arrival": 0.5}, None, ()),  # no backlog bound given
        ({"unfinished_at_last_arrival": math.nan}, 0.1, ()),
        ({"unfinished_at_last_arrival": math.inf}, 0.1, ("backlog",)),
        ({"normalized_latency": 3.0, "completed": 150}, 0.1, ("latency", "incomplete")),
        ({"normalized_latency": 3.0, "unfinished_at_last_arrival": 0.5}, 0.1,
         ("latency", "backlog")),
        ({"normalized_latency": 3.0, "completed": 1, "unfinished_at_last_arrival": 0.5}, 0.1,
         ("latency", "incomplete", "backlog")),
    ],
)  # fmt: skip
def test_failed_rules_names_each_rule_a_run_fails(
    change: dict[str, Any], max_backlog: float | None, rules: tuple[str, ...]
) -> None:
    run = OK | change
    assert failed_rules(run, 1.0, max_backlog) == rules
    if not (isinstance(run["unfinished_at_last_arrival"], float)
            and math.isinf(run["unfinished_at_last_arrival"])):  # fmt: skip
        assert passes(run, 1.0, max_backlog) is (not rules)


def test_the_backlog_allowance_on_a_short_trace_is_the_same_boundary() -> None:
    # under BACKLOG_MIN_REQUESTS requests the allowance stays at 10% of that many: 10
    n = 40
    few = OK | {"num_requests": n, "completed": n}
    assert BACKLOG_MIN_REQUESTS == 100
    assert failed_rules(few | {"unfinished_at_last_arrival": 10 / n}, 1.0, 0.1) == ()
    assert failed_rules(few | {"unfinished_at_last_arrival": 11 / n}, 1.0, 0.1) == ("backlog",)
    # 149 requests: 14.9 allowed, 15 (rounded from the share) is one too many
    run = OK | {"num_requests": 149, "completed": 149}
    assert failed_rules(run | {"unfinished_at_last_arrival": 15 / 149}, 1.0, 0.1) == ("backlog",)
    assert failed_rules(run | {"unfinished_at_last_arrival": 14 / 149}, 1.0, 0.1) == ()


def _runner(fails: dict[float, dict[str, Any]]):
    """A fake run: OK metrics, changed at a rate as ``fails`` says (above the top: latency)."""

    def run(label: str, overrides: list[str]) -> dict[str, Any]:
        rate = float(next(o for o in overrides if o.startswith("workload.rate=")).split("=")[1])
        if rate > max(fails):
            return OK | {"normalized_latency": 5.0}
        return OK | fails.get(rate, {})

    return run


def test_each_search_row_records_the_rules_its_run_failed() -> None:
    empty = {"num_requests": 0, "completed": 0}
    fails = {1.0: {}, 2.0: empty, 4.0: {"unfinished_at_last_arrival": 0.5},
             8.0: {"normalized_latency": 3.0, "completed": 10}}  # fmt: skip
    rows = search_rate(_runner(fails), "t", lambda r, s: [f"workload.rate={r}"],
                       [1.0, 2.0, 4.0, 8.0], 1.0, bisect_evals=0, max_backlog=0.1,
                       stop_after=2)  # fmt: skip
    got = {r["rate"]: (r["passes"], r["fails_on"]) for r in rows}
    assert got[1.0] == (True, "")
    assert got[2.0] == (None, None)  # no request: not measured
    assert got[4.0] == (False, "backlog")
    assert got[8.0] == (False, "latency+incomplete")
    assert list(rows[0])[:4] == ["rate", "seed", "passes", "fails_on"]


def test_rules_failed_at_a_rate_are_the_union_over_seeds() -> None:
    rows = [{"rate": 2.0, "passes": False, "fails_on": "backlog"},
            {"rate": 2.0, "passes": False, "fails_on": "latency"},
            {"rate": 2.0, "passes": True, "fails_on": ""},
            {"rate": 3.0, "passes": False, "fails_on": "incomplete"},
            {"rate": 4.0, "passes": False}]  # fmt: skip
    assert rules_failed_at(rows, 2.0) == ("latency", "backlog")  # RULES' order
    assert rules_failed_at(rows, 3.0) == ("incomplete",)
    assert rules_failed_at(rows, 4.0) == ("unrecorded",)  # a row from an older CSV
    assert rules_failed_at(rows, None) == ()
    assert rules_failed_at(rows, 1.0) == ()


def test_per_run_csvs_with_and_without_the_column_read(tmp_path: Path) -> None:
    cols = list(fig12_rates.RUN_COLUMNS)
    old = pd.DataFrame(
        [
            ["a", "vllm", 1.0, 0, True, 60.0, 10, 0.1, 100.0, 0.0],
            ["a", "vllm", 2.0, 0, False, 60.0, 10, 3.0, 900.0, 0.5],
        ],
        columns=cols,
    )
    name = f"{fig12_rates.PANELS[0].name}.csv"
    old.to_csv(tmp_path / name, index=False)
    rows = fig12_rates.read_runs(tmp_path)  # written before fails_on: still read
    assert "fails_on" not in rows[0] and rules_failed_at(rows, 2.0) == ("unrecorded",)
    new = old.assign(fails_on=["", "latency+backlog"])
    new.to_csv(tmp_path / name, index=False)
    rows = fig12_rates.read_runs(tmp_path)
    assert [r["fails_on"] for r in rows] == ["", "latency+backlog"]  # "" read back, not NaN
    assert rules_failed_at(rows, 2.0) == ("latency", "backlog")


SMALL = ["workload.duration_s=60", "--systems", "vllm", "--seeds", "1",
         "--rates", "1,4", "--workers", "1", "--bisect-evals", "1"]  # fmt: skip


def test_a_real_search_names_the_rules_in_runs_csv_capacity_csv_and_the_table(
    tmp_path: Path, capsys
) -> None:
    out = capacity.main([*SMALL, "--out", str(tmp_path / "out")])
    runs = pd.read_csv(out / "runs.csv", keep_default_na=False)
    cap = pd.read_csv(out / "capacity.csv", keep_default_na=False)
    assert (runs.loc[runs["passes"].astype(str) == "True", "fails_on"] == "").all()
    failing = runs[runs["passes"].astype(str) == "False"]
    assert len(failing) and (failing["fails_on"] != "").all()
    for _, r in runs.iterrows():
        rules = set(filter(None, r["fails_on"].split("+")))
        assert ("latency" in rules) == (float(r["normalized_latency"]) > 1.0)
    row = cap.iloc[0]
    cols = list(cap.columns)
    assert cols.index("first_failing_rules") == cols.index("first_failing_rate") + 1
    at_fail = failing[failing["rate"] == float(row["first_failing_rate"])]
    assert row["first_failing_rules"] == "+".join(
        r for r in ("latency", "incomplete", "backlog")
        if any(r in f.split("+") for f in at_fail["fails_on"])
    )  # fmt: skip
    printed = capsys.readouterr().out
    cell = f"{float(row['first_failing_rate']):.3g} {row['first_failing_rules']}"
    assert cell in next(x for x in printed.splitlines() if x.startswith("vllm"))


def _rows(system: str, fail_lat: float, fails_on: str) -> list[dict[str, Any]]:
    return [
        {"setting": "search", "system": system, "rate": 1.0, "seed": 0, "passes": True,
         "fails_on": "", "normalized_latency": 0.1},
        {"setting": "search", "system": system, "rate": 2.0, "seed": 0, "passes": False,
         "fails_on": fails_on, "normalized_latency": fail_lat},
    ]  # fmt: skip


def test_the_table_heading_names_every_rule_and_the_fails_at_column() -> None:
    rows = _rows("vllm", 0.2, "backlog") + _rows("orca_max", 3.0, "latency+backlog")
    cap = capacity.capacity_frame(rows, ["vllm", "orca_max"])
    assert list(cap["first_failing_rules"]) == ["backlog", "latency+backlog"]
    lines = capacity.print_table(cap, 1.5).splitlines()
    assert "fails at" in lines[0]
    assert lines[1:4] == [
        "  latency: normalized latency <= 1.5 s/token",
        "  incomplete: every request completes",
        "  backlog: at most 10% of the trace (of 100 requests on a shorter one) unfinished "
        "when its last request arrives",
    ]
    assert "fails at" in lines[4]
    assert "2 backlog" in lines[5] and "2 latency+backlog" in lines[6]
    assert len({len(x) for x in lines[4:]}) == 1  # the column widens to its longest cell
    # without a backlog bound the heading names two rules
    assert len(capacity.print_table(cap, 1.5, None).splitlines()) == 3 + 1 + 2


@pytest.mark.parametrize(
    ("fail_lat", "fails_on", "warned"),
    [(0.2, "backlog", True), (0.5, "backlog", True), (0.51, "backlog", False),
     (0.2, "latency+backlog", False), (0.2, "incomplete+backlog", False)],
)  # fmt: skip
def test_a_backlog_failure_at_a_low_latency_is_one_warning(
    fail_lat: float, fails_on: str, warned: bool, tmp_path: Path, caplog, capsys
) -> None:
    rows = [{**r, "label": f"r{i}"} for i, r in enumerate(_rows("vllm", fail_lat, fails_on))]
    with caplog.at_level(logging.WARNING, logger="kvlab.capacity"):
        capacity.write_outputs(rows, ["vllm"], 1.0, tmp_path)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == warned
    if warned:
        assert said[0].startswith("vllm: at 2 req/s, its lowest failing rate, the runs failed "
                                  f"the backlog rule alone, with a normalized latency of at "
                                  f"most {fail_lat:g} s/token (threshold 1)")  # fmt: skip
        assert "burst of arrivals" in said[0] and "\n" not in said[0]


def test_help_reads_whole_and_explains_workers_and_out(capsys) -> None:
    with pytest.raises(SystemExit) as ended:
        capacity.main(["--help"])
    assert ended.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "asked of any configuration: python -m experiments.capacity model=" in text
    assert "::" not in text
    assert "(backlog)" in text and "fails_on" in text  # past the first paragraph
    assert "--workers WORKERS processes searching systems at once" in text
    assert "(default: the cores," in text
    assert (
        "--out OUT the folder written (default results/capacity); an earlier search there "
        "is replaced" in text
    )
