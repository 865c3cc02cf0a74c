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


def test_an_interrupt_closes_the_bar_first(capsys: pytest.CaptureFixture[str]) -> None:
    # the "interrupted: ..." line was printed at the end of the bar's line, then the bar
    # was drawn once more after it
    from core.request import Request
    from core.systems import build_scheduler
    from sim.driver import simulate as simulate_requests

    class Interrupted:
        """Prices three steps, then a Ctrl-C arrives."""

        calls = 0

        def step_time(self, shape: object) -> float:
            self.calls += 1
            if self.calls > 3:
                raise KeyboardInterrupt
            return 0.01

    requests = [Request(i, 0.0, 10, 50) for i in range(4)]
    with pytest.raises(KeyboardInterrupt):
        simulate_requests(
            requests, lambda: build_scheduler("vllm", 4096), Interrupted(), progress=True,
            fast_forward=False,
        )  # fmt: skip
    err = capsys.readouterr().err
    assert "simulate" in err and err.endswith("\n"), repr(err[-80:])  # the bar's line ended


def test_the_phase_after_the_bar_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # the bar reached 100% and the command then went silent while it summarized and wrote
    # the tables: on a 194k-request trace half of its four minutes
    from experiments.reproduce import compose_config

    with caplog.at_level("INFO", logger="experiments.simulate"):
        metrics = simulate.run(compose_config(SIM_SMALL), tmp_path / "run")
    said = [r.getMessage() for r in caplog.records if r.name == "experiments.simulate"]
    line = f"simulated {metrics['num_steps']} steps in "
    assert any(m.startswith(line) and m.endswith(f"the tables to {tmp_path / 'run'}")
               for m in said), said  # fmt: skip
