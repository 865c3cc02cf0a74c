"""``progress=null`` (simulate's default) draws a bar when the command's stderr is a terminal
and none otherwise; ``true`` / ``false`` decide it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from experiments import simulate
from tests.test_config_errors import SIM_SMALL, run_cli


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("terminal", "setting", "bar"),
    [(True, None, True), (False, None, False), (True, "false", False), (False, "true", True)],
)
def test_the_bar_follows_the_terminal_unless_set(
    tmp_path: Path, monkeypatch, terminal: bool, setting: str | None, bar: bool
) -> None:
    seen = {}
    real_main = simulate.main

    def main_on(stderr_is_terminal: bool):
        def wrapped(*args, **kwargs):
            import sys

            err = sys.stderr
            sys.stderr = _Terminal() if stderr_is_terminal else io.StringIO()
            try:
                return real_main(*args, **kwargs)
            finally:
                seen["err"] = sys.stderr.getvalue()
                sys.stderr = err

        return wrapped

    monkeypatch.setattr(simulate, "_PROGRESS_WHEN_UNSET", False)
    args = [*SIM_SMALL, *([] if setting is None else [f"progress={setting}"])]
    status, _, _ = run_cli(_App(main_on(terminal)), args, tmp_path)
    assert status == 0
    assert ("simulate: 100%" in seen["err"]) is bar, seen["err"]
    assert simulate._PROGRESS_WHEN_UNSET is False  # later runs in the process stay quiet


class _App:
    """``experiments.simulate`` with its ``main`` wrapped, for ``run_cli``."""

    __name__ = "experiments.simulate"

    def __init__(self, main) -> None:
        self.main = main
        self.main_with_checks = simulate.main_with_checks
