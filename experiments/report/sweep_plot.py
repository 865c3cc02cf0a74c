"""A sweep's ``summary.csv`` as a table and a figure: ``python -m
experiments.report.sweep_plot SWEEP_DIR_OR_SUMMARY --x KEY --y METRIC [--y METRIC ...]
[--hue KEY] [--out DIR]``.

``--x`` and ``--hue`` are swept keys (columns of ``summary.csv``, e.g. ``system.block_size``,
``system``, ``workload.rate``), ``--y`` the metrics to plot (e.g. ``request_throughput``,
``normalized_latency``, ``kv_token_states_pct``). Rows that did not finish (``status`` other
than ``ok``) are left out and counted. Several rows at one (x, hue) point, such as seeds or a
key neither names, are averaged; the figure draws their range as an error bar. Writes
``DIR/sweep_<y>.csv`` (x, hue, mean, min, max, runs), ``.png`` and ``.pdf`` per metric
(``DIR`` defaults to the sweep's folder) and prints the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from experiments.lib.args import OneLineParser, out_dir_problem
from experiments.lib.results import write_csv


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


def aggregate(frame: pd.DataFrame, x: str, y: str, hue: str | None, file: Path) -> pd.DataFrame:
    """Mean, min, max and count of ``y`` per (``x``, ``hue``) over the finished rows."""
    if hue == x:
        raise SweepPlotError(f"--hue {hue} is the x axis already: name another key or none")
    for key in (x, y, hue):
        if key is not None and key not in frame:
            raise SweepPlotError(
                f"{file}: no column {key!r}; it has {', '.join(map(str, frame.columns))}"
            )
    done = frame[frame["status"] == "ok"] if "status" in frame else frame
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
    return table


def plot(tables: dict[str, pd.DataFrame], x: str, hue: str | None, out: Path) -> list[Path]:
    """One figure per metric: lines of mean against ``x``, one per ``hue`` value, with the
    range over the runs at each point as an error bar; returns the PNGs written."""
    from experiments.report.figures import pyplot, save

    plt = pyplot(headless=True)
    written = []
    for y, table in tables.items():
        fig, ax = plt.subplots(figsize=(5, 3.5))
        groups = [(None, table)] if hue is None else list(table.groupby(hue, dropna=False))
        for label, part in groups:
            part = part.sort_values(x)
            xs = part[x] if pd.api.types.is_numeric_dtype(part[x]) else part[x].astype(str)
            err = [part["mean"] - part["min"], part["max"] - part["mean"]]
            ax.errorbar(xs, part["mean"], yerr=err, marker="o", capsize=3,
                        label=None if label is None else str(label))  # fmt: skip
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        if hue is not None:
            ax.legend(title=hue, fontsize=7)
        written.append(save(fig, out, f"sweep_{y}"))
        plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m experiments.report.sweep_plot", description=__doc__)
    p.add_argument("summary", type=Path, help="a sweep's folder or its summary.csv")
    p.add_argument("--x", required=True, help="the swept key on the x axis")
    p.add_argument("--y", required=True, action="append", help="a metric (repeatable)")
    p.add_argument("--hue", default=None, help="a swept key: one line per value")
    p.add_argument("--out", type=Path, default=None, help="default: the summary's folder")
    args = p.parse_args(argv)
    try:
        frame, file = read_summary(args.summary)
        out = args.out or file.parent
        problem = out_dir_problem(out)
        if problem is not None:
            raise SweepPlotError(f"--out {out}: {problem}")
        tables = {y: aggregate(frame, args.x, y, args.hue, file) for y in args.y}
    except SweepPlotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for y, table in tables.items():
        write_csv(out / f"sweep_{y}.csv", table)
        print(f"{y}:\n{table.to_string(index=False)}\n")
    left = int((frame["status"] != "ok").sum()) if "status" in frame else 0
    if left:
        print(f"{left} run(s) not finished (status other than ok) left out")
    for png in plot(tables, args.x, args.hue, out):
        print(f"wrote {png} (+ .pdf, .csv)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
