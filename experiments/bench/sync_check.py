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
sleep, issue and total milliseconds; ``complete``) and prints a summary. The file is
rewritten (atomically) after the first step, after each slept step and every
``SAVE_EVERY`` steps with ``complete`` false, so a run its time limit kills keeps what it
found; at the end with ``complete`` true. ``--dry`` runs the same code on
CPU with tiny-opt, where nothing is asynchronous: it only checks the script.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.lib.args import OneLineParser
from experiments.lib.cli import check_out_dir, plain_cli

REPO = Path(__file__).resolve().parents[2]
SAVE_EVERY = 50  # steps between the partial saves (besides the first and each slept step)


def kvlab_site(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame of the stack that is kvlab's own code, as ``path:line``."""
    for frame in reversed(stack):
        path = Path(frame.filename).resolve()
        if REPO in path.parents and "experiments/bench/sync_check" not in str(path):
            return f"{path.relative_to(REPO)}:{frame.lineno}"
    return "outside kvlab"


def check(
    dry: bool, sleep_ms: float, sleep_steps: int, out: Path,
    save: Callable[[dict[str, Any]], None] = lambda doc: None,
) -> dict[str, Any]:  # fmt: skip
    """Serve the probe workload with the forward watched (module doc); the result, with
    ``complete`` true. ``save`` gets the result so far (``complete`` false) after the first
    step, after each slept step and every ``SAVE_EVERY`` steps, outside the timed calls."""
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
    calls = [0]
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
        calls[0] += 1
        if sleep or calls[0] % SAVE_EVERY == 1:
            save(result(calls[0], False))
        return out

    def result(steps: int, complete: bool) -> dict[str, Any]:
        return {
            "dry": dry, "model": serving.config["model"]["name"], "steps": steps,
            "device": torch.cuda.get_device_name(0) if cuda else "cpu (dry: nothing to find)",
            "sync_sites": dict(sites.most_common()), "stacks": dict(stacks),
            "slept_steps": list(slept), "complete": complete,
        }  # fmt: skip

    runner.forward = forward
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        served = run_to_end(serving.steps())
    return result(served.num_steps, True)


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.bench.sync_check",
                                     description=__doc__)  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--dry", action="store_true", help="CPU check of the script")
    parser.add_argument("--sleep-ms", type=float, default=100.0)
    parser.add_argument("--sleep-steps", type=int, default=6)
    args = parser.parse_args(argv)
    if not 0 < args.sleep_ms < float("inf"):
        parser.error(f"--sleep-ms must be a finite number > 0, got {args.sleep_ms:g}")
    if args.sleep_steps < 1:
        parser.error(f"--sleep-steps must be >= 1, got {args.sleep_steps}")
    check_out_dir(args.out)
    if args.dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if not args.dry and not torch.cuda.is_available():
        parser.error("no CUDA device; use --dry for a CPU check of the script")
    from experiments.lib.results import write_json

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sync_check.json"
    doc = check(args.dry, args.sleep_ms, args.sleep_steps, args.out,
                lambda partial: write_json(path, partial))  # fmt: skip
    write_json(path, doc)
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
