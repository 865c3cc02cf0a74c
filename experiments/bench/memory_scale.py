"""``python -m experiments.bench.memory_scale``: the simulator's peak memory on long traces.

Repeats an Azure-format trace (default: the 2023 conversation trace in ``../shared/traces``)
``--copies`` times end to end, each copy shifted by the trace's span plus a second, and
simulates each repeated trace in a process of its own (``experiments.simulate`` with the
run's overrides, default ``system=vllm model=llama-3.1-8b hardware=h100 cost=roofline``,
writing every table). Prints one row per trace (requests, steps, the process's peak
resident memory from ``wait4``, KB a request, wall seconds, ``steps.csv``'s size) and writes
``bench_memory.csv`` and ``bench_memory.json`` (rows, command, machine) into ``--out``
(``_mb`` columns in MiB, 2**20 bytes; ``kb_per_request`` in KiB).
Memory grows with the steps and the output tokens; the per-request figure is what to scale
a longer trace by. A wall-clock number holds only for the machine and load it ran under.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.bench.sim import machine_info, run_record
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import check_out_dir, plain_cli
from experiments.lib.results import read_metrics, write_atomic, write_json

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = "AzureLLMInferenceTrace_conv.csv"
DEFAULT_RUN = ["system=vllm", "model=llama-3.1-8b", "hardware=h100", "cost=roofline"]


def default_trace() -> Path:
    """The conversation trace where the workload configs look for it (``KVLAB_TRACES``, else
    ``../shared/traces`` beside the repository)."""
    folder = os.environ.get("KVLAB_TRACES") or str(REPO.parent / "shared" / "traces")
    return Path(folder) / DEFAULT_TRACE


def repeated_trace(trace: Path, copies: int, out: Path) -> int:
    """Write ``trace`` (Azure columns: TIMESTAMP, ContextTokens, GeneratedTokens) to ``out``
    ``copies`` times, copy k shifted by k times (its span + 1 s); returns the rows written."""
    try:
        frame = pd.read_csv(trace)
        times = pd.to_datetime(frame["TIMESTAMP"])
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError("--trace", f"{trace} is not a readable Azure trace ({exc})") from None
    if frame.empty:
        raise ConfigError("--trace", f"{trace} holds no request")
    shift = times.max() - times.min() + pd.Timedelta(seconds=1)
    parts = [frame.assign(TIMESTAMP=(times + k * shift).dt.strftime("%Y-%m-%d %H:%M:%S.%f"))
             for k in range(copies)]  # fmt: skip
    pd.concat(parts).to_csv(out, index=False)
    return len(frame) * copies


def measure(trace: Path, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """Simulate ``trace`` into ``run_dir`` in a child process: the run's ``metrics.json``
    with the process's peak RSS (MB) and its wall seconds from start to exit. A failed run
    raises ConfigError with its last line of output."""
    cmd = [sys.executable, "-m", "experiments.simulate", *overrides, "workload=azure_conv",
           f"workload.path={trace}", f"hydra.run.dir={run_dir}", "index=null",
           "progress=false"]  # fmt: skip
    t0 = time.perf_counter()
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = (run_dir.parent / f"{run_dir.name}.log").read_text().strip().splitlines()
        last = lines[-1].removeprefix("error: ") if lines else f"exit {proc.returncode}"
        raise ConfigError("simulate", last)
    return {**read_metrics(run_dir), "peak_rss_mb": usage.ru_maxrss / 1024, "wall_s": wall}


def bench(trace: Path, copies: int, overrides: list[str], scratch: Path) -> dict[str, Any]:
    """One row: the trace repeated ``copies`` times, simulated and measured."""
    path = scratch / f"trace_x{copies}.csv"
    rows = repeated_trace(trace, copies, path)
    run = scratch / f"run_x{copies}"
    m = measure(path, run, overrides)
    return {
        "copies": copies,
        "requests": rows,
        "steps": m["num_steps"],
        "peak_rss_mb": round(m["peak_rss_mb"], 1),
        "kb_per_request": round(m["peak_rss_mb"] * 1024 / rows, 2),
        "wall_s": round(m["wall_s"], 1),
        "steps_csv_mb": round((run / "steps.csv").stat().st_size / 2**20, 1),
    }


@plain_cli
def main(argv: list[str] | None = None) -> pd.DataFrame:
    p = OneLineParser(
        prog="python -m experiments.bench.memory_scale", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        help=f"an Azure-format trace (default: {DEFAULT_TRACE} in ../shared/traces)",
    )
    p.add_argument(
        "--copies",
        type=int,
        nargs="+",
        default=[1, 2],
        help="how many times to repeat the trace, one run each (default 1 2)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        default=None,
        help=f"simulate overrides (default: {' '.join(DEFAULT_RUN)})",
    )
    p.add_argument("--out", type=Path, default=Path("results/bench_memory"))
    args = p.parse_intermixed_args(argv)
    if any(c < 1 for c in args.copies):
        raise ConfigError("--copies", f"each must be at least 1, got {args.copies}")
    trace = args.trace or default_trace()
    if not trace.is_file():
        raise ConfigError("--trace", f"no file {trace}")
    overrides = args.overrides or DEFAULT_RUN
    check_out_dir(args.out)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvlab-memory-") as scratch:
        for copies in args.copies:
            rows.append(bench(trace, copies, overrides, Path(scratch)))
            print(f"x{copies}: {rows[-1]['peak_rss_mb']} MB peak", flush=True)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    write_atomic(args.out / "bench_memory.csv", table.to_csv(index=False))
    record = run_record("experiments.bench.memory_scale", argv)
    write_json(args.out / "bench_memory.json",
               {**record, "trace": trace.name, "overrides": overrides, "rows": rows,
                "machine": machine_info()})  # fmt: skip
    return table


if __name__ == "__main__":
    main()
