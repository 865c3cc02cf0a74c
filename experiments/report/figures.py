"""The report's figures, drawn once: ``experiments.report.markdown`` and the notebooks in
``notebooks/`` call these functions, so a figure looks the same wherever it is made, and
a system or a KV part has one colour everywhere.

Each ``fig*`` function takes the table the report computes and returns a matplotlib
figure; :func:`save` writes it as PNG and PDF (TrueType fonts, editable in the PDF).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.lib.results import write_atomic
from experiments.report.paper import (
    FIG2_BREAKDOWN,
    FIG13_BATCH,
    SYSTEM_LABELS,
)

KV_PARTS = ("token_states", "reserved", "internal_frag", "external_frag", "free_at_limit", "free")
PART_LABELS = {
    "token_states": "Token states",
    "reserved": "Reservation",
    "internal_frag": "Internal frag.",
    "external_frag": "External frag. & other",
    "free_at_limit": "Free (waiting on a scheduler limit)",
    "free": "Free (nobody waiting)",
}
PART_COLORS = {
    "token_states": "#4c72b0",
    "reserved": "#dd8452",
    "internal_frag": "#c44e52",
    "external_frag": "#8c8c8c",
    "free_at_limit": "#b8d4b8",
    "free": "#e5e5e5",
}
SYSTEM_COLORS = {
    "fastertransformer": "#8172b3",
    "orca_max": "#dd8452",
    "orca_pow2": "#55a868",
    "orca_oracle": "#c44e52",
    "vllm": "#4c72b0",
    "vllm_v1": "#64b5cd",
}
# a line style per system beside its colour, so that a curve drawn over another that it
# coincides with (Orca (Pow2) and Orca (Oracle) on a trace that fits both) leaves it visible;
# the broken styles are drawn above the solid ones (system_style)
SYSTEM_LINESTYLES = {
    "fastertransformer": (0, (1, 1)),
    "orca_max": "-.",
    "orca_pow2": "--",
    "orca_oracle": "-",
    "vllm": "-",
    "vllm_v1": (0, (5, 1, 1, 1)),
}
SOURCE_COLORS = {"kvlab": "#4c72b0", "paper": "#dd8452"}
WORKLOAD_COLORS = {"sharegpt": "#4c72b0", "alpaca": "#55a868"}
PREEMPTION_COLORS = {"recompute": "#4c72b0", "swap": "#c44e52"}


def system_style(system: str, spare: Any = None) -> dict[str, Any]:
    """The colour (:data:`SYSTEM_COLORS`), line style (:data:`SYSTEM_LINESTYLES`) and
    z-order of ``system``'s lines in every figure that draws systems: the capacity plot,
    the sweep plot and the report's. A broken style is drawn above a solid line, so two
    coinciding curves both show. A system without a colour of its own takes the next of
    ``spare`` (an iterator of colours; None: matplotlib's cycle) and a solid line."""
    color = SYSTEM_COLORS.get(system)
    if color is None:
        color = next(spare) if spare is not None else None
    ls = SYSTEM_LINESTYLES.get(system, "-")
    return {"color": color, "ls": ls, "zorder": 2.0 if ls == "-" else 2.5}


def wrap_title(text: str, width_in: float, fontsize: float) -> str:
    """``text`` with each line broken at spaces to fit ``width_in`` inches at ``fontsize``
    points (about 0.6 em a character, within 90% of the width: an axis title is centred on
    the axes, not the figure), so that a title does not run past the figure's edges, where
    it would be cut off."""
    import textwrap

    chars = max(20, int(0.9 * width_in * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.fill(line, chars) if line else line for line in text.split("\n"))


def pyplot(headless: bool = False) -> Any:
    """``matplotlib.pyplot`` (the Agg backend when ``headless``), or one clear line when
    matplotlib is not installed."""
    try:
        import matplotlib

        if headless:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the install
        raise SystemExit("figures need matplotlib: pip install -e '.[plot]'") from e
    return plt


def save(fig: Any, out: Path, stem: str) -> Path:
    """Write ``<stem>.png`` (150 dpi) and ``<stem>.pdf`` (fonttype 42) into ``out``, each
    atomically; return the PNG's path. The PDF carries no creation date, so the same
    figure gives the same bytes on every run."""
    import matplotlib

    fig.tight_layout()
    png = out / f"{stem}.png"
    write_atomic(png, lambda tmp: fig.savefig(tmp, dpi=150, format="png"))
    with matplotlib.rc_context({"pdf.fonttype": 42, "ps.fonttype": 42}):
        write_atomic(
            out / f"{stem}.pdf",
            lambda tmp: fig.savefig(tmp, format="pdf", metadata={"CreationDate": None}),
        )
    return png


def _value(v: Any, missing: float = 0.0) -> float:
    """``v`` as a float; ``missing`` where it is None or NaN."""
    return missing if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _end(row: Any, key: str, rate: float) -> float:
    """An interval end of a capacity row; ``rate`` (no bar on that side) where it is missing."""
    return _value(row.get(key), rate)


BAR_MARKS = "≥: a lower bound (no rate tried failed); ↑: so is the interval's top; <r: none passed"


def is_flag(row: Any, key: str) -> bool:
    """Whether a capacity row's boolean column ``key`` is true: False when absent (a CSV
    written before the column existed) or empty; the text "True" counts, NaN does not."""
    return str(row.get(key, False)).strip().lower() in ("true", "1", "1.0")


def rate_bars(ax: Any, xs: list[float], rows: list[Any], width: float, **bar: Any) -> None:
    """One system's sustained rates as bars at ``xs`` (``max_rate`` of each capacity row in
    ``rows``), the seed interval ``rate_lo``–``rate_hi`` as error bars (none on a side where
    a row lacks that end or holds NaN there), and :func:`mark_rate_bounds`' marks; ``bar``:
    label, color."""
    vals = [_value(r["max_rate"]) for r in rows]
    lows = [max(0.0, v - _end(r, "rate_lo", v)) for v, r in zip(vals, rows, strict=True)]
    highs = [max(0.0, _end(r, "rate_hi", v) - v) for v, r in zip(vals, rows, strict=True)]
    ax.bar(xs, vals, width, yerr=[lows, highs], capsize=2, error_kw={"lw": 0.8}, **bar)
    mark_rate_bounds(ax, xs, rows)


def mark_rate_bounds(ax: Any, xs: Any, rows: Any) -> None:
    """Marks on a bar chart of sustained rates (``max_rate`` with the seed interval
    ``rate_lo``–``rate_hi`` as error bars) what a bar cannot say (the legend :data:`BAR_MARKS`):
    "≥" above a bar whose rate is only a lower bound (``rate_open``), "↑" above one whose
    interval's top is (``rate_hi_open``), and "<r" on a system that passed no rate, r the
    lowest rate tried (``first_failing_rate``). ``rows``: capacity-table rows, one per x."""
    for x, row in zip(xs, rows, strict=True):
        rate = _value(row.get("max_rate"))
        top = max(rate, _value(row.get("rate_hi", rate)))
        if rate <= 0:
            fail = _value(row.get("first_failing_rate"))
            ax.annotate(f"<{fail:g}" if fail > 0 else "none", (x, 0), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=6,
                        rotation=90)  # fmt: skip
        elif is_flag(row, "rate_open") or is_flag(row, "rate_hi_open"):
            mark = "≥" if is_flag(row, "rate_open") else "↑"
            ax.annotate(mark, (x, top), xytext=(0, 1), textcoords="offset points",
                        ha="center", va="bottom", fontsize=9)  # fmt: skip
    ax.margins(y=0.12)  # room above the tallest bar for its mark


def fig2_breakdown(table: pd.DataFrame) -> Any:
    """Fig. 2: stacked KV shares, kvlab's bar beside the paper's for each system.
    ``table``: ``experiments.report.markdown.fig2_table``."""
    fig, ax = pyplot().subplots(figsize=(8, 3.8))
    names = [f"{SYSTEM_LABELS[s]}\n{who}" for s in table["system"] for who in ("kvlab", "paper")]
    xs = range(len(names))
    bottom = [0.0] * len(names)
    for part in KV_PARTS:
        values = [_value(r[f"{who}_{part}_pct"]) for _, r in table.iterrows()
                  for who in ("kvlab", "paper")]  # fmt: skip
        ax.bar(xs, values, bottom=bottom, width=0.8, color=PART_COLORS[part],
               label=PART_LABELS[part])  # fmt: skip
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(list(xs), names, fontsize=7)
    ax.set_ylabel("KV cache usage (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Fig. 2: KV memory breakdown, OPT-13B, ShareGPT 2 req/s", fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    return fig


WORKLOAD_LABELS = {"sharegpt": "ShareGPT", "alpaca": "Alpaca"}


def fig13_batch(table: pd.DataFrame) -> Any:
    """Fig. 13: mean batched requests, one panel per workload of ``table`` (``workload``
    column, ShareGPT first), each drawn by :func:`fig13_panel`.
    ``table``: ``experiments.report.markdown.fig13_table`` rows (``fig13_batch.csv``)."""
    workloads = list(dict.fromkeys(table["workload"])) if "workload" in table else [None]
    fig, axes = pyplot().subplots(1, len(workloads), figsize=(5 * len(workloads), 3),
                                  squeeze=False)  # fmt: skip
    for i, (ax, workload) in enumerate(zip(axes[0], workloads, strict=True)):
        panel = table if workload is None else table[table["workload"] == workload]
        fig13_panel(ax, panel.reset_index(drop=True), f"({chr(ord('a') + i)})")
    return fig


def fig13_panel(ax: Any, panel: pd.DataFrame, tag: str) -> None:
    """One Fig. 13 panel: kvlab's mean batch per system (value on each bar) beside the
    paper's where the paper's number is known; a note where it is not."""
    xs = list(range(len(panel)))
    paper = panel["paper_mean_batch"].astype(float)
    known = bool(paper.notna().any())
    offset, width = (-0.2, 0.4) if known else (0.0, 0.5)
    bars = ax.bar([x + offset for x in xs], panel["kvlab_mean_batch"], width=width,
                  color=SOURCE_COLORS["kvlab"], label="kvlab")  # fmt: skip
    ax.bar_label(bars, fmt="%.1f", fontsize=7)
    if known:
        ax.bar([x + 0.2 for x in xs], paper, width=0.4, color=SOURCE_COLORS["paper"],
               label="paper (Fig. 13)")  # fmt: skip
    else:
        ax.text(0.02, 0.97, "paper's values: not in kvlab's reference facts",
                transform=ax.transAxes, fontsize=7, va="top")  # fmt: skip
    ax.set_xticks(xs, [SYSTEM_LABELS[s] for s in panel["system"]], fontsize=8)
    ax.set_ylabel("# batched requests")
    ax.margins(y=0.15)
    workload = panel["workload"].iloc[0] if "workload" in panel else "sharegpt"
    rate = panel["rate"].iloc[0] if "rate" in panel else 2.0
    ax.set_title(f"Fig. 13 {tag}: OPT-13B, {WORKLOAD_LABELS.get(workload, workload)} "
                 f"{rate:g} req/s", fontsize=9)  # fmt: skip
    ax.legend(fontsize=8, loc="upper left" if known else "center left")


def fig12_panels(
    curves: pd.DataFrame, capacity: pd.DataFrame, threshold: float,
    panels: list[tuple[str, str, float]],
) -> Any:  # fmt: skip
    """Fig. 12, one axis per panel (``panels``: (panel key, title, end of the paper's
    x-axis)), laid out as the paper's (ShareGPT above Alpaca when all six are drawn).
    Per system: normalized latency's mean over seeds against the rate (line; a rate that
    passed, ``passes``, a filled dot, one that failed, ``failed``, a hollow square; one
    unmeasured on a seed, neither), shaded between the
    seeds' min and max, the threshold (dotted), and the sustainable rate as a dot with
    its interval over seeds as a horizontal bar on the threshold line; the paper's axis end
    is a grey vertical line. ``curves``: ``rate_search.curve_table`` with a ``panel`` column;
    ``capacity``: ``rate_search.capacity_table`` likewise."""
    n = len(panels)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = pyplot().subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, (key, title, axis_end) in zip(axes.flat, panels, strict=False):
        sub = curves[curves["panel"] == key]
        cap = capacity[capacity["panel"] == key].set_index("system")
        for system in [s for s in SYSTEM_COLORS if s in set(sub["system"])]:
            df = sub[sub["system"] == system].sort_values("rate")
            style = system_style(system)
            color = style["color"]
            label = SYSTEM_LABELS.get(system, system)
            if system in cap.index and not cap.loc[system, "max_rate"] > 0:
                label += " (no rate passed)"  # its points may all lie above the y-limit
            passed = (df["passes"].astype(str) == "True").tolist()
            ax.plot(df["rate"], df["normalized_latency_mean"], marker="o", ms=2.5, lw=1,
                    markevery=passed, label=label, **style)  # fmt: skip
            # an older fig12_curves.csv has no "failed": every rate that did not pass failed
            fails = df["failed"] if "failed" in df else df["passes"].astype(str) != "True"
            failed = df[(fails.astype(str) == "True").tolist()]
            ax.plot(failed["rate"], failed["normalized_latency_mean"], ls="none", marker="s",
                    ms=3, mfc="none", mew=0.7, color=color)  # fmt: skip
            ax.fill_between(df["rate"], df["normalized_latency_min"],
                            df["normalized_latency_max"], color=color, alpha=0.2, lw=0)  # fmt: skip
            if system in cap.index and cap.loc[system, "max_rate"] > 0:
                r = cap.loc[system]
                ax.errorbar([r["max_rate"]], [threshold], fmt="o", ms=5, mfc="none", color=color,
                            xerr=[[r["max_rate"] - r["rate_lo"]], [r["rate_hi"] - r["max_rate"]]],
                            capsize=3, lw=1)  # fmt: skip
                _mark_threshold_bounds(ax, r, threshold, color)
            elif system in cap.index and _value(cap.loc[system].get("first_failing_rate")) > 0:
                # nothing passed: the rate lies below the lowest one tried
                ax.plot([cap.loc[system, "first_failing_rate"]], [threshold], marker=8, ms=6,
                        color=color, ls="none")  # fmt: skip
        ax.axhline(threshold, color="k", lw=0.6, ls=":")
        ax.axvline(axis_end, color="0.6", lw=0.6)
        ax.set_ylim(0, 2 * threshold)
        top = max([axis_end, *[float(v) for v in cap["max_rate"]]]) if len(cap) else axis_end
        ax.set_xlim(0, 1.25 * top)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("normalized latency (s/token)")
        ax.set_title(title, fontsize=9)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    sep = "; " if cols == 3 else "\n"  # one or two panels: too narrow for one line
    title = (f"Fig. 12 (simulated): mean over seeds, shaded min–max{sep}threshold "
             f"{threshold:g} s/token; grey line: end of the paper's axis\n"
             "≥ rate, → interval's top: lower bounds (no rate tried failed)"
             f"{sep}◂: no rate passed, below the lowest tried{sep}"
             "hollow square: a rate that failed (filled dot: passed)")  # fmt: skip
    wrapped = wrap_title(title, 4.2 * cols, 9)
    # the panels keep their 3.3 inches each: the figure grows by the title's lines (9 pt,
    # about 1.3 line spacing), which would otherwise squeeze a one-panel figure's axes to a
    # strip and push its y label past the figure's edge
    fig.set_size_inches(4.2 * cols, 3.3 * rows + (wrapped.count("\n") + 1) * 9 * 1.3 / 72)
    fig.suptitle(wrapped, fontsize=9)
    return fig


def capacity_curves(
    curves: pd.DataFrame, capacity: pd.DataFrame, threshold: float, systems: list[str],
    setting: str = "", slo: str | None = None,
) -> Any:  # fmt: skip
    """``experiments.capacity``'s figure: per system (``systems``' order; a system without
    a colour of its own takes the next of matplotlib's cycle), normalized latency's mean
    over seeds against the rate, shaded between the seeds' min and max (a filled dot: a
    rate that passed; a hollow square: one that failed), the threshold (dotted), and the
    sustainable rate as a dot on it with its interval over seeds (with no latency limit,
    ``threshold`` inf: on the curve, and no threshold line); ``setting`` heads the title,
    wrapped to the figure's width, ``slo`` (the ``slo`` rule in words) joins its rule.
    Colours and line styles: :func:`system_style`. ``curves``:
    ``rate_search.curve_table``; ``capacity``: ``experiments.capacity.capacity_frame``."""
    width = 5.6
    fig, ax = pyplot().subplots(figsize=(width, 3.6))
    cap = capacity.set_index("system")
    spare = iter(f"C{i}" for i in range(10))
    limited = math.isfinite(threshold)
    for system in systems:
        df = curves[curves["system"] == system].sort_values("rate")
        style = system_style(system, spare)
        color = style["color"]
        passed = (df["passes"].astype(str) == "True").tolist()
        ax.plot(df["rate"], df["normalized_latency_mean"], marker="o", ms=2.5, lw=1,
                markevery=passed, label=SYSTEM_LABELS.get(system, system), **style)  # fmt: skip
        failed = df[(df["failed"].astype(str) == "True").tolist()]
        ax.plot(failed["rate"], failed["normalized_latency_mean"], ls="none", marker="s", ms=3,
                mfc="none", mew=0.7, color=color)  # fmt: skip
        ax.fill_between(df["rate"], df["normalized_latency_min"], df["normalized_latency_max"],
                        color=color, alpha=0.2, lw=0)  # fmt: skip
        r = cap.loc[system]
        if r["max_rate"] > 0:
            at = df.loc[df["rate"] == r["max_rate"], "normalized_latency_mean"]
            y = threshold if limited else _value(at.iloc[0] if len(at) else None)
            ax.errorbar([r["max_rate"]], [y], fmt="o", ms=5, mfc="none", color=color,
                        xerr=[[r["max_rate"] - r["rate_lo"]], [r["rate_hi"] - r["max_rate"]]],
                        capsize=3, lw=1)  # fmt: skip
            _mark_threshold_bounds(ax, r, y, color)
    if limited:
        ax.axhline(threshold, color="k", lw=0.6, ls=":")
        ax.set_ylim(0, 2 * threshold)
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlim(0, 1.1 * float(curves["rate"].max()))
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.legend(fontsize=7)
    rule = f"≤ {threshold:g} s/token and kept up" if limited else "kept up"
    rule += " with arrivals" + (f"; {slo}" if slo else "")
    title = (f"{setting + chr(10) if setting else ''}sustainable rate: {rule}, on every "
             "seed\nmean over seeds, shaded min–max; hollow square: a rate that failed; ≥: a "
             "lower bound")  # fmt: skip
    ax.set_title(wrap_title(title, width, 8), fontsize=8)
    return fig


def _mark_threshold_bounds(ax: Any, row: Any, threshold: float, color: str) -> None:
    """Fig. 12's bound marks on a system's rate dot (the threshold line): "≥" above it when
    the rate is only a lower bound (``rate_open``), "→" past the interval's right end when
    that end is (``rate_hi_open``)."""
    if is_flag(row, "rate_open"):
        ax.annotate("≥", (row["max_rate"], threshold), xytext=(0, 4), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8, color=color)  # fmt: skip
    if is_flag(row, "rate_hi_open"):
        ax.annotate("→", (row["rate_hi"], threshold), xytext=(3, 0), textcoords="offset points",
                    ha="left", va="center", fontsize=8, color=color)  # fmt: skip


def table1_capacity(t1: pd.DataFrame) -> Any:
    """Table 1: KV slots per model/GPU setup, kvlab beside the paper, kvlab's difference
    in percent on its bar. ``t1``: ``table1.csv`` (``sim.capacity.table1`` rows)."""
    fig, ax = pyplot().subplots(figsize=(5.5, 3.2))
    xs = list(range(len(t1)))
    diff = 100 * (t1["max_slots"] / t1["paper_slots"] - 1)
    ax.bar([x - 0.2 for x in xs], t1["max_slots"] / 1e3, width=0.4,
           color=SOURCE_COLORS["kvlab"], label="kvlab")  # fmt: skip
    ax.bar([x + 0.2 for x in xs], t1["paper_slots"] / 1e3, width=0.4,
           color=SOURCE_COLORS["paper"], label="paper (Table 1)")  # fmt: skip
    for x, slots, d in zip(xs, t1["max_slots"], diff, strict=True):
        ax.annotate(f"{d:+.1f}%", (x - 0.2, slots / 1e3), ha="center", va="bottom", fontsize=7)
    setups = [f"{m}\n{n}× {g}" for m, n, g in zip(t1["model"], t1["num_gpus"], t1["gpu"],
                                                  strict=True)]  # fmt: skip
    ax.set_xticks(xs, setups, fontsize=8)
    ax.set_ylabel("KV slots (thousand tokens)")
    ax.set_title("Table 1: KV-cache capacity, kvlab vs paper", fontsize=9)
    ax.legend(fontsize=8)
    return fig


SENSITIVITY_PANELS = (
    ("mean_batch_size", "mean batched requests", FIG13_BATCH["vllm"], "paper Fig. 13"),
    ("normalized_latency", "normalized latency (s/token)", None, None),
    ("kv_token_states_pct", "token states (% of KV)", FIG2_BREAKDOWN["vllm"]["token_states"],
     "paper Fig. 2"),
)  # fmt: skip


def with_clock_columns(sens: pd.DataFrame) -> pd.DataFrame:
    """``sens`` (``vllm_overhead_sensitivity.csv``) with its ``clock`` and ``report_clock``
    columns: a CSV from before them holds the bare roofline's runs alone."""
    if "clock" in sens.columns:
        return sens
    return sens.assign(clock="roofline", report_clock=True)


def overhead_sensitivity(sens: pd.DataFrame) -> Any:
    """The appendix study: vLLM at 2 req/s against a fixed time added to every step, a line
    per clock (the report's, solid; the bare roofline, dotted; a CSV without the ``clock``
    column holds the roofline only), with the paper's Fig. 13 batch and Fig. 2 token-state
    share as lines. ``sens``: ``vllm_overhead_sensitivity.csv``."""
    sens = with_clock_columns(sens).sort_values("per_step_overhead_ms")
    clocks = sens["clock"]
    fig, axes = pyplot().subplots(1, len(SENSITIVITY_PANELS), figsize=(10, 3))
    for ax, (column, ylabel, paper, paper_label) in zip(axes, SENSITIVITY_PANELS, strict=True):
        for clock in dict.fromkeys(clocks):
            rows = sens[clocks == clock]
            roofline = clock == "roofline"
            ax.plot(rows["per_step_overhead_ms"], rows[column], marker="o",
                    ls=":" if roofline else "-", mfc="none" if roofline else None,
                    color=SOURCE_COLORS["kvlab"],
                    label=f"kvlab vLLM, {'bare roofline' if roofline else clock}")  # fmt: skip
        if paper is not None:
            ax.axhline(paper, color=SOURCE_COLORS["paper"], ls="--", label=paper_label)
        ax.legend(fontsize=6)
        ax.set_xlabel("added overhead (ms/step)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
    fig.suptitle(
        "vLLM, OPT-13B, ShareGPT 2 req/s: sensitivity to time added to every step", fontsize=9
    )
    return fig
