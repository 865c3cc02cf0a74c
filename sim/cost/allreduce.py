"""Tensor-parallel all-reduce time, fitted on a measured all-reduce table.

A ring all-reduce of ``S`` bytes over ``n`` GPUs moves ``2 (n - 1) / n × S`` bytes over each
GPU's link, one way, in a time of a fixed part plus those bytes over the bandwidth the link
achieves (Hockney's latency-bandwidth form)::

    t(S, n) = latency + 2 (n - 1) / n × S / (efficiency × peer link bandwidth)

Two constants, each with a meaning: ``latency`` (the time of a small all-reduce on the GPU:
the NCCL kernel's steps and the peers' handshake) and ``efficiency`` (the fraction of the
datasheet peer link a large one reaches).

:func:`fit_allreduce` fits them on Vidur's ``all_reduce_*.csv`` (microsoft/vidur; each row a
collective's ``size`` in bytes, its ``num_workers`` and ``time_stats.all_reduce.median`` in
ms: the median NCCL kernel time, on the device, of calls issued back to back after a
barrier; the host's launch time is not in it), on the rows of one GPU count, with a split
by size stated in :class:`AllReduceFit`: ``latency`` is the median time of the small
messages (at most ``small_max`` bytes, where the bandwidth term is under a few percent);
``efficiency`` is the least-squares bandwidth of the large ones (at least ``large_min``)
once the latency is taken off; the sizes between are held out, and
``python -m experiments.bench.allreduce_fit`` reports the error on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.cost.profile import ProfileError, csv_rows

SMALL_MAX = 256 * 1024  # bytes: below, the bandwidth term is < 3% of a ~50 us latency
LARGE_MIN = 32 * 1024 * 1024  # bytes: above, the latency is < 23% of the time (48 us of 212)
_TIME = "time_stats.all_reduce.median"
_COLUMNS = ("size", "num_workers", _TIME)


class AllReduceTableError(ProfileError):
    """An all-reduce table is malformed; the message names the file and row."""


@dataclass(frozen=True)
class AllReduceTable:
    """One table's rows: ``size`` (bytes), ``workers`` (GPU count), ``seconds`` (median)."""

    path: Path
    size: np.ndarray
    workers: np.ndarray
    seconds: np.ndarray


@dataclass(frozen=True)
class AllReduceFit:
    """The fitted constants, the split and what the fit read (for a source text)."""

    latency_s: float
    efficiency: float
    link_bandwidth: float  # bytes/s per direction the efficiency is a fraction of
    workers: int
    small_max: int
    large_min: int
    small_rows: int
    large_rows: int
    held_out_rows: int
    note: str

    def role(self, size: float, workers: int) -> str:
        """What the fit did with a row of ``size`` bytes over ``workers`` GPUs: ``latency``
        or ``efficiency`` (fitted on it), ``held out`` (a size between the two bands) or
        ``held out (another GPU count)``."""
        if workers != self.workers:
            return "held out (another GPU count)"
        if size <= self.small_max:
            return "latency"
        return "efficiency" if size >= self.large_min else "held out"

    def seconds(self, size: np.ndarray | float, workers: int) -> np.ndarray | float:
        """Predicted time of an all-reduce of ``size`` bytes over ``workers`` GPUs on a link
        of :attr:`link_bandwidth`."""
        return ring_allreduce_s(size, workers, self.latency_s,
                                self.efficiency * self.link_bandwidth)  # fmt: skip


def ring_allreduce_s(
    size: np.ndarray | float, workers: int, latency_s: float, bandwidth: float
) -> np.ndarray | float:
    """``latency_s + 2 (workers - 1) / workers × size / bandwidth`` (0 for one GPU)."""
    if workers <= 1:
        return size * 0.0
    return latency_s + 2 * (workers - 1) / workers * size / bandwidth


def read_allreduce_table(path: Path | str) -> AllReduceTable:
    """Vidur's all-reduce CSV ``path``; a :class:`~sim.cost.profile.ProfileError` of one line
    naming the file (and row) for an unreadable file or one without data rows, and an
    :class:`AllReduceTableError` for a missing column, a size or GPU count that is
    not a whole number >= 1 (>= 2 GPUs), or a time that is not finite and > 0."""
    p = Path(path)
    rows = csv_rows(p)
    missing = [c for c in _COLUMNS if c not in rows[0][1]]
    if missing:
        raise AllReduceTableError(f"{p}: no column {', '.join(missing)}")
    size, workers, seconds = [], [], []
    for line, r in rows:
        size.append(_whole(p, line, r, "size", 1))
        workers.append(_whole(p, line, r, "num_workers", 2))
        try:
            ms = float(r[_TIME])
        except (TypeError, ValueError):
            ms = math.nan
        if not (math.isfinite(ms) and ms > 0):
            raise AllReduceTableError(
                f"{p}: row {line}: {_TIME} is {r[_TIME]!r} (a finite number of ms > 0 expected)"
            )
        seconds.append(ms / 1e3)
    return AllReduceTable(p, np.array(size, float), np.array(workers), np.array(seconds))


def _whole(p: Path, line: int, r: dict[str, str], key: str, least: int) -> int:
    text = r.get(key)
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value == int(value) and value >= least):
        raise AllReduceTableError(
            f"{p}: row {line}: {key} is {text!r} (a whole number >= {least} expected)"
        )
    return int(value)


def fit_allreduce(
    table: AllReduceTable,
    link_bandwidth: float,
    workers: int = 2,
    small_max: int = SMALL_MAX,
    large_min: int = LARGE_MIN,
) -> AllReduceFit:
    """Fit ``latency`` and ``efficiency`` (of ``link_bandwidth``, bytes/s per direction) on
    ``table``'s rows over ``workers`` GPUs: the latency on sizes <= ``small_max``, the
    efficiency on sizes >= ``large_min``. The efficiency is held to 1 (the note says so when
    the table's link was faster than ``link_bandwidth``). An :class:`AllReduceTableError`
    when either band has no row or the large sizes leave no time beyond the latency."""
    if not link_bandwidth > 0:
        raise ValueError(f"link_bandwidth must be > 0, got {link_bandwidth}")
    if not 0 < small_max < large_min:
        raise ValueError(f"need 0 < small_max < large_min, got {small_max}, {large_min}")
    mine = table.workers == workers
    small = mine & (table.size <= small_max)
    large = mine & (table.size >= large_min)
    for band, name in ((small, f"<= {small_max} bytes"), (large, f">= {large_min} bytes")):
        if not band.any():
            raise AllReduceTableError(
                f"{table.path}: no row over {workers} GPUs with size {name} to fit on"
            )
    latency = float(np.median(table.seconds[small]))
    moved = 2 * (workers - 1) / workers * table.size[large]
    beyond = table.seconds[large] - latency
    spent = float(np.sum(moved * beyond))
    if not spent > 0:
        raise AllReduceTableError(
            f"{table.path}: the {int(large.sum())} sizes >= {large_min} bytes over {workers} "
            f"GPUs take no time beyond the small sizes' latency ({latency * 1e6:.1f} us): "
            "no bandwidth to fit"
        )
    achieved = float(np.sum(moved * moved)) / spent  # least squares of beyond = moved / bw
    efficiency = min(1.0, achieved / link_bandwidth)
    held_to_one = (
        " (held to 1: the table's link was faster)"
        if efficiency < achieved / link_bandwidth
        else ""
    )
    between = mine & ~small & ~large
    held = int(between.sum())
    predicted = latency + 2 * (workers - 1) / workers * table.size[between] / (
        efficiency * link_bandwidth
    )
    actual = table.seconds[between]
    held_error = (
        f", mean absolute error {float(np.mean(np.abs(predicted - actual) / actual)):.1%} there"
        if held
        else ""
    )
    note = (
        f"{table.path.parent.name}/{table.path.name}, the {workers}-GPU rows: latency = the "
        f"median of the {int(small.sum())} sizes <= {small_max // 1024} KiB, "
        f"{latency * 1e6:.1f} us; efficiency = the least-squares bandwidth of the "
        f"{int(large.sum())} sizes >= {large_min // 2**20} MiB beyond it, "
        f"{achieved / 1e9:.0f} GB/s of {link_bandwidth / 1e9:g} = {efficiency:.3f}"
        f"{held_to_one}; "
        f"the {held} sizes between held out{held_error}"
    )
    return AllReduceFit(
        latency, efficiency, link_bandwidth, workers, small_max, large_min,
        int(small.sum()), int(large.sum()), held, note,
    )  # fmt: skip
