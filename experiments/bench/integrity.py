"""``python -m experiments.bench.integrity``: what one ``check_integrity_every`` check costs.

For each model on one GPU (default: OPT-13B, Llama-3.1-8B and tiny-llama on an A100-40GB,
vLLM's paged manager with the simulator's own KV capacity and CPU swap pool), admits the
synthetic ShareGPT workload's prompts until half the device blocks are held, then times
the paged manager's ``check_integrity()`` (every table recounted, both pools walked): the
part of a check that grows with the cache; the scheduler's queue checks grow with the
running sequences only. Prints one row per model (device and CPU blocks, blocks held,
sequences, median wall and CPU seconds of ``--repeat`` checks) and writes
``bench_integrity.csv`` and ``bench_integrity.json`` (rows plus the machine) into
``--out``. A wall-clock number holds only for the machine and the load it ran under.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd

from core.kv.base import AllocStatus
from core.kv.paged import PagedKVCacheManager
from core.request import SequenceGroup
from experiments.bench.sim import machine_info, run_record
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError, options
from experiments.lib.cli import check_out_dir, plain_cli
from experiments.lib.results import write_atomic, write_json
from experiments.lib.setup import build_setup
from experiments.reproduce import compose_config

# each model's overrides: Llama-3.1-8B's 128k context does not fit one A100-40GB
MODELS = {"opt-13b": [], "llama-3.1-8b": ["system.max_model_len=8192"], "tiny-llama": []}


def half_full_manager(
    model: str, hardware: str, seed: int, extra: list[str]
) -> PagedKVCacheManager:
    """vLLM's paged manager for ``model`` on ``hardware`` as ``simulate`` builds it, with
    the workload's prompts admitted (cycling through them) until half its blocks are held.
    ``extra``: further config overrides."""
    cfg = compose_config(
        [f"model={model}", f"hardware={hardware}", "system=vllm", f"seed={seed}",
         "workload.num_requests=200", *extra]
    )  # fmt: skip
    setup = build_setup(cfg)
    manager = setup.make_scheduler().manager
    if not isinstance(manager, PagedKVCacheManager):
        raise ConfigError("system", f"vllm's manager is {type(manager).__name__}, not paged")
    next_id, i = 0, 0
    while manager.num_device_blocks - manager.num_free_blocks() < manager.num_device_blocks // 2:
        request = setup.requests[i % len(setup.requests)]
        group = SequenceGroup(request, first_seq_id=next_id)
        if manager.can_allocate(group) is not AllocStatus.OK:
            break
        manager.allocate(group)
        next_id, i = next_id + len(group.seqs), i + 1
    return manager


def time_check(manager: PagedKVCacheManager, repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``repeat`` checks."""
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        manager.check_integrity()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def bench_model(model: str, hardware: str, seed: int, repeat: int) -> dict[str, Any]:
    manager = half_full_manager(model, hardware, seed, MODELS.get(model, []))
    wall, cpu = time_check(manager, repeat)
    return {
        "model": model,
        "hardware": hardware,
        "device_blocks": manager.num_device_blocks,
        "cpu_blocks": manager.num_cpu_blocks,
        "blocks_held": manager.num_device_blocks - manager.num_free_blocks(),
        "sequences": len(manager.held_seq_ids()),
        "check_wall_s": round(wall, 4),
        "check_cpu_s": round(cpu, 4),
    }


@plain_cli
def main(argv: list[str] | None = None) -> pd.DataFrame:
    p = OneLineParser(
        prog="python -m experiments.bench.integrity", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=options("model"))
    p.add_argument("--hardware", default="a100-40gb", choices=options("hardware"))
    p.add_argument("--repeat", type=int, default=3, help="checks timed per model (median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("results/bench_integrity"))
    args = p.parse_args(argv)
    if args.repeat < 1:
        raise ConfigError("--repeat", f"must be at least 1, got {args.repeat}")
    check_out_dir(args.out)
    rows = []
    for model in args.models:
        rows.append(bench_model(model, args.hardware, args.seed, args.repeat))
        print(f"{model}: {rows[-1]['check_wall_s']} s a check", flush=True)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    write_atomic(args.out / "bench_integrity.csv", table.to_csv(index=False))
    record = run_record("experiments.bench.integrity", argv)
    write_json(
        args.out / "bench_integrity.json", {**record, "rows": rows, "machine": machine_info()}
    )
    return table


if __name__ == "__main__":
    main()
