"""The argument parser of kvlab's argparse tools: a usage error is one line."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any, NoReturn


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors (a bad or missing argument, and every
    ``parser.error``) print one line, ``PROG: error: MESSAGE (PROG --help lists the
    arguments)``, and exit 2, as the Hydra apps' config errors do; argparse prints the usage
    block first. ``--help`` prints the description (the tool's docstring) as terminal text:
    its line breaks and lists kept, its reST markup dropped (:func:`plain_text`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("description"):
            kwargs["description"] = plain_text(kwargs["description"])
            kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the arguments)\n")


def plain_text(doc: str) -> str:
    """A docstring's reST as terminal text: double backquotes dropped, and a cross-reference
    (:role: and backquotes, a leading ~) reduced to its target."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    return text.replace("``", "").strip()


def out_dir_problem(out: Path) -> str | None:
    """Why results cannot be written in the folder ``out`` (it is a file, lies under one,
    or its nearest existing folder cannot be written), or None: checked before any work."""
    existing = Path(out)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        if existing == Path(out):
            return f"{out} is a file, not a folder"
        return f"{out} lies under {existing}, a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot write in {existing}"
    return None
