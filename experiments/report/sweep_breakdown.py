"""A sweep's KV memory breakdown as stacked bars, Fig. 2's way: ``sweep_plot --y kv_breakdown``.

Each bar is one point of the sweep (one ``--x`` value, and one ``--hue`` value beside it),
stacked from the six time-weighted ``kv_*_pct`` parts of ``summary.csv``
(:func:`core.metrics.summary.memory_shares`: token states, reservation, internal
fragmentation, external fragmentation & other, free while the queue waits on a scheduler
limit, free with nobody waiting), each part the mean over the point's finished runs. The
parts of one run sum to 100, so the means of a point's runs do too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

KV_BREAKDOWN = "kv_breakdown"  # the --y name that asks for this figure


def part_columns() -> list[str]:
    from experiments.report.figures import KV_PARTS

    return [f"kv_{part}_pct" for part in KV_PARTS]


def aggregate_breakdown(frame: pd.DataFrame, x: str, hue: str | None, file: Path) -> pd.DataFrame:
    """Per (``hue``, ``x``), in the sweep's order (:func:`~experiments.report.sweep_plot.
    sort_points`): each ``kv_*_pct`` part's mean over the finished runs, and ``runs``. Raises
    ``SweepPlotError`` naming ``file`` and what it lacks."""
    from experiments.report.sweep_plot import (
        SweepPlotError,
        check_axes,
        finished_rows,
        sort_points,
    )

    check_axes(frame, file, x, hue)
    columns = part_columns()
    missing = [c for c in columns if c not in frame]
    if missing:
        raise SweepPlotError(
            f"{file}: no column {', '.join(missing)} for --y {KV_BREAKDOWN} "
            f"(the six KV parts of a simulate or serve run's metrics)"
        )
    done = finished_rows(frame)
    parts = done[columns].apply(pd.to_numeric, errors="coerce")
    done = done.assign(**parts).dropna(subset=columns)
    if done.empty:
        raise SweepPlotError(f"{file}: no finished row holds the KV parts' numbers")
    keys = [x] if hue is None else [hue, x]
    grouped = done.groupby(keys, dropna=False)
    table = grouped[columns].mean()
    table["runs"] = grouped.size()
    return sort_points(table.reset_index(), keys, frame)


def plot_breakdown(
    table: pd.DataFrame, x: str, hue: str | None, out: Path,
    order: Mapping[str, Sequence[Any]] | None = None,
) -> Path:  # fmt: skip
    """Stacked bars of :func:`aggregate_breakdown`'s table, the ``hue`` values side by side
    at each ``x``, both in ``order`` (each key's values, :func:`~experiments.report.
    sweep_plot.sweep_order` of the summary; where not given, numbers ascending, then other
    values as they first appear in ``table``); writes ``sweep_kv_breakdown.png`` and
    ``.pdf`` in ``out``."""
    from experiments.report.figures import KV_PARTS, PART_COLORS, PART_LABELS, pyplot, save

    plt = pyplot(headless=True)
    xs = _values(table, x, order)
    hues = [None] if hue is None else _values(table, hue, order)
    width = 0.8 / len(hues)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(xs) * len(hues) + 1.5), 4.0))
    ticks, names = [], []
    for i, x_value in enumerate(xs):
        for j, hue_value in enumerate(hues):
            row = table[table[x] == x_value]
            if hue is not None:
                row = row[row[hue] == hue_value]
            if row.empty:
                continue
            pos = i + (j - (len(hues) - 1) / 2) * width
            bottom = 0.0
            for part in KV_PARTS:
                value = float(row[f"kv_{part}_pct"].iloc[0])
                label = PART_LABELS[part] if (i, j) == (0, 0) else None
                ax.bar(pos, value, bottom=bottom, width=width * 0.9, color=PART_COLORS[part],
                       label=label)  # fmt: skip
                bottom += value
            ticks.append(pos)
            names.append(str(x_value) if hue is None else f"{hue_value}\n{x_value}")
    ax.set_xticks(ticks, names, fontsize=7)
    ax.set_xlabel(x if hue is None else f"{hue} / {x}")
    ax.set_ylabel("KV cache slots (%, time-weighted)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    path = save(fig, out, f"sweep_{KV_BREAKDOWN}")
    plt.close(fig)
    return path


def _values(table: pd.DataFrame, key: str, order: Mapping[str, Sequence[Any]] | None) -> list[Any]:
    """``table[key]``'s values in ``order[key]``'s order (values it lacks after them), else
    numbers ascending before other values as they first appear."""
    present = list(pd.unique(table[key]))
    given = [v for v in (order or {}).get(key, ()) if v in present]
    rest = [v for v in present if v not in given]
    numbers = sorted(v for v in rest if _is_number(v))
    return [*given, *numbers, *(v for v in rest if not _is_number(v))]


def _is_number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True
