"""Compile every kernel for an NVIDIA GPU without one: ``python -m kernels.aot_check``.

The CPU tests run the kernels under the Triton interpreter, which accepts code the GPU
compiler rejects (e.g. ``tl.dot`` tiles under 16). This lowers each kernel, at the tile
shapes the launchers pick, through Triton's CUDA pipeline down to a cubin (Triton ships
``ptxas``), so shape and typing errors show up in CI. It needs ``TRITON_INTERPRET`` unset:
the interpreter patches ``triton.language`` in-process.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from kernels.block_ops import _copy_blocks_kernel
from kernels.kv_store import _store_kv_kernel
from kernels.paged_attention import _attn_kernel, _merge_kernel, attention_constexprs

_TRITON_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _source(kernel: object, pointers: dict[str, str], constexprs: dict) -> ASTSource:
    fn = JITFunction(getattr(kernel, "fn", kernel))
    names = fn.arg_names
    signature = {n: pointers.get(n, "i32") for n in names}
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    consts = {(names.index(k),): v for k, v in constexprs.items()}
    return ASTSource(fn=fn, signature=signature, constexprs=consts)


def attention_cases() -> list[tuple[str, dict[str, str], dict]]:
    """(name, pointer types, constexprs) for a spread of launches the engine makes."""
    shapes = [  # heads, kv_heads, head_dim, block_size, max_query_len, splits, dtype
        (40, 40, 128, 16, 1, 1, torch.float16),  # OPT-13B decode
        (32, 8, 128, 256, 512, 4, torch.bfloat16),  # GQA prefill, split, big blocks
        (32, 4, 80, 8, 7, 1, torch.float32),  # odd head_dim, small blocks, fp32 ieee dot
    ]
    cases = []
    for heads, kvh, dim, bs, max_q, splits, dtype in shapes:
        ty = _TRITON_DTYPE[dtype]
        pointers = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "out_ptr"), f"*{ty}")
        pointers.update(dict.fromkeys(("part_out_ptr", "part_m_ptr", "part_l_ptr"), "*fp32"))
        pointers.update(dict.fromkeys(("qsl_ptr", "ctx_ptr", "bt_ptr"), "*i32"))
        pointers["sm_scale_log2"] = "fp32"
        cfg = attention_constexprs(heads, kvh, dim, bs, max_q, splits, dtype)
        cases.append((f"attention {ty} H{heads}/KV{kvh} D{dim} bs{bs} q{max_q} s{splits}",
                      pointers, cfg))  # fmt: skip
    return cases


def all_cases() -> list[tuple[object, str, dict[str, str], dict]]:
    cases: list[tuple[object, str, dict[str, str], dict]] = [
        (_attn_kernel, *case) for case in attention_cases()
    ]
    merge_ptrs = {"out_ptr": "*bf16", "qsl_ptr": "*i32"} | dict.fromkeys(
        ("part_out_ptr", "part_m_ptr", "part_l_ptr"), "*fp32"
    )
    merge_cfg = {"NUM_HEADS": 32, "HEAD_DIM": 128, "BLOCK_D": 128, "NUM_SPLITS": 5,
                 "SPLITS_P2": 8}  # fmt: skip
    cases.append((_merge_kernel, "merge bf16 5 splits", merge_ptrs, merge_cfg))
    store_ptrs = dict.fromkeys(("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr"), "*fp16")
    store_ptrs["slot_ptr"] = "*i64"
    store_cfg = {"NUM_KV_HEADS": 8, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "BLOCK_H": 8,
                 "BLOCK_D": 128}  # fmt: skip
    cases.append((_store_kv_kernel, "store_kv fp16", store_ptrs, store_cfg))
    # all caches of a big model in one tensor: the stride between caches passes 2**31
    copy_ptrs = {"cache_ptr": "*bf16", "pairs_ptr": "*i64", "stride_cache": "i64"}
    cases.append((_copy_blocks_kernel, "copy_blocks bf16 stacked caches", copy_ptrs,
                  {"BLOCK_NUMEL": 16 * 8 * 128, "CHUNK": 1024}))  # fmt: skip
    return cases


def compile_all(arch: int = 90) -> dict[str, str]:
    """Compile every case for ``sm_<arch>``; name -> "ok (N B shared)" or the error text."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("TRITON_INTERPRET is set: the interpreter cannot compile for a GPU")
    target = GPUTarget("cuda", arch, 32)
    results = {}
    for kernel, name, pointers, cfg in all_cases():
        try:
            compiled = triton.compile(_source(kernel, pointers, cfg), target=target)
            results[name] = f"ok ({compiled.metadata.shared} B shared)"
        except Exception as exc:  # report every failing case, not just the first
            results[name] = f"FAILED: {exc}"
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.aot_check", description=__doc__)
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        # one line, no traceback: the CPU tests and serve backend=triton ask for this
        # variable, so a shell that exported it is the usual way to get here
        print(
            "error: TRITON_INTERPRET is set: the interpreter cannot compile for a GPU "
            "(run: env -u TRITON_INTERPRET python -m kernels.aot_check)",
            file=sys.stderr,
        )
        return 2
    results = compile_all(args.arch)
    for name, status in results.items():
        print(f"{name:55s} {status}")
    return 0 if all(s.startswith("ok") for s in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
