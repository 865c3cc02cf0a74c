"""The argument parser of kvlab's argparse tools: a usage error is one line."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors (a bad or missing argument, and every
    ``parser.error``) print one line, ``PROG: error: MESSAGE (PROG --help lists the
    arguments)``, and exit 2, as the Hydra apps' config errors do; argparse prints the usage
    block first. ``--help`` is unchanged."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the arguments)\n")
