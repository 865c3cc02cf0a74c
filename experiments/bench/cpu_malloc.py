"""How glibc malloc's thresholds move the CPU engine's step time:
``python -m experiments.bench.cpu_malloc [--reps 10] [--processes 3]
[--out results/cpu_malloc.csv]``.

Times kvlab's OPT-125M decode forward on this CPU, inside the whole model
(:meth:`experiments.bench.profile_gpu.Profiler.in_model`: one torch thread, thread CPU
time, torch attention), for a batch of equal contexts and for batches of the same size and
total context whose contexts are spread (pairs ``mean - x``, ``mean + x``), in turn, and
reports each one's median attention time per layer and whole forward. Every measurement
runs in a fresh process, since pinning is for the process's life: ``--processes`` each of
``default`` (glibc's dynamic thresholds) and ``pinned``
(:func:`experiments.lib.malloc.pin_malloc`), alternating. The table gives, per mode and
batch, the mean over the processes and the range: with the default thresholds the same
batch's time depends on what the process allocated before it, so it moves between processes
and between equal and spread contexts (what an operator profile of equal contexts misses on
an engine's mixed batches); pinned, it should not.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from experiments.bench.tables import print_table, write_csv
from experiments.lib.args import OneLineParser
from experiments.lib.malloc import pin_malloc

MODES = ("default", "pinned")
BATCHES = ((8, 1024), (16, 512))  # (sequences, mean context)


def spread_contexts(seqs: int, mean: int, rng: random.Random, shortest: int = 32) -> list[int]:
    """``seqs`` contexts summing to ``seqs × mean``: pairs ``mean - x``, ``mean + x`` with
    ``x`` uniform in ``[0, mean - shortest]`` (one ``mean`` left over when ``seqs`` is odd)."""
    xs = [rng.randint(0, mean - shortest) for _ in range(seqs // 2)]
    return [mean - x for x in xs] + [mean + x for x in xs] + [mean] * (seqs % 2)


def whole_forward_ms(ms: dict[str, float], layers: int) -> float:
    """A forward's milliseconds from ``Profiler.in_model``'s per-layer ops and its LM head."""
    return layers * (ms["linear"] + ms["other"] + ms["attn"]) + ms["lm_head"]


def measure(mode: str, reps: int, model: str = "opt-125m") -> list[dict[str, Any]]:
    """In this process: pin malloc for ``pinned``, then time every batch of ``BATCHES``,
    equal and spread contexts in turn, ``reps`` times each."""
    import torch

    from experiments.bench import profile_gpu

    if mode == "pinned":
        pin_malloc()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    plan = profile_gpu.make_plan(False, model, cpu=True, passes=1, single_calls=True)
    profiler = profile_gpu.Profiler(plan)
    layers = profiler.whole.layers if profiler.whole is not None else 1
    rng = random.Random(0)
    rows = []
    for seqs, mean in BATCHES:
        spreads = [spread_contexts(seqs, mean, rng) for _ in range(3)]
        times: dict[str, list[dict[str, float]]] = {"equal": [], "mixed": []}
        for rep in range(reps):
            times["equal"].append(profiler.in_model([1] * seqs, [mean] * seqs))
            times["mixed"].append(profiler.in_model([1] * seqs, spreads[rep % 3]))
        for kind, samples in times.items():
            forward = [whole_forward_ms(s, layers) for s in samples]
            rows.append({
                "malloc": mode, "seqs": seqs, "mean_context": mean, "contexts": kind,
                "attn_ms_per_layer": statistics.median(s["attn"] for s in samples),
                "forward_ms": statistics.median(forward),
            })  # fmt: skip
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per malloc mode, batch and contexts: the mean over processes of the median attention
    and forward times, and their range over processes as a fraction of the mean."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["malloc"], r["seqs"], r["mean_context"], r["contexts"]), []).append(r)
    out = []
    for (mode, seqs, mean, kind), group in groups.items():
        attn = [r["attn_ms_per_layer"] for r in group]
        forward = [r["forward_ms"] for r in group]
        out.append({
            "malloc": mode, "seqs": seqs, "mean_context": mean, "contexts": kind,
            "processes": len(group), "attn_ms_per_layer": statistics.fmean(attn),
            "attn_range": (max(attn) - min(attn)) / statistics.fmean(attn),
            "forward_ms": statistics.fmean(forward),
            "forward_range": (max(forward) - min(forward)) / statistics.fmean(forward),
        })  # fmt: skip
    return sorted(out, key=lambda r: (r["seqs"], r["contexts"], r["malloc"]))


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.bench.cpu_malloc",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("--reps", type=int, default=10, help="times per batch (default 10)")
    parser.add_argument("--processes", type=int, default=3,
                        help="fresh processes per malloc mode (default 3)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("results/cpu_malloc.csv"))
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reps < 1 or args.processes < 1:
        parser.error(f"--reps and --processes must be >= 1, got {args.reps}, {args.processes}")
    if args.child:
        print(json.dumps(measure(args.child, args.reps)))
        return 0
    rows = []
    for process in range(args.processes):
        for mode in MODES:
            cmd = [sys.executable, "-m", "experiments.bench.cpu_malloc", "--child", mode,
                   "--reps", str(args.reps)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows += [{"process": process, **r}
                     for r in json.loads(done.stdout.strip().splitlines()[-1])]  # fmt: skip
    rows = summarize(rows)
    print_table("decode forward on this CPU, equal vs spread contexts, by malloc mode", rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(args.out, rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
