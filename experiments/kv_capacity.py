"""``python -m experiments.kv_capacity [simulate overrides ...] [--out FILE.json]``: the KV
cache a simulator run would have, term by term, without simulating.

The overrides are ``experiments.simulate``'s (``model=``, ``hardware=``, ``model.tp=``,
``system=``, ``system.max_model_len=``, ``kv_cache_gb=``, ``num_gpu_blocks=``, a user's
config folder through ``hydra.searchpath``, ...). Prints the memory terms with their
sources (usable memory, weights, profile-run activations, CUDA-graph pool, non-torch
memory, the KV cache left, its token slots and blocks) and the batch limits, as a run's
log does (:func:`experiments.lib.setup.memory_setup`, the same function ``simulate`` calls).
``--out`` also writes the numbers as JSON. A config that cannot run is one line, status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from experiments.lib.args import OneLineParser
from experiments.lib.checks import check_config
from experiments.lib.cli import check_out_file, plain_cli
from experiments.lib.compose import (
    check_group_overrides,
    check_override_args,
    check_overrides_compose,
    check_own_yamls,
)
from experiments.lib.results import write_json
from experiments.lib.setup import (
    MemorySetup,
    as_dict,
    block_size,
    is_contiguous,
    memory_setup,
    resolve_aliases,
)
from sim.catalog import GIB


def capacity_doc(mem: MemorySetup, blocks_of: int) -> dict[str, Any]:
    """The numbers :func:`main` writes: each GPU's memory terms in GiB (``*_gib_per_gpu``),
    ``kv_cache_gib`` over the ``model.tp`` GPUs (as a run's ``metrics.json``), slots and blocks."""
    cap = mem.capacity
    return {
        "model": mem.model.name,
        "hardware": mem.gpu.name,
        "tp": mem.tp,
        "max_model_len": mem.max_model_len,
        "block_size": blocks_of,
        "total_gib_per_gpu": cap.total_bytes / GIB,
        "usable_gib_per_gpu": cap.usable_bytes / GIB,
        "weights_gib_per_gpu": cap.weight_bytes / GIB,
        "activations_gib_per_gpu": cap.activation_bytes / GIB,
        "cuda_graphs_gib_per_gpu": cap.cuda_graph_bytes / GIB,
        "non_torch_gib_per_gpu": cap.non_torch_bytes / GIB,
        "kv_cache_gib_per_gpu": cap.kv_bytes / GIB,
        "kv_cache_gib": cap.kv_bytes_total / GIB,
        "kv_bytes_per_token_per_gpu": cap.bytes_per_token_per_gpu,
        "kv_slots": cap.block_slots(blocks_of),
        "kv_blocks": cap.num_blocks(blocks_of),
        "max_num_seqs": mem.batch_limits.max_num_seqs,
        "max_num_batched_tokens": mem.batch_limits.max_num_batched_tokens,
        "sources": dict(cap.source),
    }


@plain_cli
def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m experiments.kv_capacity", description=__doc__)
    p.add_argument("overrides", nargs="*", help="experiments.simulate overrides (key=value)")
    p.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON")
    args = p.parse_intermixed_args(argv)
    check_override_args(args.overrides)
    if args.out is not None:
        check_out_file(args.out)
    check_group_overrides(list(args.overrides))
    check_own_yamls("simulate", list(args.overrides))
    several = "several values: kv_capacity sizes one setting, run it once per value"
    check_overrides_compose("simulate", list(args.overrides), several)
    from experiments.reproduce import compose_config

    c = resolve_aliases(as_dict(compose_config(list(args.overrides))))
    check_config(c, "simulate")
    mem = memory_setup(c)
    blocks_of = block_size(c["system"])
    print(f"{mem.model.name} on {mem.tp} x {mem.gpu.name}, system {c['system']['name']}, "
          f"max_model_len {mem.max_model_len}")  # fmt: skip
    print(mem.capacity.describe(blocks_of, contiguous=is_contiguous(c["system"])))
    print(f"system: {mem.batch_limits.describe()}")
    if args.out is not None:
        write_json(args.out, capacity_doc(mem, blocks_of))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
