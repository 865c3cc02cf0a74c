"""Where the host's time goes inside the engine's forward call, by part and step kind.
``python -m experiments.bench.host_time --out DIR [--dry]``.

On the H200 (``docs/validation/h200.md``, fourth call) the decode forward is bound by the
host: it returns only as the GPU finishes, with no synchronizing operation inside. And the
vllm system's pure prefill steps (no decodes in the step) took about 5 ms more host time than
Orca's mixed steps with the same prompts, running the same code. This probe found where: in
the linear calls, at token counts new to the process (a GEMM kernel's first use; since fixed
by ``LLMEngine.warm_gemms``), and it keeps checking that. It serves the same
OPT-13B trace online (``experiments.bench.engine_gpu``'s: 20 requests at 4 req/s, virtual
clock, fp16, Triton attention) under ``system=vllm`` and ``system=orca_oracle`` and, in
every forward call, adds up the host's time in each part:

- ``linear``, ``norm``, ``embedding``: inside ``nn.Linear`` / ``nn.LayerNorm`` (and any
  module class named ``*Norm``, e.g. Llama's RMSNorm) / ``nn.Embedding`` calls (module
  hooks);
- ``attention``: inside the attention backend's ``forward`` (KV store and paged attention);
- ``gc``: in Python's garbage collector (``gc.callbacks``; not counted in the part it
  interrupted), with the oldest generation it collected;
- ``rest``: the call's time outside those (module dispatch, the residual adds and ReLU,
  the LM head's indexing, and the hooks themselves).

A step is ``prefill`` (prefill chunks only), ``mixed`` or ``decode``. The hooks cost host
time too, about the same in every step of a kind, so compare kinds, not absolute times.
Writes ``DIR/host_time.csv`` (one row per forward call; rewritten, atomically, after each
system's run, so a run its time limit kills keeps the systems that finished) and
``DIR/host_time_summary.csv``
(medians by run and kind, and two counts: ``linear_extra_steps``, steps whose linear time is
over ``EXTRA_MS`` above the run's usual share of the other parts, :func:`linear_extra_ms`;
``stall_steps``, steps over ``STALL_FACTOR`` times the run's median) and prints the summary.
``--summarize`` only rewrites the summary from ``DIR/host_time.csv``. ``--dry`` runs
tiny-opt on CPU (a check of the script; its times mean nothing).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.lib import inputs
from experiments.lib.args import OneLineParser
from experiments.lib.cli import check_out_dir, plain_cli

PARTS = ("linear", "norm", "embedding", "attention", "gc")
SYSTEMS = ("vllm", "orca_oracle")
EXTRA_MS = 2.0  # a GEMM kernel's first use cost the H200's host 2-4 ms (linear_host)
STALL_FACTOR = 10.0  # a Triton compile took 0.4 s against 12-31 ms steps


def step_kind(prefill_tokens: int, decode_seqs: int) -> str:
    """``prefill``, ``mixed`` or ``decode`` (a step with neither is ``empty``)."""
    if prefill_tokens and decode_seqs:
        return "mixed"
    return "prefill" if prefill_tokens else "decode" if decode_seqs else "empty"


class HostTally:
    """Host seconds per part while ``active``; parts do not nest (leaf modules only)."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.active = False
        self.gc_generation = -1
        self._opened: list[float] = []
        self._gc_start = 0.0

    def reset(self) -> None:
        self.seconds.clear()
        self.gc_generation = -1

    def open(self) -> None:
        self._opened.append(time.perf_counter())

    def close(self, part: str) -> None:
        started = self._opened.pop()
        if self.active:
            self.seconds[part] += time.perf_counter() - started

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self.active:
            pause = time.perf_counter() - self._gc_start
            self.seconds["gc"] += pause
            self.gc_generation = max(self.gc_generation, int(info.get("generation", -1)))
            if self._opened:  # the pause is gc's, not the open part's
                self._opened[-1] += pause

    def timed(self, part: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.open()
            try:
                return call(*args, **kwargs)
            finally:
                self.close(part)

        return wrapper


def instrument(model: Any, tally: HostTally) -> None:
    """Hooks on ``model``'s leaf linear, norm and embedding modules; the attention
    backends' ``forward`` wrapped (each distinct backend object once)."""
    from torch import nn

    kinds = ((nn.Linear, "linear"), (nn.LayerNorm, "norm"), (nn.Embedding, "embedding"))
    backends: dict[int, Any] = {}
    for module in model.modules():
        part = next((name for cls, name in kinds if isinstance(module, cls)), None)
        if part is None and type(module).__name__.endswith("Norm"):  # Llama's RMSNorm
            part = "norm"
        if part is not None:
            module.register_forward_pre_hook(lambda *_: tally.open())
            module.register_forward_hook(lambda *_, part=part: tally.close(part),
                                         always_call=True)  # fmt: skip
        backend = getattr(module, "backend", None)
        if backend is not None and hasattr(backend, "forward"):
            backends[id(backend)] = backend
    for backend in backends.values():
        backend.forward = tally.timed("attention", backend.forward)


def measure(dry: bool, system: str, out: Path) -> list[dict[str, Any]]:
    """One row per forward call of one run."""
    import torch

    from experiments.bench.engine_gpu import probe_overrides
    from experiments.lib.compose import compose_config
    from experiments.serve import run_to_end, start

    serving = start(compose_config("serve", probe_overrides(dry, out, system, "online")))
    runner = serving.engine.runner
    device = runner.device
    tally = HostTally()
    instrument(runner.model, tally)
    inner_prepare, inner_forward = runner.prepare, runner.forward
    shape: dict[str, int] = {}
    rows: list[dict[str, Any]] = []

    def prepare(plan: Any, manager: Any) -> Any:
        shape["prefill_tokens"] = sum(c.end - c.start for c in plan.prefill)
        shape["decode_seqs"] = len(plan.decode)
        return inner_prepare(plan, manager)

    def forward(batch: Any) -> Any:
        tally.reset()
        tally.active = True
        t0 = time.perf_counter()
        try:
            result = inner_forward(batch)
        finally:
            tally.active = False
        issue = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        total = time.perf_counter() - t0
        parts = {p: tally.seconds[p] * 1e3 for p in PARTS}
        rows.append({
            "run": system, "step": len(rows), **shape,
            "kind": step_kind(shape["prefill_tokens"], shape["decode_seqs"]),
            "issue_ms": issue * 1e3, "total_ms": total * 1e3, **parts,
            "rest": issue * 1e3 - sum(parts.values()), "gc_generation": tally.gc_generation,
        })  # fmt: skip
        return result

    runner.prepare, runner.forward = prepare, forward
    gc.callbacks.append(tally.on_gc)
    try:
        run_to_end(serving.steps())
    finally:
        gc.callbacks.remove(tally.on_gc)
    del serving, runner
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def linear_extra_ms(df: Any) -> Any:
    """Per row, the linear calls' host ms beyond the run's median ratio of linear time to the
    other parts (attention, norm, rest) times this step's other parts: what the linear calls
    took beyond what the host's speed in this step explains."""
    others = df.attention + df.norm + df.rest
    share = (df.linear / others).groupby(df.run).transform("median")
    return df.linear - share * others


# a file that cannot be read (experiments.lib.inputs) or a CSV of other rows
UNREADABLE = (*inputs.UNREADABLE, KeyError, TypeError, AttributeError)


def summarize(rows: Any) -> Any:
    """Median milliseconds per run and step kind, with the step count, the steps with GC
    pauses, with extra linear time, and the stalls (module doc). ``ValueError`` for no rows."""
    import pandas as pd

    df = pd.DataFrame(rows)
    if df.empty:
        raise ValueError("no forward calls were timed")
    keys = ["run", "kind"]
    columns = ["issue_ms", "total_ms", *PARTS, "rest"]
    summary = df.groupby(keys)[columns].median()
    summary.insert(0, "steps", df.groupby(keys).size())
    summary["gc_steps"] = df[df.gc_generation >= 0].groupby(keys).size()
    summary["linear_extra_steps"] = df[linear_extra_ms(df) > EXTRA_MS].groupby(keys).size()
    stalled = df.issue_ms > STALL_FACTOR * df.issue_ms.groupby(df.run).transform("median")
    summary["stall_steps"] = df[stalled].groupby(keys).size()
    counts = ["gc_steps", "linear_extra_steps", "stall_steps"]
    summary[counts] = summary[counts].fillna(0).astype(int)
    return summary.reset_index()


@plain_cli
def main(argv: list[str] | None = None) -> int:
    """Measure every system (or ``--summarize``); 0 when done."""
    parser = OneLineParser(prog="python -m experiments.bench.host_time",
                                     description=__doc__)  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--dry", action="store_true", help="CPU check of the script")
    parser.add_argument("--summarize", action="store_true",
                        help="only rewrite the summary from OUT/host_time.csv")  # fmt: skip
    args = parser.parse_args(argv)
    if args.summarize:
        return rewrite_summary(args.out)
    check_out_dir(args.out)
    if args.dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if not args.dry and not torch.cuda.is_available():
        parser.error("no CUDA device; use --dry for a CPU check of the script")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = measure_all(args.dry, args.out)
    write_summary(args.out, summarize(rows))
    return 0


def measure_all(dry: bool, out: Path) -> list[dict[str, Any]]:
    """:func:`measure` each of ``SYSTEMS`` in turn; every row so far written to
    ``out/host_time.csv`` (atomically) after each system's run."""
    import pandas as pd

    from experiments.lib.results import write_csv

    rows: list[dict[str, Any]] = []
    for system in SYSTEMS:
        rows += measure(dry, system, out)
        write_csv(out / "host_time.csv", pd.DataFrame(rows))
    return rows


def write_summary(out: Path, summary: Any) -> None:
    import pandas as pd

    from experiments.lib.results import write_csv

    write_csv(out / "host_time_summary.csv", summary)
    with pd.option_context("display.width", 200, "display.precision", 3):
        print(summary.to_string(index=False))


def rewrite_summary(out: Path) -> int:
    """``--summarize``: the summary of ``out/host_time.csv``; 2 with one line if unreadable."""
    import pandas as pd

    path = out / "host_time.csv"
    try:
        rows = pd.read_csv(path)
        summary = summarize(rows)
    except UNREADABLE as exc:
        print(f"error: {path}: not a host_time.csv ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    write_summary(out, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
