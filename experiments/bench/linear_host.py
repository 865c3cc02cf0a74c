"""The host's cost of one linear layer call on the GPU, by token count.
``python -m experiments.bench.linear_host --out DIR [--dry]``.

On the H200 (``docs/validation/h200.md``, ``experiments.bench.host_time``) the host's time
inside the forward's ``nn.Linear`` calls was bimodal over prefill and mixed steps: about 5 or
10.5 ms for OPT-13B's 240 calls, while norms, attention and the rest did not move. This
looks for the cause in the linear call alone. For OPT-13B's three linear shapes (q/k/v/out,
fc1, fc2; fp16, with bias, as ``nn.Linear`` runs them) and token counts ``M`` = 1 … 64, then
every 8 up to 512, it measures:

- ``first_us``: the host's time for the first call at this ``M`` (a shape new to cuBLAS;
  the library's own set-up is spent on a throwaway 8×8 call first);
- ``host_us``: the host's time per call afterwards (median of 5 rounds of 20 calls queued
  without a synchronize);
- ``gpu_us``: the GPU's time per call (CUDA events around 20 calls);
- ``kernels``: GPU kernels one call launches (``torch.profiler``), e.g. 2 for a split-K GEMM
  and its reduction.

Writes ``DIR/linear_host.csv`` and prints the ``M`` at which ``kernels`` or ``host_us``
changes. ``--dry`` runs two small shapes on CPU (a check of the script: no kernels, times
mean nothing).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

from experiments.lib.args import OneLineParser

HIDDEN, FFN = 5120, 20480  # OPT-13B (HF config.json: hidden_size, ffn_dim)
SHAPES = {"qkvo": (HIDDEN, HIDDEN), "fc1": (HIDDEN, FFN), "fc2": (FFN, HIDDEN)}
CALLS, ROUNDS = 20, 5


def token_counts(dry: bool) -> list[int]:
    return [1, 7, 64] if dry else [*range(1, 65), *range(72, 513, 8)]


def measure_shape(linear: Any, counts: list[int], cuda: bool) -> list[dict[str, Any]]:
    """First-call and steady host time, and GPU time, of ``linear`` at each token count."""
    import torch

    rows = []
    for m in counts:
        x = torch.randn(m, linear.in_features, device=linear.weight.device,
                        dtype=linear.weight.dtype)  # fmt: skip
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        linear(x)
        first = time.perf_counter() - t0
        rounds = []
        for _ in range(ROUNDS):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                linear(x)
            rounds.append((time.perf_counter() - t0) / CALLS)
        gpu = float("nan")
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
            start.record()
            for _ in range(CALLS):
                linear(x)
            end.record()
            torch.cuda.synchronize()
            gpu = start.elapsed_time(end) * 1e3 / CALLS
        rows.append({"m": m, "first_us": first * 1e6, "host_us": statistics.median(rounds) * 1e6,
                     "gpu_us": gpu})  # fmt: skip
    return rows


def count_kernels(linear: Any, counts: list[int]) -> dict[int, int]:
    """GPU kernels one call of ``linear`` launches, per token count (one profiler session)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    inputs = {m: torch.randn(m, linear.in_features, device=linear.weight.device,
                             dtype=linear.weight.dtype) for m in counts}  # fmt: skip
    torch.cuda.synchronize()
    spans: list[tuple[int, int, int]] = []  # (m, start, end) on the host clock, µs
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for m, x in inputs.items():
            torch.cuda.synchronize()
            with torch.profiler.record_function(f"linear_m{m}"):
                linear(x)
            torch.cuda.synchronize()
    launches = {m: 0 for m in counts}
    names = {f"linear_m{m}": m for m in counts}
    for event in prof.events():
        if event.name in names:
            spans.append((names[event.name], event.time_range.start, event.time_range.end))
    for event in prof.events():
        if "LaunchKernel" not in event.name:  # cudaLaunchKernel, cuLaunchKernel(Ex), ...
            continue
        for m, start, end in spans:
            if start <= event.time_range.start <= end:
                launches[m] += 1
                break
    return launches


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.bench.linear_host",
                                     description=__doc__)  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--dry", action="store_true", help="CPU check of the script")
    args = parser.parse_args(argv)
    import torch

    if not args.dry and not torch.cuda.is_available():
        parser.error("no CUDA device; use --dry for a CPU check of the script")
    import pandas as pd

    from experiments.lib.results import write_csv

    cuda = not args.dry
    device, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
    shapes = SHAPES if cuda else {"small": (64, 64), "wide": (64, 256)}
    counts = token_counts(args.dry)
    rows = []
    torch.manual_seed(0)
    with torch.inference_mode():
        probe = torch.nn.Linear(8, 8, device=device, dtype=dtype)
        probe(torch.zeros(1, 8, device=device, dtype=dtype))  # GEMM library set-up, not a shape's
        for name, (fan_in, fan_out) in shapes.items():
            linear = torch.nn.Linear(fan_in, fan_out, device=device, dtype=dtype)
            measured = measure_shape(linear, counts, cuda)
            kernels = count_kernels(linear, counts) if cuda else {}
            for row in measured:
                rows.append({"shape": name, "in": fan_in, "out": fan_out, **row,
                             "kernels": kernels.get(row["m"], 0)})  # fmt: skip
            del linear
    df = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "linear_host.csv", df)
    for name, part in df.groupby("shape", sort=False):
        typical = part.host_us.median()
        odd = part[(part.kernels != part.kernels.mode().iloc[0]) | (part.host_us > 1.5 * typical)]
        print(
            f"{name}: host {typical:.1f} us per call (median over M), kernels "
            f"{part.kernels.mode().iloc[0]}; first call median {part.first_us.median():.1f} us"
        )
        for r in odd.itertuples():
            print(
                f"  M={r.m}: host {r.host_us:.1f} us, first {r.first_us:.1f} us, "
                f"gpu {r.gpu_us:.1f} us, kernels {r.kernels}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
