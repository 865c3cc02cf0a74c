"""Does the engine's forward wait for the GPU? ``python -m experiments.bench.sync_check --out
DIR [--dry]``.

On the first H200 runs (``docs/validation/h200.md``) the host's time to run the forward call
(``forward_issue_s``) stayed within 1% of the synchronized forward (``forward_s``) for every
step, a 1,662-token prefill whose GPU work is several times the host's too. So the host
waited for the device inside the forward: an operation that synchronizes, or a full launch
queue. This serves a short OPT-13B workload (8 requests of ``experiments.bench.engine_gpu``'s
trace, offline, fp16, Triton attention) and, around each forward call:

- with ``torch.cuda.set_sync_debug_mode("warn")`` on, records every synchronizing
  operation torch reports, by the kvlab source line that called it;
- for the first ``--sleep-steps`` steps, queues a GPU sleep of about ``--sleep-ms`` ahead
  of the forward (``torch.cuda._sleep``; its length measured with CUDA events first), then
  times the host's return from the forward call and the device's end. A host that only
  queues kernels returns long before the sleep ends; one that waits returns after it.

Writes ``DIR/sync_check.json`` (sites with counts and one stack each; per slept step the
sleep, issue and total milliseconds) and prints a summary. ``--dry`` runs the same code on
CPU with tiny-opt, where nothing is asynchronous: it only checks the script.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from experiments.lib.args import OneLineParser

REPO = Path(__file__).resolve().parents[2]


def kvlab_site(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame of the stack that is kvlab's own code, as ``path:line``."""
    for frame in reversed(stack):
        path = Path(frame.filename).resolve()
        if REPO in path.parents and "experiments/bench/sync_check" not in str(path):
            return f"{path.relative_to(REPO)}:{frame.lineno}"
    return "outside kvlab"


def check(dry: bool, sleep_ms: float, sleep_steps: int, out: Path) -> dict[str, Any]:
    import torch

    from experiments.bench.engine_gpu import probe_overrides
    from experiments.lib.compose import compose_config
    from experiments.serve import run_to_end, start

    cuda = not dry
    overrides = probe_overrides(dry, out, "vllm", "offline", 2 if dry else 8)
    serving = start(compose_config("serve", overrides))
    runner = serving.engine.runner
    inner = runner.forward
    sites: Counter[str] = Counter()
    stacks: dict[str, str] = {}
    slept: list[dict[str, float]] = []
    cycles = 0
    if cuda:  # how many cycles make sleep_ms, measured once with events
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
        probe = 10_000_000  # cycles: ~5 ms at the H200's ~1.98 GHz boost clock, a timeable span
        start_ev.record()
        torch.cuda._sleep(probe)
        end_ev.record()
        torch.cuda.synchronize()
        cycles = int(probe * sleep_ms / start_ev.elapsed_time(end_ev))

    shown = warnings.showwarning
    inside = [False]  # in the forward call, with torch's sync debug mode on

    def record(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
        if not (inside[0] and "synchroniz" in str(message)):  # not torch's sync report
            shown(message, category, filename, lineno, *rest)
            return
        stack = traceback.extract_stack()[:-1]
        site = kvlab_site(stack)
        sites[site] += 1
        stacks.setdefault(site, f"{category.__name__}: {message}\n" + "".join(
            traceback.format_list(stack[-8:])))  # fmt: skip

    def forward(batch: Any) -> Any:
        sleep = cuda and len(slept) < sleep_steps
        if sleep:
            start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
            start_ev.record()
            torch.cuda._sleep(cycles)
            end_ev.record()
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        inside[0] = cuda
        t0 = time.perf_counter()
        try:
            out = inner(batch)
        finally:
            inside[0] = False
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
        issued = time.perf_counter() - t0
        if sleep:
            torch.cuda.synchronize()
            slept.append({"sleep_ms": start_ev.elapsed_time(end_ev), "issue_ms": issued * 1e3,
                          "total_ms": (time.perf_counter() - t0) * 1e3,
                          "tokens": int(batch.input_ids.numel())})  # fmt: skip
        return out

    runner.forward = forward
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        result = run_to_end(serving.steps())
    return {
        "dry": dry, "model": serving.config["model"]["name"], "steps": result.num_steps,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (dry: nothing to find)",
        "sync_sites": dict(sites.most_common()), "stacks": stacks, "slept_steps": slept,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.bench.sync_check",
                                     description=__doc__)  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--dry", action="store_true", help="CPU check of the script")
    parser.add_argument("--sleep-ms", type=float, default=100.0)
    parser.add_argument("--sleep-steps", type=int, default=6)
    args = parser.parse_args(argv)
    if args.dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if not args.dry and not torch.cuda.is_available():
        parser.error("no CUDA device; use --dry for a CPU check of the script")
    from experiments.lib.results import write_json

    args.out.mkdir(parents=True, exist_ok=True)
    doc = check(args.dry, args.sleep_ms, args.sleep_steps, args.out)
    write_json(args.out / "sync_check.json", doc)
    print(f"{doc['model']} on {doc['device']}: {doc['steps']} steps")
    for site, count in doc["sync_sites"].items():
        print(f"  synchronizing operation x{count} at {site}")
    if not doc["sync_sites"]:
        print("  no synchronizing operation reported inside the forward")
    for s in doc["slept_steps"]:
        print(
            f"  {s['tokens']} tokens: sleep {s['sleep_ms']:.1f} ms ahead; forward call "
            f"returned after {s['issue_ms']:.1f} ms, device done after {s['total_ms']:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
