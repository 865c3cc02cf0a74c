"""``workload.max_total_tokens``: a length-only cap for the trace files (``azure_*``,
``mooncake``, ``vidur``) that drops the rows whose prompt + output exceed it (``auto``: the
served ``max_model_len``) before the run, counted in the log, where ``apply_filter`` (vLLM's
2023 ShareGPT filter) would drop every prompt over 1024 tokens too."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pytest

from core.request import RequestError
from core.workload.filters import total_cap
from core.workload.spec import build_workload
from core.workload.trace_io import read_azure_trace
from experiments import capacity
from experiments.lib.checks import ConfigError, check_config
from experiments.lib.setup import as_dict, resolve_aliases
from experiments.reproduce import compose_config
from experiments.simulate import run

DROPPED = "core.workload.trace_io.dropped"
# (seconds, prompt, output): OPT-13B serves 2,048 tokens; 5,000 + 20 is over, 2,040 + 8 is
# exactly at it (kept), 1,500 + 20 is a prompt apply_filter would drop (over 1,024)
ROWS = [(0.0, 100, 20), (0.5, 5000, 20), (1.0, 2040, 8), (1.5, 1500, 20), (2.0, 50, 10)]


def _azure(tmp_path: Path, rows: list[tuple[float, int, int]] = ROWS) -> Path:
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{t:09.6f},{p},{o}\n" for t, p, o in rows))  # fmt: skip
    return path


def _drop_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == DROPPED]


def test_the_cap_resolves_auto_to_the_served_length_and_refuses_the_impossible() -> None:
    assert total_cap(None, 2048) is None
    assert total_cap("auto", 2048) == 2048 and total_cap(300, 2048) == 300
    for bad in (0, -5, 1.5, True, "abc", "300", [300]):
        with pytest.raises(RequestError, match="max_total_tokens must be 'auto'") as info:
            total_cap(bad, 2048)
        assert info.value.key == "max_total_tokens"


def test_the_cap_drops_only_the_rows_over_it_and_says_how_many(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logging.getLogger(DROPPED), "disabled", False)
    path = str(_azure(tmp_path))
    with caplog.at_level(logging.WARNING, logger=DROPPED):
        kept = build_workload({"kind": "azure", "path": path, "max_total_tokens": "auto"})
    assert [r.prompt_len for r in kept] == [100, 2040, 1500, 50]
    assert [r.request_id for r in kept] == [0, 1, 2, 3]  # ids count the rows kept
    assert [r.arrival_time for r in kept] == [0.0, 1.0, 1.5, 2.0]
    assert _drop_lines(caplog) == [
        f"{path}: max_total_tokens=2048 dropped 1 of 5 rows before the run (prompt + output "
        "over 2048 tokens)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=DROPPED):
        small = build_workload({"kind": "azure", "path": path, "max_total_tokens": 120})
        assert len(build_workload({"kind": "azure", "path": path})) == 5  # null: no cap
    assert [r.prompt_len for r in small] == [100, 50]
    assert len(_drop_lines(caplog)) == 1 and "dropped 3 of 5 rows" in caplog.text
    # beside apply_filter, the cap counts only the rows the filter kept
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=DROPPED):
        both = read_azure_trace(path, max_model_len=2048, apply_filter=True, max_total_tokens=100)
    assert [r.prompt_len for r in both] == [50]
    lines = _drop_lines(caplog)
    assert "(apply_filter) dropped 3 of 5 rows" in lines[0]
    assert "max_total_tokens=100 dropped 1 of 5 rows" in lines[1] and len(lines) == 2


def test_auto_follows_system_max_model_len_and_the_run_rejects_nothing(tmp_path: Path) -> None:
    path = _azure(tmp_path)
    base = ["workload=azure_conv", f"workload.path={path}"]
    m = run(compose_config(base))
    assert (m["num_requests"], m["rejected_max_model_len"]) == (5, 1)
    m = run(compose_config([*base, "workload.max_total_tokens=auto"]))
    assert (m["num_requests"], m["completed"], m["rejected"]) == (4, 4, 0)
    m = run(compose_config([*base, "workload.max_total_tokens=auto",
                            "system.max_model_len=1600"]))  # fmt: skip
    assert (m["num_requests"], m["completed"], m["rejected"]) == (3, 3, 0)


@pytest.mark.parametrize("bad", ["-1", "0", "abc", "1.5", "true"])
def test_an_impossible_cap_is_one_line_naming_the_key(tmp_path: Path, bad: str) -> None:
    c = resolve_aliases(as_dict(compose_config(
        ["workload=azure_conv", f"workload.path={_azure(tmp_path)}",
         f"workload.max_total_tokens={bad}"])))  # fmt: skip
    with pytest.raises(ConfigError) as info:
        check_config(c, "simulate")
    line = info.value.line()
    assert line.startswith("error: workload.max_total_tokens: not a token count (got ")
    assert "expected auto (the served max_model_len)" in line and "\n" not in line


def test_a_kind_that_reads_no_trace_file_refuses_the_key() -> None:
    with pytest.raises(RequestError, match="max_total_tokens not used by kind 'synthetic'"):
        build_workload({"kind": "synthetic", "rate": 1.0, "num_requests": 3,
                        "max_total_tokens": "auto"})  # fmt: skip


def test_capacity_on_a_trace_capped_at_max_model_len_passes_rates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The over-long row that fails every rate (tests/test_capacity.py) is dropped instead:
    the search finds a rate, the drop is said once (not at every rate), and runs.csv and
    capacity.csv carry the offered rate (the rate itself, on a trace) and the p99 TPOT."""
    trace = tmp_path / "trace.csv"
    rows = [f"{i * 0.5},{100 + 7 * i},{20 + i % 5}" for i in range(40)]
    rows[3] = "1.5,5000,20"  # over OPT-13B's 2,048-token max_model_len
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows))
    args = ["workload=trace", "workload.kind=vidur", f"workload.path={trace}",
            "++workload.apply_filter=false", "++workload.max_total_tokens=auto",
            "workload.duration_s=15",  # a window that cuts the trace (its rows to 19.5 s)
            "--systems", "vllm", "--rates", "1,2", "--bisect-evals", "1",
            "--workers", "1"]  # fmt: skip
    dropped = logging.getLogger(DROPPED)
    level = dropped.level
    dropped.setLevel(logging.ERROR)  # as an earlier search in this process leaves it
    try:
        with caplog.at_level(logging.INFO):
            out = capacity.main([*args, "--out", str(tmp_path / "out")])
    finally:
        dropped.setLevel(level)
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "rejected at admission" in m]
    # said once (the system's setup), not again by the window's check nor at every rate
    assert len([m for m in said if "max_total_tokens=2048 dropped 1 of 40 rows" in m]) == 1
    runs = pd.read_csv(out / "runs.csv")
    assert (runs["rejected"] == 0).all() and runs["p99_tpot_ms"].notna().all()
    assert runs["offered_rate"].to_numpy() == pytest.approx(runs["rate"].to_numpy(), rel=1e-9)
    cap = pd.read_csv(out / "capacity.csv").iloc[0]
    assert cap["max_rate"] > 0
    assert cap["offered_rate_at_rate"] == pytest.approx(cap["max_rate"], rel=1e-9)
    at = runs[runs["rate"] == cap["max_rate"]]
    assert cap["p99_tpot_ms_at_rate"] == pytest.approx(at["p99_tpot_ms"].mean())


def test_a_rate_searchs_runs_do_not_repeat_the_dropped_rows() -> None:
    """capacity's runs (worker processes that keep the levels batch logging sets) say
    nothing of the rows dropped: each system's setup said it before the search."""
    from experiments.lib.batch_log import QUIET, SILENT, batch_logging

    names = (*QUIET, *SILENT)
    levels = {name: logging.getLogger(name).level for name in names}
    try:
        batch_logging()
        assert not logging.getLogger(DROPPED).isEnabledFor(logging.WARNING)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("huge", [2**63 - 1, 10**20])
def test_a_length_past_int64_is_dropped_not_wrapped_or_crashed(tmp_path: Path, huge: int) -> None:
    """A corrupt token count near or past int64's range is over every cap: the cap and the
    filter drop its row (its prompt + output neither wraps below the cap nor overflows)."""
    from core.workload.trace_io import read_vidur_trace

    path = tmp_path / "vidur.csv"
    path.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n"
        f"0,10,5\n1,10,{huge}\n2,{huge},5\n3,10,5\n"
    )
    capped = read_vidur_trace(path, apply_filter=False, max_total_tokens=2048)
    assert [(r.prompt_len, r.output_len) for r in capped] == [(10, 5), (10, 5)]
    filtered = read_vidur_trace(path, apply_filter=True)
    assert [(r.prompt_len, r.output_len) for r in filtered] == [(10, 5), (10, 5)]
