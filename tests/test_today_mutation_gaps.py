"""Behaviours of the 2026-12-07 commits a mutation audit found unpinned: trace intake's
length clip, gzip check and the cap after the filter; a ``duration_s`` window with no
arrival; the results table's sharing rows; which earlier capacity runs a search clears; the
``config.yaml`` a rate search keeps of each run. Each test fails on its mutant."""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from core.request import Request, RequestError
from core.workload.spec import build_workload
from core.workload.trace_io import TraceFormatError, read_vidur_trace, write_trace
from experiments import capacity, reproduce
from experiments.lib.setup import as_dict
from experiments.lib.table import WIDTH, result_table
from experiments.reproduce import compose_config

_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _vidur(tmp_path: Path, rows: str) -> Path:
    path = tmp_path / "vidur.csv"
    path.write_text(_HEADER + rows)
    return path


# --- trace intake ------------------------------------------------------------------------


@pytest.mark.parametrize("huge", [2**62, 2**63 - 1, 10**20])
def test_a_row_whose_prompt_and_output_are_both_huge_is_dropped(tmp_path: Path, huge: int) -> None:
    """Two clipped counts sum without int64 overflow: a row whose prompt and output are
    both near or past int64's range is over the cap and the filter (a clip at 2^62 wraps
    their sum below every cap)."""
    path = _vidur(tmp_path, f"0,10,5\n1,{huge},{huge}\n2,10,5\n")
    capped = read_vidur_trace(path, apply_filter=False, max_total_tokens=2048)
    assert [(r.prompt_len, r.output_len) for r in capped] == [(10, 5), (10, 5)]
    filtered = read_vidur_trace(path, apply_filter=True)
    assert [(r.prompt_len, r.output_len) for r in filtered] == [(10, 5), (10, 5)]


def test_the_cap_keeps_out_the_rows_the_filter_dropped(tmp_path: Path) -> None:
    """With both, a row the length filter drops (a 2-token prompt) stays out though it is
    under the cap: the cap only removes rows from those the filter keeps."""
    path = _vidur(tmp_path, "0,10,5\n1,2,5\n2,10,6\n")
    kept = read_vidur_trace(path, apply_filter=True, max_total_tokens=2048)
    assert [(r.prompt_len, r.output_len) for r in kept] == [(10, 5), (10, 6)]


def test_a_trace_gzipped_by_the_gzip_tool_says_it_is_compressed(tmp_path: Path) -> None:
    """``gzip trace.csv`` stores the file's name (header flag FNAME): only the two magic
    bytes tell a gzip file, whatever its flags."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="trace.csv", mode="wb", fileobj=buf, mtime=0) as f:
        f.write((_HEADER + "0,8,8\n").encode())
    path = tmp_path / "trace.csv.gz"
    path.write_bytes(buf.getvalue())
    with pytest.raises(TraceFormatError, match=r"trace\.csv\.gz, file: gzip-compressed"):
        read_vidur_trace(path)


def test_gzips_magic_bytes_past_the_start_are_a_bad_byte_on_their_line(tmp_path: Path) -> None:
    """A file is gzip-compressed only where it starts with the magic bytes; the same bytes
    further in are a byte that is not UTF-8, named by its line."""
    path = tmp_path / "trace.csv"
    path.write_bytes(_HEADER.encode() + b"0,8,8\n\x1f\x8b,8,8\n")
    with pytest.raises(TraceFormatError, match=r"trace\.csv, line 3: not UTF-8 text"):
        read_vidur_trace(path)


# --- the duration_s window ---------------------------------------------------------------


def _trace_cfg(path: Path, kind: str | None = None) -> dict[str, Any]:
    over = ["workload=trace", f"workload.path={path}"]
    if kind is not None:
        over.append(f"workload.kind={kind}")
    return as_dict(compose_config(over))["workload"]


def test_a_window_before_the_only_arrival_left_names_duration_s(tmp_path: Path) -> None:
    """One arrival left after start_s, past the window: the error names duration_s, as for
    several (not an empty workload)."""
    path = tmp_path / "t.csv"
    write_trace(path, [Request(i, float(i), 10, 10) for i in range(10)])
    with pytest.raises(RequestError, match=r"^0.25 s: no request arrives in the window") as exc:
        build_workload({**_trace_cfg(path), "start_s": 8.5, "duration_s": 0.25})
    assert exc.value.key == "duration_s"


def test_a_trace_the_filter_empties_is_not_blamed_on_duration_s(tmp_path: Path) -> None:
    """Every row dropped by the length filter: no request is there for the window to miss,
    so the window raises nothing of its own (the empty workload is the file's to answer)."""
    path = _vidur(tmp_path, "0,2,5\n1,2,5\n")
    assert build_workload({**_trace_cfg(path, "vidur"), "duration_s": 10.0}) == []


# --- the results table -------------------------------------------------------------------


def _cell(table: str, label: str) -> str:
    line = next(line for line in table.splitlines() if line.startswith(label + ":"))
    return line.split(":", 1)[1].strip()


def test_sharing_rows_are_percentages_to_two_decimals_under_their_heading() -> None:
    """Like the KV shares above them, the sharing shares are given to two decimals (0.06,
    not 0.05778), under a 'Sharing, %' rule, and the table closes with its '=' line."""
    table = result_table({"kv_sharing_saving_pct": 0.05778, "prefix_cache_hit_pct": 0.4444})
    lines = table.splitlines()
    assert _cell(table, "Blocks saved by sharing (time-weighted)") == "0.06"
    assert _cell(table, "Prompt tokens found in the prefix cache") == "0.44"
    heading = lines.index(" Sharing, % ".center(WIDTH, "-"))
    assert lines[heading + 1].startswith("Blocks saved by sharing")
    assert lines[-1] == "=" * WIDTH


# --- capacity: the runs an earlier search left -------------------------------------------


def test_an_earlier_runs_folder_is_cleared_only_when_it_holds_recorded_files_alone(
    tmp_path: Path,
) -> None:
    """A run of a search before config.yaml was kept (metrics.json alone) is cleared as one
    of today's; a capacity_* folder holding anything else beside them (a full run's tables)
    is the user's and stays."""
    runs = tmp_path / "runs"
    old = runs / "capacity_search_vllm_rate1_seed0"
    old.mkdir(parents=True)
    (old / "metrics.json").write_text("{}")
    full = runs / "capacity_full_run"
    full.mkdir()
    for name in ("config.yaml", "metrics.json", "requests.csv"):
        (full / name).write_text("x")
    assert capacity.clear_earlier_runs(runs) == 1
    assert not old.exists() and sorted(p.name for p in full.iterdir()) == [
        "config.yaml", "metrics.json", "requests.csv",
    ]  # fmt: skip


# --- reproduce: the config.yaml a rate search keeps --------------------------------------


def test_a_recorded_run_writes_its_resolved_config_before_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_one with ``config_out`` alone writes the run's resolved config there before the
    run (a run that fails leaves the config to rerun it from), and writes no tables."""
    import experiments.simulate as simulate

    seen: list[Any] = []

    def fake_run(cfg: Any, out_dir: Path | None) -> dict[str, Any]:
        seen.append(out_dir)
        assert OmegaConf.load(tmp_path / "r" / "config.yaml").seed == 3
        return {"completed": 1}

    monkeypatch.setattr(simulate, "run", fake_run)
    m = reproduce.run_one("r", ["seed=3"], None, config_out=tmp_path / "r")
    assert m == {"completed": 1, "label": "r"} and seen == [None]
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["config.yaml"]


def test_write_config_resolves_interpolations_and_returns_a_dictconfig(tmp_path: Path) -> None:
    """config.yaml holds values, not ``${...}`` (a rerun from its folder must not depend on
    keys it may not carry), and write_run gets the config back as a DictConfig."""
    from omegaconf import DictConfig

    from experiments.lib.results import write_config

    conf = write_config(tmp_path, {"a": 4, "b": "${a}"})
    assert isinstance(conf, DictConfig)
    assert (tmp_path / "config.yaml").read_text() == "a: 4\nb: 4\n"
