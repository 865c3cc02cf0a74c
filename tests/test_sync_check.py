"""experiments.bench.sync_check: the dry run on CPU, and how a stack is placed in kvlab."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

from experiments.bench.sync_check import REPO, check, kvlab_site, main


def test_dry_run_serves_and_writes_its_file(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path), "--dry"]) == 0
    doc = json.loads((tmp_path / "sync_check.json").read_text())
    assert doc["dry"] is True and doc["model"] == "tiny-opt" and doc["steps"] > 0
    assert doc["sync_sites"] == {} and doc["slept_steps"] == []  # CPU: nothing asynchronous


def test_the_innermost_kvlab_frame_names_the_site() -> None:
    frame = traceback.FrameSummary
    stack = [
        frame(str(REPO / "experiments/serve.py"), 10, "run"),
        frame(str(REPO / "engine/runner.py"), 125, "forward"),
        frame("/usr/lib/python3/site-packages/torch/_tensor.py", 7, "__getitem__"),
    ]
    assert kvlab_site(stack) == "engine/runner.py:125"
    assert kvlab_site(stack[2:]) == "outside kvlab"


def test_what_was_found_is_saved_while_serving(tmp_path: Path) -> None:
    """A run its time limit kills keeps a sync_check.json: one is saved after the first
    step (``complete`` false) and the result at the end says ``complete``."""
    saved: list[dict] = []
    doc = check(True, 100.0, 6, tmp_path, saved.append)
    assert saved and saved[0]["steps"] == 1 and saved[0]["complete"] is False
    assert doc["complete"] is True and doc["steps"] > saved[-1]["steps"]
    assert set(saved[0]) == set(doc)
