"""The cost-model protocol the simulator's executor calls once per step."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from core.plan import BatchShape


@runtime_checkable
class CostModel(Protocol):
    """Maps one step's work to its duration."""

    def step_time(self, shape: BatchShape) -> float:
        """Seconds the step takes (>= 0). A function of ``shape`` alone, unless the model
        sets ``priced_in_order = True`` (its answer depends on how many steps it priced
        before): the simulator then prices each step exactly once, in order, and does not
        fast-forward (which prices a step it may then leave to the step-by-step path)."""
        ...

    def describe(self) -> str:
        """Printable description, with the source of every fitted or assumed constant."""
        ...
