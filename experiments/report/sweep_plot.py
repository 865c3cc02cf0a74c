"""A sweep's ``summary.csv`` as a table and a figure: ``python -m
experiments.report.sweep_plot SWEEP_DIR_OR_SUMMARY --x KEY --y METRIC [--y METRIC ...]
[--hue KEY] [--out DIR]``.

``--x`` and ``--hue`` are swept keys (columns of ``summary.csv``, e.g. ``system.block_size``,
``system``, ``workload.rate``), ``--y`` the metrics to plot (e.g. ``request_throughput``,
``normalized_latency``, ``kv_token_states_pct``; ``kv_breakdown``: the six KV parts as
stacked bars, Fig. 2's way, :mod:`experiments.report.sweep_breakdown`). Rows that did not
finish (``status`` other than ``ok``) are left out and counted. Several rows at one (x, hue)
point, such as seeds or a key neither names, are averaged; the figure draws their range as an
error bar, and a swept key other than ``seed`` averaged so (``cost=roofline,profiled`` under
``--x hardware``) is named in a warning on stderr. Points come in the sweep's order: a
numeric key's values ascending, any other's
(``system``, a workload) as they first appear in ``summary.csv`` (the order the sweep ran
them), not alphabetically. Writes ``DIR/sweep_<y>.csv`` (hue, x, mean, min, max, runs; for
``kv_breakdown`` each part's mean and runs), ``.png`` and ``.pdf`` per metric (``DIR``
defaults to the sweep's folder) and prints the table; and every metric's mean side by side,
one row per point (hue, x, a column per metric, for ``kv_breakdown`` per part, then runs), in
``DIR/sweep_table.csv`` and, the metrics to 4 significant digits, ``sweep_table.md``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.lib.args import OneLineParser, out_dir_problem
from experiments.lib.results import HEADLINE_METRICS, write_atomic, write_csv
from experiments.report.sweep_breakdown import (
    KV_BREAKDOWN,
    aggregate_breakdown,
    part_columns,
    plot_breakdown,
)
from experiments.report.tables import markdown_rows


class SweepPlotError(ValueError):
    """A summary that cannot be plotted as asked: one line naming the file or column."""


def read_summary(path: Path) -> tuple[pd.DataFrame, Path]:
    """The sweep's ``summary.csv`` (``path`` is it or its folder) and the file read."""
    file = path / "summary.csv" if path.is_dir() else path
    if not file.is_file():
        raise SweepPlotError(f"{file}: no such file (a -m sweep writes summary.csv)")
    try:
        frame = pd.read_csv(file)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise SweepPlotError(f"{file}: not a CSV table ({str(exc).splitlines()[0]})") from None
    return frame, file


def check_axes(frame: pd.DataFrame, file: Path, x: str, hue: str | None, *more: str) -> None:
    """A SweepPlotError when ``hue`` is ``x`` or ``frame`` lacks one of the named columns."""
    if hue == x:
        raise SweepPlotError(f"--hue {hue} is the x axis already: name another key or none")
    for key in (x, *more, hue):
        if key is not None and key not in frame:
            raise SweepPlotError(
                f"{file}: no column {key!r}; it has {', '.join(map(str, frame.columns))}"
            )


def finished_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of runs that finished (``status`` ok; every row of a table without one)."""
    return frame[frame["status"] == "ok"] if "status" in frame else frame


def sweep_order(frame: pd.DataFrame, key: str) -> list[Any]:
    """``key``'s values in the order a sweep's points are shown: a numeric column's
    ascending, any other's as they first appear in ``frame`` (``summary.csv`` lists its jobs
    in the order the sweep ran them); a missing value last."""
    values = frame[key]
    missing = [values[values.isna()].iloc[0]] if values.isna().any() else []
    if not pd.api.types.is_numeric_dtype(values):
        return list(pd.unique(values.dropna())) + missing
    return sorted(values.dropna().unique()) + missing


def sort_points(table: pd.DataFrame, keys: Sequence[str], frame: pd.DataFrame) -> pd.DataFrame:
    """``table``'s rows (one per point of ``keys``) by ``keys`` in :func:`sweep_order`."""
    if table.empty:
        return table
    by = list(keys)

    def rank(column: pd.Series) -> Any:
        order = [v for v in sweep_order(frame, str(column.name)) if not pd.isna(v)]
        places = pd.Series(pd.Index(order).get_indexer(column), index=column.index)
        return places.mask(column.isna(), len(order))  # a missing value last

    return table.sort_values(by, key=rank, kind="stable").reset_index(drop=True)


def averaged_keys(frame: pd.DataFrame, x: str, hue: str | None) -> dict[str, list[str]]:
    """The swept keys a point averages over: each override column of ``summary.csv`` (those
    before its first headline metric, :data:`HEADLINE_METRICS`) other than ``job``, ``seed``,
    ``x`` and ``hue`` that holds more than one value among the finished rows of one (``x``,
    ``hue``) point, with its values in the sweep's order. Seeds are averaged by design; any
    other key (``cost``, ``hardware``, ...) mixes runs a reader would compare apart."""
    first = next((i for i, c in enumerate(frame.columns) if c in HEADLINE_METRICS), 0)
    own = {"job", "seed", x, hue}
    keys = [str(c) for c in frame.columns[:first] if c not in own]
    done = finished_rows(frame)
    if not keys or done.empty:
        return {}
    by = [x] if hue is None else [hue, x]
    spread = done.groupby(by, dropna=False)[keys].nunique(dropna=False).max()
    return {k: [str(v) for v in sweep_order(done, k)] for k in keys if int(spread.get(k, 0)) > 1}


def aggregate(frame: pd.DataFrame, x: str, y: str, hue: str | None, file: Path) -> pd.DataFrame:
    """Mean, min, max and count of ``y`` per (``x``, ``hue``) over the finished rows, the
    points in :func:`sweep_order`."""
    check_axes(frame, file, x, hue, y)
    done = finished_rows(frame)
    values = pd.to_numeric(done[y], errors="coerce")
    if values.isna().all():
        raise SweepPlotError(f"{file}: column {y!r} holds no number in a finished row")
    keys = [x] if hue is None else [hue, x]
    table = (
        done.assign(**{y: values})
        .groupby(keys, dropna=False)[y]
        .agg(["mean", "min", "max", "count"])
        .rename(columns={"count": "runs"})
        .reset_index()
    )
    return sort_points(table, keys, frame)


# units of summary.csv's metrics that their names do not carry as a suffix
_UNITS = {"request_throughput": "req/s", "offered_rate": "req/s",
          "output_throughput": "tokens/s", "normalized_latency": "s/token"}  # fmt: skip
_SUFFIX_UNITS = {"_ms": "ms", "_pct": "%", "_s": "s", "_gb": "GB", "_gib": "GiB"}


def axis_label(name: str) -> str:
    """``name`` with its unit, read from :data:`_UNITS` or the name's suffix (``_ms``,
    ``_pct``, ...); ``name`` alone when neither gives one."""
    unit = _UNITS.get(name) or next(
        (u for suffix, u in _SUFFIX_UNITS.items() if name.endswith(suffix)), None
    )
    return name if unit is None else f"{name} ({unit})"


def _powers_of_two(values: pd.Series) -> bool:
    """Three or more distinct positive powers of two (block sizes): a log2 axis spreads
    them evenly."""
    if not pd.api.types.is_integer_dtype(values):
        return False
    distinct = set(values.dropna().astype(int))
    return len(distinct) >= 3 and all(v > 0 and v & (v - 1) == 0 for v in distinct)


def plot(
    tables: dict[str, pd.DataFrame], x: str, hue: str | None, out: Path,
    order: Mapping[str, Sequence[Any]] | None = None,
) -> list[Path]:  # fmt: skip
    """One figure per metric: lines of mean against ``x``, one per ``hue`` value, with the
    range over the runs at each point as an error bar; returns the PNGs written. With
    ``--hue system`` a system's line takes its colour and style in every figure
    (:func:`experiments.report.figures.system_style`). Lines and categories come in the
    tables' row order (:func:`sort_points`), categories of ``x`` in ``order[x]`` where
    given (:func:`sweep_order` of the summary)."""
    from experiments.report.figures import pyplot, save, system_style

    plt = pyplot(headless=True)
    written = []
    for y, table in tables.items():
        fig, ax = plt.subplots(figsize=(5, 3.5))
        groups = (
            [(None, table)] if hue is None else list(table.groupby(hue, dropna=False, sort=False))
        )
        spare = iter(f"C{i}" for i in range(10))
        numeric = pd.api.types.is_numeric_dtype(table[x])
        if not numeric:  # the categories' places, before any line's points claim them
            present = [str(v) for v in pd.unique(table[x])]
            given = [str(v) for v in (order or {}).get(x, ()) if str(v) in present]
            places = [*given, *(v for v in present if v not in given)]
            ax.plot(places, [math.nan] * len(places), linestyle="none", color="none")
        for label, part in groups:
            style = system_style(str(label), spare) if hue == "system" else {}
            part = part.sort_values(x) if numeric else part
            xs = part[x] if numeric else part[x].astype(str)
            err = [part["mean"] - part["min"], part["max"] - part["mean"]]
            line = style.pop("ls", "-")  # popped either way: errorbar refuses ls + linestyle
            line = line if numeric else "none"  # no line between categories
            ax.errorbar(xs, part["mean"], yerr=err, marker="o", capsize=3, linestyle=line,
                        label=None if label is None else str(label), **style)  # fmt: skip
        if _powers_of_two(table[x]):
            ax.set_xscale("log", base=2)
        ax.set_xlabel(axis_label(x))
        ax.set_ylabel(axis_label(y))
        if hue is not None:
            ax.legend(title=hue, fontsize=7)
        written.append(save(fig, out, f"sweep_{y}"))
        plt.close(fig)
    return written


def side_by_side(
    tables: dict[str, pd.DataFrame], x: str, hue: str | None, frame: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Every metric's mean at each (``hue``, ``x``) point of ``tables`` (:func:`aggregate`'s,
    :func:`aggregate_breakdown`'s for ``kv_breakdown``: a column per part), one row per
    point, then ``runs``: the most runs any metric averaged there (a metric averages fewer
    where a run holds no number for it); the points in :func:`sweep_order` of ``frame`` (the
    summary) where given."""
    keys = [x] if hue is None else [hue, x]
    merged: pd.DataFrame | None = None
    runs: list[str] = []
    for i, (y, table) in enumerate(tables.items()):
        values = part_columns() if y == KV_BREAKDOWN else [y]
        named = table.rename(columns={"mean": y, "runs": f"runs {i}"})
        part = named[[*keys, *values, f"runs {i}"]]
        merged = part if merged is None else merged.merge(part, on=keys, how="outer")
        runs.append(f"runs {i}")
    assert merged is not None
    merged["runs"] = merged[runs].max(axis=1).astype(int)
    merged = merged.drop(columns=runs)
    return merged if frame is None else sort_points(merged, keys, frame)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "" if value != value else f"{value:.4g}"  # NaN: no number
    return str(value)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m experiments.report.sweep_plot", description=__doc__)
    p.add_argument("summary", type=Path, help="a sweep's folder or its summary.csv")
    p.add_argument("--x", required=True, help="the swept key on the x axis")
    p.add_argument("--y", required=True, action="append",
                   help=f"a metric (repeatable); {KV_BREAKDOWN}: the KV parts stacked")  # fmt: skip
    p.add_argument("--hue", default=None, help="a swept key: one line per value")
    p.add_argument("--out", type=Path, default=None, help="default: the summary's folder")
    args = p.parse_args(argv)
    try:
        frame, file = read_summary(args.summary)
        out = args.out or file.parent
        problem = out_dir_problem(out)
        if problem is not None:
            raise SweepPlotError(f"--out {out}: {problem}")
        tables = {
            y: aggregate_breakdown(frame, args.x, args.hue, file)
            if y == KV_BREAKDOWN
            else aggregate(frame, args.x, y, args.hue, file)
            for y in args.y
        }
    except SweepPlotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for key, values in averaged_keys(frame, args.x, args.hue).items():
        print(
            f"warning: each point averages runs of differing {key} ({', '.join(values)}): "
            f"name it as --x or --hue, or plot each {key}'s sweep apart",
            file=sys.stderr,
        )
    out.mkdir(parents=True, exist_ok=True)
    for y, table in tables.items():
        write_csv(out / f"sweep_{y}.csv", table)
        print(f"{y}:\n{table.to_string(index=False)}\n")
    table = side_by_side(tables, args.x, args.hue, frame)
    write_csv(out / "sweep_table.csv", table)
    keys = [args.x] if args.hue is None else [args.hue, args.x]
    text = table.apply(lambda c: c.map(str if c.name in keys else _cell)).set_index(keys[0])
    write_atomic(out / "sweep_table.md", "\n".join(markdown_rows(text)) + "\n")
    left = int((frame["status"] != "ok").sum()) if "status" in frame else 0
    if left:
        print(f"{left} run(s) not finished (status other than ok) left out")
    lines = {y: t for y, t in tables.items() if y != KV_BREAKDOWN}
    order = {k: sweep_order(frame, k) for k in keys}
    pngs = plot(lines, args.x, args.hue, out, order)
    if KV_BREAKDOWN in tables:
        pngs.append(plot_breakdown(tables[KV_BREAKDOWN], args.x, args.hue, out, order))
    for png in pngs:
        print(f"wrote {png} (+ .pdf, .csv)")
    print(f"wrote {out / 'sweep_table.md'} (+ .csv): every metric's mean, a row per point")
    return 0


if __name__ == "__main__":
    sys.exit(main())
