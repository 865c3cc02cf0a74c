"""The sharing figures of the paper's §6.3–6.5 as one reproduce section: Fig. 14 (parallel
sampling, beam search), Fig. 15 (memory saved by sharing, from Fig. 14's vLLM runs),
Fig. 16 (shared prefix) and Fig. 17 (chatbot).

:func:`submit` queues every capacity search on an executor (a process pool, or threads in
front of a Hydra launcher); :func:`write` waits for them and writes each figure's CSV, PNG
and PDF and returns the report sections. ``python -m experiments.report.sharing`` runs them
alone. Traces default to :data:`DURATION_S` seconds of arrivals (a few minutes on 2 cores);
the paper's are 1 hour (``--full``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from functools import partial
from pathlib import Path
from typing import Any

from experiments.lib.args import OneLineParser
from experiments.lib.batch_log import batch_logging
from experiments.lib.checks import ConfigError
from experiments.lib.cli import check_out_dir, report_config_error
from experiments.lib.pool import worker_pool
from experiments.lib.results import write_atomic
from experiments.report import fig14_sampling, fig15_sharing, fig16_prefix, fig17_chatbot
from experiments.report.figures import pyplot
from experiments.report.rate_search import Runner, run_search

log = logging.getLogger("kvlab.reproduce")
STEMS = {"fig14": "fig14_sampling", "fig15": "fig15_sharing", "fig16": "fig16_prefix",
         "fig17": "fig17_chatbot"}  # fmt: skip
DURATION_S = 30.0
FULL_DURATION_S = 3600.0
FIGURES = {"fig14": fig14_sampling, "fig16": fig16_prefix, "fig17": fig17_chatbot}
WRITERS = {
    "fig14": ("fig14", fig14_sampling.write),
    "fig15": ("fig14", fig15_sharing.write),  # Fig. 15 reads Fig. 14's vLLM runs
    "fig16": ("fig16", fig16_prefix.write),
    "fig17": ("fig17", fig17_chatbot.write),
}  # figure -> (the searches it reads, its writer)


def submit(
    pool: Executor, run: Runner, duration_s: float, seed: int, threshold: float,
    figures: Sequence[str] = tuple(WRITERS), seeds: int = 1,
) -> dict[str, list[Future]]:  # fmt: skip
    """Queue on ``pool`` every search the selected ``figures`` read (:data:`WRITERS`); Fig. 14
    runs every rate on ``seeds`` seeds (the other figures on ``seed`` alone)."""
    needed = {WRITERS[f][0] for f in figures}
    jobs: dict[str, list[Future]] = {}
    for name, module in FIGURES.items():
        if name not in needed:
            continue
        searches = (fig14_sampling.searches(duration_s, seed, seeds) if name == "fig14"
                    else module.searches(duration_s, seed))  # fmt: skip
        jobs[name] = [pool.submit(run_search, run, s, threshold) for s in searches]
    return jobs


def write(
    jobs: dict[str, list[Future]], out: Path, plt: Any, duration_s: float,
    figures: Sequence[str] = tuple(WRITERS), on_written: Callable[..., None] | None = None,
) -> str:  # fmt: skip
    """Wait for the searches, write the selected ``figures``' files into ``out`` (calling
    ``on_written(figure, *file_stems)`` after each); the report text."""
    sections = [
        "# Sharing: parallel sampling, beam search, shared prefix, chatbot\n\n"
        f"Traces of {duration_s:g} s of arrivals (the paper: 1 hour; `--full`). A rate "
        "sustained on a short trace may not be on a long one (queues have little time to "
        "build), so short traces overstate every sustained rate; the ratios between "
        "systems are the comparable numbers. The clock is reproduce's `--cost` (default: the "
        "paper-era A100 stack, printed at the top of reproduce's report).\n"
    ]
    rows: dict[str, list[dict[str, Any]]] = {}
    for name, futures in jobs.items():
        t0 = time.perf_counter()
        rows[name] = [row for f in futures for row in f.result()]
        log.info("%s: %d runs (waited %.0f s)", name, len(rows[name]), time.perf_counter() - t0)
    for figure in figures:
        searches, writer = WRITERS[figure]
        sections.append(writer(rows[searches], out, plt))
        if on_written is not None:
            on_written(figure, f"{STEMS[figure]}.csv/.png/.pdf")
    return "\n".join(sections)


def _plt() -> Any:
    return pyplot(headless=True)


def main(argv: list[str] | None = None) -> Path:
    p = OneLineParser(
        prog="python -m experiments.report.sharing", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--out", type=Path, default=Path("results/sharing"))
    p.add_argument("--full", action="store_true", help="the paper's 1-hour traces")
    p.add_argument("--duration", type=float, default=None, help="trace seconds (override)")
    p.add_argument("--threshold", type=float, default=1.0, help="normalized latency, s/token")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=3, help="seeds per Fig. 14 rate")
    p.add_argument("--cost", choices=("paper-a100", "roofline"), default="paper-a100")
    args = p.parse_args(argv)
    from experiments.reproduce import COSTS, check_run_numbers, run_on_clock

    try:
        check_run_numbers(args)
        check_out_dir(args.out)
    except ConfigError as err:
        report_config_error(err)
    batch_logging()

    duration = args.duration or (FULL_DURATION_S if args.full else DURATION_S)
    args.out.mkdir(parents=True, exist_ok=True)
    run: Callable[..., dict[str, Any]] = partial(run_on_clock, COSTS[args.cost])
    with worker_pool(args.workers) as pool:
        jobs = submit(pool, run, duration, args.seed, args.threshold, seeds=args.seeds)
        text = write(jobs, args.out, _plt(), duration)
    write_atomic(args.out / "report.md", text)
    log.info("wrote %s", args.out / "report.md")
    return args.out


if __name__ == "__main__":
    main()
