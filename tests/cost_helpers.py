"""Test doubles of a cost model."""

from __future__ import annotations


class ConstantCost:
    """A cost model whose every step takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def step_time(self, shape: object) -> float:
        return self.seconds

    def describe(self) -> str:
        return f"{self.seconds} s a step"
