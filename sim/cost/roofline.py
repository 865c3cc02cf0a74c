"""Roofline step-time model: the FLOPs and bytes of one step (:mod:`sim.cost.work`) at
datasheet peaks times efficiency factors.

Each part (linear, attention) costs ``max(flops / (peak × compute), bytes / (bandwidth ×
memory))`` and the two are summed: they run as separate kernels one after another, so the
weight stream of the matmuls cannot hide the KV stream of attention (a single max over
summed FLOPs and bytes would let it). Added on top: all-reduces (ring: ``2 (tp−1)/tp ×
bytes / peer link``, the GPU's NVLink or PCIe as its hardware YAML says, + a per-call
latency), swaps over the host link, block copies, and the
per-step overhead. With the default efficiencies and ``stack="none"`` this is a lower
bound on step time.

A ``stack`` preset (:mod:`sim.cost.overhead`) adds what a serving stack costs around the
operators: CPU time per step (serial or overlapped), the paged kernel's per-block gather
and last-block waste, a latency per host-link copy and per device-copy call.
"""

from __future__ import annotations

from typing import Any

from core.defaults import DEFAULT_BLOCK_SIZE
from core.model_spec import ModelSpec
from core.plan import BatchShape
from sim.catalog import GPUSpec, get_gpu, get_model
from sim.cost.efficiency import Efficiency
from sim.cost.overhead import (
    Stack,
    describe_stack,
    device_copy_seconds,
    extra_kv_tokens,
    get_stack,
    swap_seconds,
)
from sim.cost.work import WorkCoefficients, count_work, shape_counts


class RooflineCostModel:
    """Step time of ``model`` on ``tp`` × ``gpu`` at ``efficiency``; see the module doc."""

    def __init__(
        self,
        model: ModelSpec | str,
        gpu: GPUSpec | str,
        tp: int = 1,
        dtype_bytes: int = 2,
        efficiency: Efficiency | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        stack: str | Stack | None = None,
    ) -> None:
        self.model = m = get_model(model)
        self.gpu = g = get_gpu(gpu)
        self.tp = tp
        self.dtype_bytes = dtype_bytes
        self.efficiency = eff = efficiency or Efficiency()
        self.block_size = block_size
        if block_size < 1 or dtype_bytes < 1:
            raise ValueError(
                f"block_size and dtype_bytes must be >= 1, got {block_size}, {dtype_bytes}"
            )
        self.work_coefficients = k = WorkCoefficients.of(m, tp, dtype_bytes)  # validates tp
        self.stack = stack if isinstance(stack, Stack) else get_stack(stack, tp)
        self._plain = self.stack.name == "none"
        # Work per GPU, per unit of each BatchShape count (sim.cost.work).
        self.flops_per_token = k.flops_per_token
        self.flops_per_logit = k.flops_per_logit
        self.flops_per_pair = k.flops_per_pair
        self.weight_bytes = k.weight_bytes
        self.kv_bytes_per_token = k.kv_bytes_per_token
        self.act_bytes_per_token = k.act_bytes_per_token
        self.block_bytes = block_size * k.kv_bytes_per_token
        # Rates.
        self._flop_rate = g.peak_flops * eff.compute
        self._byte_rate = g.mem_bandwidth * eff.memory
        self._pcie = eff.pcie_bandwidth or g.host_link_bandwidth
        layers, h = m.num_layers, m.hidden_size
        self._allreduce_calls = 2 * layers if tp > 1 else 0
        link = g.peer_link_bandwidth * eff.peer_link_efficiency  # achieved bytes/s one way
        self._allreduce_s_per_token = (
            self._allreduce_calls * 2 * (tp - 1) / tp * h * dtype_bytes / link
        )
        self._allreduce_fixed_s = self._allreduce_calls * eff.allreduce_latency_s

    def work(self, shape: BatchShape) -> dict[str, float]:
        """Per-GPU FLOPs and bytes of ``shape`` by part (for inspection and fitting)."""
        lf, lb, af, ab = count_work(self.work_coefficients, *shape_counts(shape))
        return {
            "linear_flops": float(lf),
            "linear_bytes": float(lb),
            "attn_flops": float(af),
            "attn_bytes": float(ab),
        }

    def gpu_parts(self, shape: BatchShape) -> tuple[float, float]:
        """Seconds of the linear part and of the attention part of a non-empty step
        (attention includes the stack's per-block gather and last-block waste)."""
        fr, br = self._flop_rate, self._byte_rate
        lf, lb, af, ab = count_work(self.work_coefficients, *shape_counts(shape))
        if not self._plain:
            ab += self.kv_bytes_per_token * extra_kv_tokens(
                self.stack, shape.decode_seqs, shape.decode_ctx_tokens, self.block_size
            )
        # max(a, b) as conditionals: the same float, without two builtin calls
        a, b = lf / fr, lb / br
        c, d = af / fr, ab / br
        return (a if a >= b else b), (c if c >= d else d)

    def allreduce_time(self, tokens: int) -> float:
        """Seconds of the step's all-reduces (0 at tp 1)."""
        if not self._allreduce_calls:
            return 0.0
        return tokens * self._allreduce_s_per_token + self._allreduce_fixed_s

    def step_time(self, shape: BatchShape) -> float:
        """Seconds for one step; 0 for an empty shape."""
        tokens = shape.prefill_tokens + shape.decode_seqs
        t = 0.0
        if tokens:
            lin, attn = self.gpu_parts(shape)
            t = lin + attn
            if self._allreduce_calls:
                t += self.allreduce_time(tokens)
        return self.finish(t, shape)

    def finish(self, gpu_s: float, shape: BatchShape) -> float:
        """Add to the operators' ``gpu_s`` the transfers, the per-step overhead and the
        stack's CPU time (nothing to an empty step)."""
        t = gpu_s
        if shape.swap_in_blocks or shape.swap_out_blocks or shape.copy_blocks:
            t += self.transfer_time(shape)  # else it adds exactly 0.0
        if t > 0.0:
            t += self.efficiency.per_step_overhead_s
            if not self._plain:
                t = self.with_cpu(t, shape)
        return t

    def with_cpu(self, gpu_s: float, shape: BatchShape) -> float:
        """``gpu_s`` plus (or, overlapped, at least) the stack's CPU time for ``shape``."""
        cpu = self.stack.cpu
        if cpu is None:
            return gpu_s
        c = cpu.per_step_s + cpu.per_seq_s * (shape.prefill_seqs + shape.decode_seqs)
        if self.stack.overlapped:
            return gpu_s if gpu_s >= c else c
        return gpu_s + c

    def transfer_time(self, shape: BatchShape) -> float:
        """Seconds of block swaps over the host link (plus the stack's per-copy latency)
        and device block copies (read + write, plus the stack's per-call latency)."""
        swaps = shape.swap_in_blocks + shape.swap_out_blocks
        copy = device_copy_seconds(self.stack, shape.copy_blocks, self.block_bytes, self._byte_rate)
        if self._plain:
            return swaps * self.block_bytes / self._pcie + copy
        layers = self.model.num_layers
        return (
            swap_seconds(
                self.stack, shape.swap_in_blocks, shape.swap_out_blocks, self.block_bytes,
                layers, self._pcie,
            )
            + copy
        )  # fmt: skip

    def config(self) -> dict[str, Any]:
        return {
            "kind": "roofline",
            "model": self.model.name,
            "gpu": self.gpu.name,
            "tp": self.tp,
            "dtype_bytes": self.dtype_bytes,
            "block_size": self.block_size,
            "stack": self.stack.name,
        }

    def describe(self) -> str:
        """Model, hardware, the efficiency table and the stack, with sources."""
        head = (
            f"roofline cost model: {self.model.name} on {self.tp} × {self.gpu.name} "
            f"(dtype {self.dtype_bytes} B, block {self.block_size})"
        )
        return "\n".join(
            [head, self.describe_hardware(), self.efficiency.describe(), describe_stack(self.stack)]
        )

    def describe_hardware(self) -> str:
        """The GPU's datasheet numbers the model prices with, each with its source, and at
        tp > 1 how the all-reduces are priced."""
        g, src = self.gpu, self.gpu.source
        lines = [
            f"  gpu {g.name}: HBM {g.mem_bandwidth / 1e9:g} GB/s "
            f"({src.get('mem_bandwidth_gbs', 'no source given')})",
            f"    peak {g.peak_flops / 1e12:g} TFLOP/s dense 16-bit "
            f"({src.get('peak_tflops', 'no source given')})",
            f"    host link {g.host_link_bandwidth / 1e9:g} GB/s per direction "
            f"({src.get('host_link_gbs', 'no source given')})",
        ]
        if self.tp > 1:
            lines.append(
                f"  tp {self.tp}: a ring all-reduce of each token's hidden state twice per "
                f"layer over {g.peer_link} at {g.peer_link_bandwidth / 1e9:g} GB/s per "
                f"direction ({src.get('peer_link_gbs', 'no source given')}) times "
                "peer_link_efficiency, plus allreduce_latency_s per call (both in the factor table)"
            )
        return "\n".join(lines)
