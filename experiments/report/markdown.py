"""Tables, figures and the markdown report of ``experiments.reproduce``.

Numbers in the report are what the runs computed; the paper's numbers stand beside them
(``experiments.report.paper``). Figures: ``experiments.report.figures`` (shared with the
notebooks), PNG and PDF (fonttype 42).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.lib.results import write_atomic, write_csv
from experiments.lib.setup import as_dict, build_setup, make_cost_model
from experiments.report.clock import (
    draw_fig18b,
    draw_fig19,
    fig18b_section,
    fig19_runs,
    fig19_section,
    gap_lines,
    preemption_cost,
)
from experiments.report.figures import (
    KV_PARTS,
    PART_LABELS,
    WORKLOAD_LABELS,
    fig2_breakdown,
    fig13_batch,
    overhead_sensitivity,
    pyplot,
    save,
    table1_capacity,
)
from experiments.report.paper import (
    FIG2_BREAKDOWN,
    FIG2_LIKELY,
    FIG13_BATCH,
    SYSTEM_LABELS,
)
from experiments.report.selection import FIGURES
from sim.capacity import PAPER_TABLE1, format_table1, table1, table1_gap_lines
from sim.cost.overhead import contiguous_note

PARTS = KV_PARTS[:4]  # the paper's four; kvlab adds "free_at_limit" and "free" (nobody waiting)


def fig2_table(fig2: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in fig2.iterrows():
        s = r["system"]
        row: dict[str, Any] = {"system": s}
        for part in KV_PARTS:
            row[f"kvlab_{part}_pct"] = r[f"kv_{part}_pct"]
            paper = FIG2_BREAKDOWN.get(s, {}).get(part)
            row[f"paper_{part}_pct"] = paper
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(v: Any, spec: str = ".1f") -> str:
    if v is None or (isinstance(v, float) and (math.isnan(v))):
        return "—"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    return format(v, spec)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_outputs(
    out: Path,
    fig2: pd.DataFrame,
    sensitivity: pd.DataFrame,
    cfg: Any,
    blocks: pd.DataFrame | None = None,
    *,
    duration: float,
    wall_s: float,
    figures: Collection[str] = FIGURES,
    on_written: Callable[..., None] = lambda figure, *files: None,
    fig13_alpaca: pd.DataFrame | None = None,
    fig13_alpaca_rate: float | None = None,
    sections: Sequence[str] = (),
    command: str = "python -m experiments.reproduce",
    code: str = "",
) -> None:
    """Write the CSVs, figures and ``report.md`` of the selected ``figures``
    (``experiments.report.selection``) into ``out``, calling ``on_written(figure, *files)``
    after each. ``fig2``: the Fig. 2/13 runs; ``sensitivity``: vLLM at 2 req/s on the
    roofline with added per-step overheads; ``blocks``: the Fig. 18b / Fig. 19 runs
    (``reproduce.block_study``), if any; ``fig13_alpaca``: Fig. 13 (b)'s runs (Alpaca at
    ``fig13_alpaca_rate`` req/s); ``sections``: more markdown the report ends with (the
    rate-search figures' text), each after a blank line; ``command``: the command line that
    made it, as the report names it; ``code``: the code that ran, in words
    (:func:`experiments.lib.provenance.code_words`), named beside it."""
    out.mkdir(parents=True, exist_ok=True)
    t1 = table1()
    plt = pyplot(headless=True)
    drawn = []
    if "table1" in figures:
        t1_table = pd.DataFrame([dataclasses.asdict(r) for r in t1])
        write_csv(out / "table1.csv", t1_table)
        drawn.append(("table1", table1_capacity(t1_table), "table1"))
    f2 = fig2_table(fig2) if len(fig2) else pd.DataFrame()
    if "fig2" in figures:
        write_csv(out / "fig2_breakdown.csv", f2)
        drawn.append(("fig2", fig2_breakdown(f2), "fig2_breakdown"))

    alpaca = fig13_alpaca if fig13_alpaca is not None else pd.DataFrame()
    panels = [fig13_table(fig2, "sharegpt", 2.0)] if len(fig2) else []
    if len(alpaca):
        panels.append(fig13_table(alpaca, "alpaca", fig13_alpaca_rate))
    f13 = pd.concat(panels, ignore_index=True) if panels else pd.DataFrame()
    if "fig13" in figures:
        write_csv(out / "fig13_batch.csv", f13)
        drawn.append(("fig13", fig13_batch(f13), "fig13_batch"))
    if "sensitivity" in figures:
        write_csv(out / "vllm_overhead_sensitivity.csv", sensitivity)
        drawn.append(("sensitivity", overhead_sensitivity(sensitivity),
                      "vllm_overhead_sensitivity"))  # fmt: skip

    for name, fig, stem in drawn:
        _save(plt, fig, out, stem)
        on_written(name, f"{stem}.csv/.png/.pdf")

    c = as_dict(cfg)
    setup = build_setup(c)
    cost = setup.cost_model
    stack = getattr(getattr(cost, "stack", None), "name", "none")
    cost_line = (
        f"Clock: {cost.describe().splitlines()[0]}, stack {stack}; "
        "constants and sources under *Cost model* above."
    )
    extra = ["## Computed gaps (step-time-bound results)", "", cost_line, "",
             *gap_lines(fig2, figures, sensitivity), ""]  # fmt: skip
    if blocks is not None and len(blocks):
        sizes = tuple(sorted(int(b) for b in blocks["block_size"].unique()))

        def cost_at(bs: int) -> Any:
            at_bs = {**c, "system": {**c["system"], "block_size": bs}}
            return make_cost_model(at_bs, setup.model, setup.gpu, setup.tp)

        price = preemption_cost(cost_at, sizes)
        if "fig18b" in figures:
            write_csv(out / "fig18b_block_size.csv", blocks[blocks["study"] == "fig18b"])
            _save(plt, draw_fig18b(blocks), out, "fig18b_block_size")
            extra += fig18b_section(blocks, cost_line)
            on_written("fig18b", "fig18b_block_size.csv/.png/.pdf")
        if "fig19" in figures:
            write_csv(out / "fig19_swap_recompute.csv", fig19_runs(blocks))
            write_csv(out / "fig19_preemption_cost.csv", price)
            _save(plt, draw_fig19(blocks, price), out, "fig19_swap_recompute")
            extra += fig19_section(blocks, price, cost_line)
            on_written("fig19", "fig19_swap_recompute.csv/.png/.pdf", "fig19_preemption_cost.csv")
    note = contiguous_note(getattr(cost, "stack", None))
    text = _report(
        f2, f13, sensitivity, t1, cost.describe() + (f"\n{note}" if note else ""), fig2,
        duration, wall_s, extra, figures, alpaca, command, code,
    )  # fmt: skip
    write_atomic(out / "report.md", text + "".join("\n" + t for t in sections if t))


def _save(plt: Any, fig: Any, out: Path, stem: str) -> None:
    save(fig, out, stem)
    plt.close(fig)


def fig13_table(
    runs: pd.DataFrame, workload: str = "sharegpt", rate: float | None = 2.0
) -> pd.DataFrame:
    """One Fig. 13 panel's rows: per system, kvlab's mean batched requests beside the
    paper's. The paper's numbers in kvlab's reference facts are the ShareGPT panel's
    (``FIG13_BATCH``); other workloads get none (NaN), never an invented value."""
    paper = FIG13_BATCH if workload == "sharegpt" else {}
    f13 = pd.DataFrame(
        {
            "workload": workload,
            "rate": rate,
            "system": runs["system"],
            "kvlab_mean_batch": runs["mean_batch_size"],
            "paper_mean_batch": [paper.get(s, math.nan) for s in runs["system"]],
        }
    )
    f13["kvlab_over_paper"] = f13["kvlab_mean_batch"] / f13["paper_mean_batch"]
    return f13


def fig13_section(f13: pd.DataFrame, sharegpt: pd.DataFrame, alpaca: pd.DataFrame) -> list[str]:
    """The report's Fig. 13: (a) ShareGPT beside the paper, with a gap line; (b) Alpaca,
    kvlab's numbers only. ``sharegpt`` and ``alpaca``: the panels' runs."""
    parts = ["## Fig. 13: mean batched requests (OPT-13B)", "", BATCH_DEFINITION, ""]
    for workload, runs in (("sharegpt", sharegpt), ("alpaca", alpaca)):
        t = f13[f13["workload"] == workload] if len(f13) else f13
        if not len(t):
            continue
        rate = float(t["rate"].iloc[0])
        panel = "(a) ShareGPT" if workload == "sharegpt" else "(b) Alpaca"
        parts += [f"### {panel}, {rate:g} req/s", "", _md_table(BATCH_HEADER, _batch_rows(t)), ""]
        if t["paper_mean_batch"].notna().any():
            gaps = [
                f"{SYSTEM_LABELS[r['system']]} {r['kvlab_mean_batch'] - r['paper_mean_batch']:+.2f}"
                f" ({r['kvlab_over_paper'] - 1:+.0%})"
                for _, r in t.iterrows()
            ]
            name = WORKLOAD_LABELS[workload]
            parts += [f"Gap ({name}), kvlab − paper: " + "; ".join(gaps) + ".", ""]
        else:
            parts += [
                "The paper's values for this panel are not in kvlab's reference facts "
                "(`../shared/PAPER.md` gives only the ShareGPT panel's), so no paper column "
                "or gap is computed. PAPER.md does not state this panel's rate either; "
                f"{rate:g} req/s is kvlab's choice (`reproduce.FIG13_ALPACA_RATE`).",
                "",
            ]
        parts += [
            "Other metrics of the same runs:",
            "",
            _md_table(
                ["system", "completed", "req/s", "normalized latency (s/token)", "preemptions"],
                [[SYSTEM_LABELS[r["system"]], str(r["completed"]),
                  _fmt(r["request_throughput"], ".3f"), _fmt(r["normalized_latency"], ".3f"),
                  str(r["num_preemptions"])] for _, r in runs.iterrows()],
            ),
            "",
        ]  # fmt: skip
    return parts


def _breakdown_rows(f2: pd.DataFrame) -> list[list[str]]:
    rows = []
    for _, r in f2.iterrows():
        cells = [SYSTEM_LABELS[r["system"]]]
        for part in PARTS:
            likely = "≈" if (r["system"], part) in FIG2_LIKELY else ""
            cells.append(f"{_fmt(r[f'kvlab_{part}_pct'])} ({likely}{_fmt(r[f'paper_{part}_pct'])})")
        cells.append(_fmt(r["kvlab_free_at_limit_pct"]))
        cells.append(_fmt(r["kvlab_free_pct"]))
        rows.append(cells)
    return rows


def _batch_rows(f13: pd.DataFrame) -> list[list[str]]:
    return [
        [SYSTEM_LABELS[r["system"]], _fmt(r["kvlab_mean_batch"], ".2f"),
         _fmt(r["paper_mean_batch"], ".2f"), _fmt(r["kvlab_over_paper"], ".2f")]
        for _, r in f13.iterrows()
    ]  # fmt: skip


BATCH_DEFINITION = (
    "Batched requests (kvlab's `mean_batch_size`): the requests holding KV in the running "
    "batch, averaged over the steps weighted by each step's duration, idle time left out."
)
TABLE1_UNITS = (
    'The paper\'s memory figures ("12 GB / 21 GB / 264 GB" of KV) are read as GiB: with '
    "GiB its 15.7K / 9.7K / 60.1K slots follow from each model's KV bytes a token (800 KiB "
    "for OPT-13B; the lines below, `sim/capacity.py`)."
)
BREAKDOWN_HEADER = [
    "system", *(f"{PART_LABELS[p]} kvlab (paper)" for p in PARTS),
    "free, waiting on a limit, kvlab", "free kvlab",
]  # fmt: skip
BATCH_HEADER = ["system", "kvlab", "paper", "kvlab / paper"]


FIG2_SETUP = ("opt-13b", "a100-40gb", 1)  # Figs. 2 and 13: OPT-13B on one A100-40GB
# the paper's KV slots for that setup (Table 1)
PAPER_KV_SLOTS = next(row[5] for row in PAPER_TABLE1 if row[:3] == FIG2_SETUP)


def tokens_per_request(
    token_share_pct: Mapping[str, float], batch: Mapping[str, float], slots: float
) -> dict[str, float]:
    """Per system: the K/V tokens a batched request holds on average, token-state share
    (Fig. 2) × KV slots ÷ mean batched requests (Fig. 13)."""
    return {
        s: token_share_pct[s] / 100 * slots / batch[s]
        for s in token_share_pct
        if s in batch and batch[s] > 0
    }


def tokens_per_request_line(fig2_runs: pd.DataFrame, slots: float) -> str | None:
    """The computed check of Fig. 2 against Fig. 13: kvlab's tokens per batched request
    beside what the paper's two figures give (None without the four systems' runs)."""
    systems = list(FIG13_BATCH)
    by = fig2_runs.set_index("system") if len(fig2_runs) else pd.DataFrame()
    if not set(systems) <= set(by.index):
        return None
    ours = tokens_per_request(
        {s: float(by.loc[s, "kv_token_states_pct"]) for s in systems},
        {s: float(by.loc[s, "mean_batch_size"]) for s in systems},
        slots,
    )
    paper = tokens_per_request(
        {s: float(FIG2_BREAKDOWN[s]["token_states"] or math.nan) for s in systems},
        FIG13_BATCH,
        PAPER_KV_SLOTS,
    )
    orca = [s for s in systems if s != "vllm"]
    less = [1 - paper[s] / paper["vllm"] for s in orca]
    batch_gap = [abs(by.loc[s, "mean_batch_size"] / FIG13_BATCH[s] - 1) for s in systems]
    share_gap = [
        float(by.loc[s, "kv_token_states_pct"]) - float(FIG2_BREAKDOWN[s]["token_states"] or 0)
        for s in orca
    ]
    names = ", ".join(SYSTEM_LABELS[s] for s in systems)
    return (
        f"If Fig. 2's runs are Fig. 13's (kvlab's reading above), tokens held per batched "
        f"request (token-state share × KV slots ÷ Fig. 13's batch), "
        f"{names}: kvlab {', '.join(f'{ours[s]:.0f}' for s in systems)}; the paper's Figs. 2 "
        f"and 13 ({PAPER_KV_SLOTS:,} slots) give {', '.join(f'{paper[s]:.0f}' for s in systems)}. "
        f"All four serve the same requests first come, first served, and kvlab's agree within "
        f"{max(ours.values()) / min(ours.values()) - 1:.0%}; the paper's Orca runs hold "
        f"{min(less):.0%}–{max(less):.0%} fewer tokens per request than its vLLM run. So, counted "
        f"as kvlab counts them, the paper's Orca shares and Orca batches cannot both come from "
        f"the requests its vLLM run held. kvlab's "
        f"batches are within {min(batch_gap):.0%}–{max(batch_gap):.0%} of the paper's, and its "
        f"Orca token-state shares differ from the paper's by {min(share_gap):+.1f} to "
        f"{max(share_gap):+.1f} points."
    )


def _opt13b_slots(t1: list[Any]) -> float:
    """kvlab's KV slots for the Fig. 2 / 13 setup (OPT-13B on one A100-40GB, Table 1)."""
    row = next((r for r in t1 if (r.model, r.gpu, r.num_gpus) == FIG2_SETUP), None)
    return float(row.max_slots) if row is not None else math.nan


def _largest_gaps(f2: pd.DataFrame, k: int = 4) -> list[str]:
    gaps = []
    for _, r in f2.iterrows():
        for part in PARTS:
            paper = r[f"paper_{part}_pct"]
            if paper is None or (isinstance(paper, float) and math.isnan(paper)):
                continue
            d = r[f"kvlab_{part}_pct"] - paper
            gaps.append((abs(d), f"{SYSTEM_LABELS[r['system']]} {PART_LABELS[part]}: "
                                 f"{d:+.1f} points"))  # fmt: skip
    return [text for _, text in sorted(gaps, reverse=True)[:k]]


def _report(
    f2: pd.DataFrame,
    f13: pd.DataFrame,
    sensitivity: pd.DataFrame,
    t1: list[Any],
    cost_text: str,
    fig2_runs: pd.DataFrame,
    duration: float,
    wall_s: float,
    extra: list[str] | None = None,
    figures: Collection[str] = FIGURES,
    fig13_alpaca: pd.DataFrame | None = None,
    command: str = "python -m experiments.reproduce",
    code: str = "",
) -> str:
    parts = [
        "# kvlab reproduction of the vLLM paper (simulated)",
        "",
        f"Unless a section says otherwise (Fig. 12's panels and the sharing figures name their "
        f"own models, workloads and trace lengths, Fig. 13 (b) its workload and rate): "
        f"OPT-13B on one "
        f"A100-40GB, synthetic ShareGPT-like requests, Poisson arrivals, "
        f"{duration:.0f}-second traces. Generated by `{command}` in "
        f"{wall_s:.0f} s{f' (code: {code})' if code else ''}. Every number below is what "
        "kvlab computed; the paper's "
        "(Kwon et al., SOSP 2023) stand beside it in parentheses or their own column.",
        "",
        *(
            [f"Figures made (`--figures`): {', '.join(f for f in FIGURES if f in figures)}.", ""]
            if set(FIGURES) - set(figures)
            else []
        ),
        "## Cost model (printed beside every reproduced figure)",
        "",
        "```",
        cost_text.strip(),
        "```",
        "",
    ]
    if "table1" in figures:
        parts += ["## Table 1: KV cache capacity", "", "```", format_table1(t1).strip(), "```", "",
                  TABLE1_UNITS, "", *table1_gap_lines(t1), ""]  # fmt: skip
    if "fig2" in figures:
        parts += [
            "## Fig. 2: KV memory breakdown (% of KV slots, time-averaged, ShareGPT 2 req/s)",
            "",
            "Setup: OPT-13B on ShareGPT at 2 req/s, Fig. 13's runs. This is kvlab's reading: "
            "the paper's caption names neither the model nor the rate.",
            "",
            _md_table(BREAKDOWN_HEADER, _breakdown_rows(f2)),
            "",
            "Definitions (kvlab): token states = slots holding K/V; reservation = slots set aside "
            "for tokens the request will still generate; internal fragmentation = slots reserved "
            "beyond the true output (contiguous) or the unfilled tail of each last block (paged); "
            "external fragmentation & other = buddy-allocator rounding plus free slots while "
            "requests wait on memory for admission or swap-in; free, waiting on a limit = free "
            "slots while the queue's head waits on max_num_seqs, the token budget or a batch "
            "in flight instead; free = free slots with nobody waiting. "
            "≈: a paper value read off the figure's bar (the text does not print it).",
            "",
            "Largest differences from the paper: " + "; ".join(_largest_gaps(f2)) + ".",
            "",
        ]
        per_request = tokens_per_request_line(fig2_runs, _opt13b_slots(t1))
        if per_request:
            parts += [per_request, ""]
    if "fig13" in figures:
        alpaca = fig13_alpaca if fig13_alpaca is not None else pd.DataFrame()
        parts += fig13_section(f13, fig2_runs, alpaca)
    parts += extra or []
    parts += [GAPS_TEXT, ""]
    if "sensitivity" in figures:
        parts += [
            "## Appendix: how strongly step time moves vLLM (computed)",
            "",
            "vLLM's batch at 2 req/s depends on how fast steps are. The same vLLM run with a "
            "fixed time added to every step, on the report's clock (what time per step that it "
            "does not model would change) and on the bare datasheet roofline (a lower bound on "
            "step time); the added times are not measurements, nothing here is fitted and the "
            "report's clock does not use these numbers:",
            "",
            _md_table(
                [
                    "clock",
                    "added overhead (ms/step)",
                    "mean batch",
                    "normalized latency (s/token)",
                    "token states %",
                    "free %",
                    "preemptions",
                ],
                [
                    [
                        _sensitivity_clock(r),
                        _fmt(r["per_step_overhead_ms"], "g"),
                        _fmt(r["mean_batch_size"], ".2f"),
                        _fmt(r["normalized_latency"], ".3f"),
                        _fmt(r["kv_token_states_pct"]),
                        _fmt(r["kv_free_pct"]),
                        str(r["num_preemptions"]),
                    ]
                    for _, r in sensitivity.iterrows()
                ],
            ),
            "",
        ]

    return "\n".join(parts) + "\n"


def _sensitivity_clock(row: pd.Series) -> str:
    """The appendix's clock column: the report's own clock, or the bare roofline (a CSV
    from before the column's time holds the roofline only)."""
    if "clock" not in row.index or row["clock"] == "roofline":
        return "bare roofline"
    return f"the report's ({row['clock']})"


GAPS_TEXT = (Path(__file__).with_name("gaps.md")).read_text()
