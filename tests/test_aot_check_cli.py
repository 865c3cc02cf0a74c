"""``python -m kernels.aot_check`` under TRITON_INTERPRET=1: one line, status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_aot_check_refuses_interpreter_in_one_line() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "kernels.aot_check"],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "TRITON_INTERPRET" in lines[0], proc.stderr
    assert proc.stdout == ""
