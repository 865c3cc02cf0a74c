"""CPU engine benchmark: ``python -m experiments.bench.engine_cpu [--out DIR] [--quick]``.

Side by side in one process, on OPT-125M shapes (``sim.catalog``) with the SAME random
weights (an HF ``OPTForCausalLM`` built under a fixed seed; its state dict is loaded into
kvlab's model) and ONE ShareGPT-like request set:

(a) request-level baseline vs continuous batching: HF ``transformers`` ``generate()`` on
    static, left-padded batches of ``B`` requests in arrival order (greedy,
    ``min_new_tokens = max_new_tokens =`` the batch's longest output, so the batch runs
    until its longest request ends; each request counts only its own output tokens)
    against the kvlab engine, ``system=vllm``, offline (all requests at t = 0);
(b) paged vs contiguous under the SAME KV budget of ``orca_max_batch × max_model_len``
    token slots: ``vllm`` against ``orca_max``, which reserves ``max_model_len`` (2048 for
    OPT, Kwon et al., SOSP 2023, §6.1) slots per request and so admits at most
    ``orca_max_batch`` requests at once.

Lengths are scaled so the default run fits a few minutes on 2 shared cores: requests are
drawn from the fitted ShareGPT model (vLLM's filter at 2048) and every prompt and output
length is multiplied by ``length_scale`` (default 1/4, at least 4 tokens; prompts keep their
first ids), keeping the distribution's shape. The schedulers keep the model's
``max_model_len`` (so Orca (Max) still reserves 2048). Throughput is output tokens / wall
seconds of the serving call, same torch thread count for all systems (default 1: on a
shared 2-core machine one intra-op thread was faster than two for these shapes).

Writes ``DIR/results.csv`` (one row per system) and ``DIR/results.json`` (rows, ratios,
plan, machine, versions, date, command) and prints a table. ``--quick`` runs tiny-opt on a
handful of requests (seconds) so a test can check the script.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.defaults import DEFAULT_BLOCK_SIZE
from core.model_spec import kv_bytes_per_token
from core.request import Request
from core.sched.base import SchedulerConfig
from core.workload.synthetic import synthesize
from engine.engine import LLMEngine
from engine.weights import load_weights
from experiments.bench.tables import print_table, write_csv
from experiments.lib.args import OneLineParser
from experiments.lib.cli import check_out_dir, plain_cli
from experiments.lib.malloc import malloc_state, pin_malloc
from experiments.lib.results import write_atomic
from sim.catalog import ModelSpec, get_model

MIN_LEN = 4  # vLLM's benchmark filter drops prompts/outputs under 4 tokens


@dataclass(frozen=True)
class BenchPlan:
    """Everything that sizes one benchmark run."""

    model: str
    num_requests: int
    hf_batch_size: int  # B of the static-batch baseline
    length_scale: float
    orca_max_batch: int  # KV budget = this many max_model_len reservations
    threads: int
    block_size: int = DEFAULT_BLOCK_SIZE
    seed: int = 0


def make_plan(quick: bool, num_requests: int | None, threads: int) -> BenchPlan:
    if quick:
        return BenchPlan("tiny-opt", num_requests or 6, 2, 1 / 16, 2, threads, block_size=4)
    return BenchPlan("opt-125m", num_requests or 32, 8, 1 / 4, 4, threads)


def build_requests(plan: BenchPlan, spec: ModelSpec) -> list[Request]:
    """ShareGPT-like offline requests with token ids, lengths scaled by ``length_scale``."""
    raw = synthesize(
        "sharegpt",
        None,
        num_requests=plan.num_requests,
        seed=plan.seed,
        with_token_ids=True,
        vocab_size=spec.vocab_size,
    )
    out = scale_lengths(raw, plan.length_scale)
    too_long = [r.request_id for r in out if r.prompt_len + r.output_len > spec.max_model_len]
    if too_long:
        raise ValueError(f"requests {too_long} exceed max_model_len {spec.max_model_len}")
    return out


def scale_lengths(requests: list[Request], scale: float) -> list[Request]:
    """Prompt and output lengths times ``scale`` (rounded, at least ``MIN_LEN``); prompts
    with token ids keep their first ones."""
    if not 0 < scale <= 1:
        raise ValueError(f"length scale must be in (0, 1], got {scale}")
    out = []
    for r in requests:
        p = max(MIN_LEN, round(r.prompt_len * scale))
        o = max(MIN_LEN, round(r.output_len * scale))
        ids = None if r.prompt_token_ids is None else r.prompt_token_ids[:p]
        out.append(dataclasses.replace(r, prompt_len=p, output_len=o, prompt_token_ids=ids))
    return out


def hf_model(spec: ModelSpec, seed: int) -> Any:
    """HF ``OPTForCausalLM`` of ``spec``'s shape with weights drawn under ``seed``."""
    import transformers

    if spec.family != "opt":
        raise ValueError(f"the HF baseline builds OPT models; {spec.name} is {spec.family}")
    torch.manual_seed(seed)
    return transformers.OPTForCausalLM(transformers.OPTConfig(**spec.to_hf_config())).eval()


@torch.inference_mode()
def run_hf(hf: Any, requests: list[Request], batch_size: int) -> dict[str, Any]:
    """Static padded batches in request order; only each request's own tokens count."""
    pad = int(hf.config.pad_token_id)
    useful = padded = num_steps = 0
    wall = 0.0
    for lo in range(0, len(requests), batch_size):
        batch = requests[lo : lo + batch_size]
        width = max(r.prompt_len for r in batch)
        steps = max(r.output_len for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):  # left padding: every row's last prompt token aligns
            ids[i, width - r.prompt_len :] = torch.tensor(r.prompt_token_ids)
            mask[i, width - r.prompt_len :] = 1
        t0 = time.perf_counter()
        out = hf.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            pad_token_id=pad,
        )
        wall += time.perf_counter() - t0
        if out.shape[1] != width + steps:
            raise RuntimeError(f"HF generate returned {out.shape[1] - width} tokens, not {steps}")
        useful += sum(r.output_len for r in batch)
        padded += len(batch) * steps
        num_steps += steps
    return {
        "system": f"hf_static_b{batch_size}",
        "engine": "transformers.generate",
        "completed": len(requests),
        "output_tokens": useful,
        "computed_tokens": padded,
        "wall_s": wall,
        "output_tok_s": useful / wall,
        "mean_batch_size": float(batch_size),
        "num_steps": num_steps,
    }


def run_kvlab(
    model_config: ModelSpec,
    state: dict[str, torch.Tensor],
    system: str,
    requests: list[Request],
    plan: BenchPlan,
    max_model_len: int,
) -> dict[str, Any]:
    """One offline kvlab engine run of ``system`` on a KV cache of the plan's budget."""
    from core.metrics.summary import summarize

    slots = plan.orca_max_batch * max_model_len
    engine = LLMEngine(
        model_config,
        system=system,
        num_blocks=slots // plan.block_size,
        block_size=plan.block_size,
        sched_config=SchedulerConfig(max_model_len=max_model_len),
        seed=plan.seed,
    )
    load_weights(engine.model, state.items())
    t0 = time.perf_counter()
    result = engine.generate(requests, mode="offline")
    wall = time.perf_counter() - t0
    rec = result.recorder
    metrics = summarize(rec.requests_frame(), rec.steps_frame())
    tokens = sum(len(o.token_ids[0]) for o in result.outputs.values() if not o.reject_reason)
    return {
        "system": system,
        "engine": "kvlab",
        "completed": int(metrics["completed"]),
        "output_tokens": tokens,
        "computed_tokens": tokens,
        "wall_s": wall,
        "output_tok_s": tokens / wall,
        "mean_batch_size": metrics["mean_batch_size"],
        "num_steps": result.num_steps,
    }


def warm_up(hf: Any, model_config: ModelSpec, state: dict[str, torch.Tensor]) -> None:
    """One tiny untimed call of each body (first-call allocations, lazy imports)."""
    with torch.inference_mode():
        hf.generate(input_ids=torch.tensor([[5, 6, 7]]), max_new_tokens=2, do_sample=False)
    engine = LLMEngine(model_config, num_blocks=4, block_size=16, seed=0)
    load_weights(engine.model, state.items())
    engine.generate([Request(0, 0.0, 3, 2, prompt_token_ids=(5, 6, 7))], mode="offline")


def metadata(plan: BenchPlan, argv: list[str], kv_bytes: int) -> dict[str, Any]:
    import transformers

    return {
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "malloc": malloc_state(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m experiments.bench.engine_cpu", *argv]),
        "plan": dataclasses.asdict(plan),
        "kv_slots": plan.orca_max_batch * get_model(plan.model).max_model_len,
        "kv_bytes": kv_bytes,
        "dtype": "float32",
    }


def ratios(rows: dict[str, dict[str, Any]], hf_name: str) -> dict[str, float]:
    """(a) vllm over the HF baseline; (b) vllm over orca_max, throughput and mean batch."""
    vllm, orca = rows["vllm"], rows["orca_max"]
    return {
        "vllm_over_hf_throughput": vllm["output_tok_s"] / rows[hf_name]["output_tok_s"],
        "vllm_over_orca_max_throughput": vllm["output_tok_s"] / orca["output_tok_s"],
        "vllm_over_orca_max_batch": vllm["mean_batch_size"] / orca["mean_batch_size"],
    }


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.bench.engine_cpu")
    parser.add_argument("--out", type=Path, default=Path("results/bench_engine_cpu"))
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--quick", action="store_true", help="tiny-opt, a few requests")
    args_list = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(args_list)
    if args.num_requests is not None and args.num_requests < 1:
        parser.error(f"--num-requests must be >= 1, got {args.num_requests}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    check_out_dir(args.out)
    plan = make_plan(args.quick, args.num_requests, args.threads)
    pin_malloc()  # both bodies alike (experiments.lib.malloc)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(plan.threads)
    try:
        results = run_all(plan, args_list)
    finally:
        torch.set_num_threads(threads_before)
    write_csv(args.out / "results.csv", results["rows"])
    write_atomic(args.out / "results.json", json.dumps(results, indent=2) + "\n")
    print_table(
        f"{plan.model}, {plan.num_requests} requests, {plan.threads} thread(s)", results["rows"]
    )
    for key, value in results["ratios"].items():
        print(f"{key}: {value:.2f}x")
    print(f"wrote {args.out}")
    return 0


def run_all(plan: BenchPlan, argv: list[str]) -> dict[str, Any]:
    """Every system on the same weights and requests; rows, ratios and metadata."""
    spec = get_model(plan.model)
    model_config = spec
    requests = build_requests(plan, spec)
    hf = hf_model(spec, plan.seed)
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    warm_up(hf, model_config, state)
    rows = {}
    hf_row = run_hf(hf, requests, plan.hf_batch_size)
    rows[hf_row["system"]] = hf_row
    for system in ("vllm", "orca_max"):
        rows[system] = run_kvlab(model_config, state, system, requests, plan, spec.max_model_len)
    per_token = kv_bytes_per_token(spec, dtype_bytes=4)  # fp32
    meta = metadata(plan, argv, plan.orca_max_batch * spec.max_model_len * per_token)
    meta["mean_prompt_len"] = float(np.mean([r.prompt_len for r in requests]))
    meta["mean_output_len"] = float(np.mean([r.output_len for r in requests]))
    meta["hf_attention"] = str(hf.config._attn_implementation)
    meta["kvlab_attention"] = "torch"
    return {"meta": meta, "rows": list(rows.values()), "ratios": ratios(rows, hf_row["system"])}


if __name__ == "__main__":
    sys.exit(main())
