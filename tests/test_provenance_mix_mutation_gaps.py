"""Tests from a mutation audit of ``provenance.json`` (experiments.lib.provenance, the input walk
it shares with the resume stamps, reproduce's and capacity's records) and of Fig. 12's Alpaca
lines (experiments.report.fig12_mix): each kills a mutant the earlier tests let through. The
last two show a bug the audit found: a second narrower rerun of reproduce into one ``--out``
forgot the figures whose files the first command had left there."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments import capacity, reproduce
from experiments.lib import provenance as prov
from experiments.lib.input_stamps import REPO, input_files, input_paths
from experiments.report import fig12_mix, fig12_rates
from tests.test_fig12_mix import _panel_runs

# --- experiments.lib.provenance -------------------------------------------------------------


@pytest.fixture
def fresh_code_version() -> Iterator[None]:
    """``code_version`` read again in the test and after it."""
    prov.code_version.cache_clear()
    yield
    prov.code_version.cache_clear()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


@pytest.mark.parametrize(
    "failure",
    [
        FileNotFoundError(2, "No such file or directory", "git"),  # git not installed
        subprocess.TimeoutExpired(["git"], prov.GIT_TIMEOUT_S),  # git hangs (a locked index)
        subprocess.CompletedProcess(["git"], 128, stdout="HEAD\n", stderr="fatal"),  # it fails
    ],
    ids=["git-missing", "git-timeout", "git-fails"],
)
def test_git_that_cannot_answer_leaves_the_git_keys_null(
    failure: Any, monkeypatch: pytest.MonkeyPatch, fresh_code_version: None
) -> None:
    def run(*args: Any, **kwargs: Any) -> Any:
        if isinstance(failure, BaseException):
            raise failure
        return failure

    monkeypatch.setattr(prov.subprocess, "run", run)
    v = prov.code_version()
    assert (v["git_commit"], v["git_dirty"], v["git_changed"]) == (None, None, None)
    assert v["code_sha256"] and prov.code_words().startswith("not a git checkout, ")


def test_code_words_name_a_clean_commit_and_the_sources_in_twelve_digits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_code_version: None
) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    monkeypatch.setattr(prov, "REPO", tmp_path)
    head = _git(tmp_path, "rev-parse", "HEAD")
    sources = prov.code_version()["code_sha256"]
    assert prov.code_words() == f"git {head[:12]}, sources sha256 {sources[:12]}"


def test_package_versions_cover_every_package_and_null_one_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prov.package_versions.cache_clear()
    try:
        assert tuple(prov.package_versions()) == prov.PACKAGES
        monkeypatch.setattr(prov, "PACKAGES", ("numpy", "kvlab-no-such-package"))
        prov.package_versions.cache_clear()
        assert prov.package_versions() == {"numpy": metadata.version("numpy"),
                                           "kvlab-no-such-package": None}  # fmt: skip
    finally:
        prov.package_versions.cache_clear()


def test_a_file_of_exactly_the_hash_limit_is_hashed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(prov, "MAX_HASH_BYTES", 1024)
    at, over = tmp_path / "at.bin", tmp_path / "over.bin"
    at.write_bytes(b"\1" * 1024)
    over.write_bytes(b"\1" * 1025)
    assert prov.file_sha256(at) == hashlib.sha256(b"\1" * 1024).hexdigest()
    assert prov.file_sha256(over) is None


def test_a_file_larger_than_a_read_block_is_hashed_whole(tmp_path: Path) -> None:
    data = b"\0" * (1 << 20) + b"tail"
    path = tmp_path / "shard.bin"
    path.write_bytes(data)
    assert prov.file_sha256(path) == hashlib.sha256(data).hexdigest()


def _rewrite(path: Path, data: bytes, keep_mtime: bool) -> None:
    """Rewrite ``path`` in place with ``data`` until its change time moves (the file
    system's clock may be coarser than two writes), its modification time put back where
    ``keep_mtime`` (as ``cp -p`` or ``rsync -t`` onto it do)."""
    before = path.stat()
    while True:
        path.write_bytes(data)
        if keep_mtime:
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        if path.stat().st_ctime_ns != before.st_ctime_ns:
            return
        time.sleep(0.002)


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["edited", "edited-mtime-kept"])
def test_an_edit_of_the_same_size_is_hashed_again(tmp_path: Path, keep_mtime: bool) -> None:
    """The per-process cache keys a file by its size and times: an edit that keeps the
    size (and even the modification time) is still read again."""
    path = tmp_path / "trace.csv"
    path.write_bytes(b"a" * 64)
    assert prov.file_sha256(path) == hashlib.sha256(b"a" * 64).hexdigest()
    _rewrite(path, b"b" * 64, keep_mtime)
    assert path.stat().st_size == 64
    assert prov.file_sha256(path) == hashlib.sha256(b"b" * 64).hexdigest()


def test_input_digests_give_the_absolute_path_and_nested_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model" / "sub").mkdir(parents=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "sub" / "shard.bin").write_bytes(b"\1")
    got = prov.input_digests({"model": {"path": "model"}})
    assert got == {"model.path": {
        "path": str((tmp_path / "model").resolve()),
        "sha256": {"config.json": hashlib.sha256(b"{}").hexdigest(),
                   str(Path("sub", "shard.bin")): hashlib.sha256(b"\1").hexdigest()},
    }}  # fmt: skip


def test_input_digests_resolve_the_configs_interpolations(tmp_path: Path) -> None:
    """A config's ``${...}`` in an input path (``${oc.env:DATA}/trace.csv``) names the file
    the run read."""
    (tmp_path / "trace.csv").write_text("x\n")
    cfg = OmegaConf.create({"data": str(tmp_path), "workload": {"path": "${data}/trace.csv"}})
    got = prov.input_digests(cfg)["workload.path"]
    assert got["path"] == str((tmp_path / "trace.csv").resolve())
    assert got["sha256"] == {"trace.csv": hashlib.sha256(b"x\n").hexdigest()}


def test_the_recorded_command_survives_a_shell(tmp_path: Path) -> None:
    argv = ["workload.path=my trace.csv", "--out", f"{tmp_path}/it's here"]
    assert shlex.split(prov.command_line("experiments.capacity", argv)) == [
        "python", "-m", "experiments.capacity", *argv,
    ]  # fmt: skip


# --- experiments.lib.input_stamps: the walk provenance shares -------------------------------


def test_input_files_lists_only_files_in_path_order(tmp_path: Path) -> None:
    for name in ("z.bin", "m.bin", "a.bin", "k/b.bin", "c/d/e.bin"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"\0")
    names = [name for name, _ in input_files(tmp_path)]
    assert names == [str(Path(n)) for n in ("a.bin", "c/d/e.bin", "k/b.bin", "m.bin", "z.bin")]


def test_an_empty_input_path_names_no_input(tmp_path: Path, monkeypatch) -> None:
    """An empty value is no path, not the working directory (which would be hashed whole)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "big.bin").write_bytes(b"\0")
    assert input_paths({"workload": {"path": ""}, "model": {"path": ""}}) == {}


def test_a_shipped_input_is_found_in_the_repository_from_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = "sim/cost/stacks/kvlab-cpu-tiny-opt.json"
    monkeypatch.chdir(tmp_path)
    assert input_paths({"cost": {"stack_path": shipped}}) == {"cost.stack_path": REPO / shipped}
    digests = prov.input_digests({"cost": {"stack_path": shipped}})["cost.stack_path"]
    assert digests["sha256"] == {
        "kvlab-cpu-tiny-opt.json": hashlib.sha256((REPO / shipped).read_bytes()).hexdigest()
    }


# --- reproduce and capacity: their provenance.json ------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        '{"command": "python -m experiments.capacity", "setting": "s"}',  # capacity's record
        '{"command": "python -m experiments.reproduce", "figures": ["fig2"',  # cut short
        '{"command": "python -m experiments.reproduce", "figures": null}',
        '[["fig2"]]',
        '{"figures": ["fig2"]}',  # no command to name
        '{"command": "python -m experiments.reproduce", "figures": [], "earlier": ["fig2"]}',
    ],
    ids=["capacity", "cut", "null-figures", "a-list", "no-command", "earlier-a-list"],
)
def test_an_earlier_record_that_is_not_reproduces_is_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, record: str
) -> None:
    """``--out`` may hold another command's ``provenance.json`` (a capacity search's) or a
    damaged one: the rerun goes on without a warning."""
    path = tmp_path / "provenance.json"
    path.write_text(record)
    with caplog.at_level(logging.WARNING, logger="experiments.reproduce"):
        reproduce.note_earlier_figures(path, ["table1"])
    assert caplog.records == []


def test_the_left_figures_warning_names_the_folder_and_what_the_report_covers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "provenance.json"
    path.write_text(json.dumps({"command": "CMD", "figures": ["table1", "fig2", "fig13"]}))
    with caplog.at_level(logging.WARNING, logger="experiments.reproduce"):
        reproduce.note_earlier_figures(path, ["table1", "fig7"])
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path} holds the files of fig2, fig13 from an earlier command (CMD); they stay, "
        "and the new report.md covers table1, fig7 only"
    ]


def test_a_capacity_record_digests_the_searchs_input_files(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n")
    plan = capacity.Plan(setting="a trace", config={"workload": {"path": str(trace)}})
    args = argparse.Namespace(out=tmp_path / "out", seeds=1)
    doc = capacity.search_provenance(["--out", str(tmp_path / "out")], args, plan)
    assert doc["inputs"] == {"workload.path": {
        "path": str(trace.resolve()), "sha256": {"trace.csv": hashlib.sha256(
            trace.read_bytes()).hexdigest()},
    }}  # fmt: skip
    assert doc["options"] == {"out": str(tmp_path / "out"), "seeds": 1}


# --- experiments.report.fig12_mix -----------------------------------------------------------


def _mix_rows(letter: str, vllm: dict[str, Any], orca: dict[str, Any]) -> list[dict[str, Any]]:
    """A panel's two step-mix rows, ``vllm`` and ``orca`` changing each's defaults."""
    base = {"panel": letter, "rate": 10.0, "seed": 0, "trace_s": 60.0, "steps": 100,
            "prompt_only_steps": 30, "mixed_steps": 0, "decode_only_steps": 70,
            "decode_only_step_ms": 50.0, "prompt_only_busy_pct": 25.0,
            "mean_tpot_ms": 60.0}  # fmt: skip
    return [base | {"system": "vllm"} | vllm, base | {"system": "orca_oracle"} | orca]


def test_a_mix_row_keeps_its_runs_numbers_in_column_order(tmp_path: Path) -> None:
    run = fig12_mix.mix_runs([fig12_rates.BY_LETTER["f"]], lambda p: 45.0, seed=3)[0]
    pd.DataFrame({"prefill_seqs": [1, 0], "decode_seqs": [0, 1], "duration_s": [0.02, 0.01]}
                 ).to_csv(tmp_path / "steps.csv", index=False)  # fmt: skip
    row = fig12_mix.mix_row(run, tmp_path, {"mean_tpot_ms": 12.5})
    assert list(row) == list(fig12_mix.MIX_COLUMNS)
    assert [row[k] for k in ("panel", "system", "rate", "seed", "trace_s", "mean_tpot_ms")] == [
        "f", "vllm", 10.0, 3, 45.0, 12.5,
    ]  # fmt: skip


def test_memory_is_the_mean_over_seeds_at_the_sustainable_rate() -> None:
    runs, cap = _panel_runs("f")
    assert fig12_mix.memory_at_rate(runs, cap, "f", "vllm") == {
        "rate": 20.0, "open": False, "batch": 100.5, "preemptions": 5.0,
        "free_at_limit": 40.0, "free": 50.0, "by_limit": {},
    }  # fmt: skip


def test_both_alpaca_panels_get_their_own_line_in_panel_order() -> None:
    """(d) and (f) in one report: each line has its panel's memory and step mix."""
    runs_d, cap_d = _panel_runs("d")
    runs_d["mean_batch_size"] += 1000
    runs_f, cap_f = _panel_runs("f")
    runs = pd.concat([runs_f, runs_d], ignore_index=True)
    cap = pd.concat([cap_f, cap_d], ignore_index=True)
    mix = fig12_mix.mix_table([
        *_mix_rows("f", {"prompt_only_steps": 31}, {"mixed_steps": 41}),
        *_mix_rows("d", {"prompt_only_steps": 32}, {"mixed_steps": 42}),
    ])  # fmt: skip
    lines = fig12_mix.lines(runs, cap, mix)
    assert len(lines) == 5 and lines[1] == lines[4] == ""
    d, f = lines[2], lines[3]
    assert d.startswith("- (d) memory") and f.startswith("- (f) memory")
    assert "vLLM batches 1100 requests against Orca (Oracle)'s 1050" in d
    assert "vLLM batches 100 requests against Orca (Oracle)'s 50" in f
    assert "32 of vLLM's 100 steps" in d and "ride in 42 decode steps" in d
    assert "31 of vLLM's 100 steps" in f and "ride in 41 decode steps" in f


def test_the_step_mix_table_is_by_panel_then_system_and_reads_back(tmp_path: Path) -> None:
    rows = [*_mix_rows("f", {}, {}), *_mix_rows("d", {}, {})]
    mix = fig12_mix.mix_table(rows)
    assert list(zip(mix["panel"], mix["system"], strict=True)) == [
        ("d", "orca_oracle"), ("d", "vllm"), ("f", "orca_oracle"), ("f", "vllm"),
    ]  # fmt: skip
    mix.to_csv(tmp_path / "mix.csv", index=False)
    back = fig12_mix.read_mix(tmp_path / "mix.csv")  # a system on two panels is not twice
    assert back is not None and len(back) == 4


@pytest.mark.parametrize(
    ("vllm_steps", "orca_steps", "said"),
    [(0, 100, ": vLLM ran no step"), (100, 0, ": Orca (Oracle) ran no step")],
)
def test_the_one_system_without_a_step_is_named(
    vllm_steps: int, orca_steps: int, said: str
) -> None:
    runs, cap = _panel_runs("f")
    mix = fig12_mix.mix_table(_mix_rows("f", {"steps": vllm_steps}, {"steps": orca_steps}))
    text = "\n".join(fig12_mix.lines(runs, cap, mix))
    assert f"steps, one run each at 10 req/s (seed 0, 60-s trace){said}." in text


def test_a_mix_without_one_systems_run_gives_the_memory_part_alone() -> None:
    runs, cap = _panel_runs("f")
    mix = fig12_mix.mix_table(_mix_rows("f", {}, {})[:1])  # vLLM's row alone
    text = "\n".join(fig12_mix.lines(runs, cap, mix))
    assert "memory, at the sustainable rates" in text and "steps, one run each" not in text


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"panel,system\nf,vllm\nf,vllm,1,2\n", "not a step-mix CSV (Error tokenizing data."),
        (b"panel,system\n\xff\xfe\x00\x81\n", "not a step-mix CSV ("),
        (",".join(fig12_mix.MIX_COLUMNS[1:]).encode() + b"\n", "missing column(s) panel"),
    ],
    ids=["ragged", "not-utf8", "no-panel"],
)
def test_a_step_mix_file_that_is_not_one_is_one_line(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / fig12_rates.MIX_FILE
    path.write_bytes(content)
    with pytest.raises(fig12_mix.ConfigError) as err:
        fig12_mix.read_mix(path)
    line = err.value.line()
    assert "\n" not in line and line.startswith(f"error: {path}: {problem}"), line


def test_the_limit_split_is_the_mean_over_seeds_and_shows_a_share_that_prints_as_0_1() -> None:
    runs, cap = _panel_runs("f")
    vllm = runs["system"] == "vllm"
    runs["kv_free_at_max_num_seqs_pct"] = (30.0 + 2 * runs["seed"]).where(vllm, 0.0)  # 30, 32
    runs["kv_free_at_token_budget_pct"] = 0.05  # prints as 0.1: shown
    text = "\n".join(fig12_mix.lines(runs, cap, None))
    assert ("scheduler limit (max_num_seqs 31.0%, max_num_batched_tokens 0.1%); Orca (Oracle): "
            "3.0% and 2.0% (max_num_batched_tokens 0.1%)) and") in text  # fmt: skip


def test_a_second_narrower_rerun_still_names_the_figures_the_first_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the first rerun's ``provenance.json`` listed its own figures alone, so a second
    rerun into the folder logged nothing about fig2's files, still there from the first
    command, and the folder's record named the last command's commit for them."""
    first = "python -m experiments.reproduce --figures table1,fig2"
    (tmp_path / "provenance.json").write_text(
        json.dumps({"command": first, "figures": ["table1", "fig2"]})
    )
    named = []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="experiments.reproduce"):
            reproduce.main(["--figures", "table1", "--out", str(tmp_path)])
        named.append(f"holds the files of fig2 from an earlier command ({first})" in caplog.text)
    assert named == [True, True]
    doc = json.loads((tmp_path / "provenance.json").read_text())
    assert doc["figures"] == ["table1"] and doc["earlier"] == {"fig2": first}


def test_figures_left_by_two_earlier_commands_are_named_with_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "provenance.json"
    path.write_text(json.dumps({"command": "B", "figures": ["table1", "fig13"],
                                "earlier": {"fig2": "A", "fig13": "A"}}))  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="experiments.reproduce"):
        left = reproduce.note_earlier_figures(path, ["table1"])
    assert left == {"fig2": "A", "fig13": "B"}  # fig13 made again by B
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path} holds the files of fig2 from an earlier command (A) and of fig13 from an "
        "earlier command (B); they stay, and the new report.md covers table1 only"
    ]
    path.write_text(json.dumps({"command": "B", "figures": ["table1"], "earlier": {"fig2": "A"}}))
    assert reproduce.note_earlier_figures(path, ["table1", "fig2"]) == {}  # made again: none
