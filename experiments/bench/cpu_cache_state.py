"""How much an operator of kvlab's CPU engine costs warm against cold:
``python -m experiments.bench.cpu_cache_state --out DIR [--repeats N] [--model NAME]``.

One decoder layer of the model (``profile_gpu``'s :class:`Profiler`, one torch thread,
thread CPU time), each operator timed ``--repeats`` times in three states, twice each, the
states alternating: ``warm`` (called again on the same tensors), ``write`` (after writing
:func:`~experiments.bench.profile_gpu.cpu_flush_bytes` bytes, as ``profile_gpu --cpu``
does) and ``read`` (after reading as many). Prints a table of medians and writes
``DIR/cpu_cache_state.json``. In the engine a layer's weights and K/V have been evicted by
the other layers since they were last read; a profile taken warm underprices what that
costs (``docs/validation/cpu-engine.md``).
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from experiments.bench.profile_gpu import (
    Profiler,
    cpu_flush_bytes,
    engine_model_problem,
    make_plan,
)
from experiments.bench.tables import print_table
from experiments.lib.args import OneLineParser, out_dir_problem
from experiments.lib.results import write_json

STATES = ("warm", "write", "read")
# (label, decode sequences, context per sequence) or (label, rows) for the linear layers
ATTENTION = (("decode attention 2 x 128", 2, 128), ("decode attention 32 x 32", 32, 32),
             ("decode attention 1 x 1024", 1, 1024),
             ("decode attention 2 x 2048", 2, 2048))  # fmt: skip
LINEAR = (("linear layers, 1 row", 1), ("linear layers, 4 rows", 4),
          ("linear layers, 32 rows", 32))  # fmt: skip


def timed(fn: Callable[[], object], before: Callable[[], object], repeats: int) -> float:
    """Median thread-CPU milliseconds of ``fn`` over ``repeats`` calls, ``before()`` run
    untimed ahead of each, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        before()
        start = time.thread_time()
        fn()
        times.append((time.thread_time() - start) * 1e3)
    return statistics.median(times)


def measure(model: str, repeats: int) -> list[dict[str, Any]]:
    """One row per operator: its median in each state, each the mean of two alternations."""
    torch.set_num_threads(1)
    prof = Profiler(make_plan(False, model, cpu=True))
    cfg = prof.config
    buf = torch.ones(cpu_flush_bytes(), dtype=torch.uint8)
    before = {"warm": lambda: None, "write": lambda: buf.fill_(1), "read": lambda: buf.max()}
    ops: list[tuple[str, Callable[[], object]]] = []
    for label, n, ctx in ATTENTION:
        q = prof._randn(n, cfg.num_heads, cfg.head_dim)
        k = prof._randn(n, cfg.num_kv_heads, cfg.head_dim)
        meta = prof._meta([1] * n, [ctx] * n)
        scale = cfg.head_dim**-0.5
        ops.append((label, lambda q=q, k=k, meta=meta, scale=scale: prof.backend.forward(
            q, k, k, prof.k_cache, prof.v_cache, meta, scale)))  # fmt: skip
    for label, rows in LINEAR:
        xs = [(m, prof.inputs[m.in_features][:rows]) for m in prof.linears]
        ops.append((label, lambda xs=xs: [m(x) for m, x in xs]))
    out = []
    with torch.inference_mode():
        for label, fn in ops:
            ms: dict[str, list[float]] = {s: [] for s in STATES}
            for _ in range(2):
                for state in STATES:
                    ms[state].append(timed(fn, before[state], repeats))
            out.append({"operator": label, **{f"{s}_ms": round(statistics.mean(ms[s]), 3)
                                              for s in STATES}})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.bench.cpu_cache_state")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--model", default="opt-125m")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    model_problem = engine_model_problem(args.model)
    if model_problem is not None:
        parser.error(f"--model: {model_problem}")
    problem = out_dir_problem(args.out)
    if problem is not None:  # before the measuring, not after it
        parser.error(f"--out {args.out}: {problem}")
    rows = measure(args.model, args.repeats)
    print_table(f"{args.model}, one layer, ms (median of {args.repeats}, thread CPU time)", rows)
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": args.model, "repeats": args.repeats, "flush_bytes": cpu_flush_bytes(),
        "torch": torch.__version__, "rows": rows,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "cpu_cache_state.json", doc)
    print(f"wrote {args.out / 'cpu_cache_state.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
