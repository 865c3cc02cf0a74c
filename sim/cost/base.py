"""The cost-model protocol the simulator's executor calls once per step."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from core.plan import BatchShape


@runtime_checkable
class CostModel(Protocol):
    """Maps one step's work to its duration."""

    def step_time(self, shape: BatchShape) -> float:
        """Seconds the step takes (>= 0)."""
        ...

    def describe(self) -> str:
        """Printable description, with the source of every fitted or assumed constant."""
        ...
