"""``provenance.json``: a result folder says which code made it, from which inputs, and how
to make it again (the README's *Where results go*)."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from experiments import capacity, reproduce
from experiments.lib import provenance as prov
from experiments.lib import results


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A git checkout with one commit, taken for the code's repository."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    monkeypatch.setattr(prov, "REPO", repo)
    prov.code_version.cache_clear()
    yield repo
    prov.code_version.cache_clear()


def test_the_code_version_is_the_commit_and_whether_it_was_edited(checkout: Path) -> None:
    clean = prov.code_version()
    assert clean["git_commit"] == _git(checkout, "rev-parse", "HEAD")
    assert clean["git_dirty"] is False and clean["git_changed"] == []
    (checkout / "notes.txt").write_text("untracked: not an edit of the commit")
    prov.code_version.cache_clear()
    assert prov.code_version()["git_dirty"] is False
    (checkout / "a.py").write_text("x = 2\n")
    prov.code_version.cache_clear()
    edited = prov.code_version()
    assert edited["git_dirty"] is True and edited["git_changed"] == [" M a.py"]
    assert "(with uncommitted changes)" in prov.code_words()


def test_outside_a_git_checkout_the_commit_is_null(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(prov, "REPO", tmp_path)
    prov.code_version.cache_clear()
    try:
        v = prov.code_version()
        assert v["git_commit"] is None and v["git_dirty"] is None
        assert v["code_sha256"]  # the sources' digest is there all the same
        assert prov.code_words().startswith("not a git checkout, sources sha256 ")
    finally:
        prov.code_version.cache_clear()


def test_a_run_folder_records_the_code_and_the_traces_digest(
    tmp_path: Path, checkout: Path, monkeypatch
) -> None:
    """Before: ``inputs.json`` had the trace's name, size and time alone, and no file named
    the commit."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n")
    big = tmp_path / "weights"
    big.mkdir()
    (big / "model.bin").write_bytes(b"\0" * 4096)
    monkeypatch.setattr(prov, "MAX_HASH_BYTES", 1024)
    cfg = {"workload": {"path": str(trace)}, "model": {"path": str(big)}, "seed": 7}
    frame = pd.DataFrame({"a": [1]})
    run = results.write_run(tmp_path / "run", cfg, {"completed": 1}, frame, frame)
    doc = json.loads((run / "provenance.json").read_text())
    assert doc["code"]["git_commit"] == _git(checkout, "rev-parse", "HEAD")
    assert doc["code"]["git_dirty"] is False
    want = hashlib.sha256(trace.read_bytes()).hexdigest()
    assert doc["inputs"]["workload.path"] == {"path": str(trace.resolve()),
                                              "sha256": {"trace.csv": want}}  # fmt: skip
    assert doc["inputs"]["model.path"]["sha256"] == {"model.bin": None}  # too large to hash
    assert doc["python"] and "numpy" in doc["packages"]
    # a rerun into the folder clears it with the run's other files
    results.clear_run(run)
    assert not (run / "provenance.json").exists()


def test_a_capacity_folder_says_how_to_make_it_again(tmp_path: Path) -> None:
    """Before: ``--out`` held the tables and each run's ``metrics.json``, and nothing named
    the overrides, the options, the config or the code that made them."""
    args = ["workload.duration_s=30", "--systems", "vllm", "--seeds", "1", "--rates",
            "0.5,1", "--workers", "1", "--bisect-evals", "1"]  # fmt: skip
    first = capacity.main([*args, "--out", str(tmp_path / "a")])
    doc = json.loads((first / "provenance.json").read_text())
    assert doc["config"]["workload"]["duration_s"] == 30
    assert doc["config"]["cost"]["kind"] == "roofline" and "roofline" in doc["cost_model"]
    assert doc["options"]["seeds"] == 1 and doc["code"]["code_sha256"]
    assert doc["setting"].startswith("opt-13b on 1 x a100-40gb, sharegpt")
    # the recorded command, into another folder, makes the same tables
    argv = shlex.split(doc["command"])
    assert argv[:3] == ["python", "-m", "experiments.capacity"]
    again = capacity.main([*argv[3:-2], "--out", str(tmp_path / "b")])
    for name in ("capacity.csv", "runs.csv", "curves.csv"):
        assert (first / name).read_bytes() == (again / name).read_bytes()


def test_a_reproduction_names_its_code(tmp_path: Path) -> None:
    reproduce.main(["--figures", "table1", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "provenance.json").read_text())
    assert doc["command"] == f"python -m experiments.reproduce --figures table1 --out {tmp_path}"
    assert doc["options"]["figures"] == "table1" and doc["options"]["seed"] == 0
    assert f"(code: {prov.code_words()})" in (tmp_path / "report.md").read_text()


def test_a_narrower_rerun_into_the_same_out_names_the_figures_it_leaves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An earlier command's figures that this one does not make keep their files; the log
    names them, since the new report does not describe them."""
    earlier = {"command": "python -m experiments.reproduce --figures table1,fig2",
               "figures": ["table1", "fig2"]}  # fmt: skip
    (tmp_path / "provenance.json").write_text(json.dumps(earlier))
    with caplog.at_level("WARNING", logger="experiments.reproduce"):
        reproduce.main(["--figures", "table1", "--out", str(tmp_path)])
    assert "holds the files of fig2 from an earlier command (python -m experiments." in caplog.text
    assert json.loads((tmp_path / "provenance.json").read_text())["figures"] == ["table1"]
    caplog.clear()
    (tmp_path / "provenance.json").write_text(json.dumps({"command": "c", "figures": ["table1"]}))
    with caplog.at_level("WARNING", logger="experiments.reproduce"):
        reproduce.main(["--figures", "table1", "--out", str(tmp_path)])
    assert "earlier command" not in caplog.text  # the same figures: nothing left behind


def test_a_run_folder_alone_runs_it_again_byte_for_byte(tmp_path: Path) -> None:
    """The README's recipe: the folder's resolved config as the config."""
    root = Path(__file__).resolve().parents[1]

    def simulate(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "experiments.simulate", *args], cwd=root,
                       check=True, capture_output=True)  # fmt: skip

    simulate("system=orca_pow2", "workload.duration_s=20", "seed=3", "index=null",
             f"hydra.run.dir={tmp_path / 'a'}")  # fmt: skip
    simulate("--config-dir", str(tmp_path / "a"), "--config-name", "config",
             f"hydra.run.dir={tmp_path / 'b'}")  # fmt: skip
    for name in ("config.yaml", "requests.csv", "steps.csv", "cost_model.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_an_unchanged_input_is_hashed_once_per_process(tmp_path: Path, monkeypatch) -> None:
    """Before: every run of a sweep hashed every input file again (a 20-job multirun on a
    1.6 GB model folder took 28 s instead of 5); an edited file is hashed again."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "shard.bin").write_bytes(b"\1" * 4096)
    reads = []
    sha256 = hashlib.sha256
    monkeypatch.setattr(prov.hashlib, "sha256", lambda *a: reads.append(1) or sha256(*a))
    cfg = {"model": {"hf_config": str(folder)}}
    first = prov.input_digests(cfg)
    assert prov.input_digests(cfg) == first and len(reads) == 2  # two files, once each
    (folder / "shard.bin").write_bytes(b"\2" * 4097)
    edited = prov.input_digests(cfg)["model.hf_config"]["sha256"]
    assert len(reads) == 3 and edited["shard.bin"] == sha256(b"\2" * 4097).hexdigest()
    assert edited["config.json"] == first["model.hf_config"]["sha256"]["config.json"]
