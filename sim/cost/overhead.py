"""Framework (CPU) overhead per step, fitted to a measured table, and how it meets GPU time.

The measurement: ``../shared/measurements/vidur/a100/cpu_overheads.csv`` (Vidur,
microsoft/vidur commit 6d98aa8, MIT): the median CPU milliseconds per step of a
vLLM-derived engine (Sarathi-Serve) on A100 hosts, by ``batch_size`` (sequences in the
step) and ``tensor_parallel_degree``. The four phases a synchronous (vLLM v0-style) engine
runs while the GPU waits, one column each:

- ``schedule_median``: the scheduler;
- ``prepare_inputs_e2e_median``: building the input tensors and block tables;
- ``sampler_e2e_median``: the Python sampler (logits processing, sampling);
- ``process_model_outputs_median``: appending tokens, stop checks, detokenization.

``model_execution_*`` is left out: in eager mode kernel launches run ahead of the GPU and
are hidden whenever the GPU work takes longer than launching it (true for every step of
the models kvlab reproduces).

``ray_comm_time_mean`` is the step's wall time beyond five recorded phases, the four above
and model execution (Vidur's profiler: ``(end - start - the five phases' sums) / steps``; a
mean, the table has no median), so neither the forward pass nor its all-reduces are in it.
The profiled engine drives its model workers through Ray. At tp >= 2 the column is 5.3-6.9
ms a step, flat in the batch (8-128) and the model (20B-72B); at tp 1, 0.2-1.0 ms. vLLM
v0.1, the paper's stack, ran its workers as Ray actors exactly when tp > 1 (its
``ParallelConfig`` sets ``worker_use_ray`` for a world size above 1) and its one worker in
the driver's process at tp 1. kvlab's assumption: vLLM v0.1 at tp > 1 paid what the
profiled engine pays at tp >= 2 (both drive several workers through Ray every step; Vidur's
own step time adds the column as well). So a stack that says so (``Stack.ray_workers``:
``vllm-2023``) adds it at tp >= 2 (:data:`A100_CPU_OVERHEAD_RAY`, fitted with the phases as
one total), and no stack adds it at tp 1.

Each phase is ``a + b × sequences`` (least squares). Split: fitted on one model's rows of
each tensor-parallel group (tp 1: Llama-2-7B, rows 13–25; tp ≥ 2: CodeLlama-34B, rows
0–12); held out: every other model's rows of that group but Qwen-72B's (tp 4, rows
65–77), whose four phases lie 20–28% above the tp >= 2 line at batch 8–96 (rows 65–75) and
18–25% below it at 112–128 (rows 76–77), and which are left out of the stated errors
(:func:`fit_cpu_overheads` reports train and held-out errors without them). With them, the
tp ≥ 2 group's held-out error is 10.1% mean, 34% at most (4.6% / 11.8% without).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from core.defaults import swap_chunk_blocks

PHASES = (
    "schedule_median",
    "prepare_inputs_e2e_median",
    "sampler_e2e_median",
    "process_model_outputs_median",
)
RAY_COLUMN = "ray_comm_time_mean"
CPU_OVERHEADS_CSV = "measurements/vidur/a100/cpu_overheads.csv"  # under ../shared
TRAIN_MODEL = {1: "meta-llama/Llama-2-7b-hf", 2: "codellama/CodeLlama-34b-Instruct-hf"}


@dataclass(frozen=True, slots=True)
class CPUOverheadFit:
    """Total CPU seconds per step ``= per_step_s + per_seq_s × sequences``, with the fit's
    errors (mean / max absolute relative error of the total) on its train and held-out rows."""

    per_step_s: float
    per_seq_s: float
    train_mape: float
    heldout_mape: float
    heldout_max_err: float
    source: str

    def seconds(self, seqs: float) -> float:
        return self.per_step_s + self.per_seq_s * seqs


# The fit of the table above, stored so the simulator runs without ../shared;
# tests/test_cost_overhead.py re-fits the table and checks these numbers.
A100_CPU_OVERHEAD: dict[int, CPUOverheadFit] = {
    1: CPUOverheadFit(
        7.8992e-4, 4.2551e-5, 0.013, 0.013, 0.056,
        "vidur a100/cpu_overheads.csv: schedule + prepare_inputs_e2e + sampler_e2e + "
        "process_model_outputs medians, tp 1; fit on Llama-2-7b rows (13-25), held out "
        "phi-2 rows (39-51): MAPE 1.3%, max 5.6%",
    ),
    2: CPUOverheadFit(
        1.40507e-3, 4.3541e-5, 0.006, 0.046, 0.118,
        "vidur a100/cpu_overheads.csv: same four phases, tp >= 2; fit on CodeLlama-34b tp 2 "
        "rows (0-12), held out internlm-20b tp 2 (rows 52-64) and Llama-2-70b tp 4 (rows 26-38): "
        "MAPE 4.6%, max 11.8% (Qwen-72B tp 4 rows 65-77 deviate by up to 34%: not used)",
    ),
}  # fmt: skip


# The tp >= 2 fit with the driver's Ray calls to its workers (``ray_comm_time_mean``) in
# the total; tests/test_cost_overhead.py re-fits it too.
A100_CPU_OVERHEAD_RAY = CPUOverheadFit(
    7.67816e-3, 4.44565e-5, 0.004, 0.022, 0.056,
    "vidur a100/cpu_overheads.csv: the same four phases + ray_comm_time_mean (the step's "
    "wall time beyond them and model execution: the driver's Ray calls to its workers, "
    "assumed as vLLM 0.1's at tp > 1; a mean), tp >= 2; fit on "
    "CodeLlama-34b tp 2 rows (0-12), held out internlm-20b tp 2 (rows 52-64) and Llama-2-70b "
    "tp 4 (rows 26-38): MAPE 2.2%, max 5.6% (Qwen-72B tp 4 rows 65-77: 4-6% but up to 21% "
    "at batch 112-128, not used; with it 3.9%)",
)  # fmt: skip


def cpu_overhead_for_tp(tp: int, ray_workers: bool = False) -> CPUOverheadFit:
    """The A100 fit for ``tp`` GPUs; at tp >= 2 with the Ray term when ``ray_workers``."""
    if tp == 1:
        return A100_CPU_OVERHEAD[1]
    return A100_CPU_OVERHEAD_RAY if ray_workers else A100_CPU_OVERHEAD[2]


def read_cpu_overheads(path: Path) -> list[dict[str, float | str]]:
    """The table's rows: model, tp, batch size, the summed four phases (``total_s``) and
    ``ray_comm_time_mean`` (``ray_s``), in seconds; a bad row is a ValueError naming the
    file and the row's line."""
    rows: list[dict[str, float | str]] = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        for i, r in enumerate(reader):
            try:
                total_ms = sum(float(r[p]) for p in PHASES)
                rows.append(
                    {
                        "row": float(i),
                        "model": r["model_name"],
                        "tp": float(r["tensor_parallel_degree"]),
                        "seqs": float(r["batch_size"]),
                        "total_s": total_ms / 1e3,
                        "ray_s": float(r[RAY_COLUMN]) / 1e3,
                    }
                )
            except (KeyError, ValueError) as e:
                where = f"{path}: row {reader.line_num}"  # the line, as csv_rows numbers it
                raise ValueError(f"{where}: bad or missing column ({e})") from e
    return rows


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``y = a + b x``."""
    n = len(xs)
    sx, sy = sum(xs), sum(ys)
    sxx = sum(x * x for x in xs)
    sxy = sum(x * y for x, y in zip(xs, ys, strict=True))
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return float((sy - b * sx) / n), float(b)


def relative_errors(a: float, b: float, xs: Iterable[float], ys: Iterable[float]) -> list[float]:
    """``|a + b x − y| / y`` at each point."""
    return [abs(a + b * float(x) - float(y)) / float(y) for x, y in zip(xs, ys, strict=True)]


def fit_cpu_overheads(
    path: Path, tp_group: int, ray: bool = False
) -> tuple[float, float, float, float, float]:
    """Re-fit one group (1: tp 1; 2: tp >= 2) of the table: ``(per_step_s, per_seq_s,
    train_mape, heldout_mape, heldout_max_err)``, of the four phases' total, with
    ``ray_comm_time_mean`` added when ``ray``. Held-out rows exclude Qwen-72B (see
    :data:`A100_CPU_OVERHEAD`)."""
    rows = [r for r in read_cpu_overheads(path) if (r["tp"] == 1) == (tp_group == 1)]
    train = [r for r in rows if r["model"] == TRAIN_MODEL[tp_group]]
    held = [r for r in rows if r["model"] != TRAIN_MODEL[tp_group] and "Qwen" not in r["model"]]

    def total(r: dict[str, float | str]) -> float:
        return float(r["total_s"]) + (float(r["ray_s"]) if ray else 0.0)

    a, b = fit_line([float(r["seqs"]) for r in train], [total(r) for r in train])

    def errors(part: list[dict[str, float | str]]) -> list[float]:
        return relative_errors(a, b, [r["seqs"] for r in part], [total(r) for r in part])

    tr, he = errors(train), errors(held)
    return a, b, sum(tr) / len(tr), sum(he) / len(he), max(he)


@dataclass(frozen=True, slots=True)
class Stack:
    """A serving stack's costs around the GPU's operators.

    - ``cpu``: CPU seconds per step (None: none modelled);
    - ``overlapped``: the CPU work of step i+1 runs while the GPU computes step i
      (async scheduling, CUDA graphs): a step takes ``max(gpu, cpu)``; otherwise ``gpu + cpu``;
    - ``gather_tokens_per_block``: extra K/V-token-equivalents the paged attention kernel
      spends per block it reads (block-table lookup, gather), 0 for a contiguous kernel;
    - ``block_granular``: the kernel works in whole blocks, so each sequence's unfilled last
      block costs as if read;
    - ``copy_latency_s`` / ``copies_per_block``: a swap issues one host-link copy per block,
      per layer, for K and V each, and each copy costs this latency on top of its bytes;
    - ``swap_calls_per_direction`` / ``swap_chunk_bytes``: calls a step's swap issues per
      direction (in, out) and per chunk of at most ``swap_chunk_bytes`` (0: one chunk)
      however many layers it moves, each costing ``copy_latency_s`` (kvlab's engine: a
      gather, a transfer and a scatter per chunk); 0 where the stack copies per block;
    - ``d2d_call_latency_s`` / ``d2d_calls_per_step``: a step with device block copies
      (copy-on-write) issues that many copy calls (kernel launches), each costing this
      latency on top of the bytes read and written at the device's bandwidth;
    - ``ray_workers``: at tp >= 2 the driver calls its workers through Ray every step, and
      the CPU fit includes that time (:data:`A100_CPU_OVERHEAD_RAY`);
    - ``blocks_for_contiguous``: the stack's engine reads a contiguous system's region
      through a block table too, so :func:`contiguous_kernel` keeps the per-block terms
      (kvlab's engine, the ``measured`` stack).
    """

    name: str
    cpu: CPUOverheadFit | None
    overlapped: bool
    gather_tokens_per_block: float
    block_granular: bool
    copy_latency_s: float
    copies_per_block_per_layer: int
    summary: str
    sources: dict[str, str]
    d2d_call_latency_s: float = 0.0
    d2d_calls_per_step: int = 0
    swap_calls_per_direction: int = 0
    swap_chunk_bytes: float = 0.0
    ray_workers: bool = False
    blocks_for_contiguous: bool = False


# §7.1 / Fig. 18a of the vLLM paper (Kwon et al., SOSP 2023): its paged attention kernel is
# 20–26% slower than FasterTransformer's contiguous kernel (context 64–256, batch 8 and 32,
# block 16). Read as a per-block cost: 23% (midpoint) × 16 tokens = 3.68 token-equivalents.
# The figure's contexts fill whole blocks; extra_kv_tokens adds each sequence's expected
# unfilled tail ((block - 1) / 2, as BatchShape keeps only sums), so at the figure's own
# points the term is 27–37% of the K/V read (batch 8 or 32, context 256 to 64), not 23%.
FIG18A_GATHER_TOKENS_PER_BLOCK = 0.23 * 16
# DualPath (Wu et al., arXiv 2602.21548, §5.2): one cudaMemcpyAsync call costs ~5–7 µs
# on top of its bytes when copying many small chunks; midpoint.
MEMCPY_LATENCY_S = 6e-6
# A device block copy is one call that enqueues device work, as a cudaMemcpyAsync is: the
# same ~6 µs per call is taken for its launch (an assumption, not measured for kernels).
D2D_CALL_LATENCY_S = MEMCPY_LATENCY_S
# vLLM v0's copy_blocks (csrc/cache_kernels.cu): one kernel per step for every CoW pair of
# every layer (grid: layers x pairs).
D2D_CALLS_PER_STEP = 1

_KERNEL_SOURCES = {
    "gather_tokens_per_block": "vLLM paper Fig. 18a (§7.1): paged kernel 20-26% slower than "
    "a contiguous one at block 16 -> 0.23 x 16 = 3.68 token-equivalents per block (with the "
    "expected half-block tail added, 27-37% at the figure's block-aligned contexts)",
    "block_granular": "assumption: vLLM's kernel iterates whole blocks (masked tail); the "
    "unfilled part of the last block costs time",
    "copy_latency_s": "DualPath (Wu et al., arXiv 2602.21548, §5.2): cudaMemcpyAsync "
    "~5-7 us per call for small chunks -> 6 us",
    "copies_per_block_per_layer": "vLLM v0 swap: one cudaMemcpyAsync per block, per layer, "
    "for K and V (2 copies per block per layer)",
    "d2d_calls_per_step": "vLLM v0 copy_blocks (csrc/cache_kernels.cu): one kernel per step "
    "for all copy-on-write pairs of all layers (grid layers x pairs)",
    "d2d_call_latency_s": "assumption: a kernel launch costs what one cudaMemcpyAsync call "
    "does (DualPath §5.2, ~5-7 us) -> 6 us per call",
    "d2d_bytes": "each copied block read and written at the GPU's HBM bandwidth x this "
    "cost model's efficiency factor 'memory' (its value and source in the factor table "
    "above)",
}

STACKS: dict[str, Stack] = {
    "none": Stack(
        "none", None, False, 0.0, False, 0.0, 0,
        "no framework cost: the GPU operators alone (a lower bound)",
        {"cpu": "none", "copy_latency_s": "0: bytes only"},
    ),
    "vllm-2023": Stack(
        "vllm-2023", A100_CPU_OVERHEAD[1], False, FIG18A_GATHER_TOKENS_PER_BLOCK, True,
        MEMCPY_LATENCY_S, 2,
        "eager PyTorch, Python scheduler and sampler, synchronous: step = GPU + CPU",
        {"cpu": "the tp-1 fit above (tp >= 2: the tp >= 2 fit with the Ray term)",
         "overlap": "vLLM v0.1 (2023) ran schedule, input preparation, the model, the "
         "sampler and output processing one after another",
         "ray_workers": "vLLM v0.1 ran its workers as Ray actors when tp > 1 (ParallelConfig "
         "sets worker_use_ray for world_size > 1; one remote call per worker per step) and "
         "its one worker in the driver's process at tp 1",
         **_KERNEL_SOURCES},
        d2d_call_latency_s=D2D_CALL_LATENCY_S, d2d_calls_per_step=D2D_CALLS_PER_STEP,
        ray_workers=True,
    ),
    "vllm-v1": Stack(
        "vllm-v1", A100_CPU_OVERHEAD[1], True, FIG18A_GATHER_TOKENS_PER_BLOCK, True,
        MEMCPY_LATENCY_S, 2,
        "CUDA graphs + async scheduling: CPU work overlaps the GPU, step = max(GPU, CPU)",
        {"cpu": "the 2023 CPU fit (an upper bound: v1's CPU path is leaner; not measured "
         "here)", "overlap": "assumption from vLLM V1's design (async scheduling, CUDA "
         "graphs; the vllm/ measurement in ../shared ran with both on): the next step is "
         "scheduled while the GPU runs", **_KERNEL_SOURCES},
        d2d_call_latency_s=D2D_CALL_LATENCY_S, d2d_calls_per_step=D2D_CALLS_PER_STEP,
    ),
}  # fmt: skip


def get_stack(name: str | None, tp: int = 1) -> Stack:
    """The preset ``name`` (None: ``"none"``) with its CPU fit for ``tp``; an unknown name
    raises ``ValueError`` listing the known ones (``measured`` is read from a file:
    :func:`sim.cost.stack_file.load_stack_file`)."""
    key = "none" if name is None else str(name)
    if key == "measured":
        raise ValueError(
            "cost.stack=measured needs cost.stack_path=<a stack file written by "
            "experiments.calibrate_overhead>"
        )
    if key not in STACKS:
        raise ValueError(
            f"unknown cost.stack {key!r}; known stacks: {', '.join(STACKS)}, measured (with "
            "cost.stack_path)"
        )
    s = STACKS[key]
    if s.cpu is None or tp == 1:
        return s
    return replace(s, cpu=cpu_overhead_for_tp(tp, s.ray_workers))


CONTIGUOUS_KERNEL_SOURCES = {
    "gather_tokens_per_block": "0: a contiguous system (Orca, FasterTransformer) holds each "
    "sequence's K/V in one region, read without a block table (FasterTransformer's kernel, "
    "the contiguous side of the vLLM paper's Fig. 18a, §7.1; the paper does not name the "
    "kernel of its Orca reimplementation: assumed contiguous, as its reservations are)",
    "block_granular": "False: a contiguous region has no unfilled last block to read",
}


def contiguous_note(s: Stack | None) -> str:
    """A line for a clock's description saying how a contiguous system is priced on ``s``
    (:func:`contiguous_kernel`); empty when ``s`` has no per-block term to drop."""
    if s is None or contiguous_kernel(s) is s:
        return ""
    return (
        "contiguous systems (Orca, FasterTransformer): the same clock with "
        "gather_tokens_per_block 0 and block_granular False (source: "
        f"{CONTIGUOUS_KERNEL_SOURCES['gather_tokens_per_block']})"
    )


def contiguous_kernel(s: Stack) -> Stack:
    """``s`` for a system whose KV is contiguous: its attention kernel pays no per-block
    gather and reads no unfilled last block (both terms 0, their sources saying why); every
    other term (CPU time, transfers) is the stack's. A stack already without them, or one
    whose engine reads contiguous regions through a block table
    (:attr:`Stack.blocks_for_contiguous`), is returned as is."""
    if s.blocks_for_contiguous or not (s.gather_tokens_per_block or s.block_granular):
        return s
    return replace(
        s, gather_tokens_per_block=0.0, block_granular=False,
        summary=f"{s.summary}; contiguous KV: no per-block kernel cost",
        sources={**s.sources, **CONTIGUOUS_KERNEL_SOURCES},
    )  # fmt: skip


def extra_kv_tokens(s: Stack, decode_seqs: float, kv_tokens: float, block_size: int) -> float:
    """K/V-token-equivalents the paged kernel spends beyond the ``kv_tokens`` it reads for
    ``decode_seqs`` sequences: ``gather_tokens_per_block`` per block read plus, when
    block-granular, the unfilled tail of each last block. A sequence's blocks are
    ``ceil(ctx / block)``; BatchShape keeps only sums, so the count uses the expected tail
    ``(block − 1) / 2`` tokens per sequence (remainders spread evenly)."""
    if not decode_seqs:
        return 0.0
    tail = decode_seqs * (block_size - 1) / 2
    blocks = (kv_tokens + tail) / block_size
    return s.gather_tokens_per_block * blocks + (tail if s.block_granular else 0.0)


def swap_seconds(
    s: Stack, blocks_in: int, blocks_out: int, block_bytes: float, layers: int, link_bps: float
) -> float:
    """Seconds to move a step's swapped blocks over the host link: bytes at ``link_bps``
    plus ``copy_latency_s`` per call, the calls being ``copies_per_block_per_layer`` per
    block per layer and ``swap_calls_per_direction`` per chunk of each direction that moves
    blocks (``block_bytes``: one block, all layers' K and V, this GPU's share)."""
    blocks = blocks_in + blocks_out
    calls = blocks * layers * s.copies_per_block_per_layer
    if s.swap_calls_per_direction:
        per_chunk = (
            swap_chunk_blocks(block_bytes, s.swap_chunk_bytes)
            if s.swap_chunk_bytes
            else max(blocks, 1)
        )
        chunks = -(-blocks_in // per_chunk) + -(-blocks_out // per_chunk)
        calls += chunks * s.swap_calls_per_direction
    return blocks * block_bytes / link_bps + calls * s.copy_latency_s


def device_copy_seconds(s: Stack, blocks: int, block_bytes: float, byte_rate: float) -> float:
    """Seconds of ``blocks`` device block copies (copy-on-write) in one step: each block read
    and written at ``byte_rate`` plus ``d2d_calls_per_step`` call latencies (0 without
    copies)."""
    if not blocks:
        return 0.0
    return blocks * 2 * block_bytes / byte_rate + s.d2d_calls_per_step * s.d2d_call_latency_s


def describe_stack(s: Stack) -> str:
    lines = [f"stack {s.name}: {s.summary}"]
    if s.cpu is not None:
        lines.append(
            f"  cpu per step  {s.cpu.per_step_s * 1e3:.3f} ms + {s.cpu.per_seq_s * 1e6:.1f} us"
            f" x sequences  ({s.cpu.source})"
        )
    lines.append(f"  gather_tokens_per_block {s.gather_tokens_per_block:.3g}")
    lines.append(f"  block_granular {s.block_granular}")
    lines.append(f"  copy_latency_s {s.copy_latency_s:.3g} x {s.copies_per_block_per_layer} "
                 "per block per layer")  # fmt: skip
    if s.swap_calls_per_direction:
        chunk = f"{s.swap_chunk_bytes / 2**20:.0f} MiB" if s.swap_chunk_bytes else "all"
        lines.append(f"  + {s.swap_calls_per_direction} calls per swap direction per chunk "
                     f"of {chunk} per step")  # fmt: skip
    lines.append(f"  d2d_call_latency_s {s.d2d_call_latency_s:.3g} x {s.d2d_calls_per_step} "
                 "per step with block copies")  # fmt: skip
    lines += [f"  source {k}: {v}" for k, v in s.sources.items()]
    return "\n".join(lines)
