"""``experiments.capacity --resume``: a stopped search goes on from the runs it finished
(reused by a resumed sweep's rule: the same config, on inputs and code unchanged), and its
tables are those of a search never stopped."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pandas as pd
import pytest

from experiments import capacity

TABLES = ("capacity.csv", "runs.csv", "curves.csv")
SMALL = ["workload.duration_s=30", "--systems", "vllm", "--seeds", "1", "--rates", "0.5,1,2",
         "--workers", "1", "--bisect-evals", "1"]  # fmt: skip


def _said(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def _identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def test_a_resumed_search_reuses_its_finished_runs_and_writes_the_same_tables(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a search into an ``--out`` removed the earlier search's runs first, so a
    search stopped midway started over; ``--resume`` did not exist."""
    clean = capacity.main([*SMALL, "--out", str(tmp_path / "clean")])
    stopped = tmp_path / "stopped"
    shutil.copytree(clean, stopped)
    runs = stopped / "runs"
    labels = sorted(d.name for d in runs.iterdir())
    assert len(labels) >= 4
    gone, unfinished, damaged, *kept = labels
    shutil.rmtree(runs / gone)  # never started
    (runs / unfinished / "metrics.json").unlink()  # stopped while it ran
    (runs / unfinished / ".metrics.json.abc.tmp").write_text("{")  # a write cut short
    (runs / damaged / "metrics.json").write_text('{"normalized_latency": ')
    for name in TABLES:  # the tables of the stopped search are not this one's
        (stopped / name).write_text("earlier")
    before = {k: _identity(runs / k / "metrics.json") for k in kept}
    with caplog.at_level(logging.INFO):
        capacity.main([*SMALL, "--out", str(stopped), "--resume"])
    for name in TABLES:
        assert (stopped / name).read_bytes() == (clean / name).read_bytes(), name
    assert {k: _identity(runs / k / "metrics.json") for k in kept} == before  # not run
    assert sorted(d.name for d in runs.iterdir()) == labels
    assert {p.name for p in (runs / unfinished).iterdir()} == capacity.RECORDED
    assert _said(caplog, "runs from the earlier search") == [
        f"reused {len(kept)} of the {len(labels)} runs from the earlier search in {runs}"
    ]


def test_a_resumed_search_runs_again_what_its_options_or_inputs_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run of another config (another workload, another seed) or of an input file edited
    since is not reused; the earlier runs this search does not hold are removed at its end,
    so that ``runs/`` holds the runs of ``runs.csv``."""
    trace = tmp_path / "trace.csv"
    rows = [f"{i * 0.5},{100 + 7 * i},{20 + i % 5}" for i in range(40)]
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows))
    base = ["workload=trace", "workload.kind=vidur", f"workload.path={trace}", "--systems",
            "vllm", "--rates", "1,2", "--bisect-evals", "1", "--workers", "1"]  # fmt: skip
    out = tmp_path / "out"
    capacity.main([*base, "--out", str(out)])
    # another workload: the same run folders, another config in each
    other = [*base, "workload.duration_s=15"]
    with caplog.at_level(logging.INFO):
        capacity.main([*other, "--out", str(out), "--resume"])
    capacity.main([*other, "--out", str(tmp_path / "clean")])
    for name in TABLES:
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name
    labels = set(pd.read_csv(out / "runs.csv")["label"])
    assert _said(caplog, "runs from the earlier search") == [
        f"reused 0 of the {len(labels)} runs from the earlier search in {out / 'runs'}"
    ]
    assert _said(caplog, "had other options (overrides)")
    # the same options, the trace rewritten with the same bytes: its stamp changed
    caplog.clear()
    trace.write_text(trace.read_text())
    with caplog.at_level(logging.INFO):
        capacity.main([*other, "--out", str(out), "--resume"])
    assert _said(caplog, "reused 0 of")
    # another seed: other runs; the earlier seed's go at the end
    caplog.clear()
    with caplog.at_level(logging.INFO):
        capacity.main([*other, "--seed", "1", "--out", str(out), "--resume"])
    assert _said(caplog, "reused 0 of") and _said(caplog, "had other options (--seed)")
    now = set(pd.read_csv(out / "runs.csv")["label"])
    assert all(label.endswith("_seed1") for label in now)
    assert {d.name for d in (out / "runs").iterdir()} == now


def test_without_resume_a_search_starts_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = capacity.main([*SMALL, "--out", str(tmp_path / "out")])
    label = pd.read_csv(out / "runs.csv")["label"].iloc[0]
    metrics = out / "runs" / label / "metrics.json"
    was = _identity(metrics)
    with caplog.at_level(logging.INFO):
        capacity.main([*SMALL, "--out", str(out)])
    assert _identity(metrics) != was and not _said(caplog, "runs from the earlier search")
    assert _said(caplog, "removed the")


def test_an_interrupted_search_says_how_to_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(KeyboardInterrupt), capacity.resume_hint(tmp_path):
        raise KeyboardInterrupt
    assert _said(caplog, f"stay in {tmp_path / 'runs'}: run the same command with --resume")


def test_the_earlier_options_named_are_those_that_define_the_search(tmp_path: Path) -> None:
    path = tmp_path / "provenance.json"
    assert capacity.earlier_options(path, {"seeds": 1}) == []  # no earlier search
    mine = {"seeds": 1, "threshold": float("inf"), "workers": 2, "out": "a", "resume": True,
            "overrides": ["workload.duration_s=30"]}  # fmt: skip
    theirs = {**mine, "threshold": None, "workers": 1, "out": "b", "resume": False}
    path.write_text(json.dumps({"options": theirs}))
    assert capacity.earlier_options(path, mine) == []  # inf is written as null
    path.write_text(json.dumps({"options": {**theirs, "seeds": 2, "overrides": []}}))
    assert capacity.earlier_options(path, mine) == ["seeds", "overrides"]
    path.write_text("{")
    assert capacity.earlier_options(path, mine) == []


def test_a_resumed_search_stopped_before_its_tables_leaves_none_of_the_earlier_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The earlier search's tables describe runs that this one may run again: they go before
    any run, so a resumed search stopped midway leaves no tables but its runs."""
    out = tmp_path / "out"
    out.mkdir()
    for name in capacity.OUTPUT_FILES:
        (out / name).write_text("earlier")

    def stopped(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(capacity, "_result_with_heartbeat", stopped)
    with pytest.raises(KeyboardInterrupt):
        capacity.main([*SMALL, "--out", str(out), "--resume"])
    assert not [name for name in capacity.OUTPUT_FILES if (out / name).exists()]


def test_a_finished_run_is_read_back_only_with_resume(tmp_path: Path) -> None:
    overrides = ["model=opt-125m", "workload.num_requests=3"]
    first = capacity.run_kept(tmp_path, False, "capacity_x", overrides)
    metrics = tmp_path / "capacity_x" / "metrics.json"
    was = _identity(metrics)
    assert capacity.run_kept(tmp_path, True, "capacity_x", overrides) == first
    assert _identity(metrics) == was  # read back
    capacity.run_kept(tmp_path, False, "capacity_x", overrides)
    assert _identity(metrics) != was  # run again


def test_the_earlier_options_of_a_damaged_provenance_are_none(tmp_path: Path) -> None:
    path = tmp_path / "provenance.json"
    for doc in ({"options": ["--seeds", "1"]}, ["options"], {"options": None}):
        path.write_text(json.dumps(doc))
        assert capacity.earlier_options(path, {"seeds": 1}) == []


@pytest.mark.parametrize("keep", [(), ("capacity_other",)])
def test_a_run_killed_while_writing_is_an_earlier_run(tmp_path: Path, keep: tuple[str]) -> None:
    """A run killed (SIGKILL) while it wrote ``metrics.json`` leaves the temporary file of
    that write beside its ``config.yaml``: the run is removed as any earlier one (it stayed,
    with or without ``--resume``, in a ``runs/`` then holding a run ``runs.csv`` did not);
    a folder holding a file of another name stays."""
    killed, mine = tmp_path / "capacity_killed", tmp_path / "capacity_mine"
    for folder in (killed, mine):
        folder.mkdir()
        (folder / "config.yaml").write_text("seed: 0\n")
        (folder / ".metrics.json.k9x.tmp").write_text('{"normalized')
    (mine / "notes.txt").write_text("mine")
    assert capacity.clear_earlier_runs(tmp_path, keep=keep) == 1
    assert not killed.exists() and mine.is_dir()


def test_a_resumed_search_counts_the_runs_it_did_as_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat counted the earlier search's runs as done at the start of a resumed
    search, runs it would then run again too."""
    from concurrent.futures import TimeoutError as FuturesTimeout

    for label in ("capacity_a", "capacity_b"):
        (tmp_path / label).mkdir()
        (tmp_path / label / "metrics.json").write_text("{}")
    before = capacity.finished_before(tmp_path)

    class SlowJob:
        waits = 0

        def result(self, timeout: float | None = None) -> list:
            self.waits += 1
            if self.waits == 1:
                (tmp_path / "capacity_c").mkdir()
                (tmp_path / "capacity_c" / "metrics.json").write_text("{}")
                raise FuturesTimeout
            return ["found"]

    with caplog.at_level(logging.INFO, logger=capacity.log.name):
        assert capacity._result_with_heartbeat(SlowJob(), tmp_path, 0.0, before) == ["found"]
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["... 1 run(s) done so far"]


def test_a_search_stopped_while_it_writes_its_tables_says_how_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every run is done when the tables are written (the figure takes seconds): a Ctrl-C
    there said nothing of --resume."""

    def stopped(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(capacity, "write_outputs", stopped)
    with pytest.raises(KeyboardInterrupt), caplog.at_level(logging.INFO):
        capacity.main([*SMALL, "--out", str(tmp_path / "out")])
    assert _said(caplog, "run the same command with --resume")
