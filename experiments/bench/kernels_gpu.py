"""GPU validation and benchmark of the Triton kernels.

``python -m experiments.bench.kernels_gpu --out DIR [--dry]``.

Sections (one CSV each, all rows also in ``results.json`` with the run's metadata):

- ``correctness``: compiled kernels in fp16 and bf16 against ``kernels.reference``.
- ``fig18a``: decode latency of paged attention vs contiguous ``torch`` SDPA at OPT-13B head
  shapes (40 heads × 128), context 64/128/256, batch 8/32 — the setting of Kwon et al.,
  SOSP 2023, §7.1 / Fig. 18a (there against a FasterTransformer kernel: paged 20–26% slower).
- ``long_context``: decode over 1K–32K contexts as achieved bandwidth (KV bytes read / time),
  against a measured device-to-device copy bandwidth (bytes read + written / time).
- ``block_size``: block sizes 8…256 at one decode shape.

Timing: CUDA events around each call after warm-up, median of many repeats; before each
repeat a short GPU sleep (so the host enqueues the call before the GPU reaches it: launch
overhead is not timed) and a write of a buffer larger than L2 (cold cache). Inputs are random
normal, never zero. ``--dry`` runs everything on CPU under the Triton interpreter with tiny
shapes and 2 repeats so CI can check the script; its timings are meaningless and labelled so.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.bench import timing
from experiments.bench.tables import print_table, write_csv
from experiments.lib.args import OneLineParser
from experiments.lib.cli import check_out_dir, plain_cli
from experiments.lib.results import write_atomic

SECTIONS = ("correctness", "fig18a", "long_context", "block_size")


@dataclass(frozen=True)
class Plan:
    """Shapes and repeat counts for one run (full on GPU, tiny for ``--dry``)."""

    device: torch.device
    dry: bool
    repeats: int
    warmup: int
    dtypes: tuple[torch.dtype, ...]
    fig18a_heads: tuple[int, int]  # (heads, head_dim)
    fig18a_contexts: tuple[int, ...]
    fig18a_batches: tuple[int, ...]
    long_heads: tuple[int, int, int]  # (heads, kv_heads, head_dim)
    long_contexts: tuple[int, ...]
    long_batches: tuple[int, ...]
    sweep_shape: tuple[int, int]  # (batch, context), fig18a heads
    sweep_block_sizes: tuple[int, ...]
    copy_bytes: int
    flush_bytes: int


def make_plan(dry: bool) -> Plan:
    if dry:
        return Plan(
            torch.device("cpu"), True, 2, 1, (torch.float32, torch.float16),
            (2, 16), (8, 16), (2,), (4, 2, 16), (32, 64), (1, 2), (2, 32), (8, 16, 64),
            1 << 20, 0,
        )  # fmt: skip
    return Plan(
        torch.device("cuda"), False, 100, 10, (torch.float16, torch.bfloat16),
        (40, 128), (64, 128, 256), (8, 32),
        (32, 8, 128), (1024, 2048, 4096, 8192, 16384, 32768), (1, 8, 32, 64),
        (32, 1024), (8, 16, 32, 64, 128, 256),
        1 << 30, 256 << 20,
    )  # fmt: skip


def time_ms(fn: Callable[[], object], plan: Plan) -> float:
    """Median milliseconds of ``fn`` under ``plan`` (see ``experiments.bench.timing``)."""
    return timing.time_ms(fn, plan.device, plan.repeats, plan.warmup, plan.flush_bytes)


@dataclass
class DecodeBatch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    query_start_loc: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    context: int

    def kv_bytes(self) -> int:
        """Bytes of K and V the batch's attention must read."""
        batch, _, dim = self.q.shape
        kvh = self.k_cache.shape[2]
        return 2 * batch * self.context * kvh * dim * self.k_cache.element_size()

    def attend(self, num_splits: int | None = None) -> torch.Tensor:
        from kernels.paged_attention import paged_attention

        return paged_attention(
            self.q, self.k_cache, self.v_cache, self.query_start_loc, self.context_lens,
            self.block_tables, 1, self.context, self.q.shape[-1] ** -0.5, num_splits=num_splits,
        )  # fmt: skip

    def contiguous_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of every sequence gathered into ``[B, KVH, context, D]``."""
        shape = (self.q.shape[0], -1, *self.k_cache.shape[2:])
        tables = self.block_tables.long()
        k = self.k_cache[tables].reshape(shape)[:, : self.context].transpose(1, 2).contiguous()
        v = self.v_cache[tables].reshape(shape)[:, : self.context].transpose(1, 2).contiguous()
        return k, v


def decode_batch(
    batch: int, context: int, heads: tuple[int, int, int], block_size: int,
    dtype: torch.dtype, device: torch.device, seed: int,
) -> DecodeBatch:  # fmt: skip
    """``batch`` decode tokens at ``context``; block tables are a random permutation."""
    num_heads, kv_heads, dim = heads
    gen = torch.Generator(device=device).manual_seed(seed)
    per_seq = -(-context // block_size)
    num_blocks = batch * per_seq
    tables = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
    shape = (num_blocks, block_size, kv_heads, dim)
    return DecodeBatch(
        q=torch.randn(batch, num_heads, dim, generator=gen, device=device, dtype=dtype),
        k_cache=torch.randn(shape, generator=gen, device=device, dtype=dtype),
        v_cache=torch.randn(shape, generator=gen, device=device, dtype=dtype),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
        context_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
        block_tables=tables.reshape(batch, per_seq),
        context=context,
    )


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref.float()).abs().max() / ref.float().abs().max())


def run_correctness(plan: Plan) -> list[dict]:
    from kernels.block_ops import copy_blocks
    from kernels.kv_store import store_kv
    from kernels.paged_attention import paged_attention
    from kernels.reference import ref_copy_blocks, ref_paged_attention, ref_store_kv

    tols = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}
    dim = 16 if plan.dry else 128
    block_size = 16
    long_ctx = 40 if plan.dry else 700
    lens = [(2 * block_size, 2 * block_size), (1, 1), (5, 3 * block_size), (1, long_ctx)]
    max_q, max_ctx = max(ql for ql, _ in lens), max(c for _, c in lens)
    rows = []
    for dtype in plan.dtypes:
        gen = torch.Generator(device=plan.device).manual_seed(0)

        def rnd(
            *shape: int, gen: torch.Generator = gen, dtype: torch.dtype = dtype
        ) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=plan.device, dtype=dtype)

        per_seq = [-(-ctx // block_size) for _, ctx in lens]
        num_blocks = sum(per_seq)
        perm = torch.randperm(num_blocks, generator=gen, device=plan.device).to(torch.int32)
        tables = torch.zeros(len(lens), max(per_seq), dtype=torch.int32, device=plan.device)
        used = 0
        for i, n in enumerate(per_seq):
            tables[i, :n] = perm[used : used + n]
            used += n
        qlens = torch.tensor([0] + [ql for ql, _ in lens], device=plan.device)
        qsl = torch.cumsum(qlens, 0).to(torch.int32)
        ctx = torch.tensor([c for _, c in lens], dtype=torch.int32, device=plan.device)
        kc, vc = rnd(num_blocks, block_size, 2, dim), rnd(num_blocks, block_size, 2, dim)
        q = rnd(int(qsl[-1]), 8, dim)
        args = (q, kc, vc, qsl, ctx, tables)
        ref = ref_paged_attention(*args, dim**-0.5)
        for splits in (1, 4):
            out = torch.full_like(q, float("nan"))
            paged_attention(*args, max_q, max_ctx, dim**-0.5, out, splits)
            err = rel_err(out, ref) if torch.isfinite(out).all() else float("nan")
            rows.append(_check_row("paged_attention", f"mixed GQA4 splits={splits}", dtype,
                                   err, tols[dtype]))  # fmt: skip

        slots = torch.randperm(num_blocks * block_size, generator=gen, device=plan.device)[:9]
        slots[3] = -1
        k, v = rnd(9, 2, dim), rnd(9, 2, dim)
        kc2, vc2, kr, vr = kc.clone(), vc.clone(), kc.clone(), vc.clone()
        store_kv(k, v, kc2, vc2, slots)
        ref_store_kv(k, v, kr, vr, slots)
        err = max(rel_err(kc2, kr), rel_err(vc2, vr))
        rows.append(_check_row("store_kv", "9 tokens, one padding", dtype, err, 0.0))
        pairs = torch.tensor([[0, 3], [1, 4]], device=plan.device)
        stacked, stacked_ref = torch.stack([kc2, vc2]), torch.stack([kr, vr])
        ref_copy_blocks(stacked_ref, pairs)
        copy_blocks(stacked, pairs)
        err = rel_err(stacked, stacked_ref)
        rows.append(_check_row("copy_blocks", "2 pairs, K and V stacked", dtype, err, 0.0))
    return rows


def _check_row(kernel: str, case: str, dtype: torch.dtype, err: float, tol: float) -> dict:
    ok = err <= tol  # NaN fails
    return {"kernel": kernel, "case": case, "dtype": str(dtype).removeprefix("torch."),
            "max_rel_err": err, "tol": tol, "ok": ok}  # fmt: skip


def run_fig18a(plan: Plan) -> list[dict]:
    heads, dim = plan.fig18a_heads
    dtype = plan.dtypes[-1] if plan.dry else torch.float16
    rows = []
    for batch in plan.fig18a_batches:
        for context in plan.fig18a_contexts:
            b = decode_batch(batch, context, (heads, heads, dim), 16, dtype, plan.device, seed=1)
            k, v = b.contiguous_kv()
            q4 = b.q[:, :, None, :]  # [B, H, 1, D]

            def sdpa(
                q4: torch.Tensor = q4, k: torch.Tensor = k, v: torch.Tensor = v
            ) -> torch.Tensor:
                return torch.nn.functional.scaled_dot_product_attention(q4, k, v)

            paged_ms, contig_ms = time_ms(b.attend, plan), time_ms(sdpa, plan)
            rows.append({
                "batch": batch, "context": context, "heads": heads, "head_dim": dim,
                "block_size": 16, "dtype": str(dtype).removeprefix("torch."),
                "paged_ms": paged_ms, "contiguous_ms": contig_ms,
                "ratio_paged_over_contiguous": paged_ms / contig_ms,
                "agree_rel_err": rel_err(b.attend(), sdpa()[:, :, 0]),
            })  # fmt: skip
    return rows


def copy_bandwidth_gbps(plan: Plan) -> float:
    """Device-to-device copy: (bytes read + bytes written) / time of a large ``clone``."""
    gen = torch.Generator(device=plan.device).manual_seed(2)
    buf = torch.randn(plan.copy_bytes // 2, generator=gen, device=plan.device, dtype=torch.float16)
    ms = time_ms(buf.clone, plan)
    return 2 * plan.copy_bytes / (ms * 1e-3) / 1e9


def run_long_context(plan: Plan, copy_gbps: float) -> list[dict]:
    from kernels.paged_attention import choose_num_splits

    dtype = plan.dtypes[-1] if plan.dry else torch.float16
    heads, kv_heads, dim = plan.long_heads
    budget = torch.cuda.mem_get_info()[0] // 4 if plan.device.type == "cuda" else 1 << 30
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count if not plan.dry else 1
    rows = []
    for batch in plan.long_batches:
        for context in plan.long_contexts:
            kv_bytes = 2 * batch * context * kv_heads * dim * torch.finfo(dtype).bits // 8
            if kv_bytes > budget:
                continue  # does not fit in a quarter of free memory
            b = decode_batch(batch, context, plan.long_heads, 16, dtype, plan.device, seed=3)
            splits = choose_num_splits(batch * kv_heads, context, num_sms)  # decode: 1 q tile
            ms = time_ms(b.attend, plan)
            ms_one = time_ms(lambda b=b: b.attend(num_splits=1), plan)
            gbps = b.kv_bytes() / (ms * 1e-3) / 1e9
            rows.append({
                "batch": batch, "context": context, "heads": heads, "kv_heads": kv_heads,
                "head_dim": dim, "block_size": 16, "num_splits": splits, "ms": ms,
                "kv_gbytes": b.kv_bytes() / 1e9, "gbps": gbps,
                "gbps_no_split": b.kv_bytes() / (ms_one * 1e-3) / 1e9,
                "copy_gbps": copy_gbps, "frac_of_copy_bw": gbps / copy_gbps,
            })  # fmt: skip
            del b
    return rows


def run_block_size(plan: Plan) -> list[dict]:
    heads, dim = plan.fig18a_heads
    batch, context = plan.sweep_shape
    dtype = plan.dtypes[-1] if plan.dry else torch.float16
    rows = []
    for bs in plan.sweep_block_sizes:
        b = decode_batch(batch, context, (heads, heads, dim), bs, dtype, plan.device, seed=4)
        ms = time_ms(b.attend, plan)
        rows.append({
            "block_size": bs, "batch": batch, "context": context, "heads": heads,
            "head_dim": dim, "ms": ms, "gbps": b.kv_bytes() / (ms * 1e-3) / 1e9,
        })  # fmt: skip
    base = next((r["ms"] for r in rows if r["block_size"] == 16), rows[0]["ms"])
    for r in rows:
        r["ratio_to_bs16"] = r["ms"] / base
    return rows


def metadata(plan: Plan, argv: list[str]) -> dict:
    import triton

    device = "cpu (Triton interpreter)" if plan.dry else torch.cuda.get_device_name(plan.device)
    return {
        "device": device,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m experiments.bench.kernels_gpu", *argv]),
        "dry": plan.dry,
        "timings": "MEANINGLESS: dry run on CPU under the Triton interpreter"
        if plan.dry
        else "CUDA events, median of repeats, cold L2, launch overhead hidden",
        "repeats": plan.repeats,
        "warmup": plan.warmup,
    }


@plain_cli
def main(argv: list[str] | None = None) -> int:
    """Run every section, write ``DIR/<section>.csv`` and ``DIR/results.json`` (atomically,
    after each section, so a killed run keeps the sections done); 0 if all ok."""
    parser = OneLineParser(prog="python -m experiments.bench.kernels_gpu", description=__doc__)
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--dry", action="store_true", help="tiny CPU run under the interpreter")
    args_list = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(args_list)
    check_out_dir(args.out)
    if args.dry:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module imports triton
    elif not torch.cuda.is_available():
        parser.error("no CUDA device; use --dry for a CPU check of the script")
    plan = make_plan(args.dry)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"meta": metadata(plan, args_list), "errors": {}}
    copy_gbps = copy_bandwidth_gbps(plan)
    results["meta"]["copy_gbps"] = copy_gbps
    runners: dict[str, Callable[[], list[dict]]] = {
        "correctness": lambda: run_correctness(plan),
        "fig18a": lambda: run_fig18a(plan),
        "long_context": lambda: run_long_context(plan, copy_gbps),
        "block_size": lambda: run_block_size(plan),
    }
    for name in SECTIONS:
        try:
            rows = runners[name]()
        except Exception as exc:  # one failing section must not lose the others' numbers
            results["errors"][name] = repr(exc)
            print(f"\n== {name} == FAILED: {exc!r}")
            rows = []
        results[name] = rows
        write_csv(args.out / f"{name}.csv", rows)
        write_atomic(args.out / "results.json", json.dumps(results, indent=2))
        print_table(name + (" (dry: timings meaningless)" if plan.dry else ""), rows)
    all_ok = not results["errors"] and all(r["ok"] for r in results["correctness"])
    print(f"\ncopy bandwidth {copy_gbps:.4g} GB/s; wrote {args.out}; all ok: {all_ok}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
