"""experiments.lib.args.OneLineParser: every argparse tool's usage error is one line."""

from __future__ import annotations

import pytest

from experiments import calibrate, reproduce
from experiments.lib.args import OneLineParser


def test_a_bad_argument_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    parser = OneLineParser(prog="tool")
    parser.add_argument("--rate", type=float)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--rate", "fast"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "tool: error: argument --rate: invalid float value: 'fast' (tool --help lists the "
        "arguments)"
    ]


@pytest.mark.parametrize(
    ("main", "argv", "phrase"),
    [
        (calibrate.main, [], "the following arguments are required: run_dir"),
        (reproduce.main, ["--fig12-panels", "z"], "--fig12-panels: no panel z"),
        (reproduce.main, ["--duration", "soon"], "--duration"),
    ],
)
def test_the_tools_say_it_in_one_line(main, argv, phrase, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and phrase in lines[0] and "--help lists" in lines[0]


def test_help_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    parser = OneLineParser(prog="tool", description="Does a thing.")
    parser.add_argument("--rate", type=float, help="requests per second")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: tool") and "requests per second" in out


def test_help_prints_the_docstring_as_terminal_text(capsys: pytest.CaptureFixture[str]) -> None:
    doc = """``python -m tool RUN``: does a thing.

- ``--fast``: see :func:`~core.thing.run` and :mod:`core.other`;
- default: the rest.
"""
    parser = OneLineParser(prog="tool", description=doc)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "python -m tool RUN: does a thing." in out
    assert "\n- --fast: see core.thing.run and core.other;\n- default: the rest." in out
    assert "``" not in out and ":func:" not in out
