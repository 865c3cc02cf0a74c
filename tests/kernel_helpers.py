"""Test helpers for the Triton kernels."""

from __future__ import annotations


class CountingLauncher:
    """Stands in for a ``@triton.jit`` kernel: counts ``kernel[grid](...)`` launches."""

    def __init__(self, kernel: object) -> None:
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid: tuple[int, ...]) -> object:
        self.grids.append(grid)
        return self.kernel[grid]  # type: ignore[index]
