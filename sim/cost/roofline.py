"""Roofline step-time model: FLOPs and bytes of one step from the model shape.

Per GPU of a ``tp``-way tensor-parallel group (Megatron-style: heads, MLP columns and the
vocabulary are split over ``tp``; two all-reduces per layer):

- linear part — FLOPs ``2 × matmul params × tokens`` for the decoder layers plus
  ``2 × hidden × vocab`` per sampled row for the LM head (logits are computed only for the
  rows that sample: one per prefill sequence and per decode sequence); bytes = the weights,
  read once per step, plus activations (see ``_act_elems_per_token``);
- attention part — FLOPs ``4 × head_dim × heads × pairs`` per layer (QK^T and PV, 2 FLOPs
  per multiply-add) over ``prefill_attn_pairs + decode_ctx_tokens`` pairs; bytes = K/V read
  (``decode_ctx_tokens + prefill_kv_read_tokens`` tokens) plus K/V written (new tokens).

Each part costs ``max(flops / (peak × compute), bytes / (bandwidth × memory))`` and the two
are summed: they run as separate kernels one after another, so the weight stream of the
matmuls cannot hide the KV stream of attention (a single max over summed FLOPs and bytes
would let it). Added on top: all-reduces (ring: ``2 (tp−1)/tp × bytes / peer link``, the
GPU's NVLink or PCIe as its hardware YAML says, + a per-call latency), swaps over the host
link, block copies, and the per-step overhead. At the default efficiencies this is a lower
bound on step time.
"""

from __future__ import annotations

from typing import Any

from core.defaults import DEFAULT_BLOCK_SIZE
from core.model_spec import ModelSpec, kv_bytes_per_token
from core.plan import BatchShape
from sim.capacity import check_tp
from sim.catalog import GPUSpec, get_gpu, get_model
from sim.cost.efficiency import Efficiency


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
    ) -> None:
        self.model = m = get_model(model)
        self.gpu = g = get_gpu(gpu)
        self.tp = tp
        self.dtype_bytes = dtype_bytes
        self.efficiency = eff = efficiency or Efficiency()
        self.block_size = block_size
        check_tp(m, tp)
        if block_size < 1 or dtype_bytes < 1:
            raise ValueError(
                f"block_size and dtype_bytes must be >= 1, got {block_size}, {dtype_bytes}"
            )
        layers, h = m.num_layers, m.hidden_size
        # Work per GPU, per unit of each BatchShape count.
        self.flops_per_token = 2 * layers * m.layer_matmul_params() / tp
        self.flops_per_logit = 2 * m.lm_head_params() / tp
        self.flops_per_pair = 4 * m.head_dim * (m.num_heads // tp) * layers
        self.weight_bytes = (
            (layers * m.layer_matmul_params() + m.lm_head_params()) * dtype_bytes / tp
        )
        self.kv_bytes_per_token = kv_bytes_per_token(m, dtype_bytes, tp)
        self.act_bytes_per_token = layers * self._act_elems_per_token() * dtype_bytes
        self.block_bytes = block_size * self.kv_bytes_per_token
        # Rates.
        self._flop_rate = g.peak_flops * eff.compute
        self._byte_rate = g.mem_bandwidth * eff.memory
        self._pcie = eff.pcie_bandwidth or g.host_link_bandwidth
        self._allreduce_calls = 2 * layers if tp > 1 else 0
        self._allreduce_s_per_token = (
            self._allreduce_calls * 2 * (tp - 1) / tp * h * dtype_bytes / g.peer_link_bandwidth
        )
        self._allreduce_fixed_s = self._allreduce_calls * eff.allreduce_latency_s

    def _act_elems_per_token(self) -> float:
        """Activation elements one token moves through HBM in one layer, counting each
        matmul's input read and output written once (norms, residual adds and the MLP
        activation assumed fused into neighbours, as a lower bound should).

        Unsharded (hidden-wide): QKV and fc1 inputs, O and fc2 outputs: ``4h``. Sharded
        over tp: QKV output ``q + 2kv``, attention input q and output q, O input q
        (``3q``), fc1 output and activation input (``2 × g × ffn``, g = 2 if gated else 1),
        activation output and fc2 input (``2 ffn``). Next to the weights this is small for
        decode batches (~10% at 256 sequences on OPT-13B); prefills are compute-bound.
        """
        m = self.model
        g = 2 if m.gated_mlp else 1
        sharded = m.q_size + 2 * m.kv_size + 3 * m.q_size + 2 * (g + 1) * m.ffn_hidden_size
        return 4 * m.hidden_size + sharded / self.tp

    def work(self, shape: BatchShape) -> dict[str, float]:
        """Per-GPU FLOPs and bytes of ``shape`` by part (for inspection and fitting)."""
        tokens = shape.prefill_tokens + shape.decode_seqs
        active = 1.0 if tokens else 0.0
        return {
            "linear_flops": tokens * self.flops_per_token
            + (shape.prefill_seqs + shape.decode_seqs) * self.flops_per_logit,
            "linear_bytes": active * self.weight_bytes + tokens * self.act_bytes_per_token,
            "attn_flops": (shape.prefill_attn_pairs + shape.decode_ctx_tokens)
            * self.flops_per_pair,
            "attn_bytes": (shape.decode_ctx_tokens + shape.prefill_kv_read_tokens + tokens)
            * self.kv_bytes_per_token,
        }

    def step_time(self, shape: BatchShape) -> float:
        """Seconds for one step; 0 for an empty shape."""
        decode_seqs, ctx = shape.decode_seqs, shape.decode_ctx_tokens
        tokens = shape.prefill_tokens + decode_seqs
        t = 0.0
        if tokens:
            fr, br = self._flop_rate, self._byte_rate
            lin_flops = (
                tokens * self.flops_per_token
                + (shape.prefill_seqs + decode_seqs) * self.flops_per_logit
            )
            lin_bytes = self.weight_bytes + tokens * self.act_bytes_per_token
            pairs = shape.prefill_attn_pairs + ctx
            kv_tokens = ctx + shape.prefill_kv_read_tokens + tokens
            # max(a, b) as conditionals: the same float, without two builtin calls
            a, b = lin_flops / fr, lin_bytes / br
            c, d = pairs * self.flops_per_pair / fr, kv_tokens * self.kv_bytes_per_token / br
            t = (a if a >= b else b) + (c if c >= d else d)
            if self._allreduce_calls:
                t += tokens * self._allreduce_s_per_token + self._allreduce_fixed_s
        if shape.swap_in_blocks or shape.swap_out_blocks or shape.copy_blocks:
            t += self.transfer_time(shape)  # else it adds exactly 0.0
        if t > 0.0:
            t += self.efficiency.per_step_overhead_s
        return t

    def transfer_time(self, shape: BatchShape) -> float:
        """Seconds of block swaps over the host link and device block copies (read+write)."""
        swaps = shape.swap_in_blocks + shape.swap_out_blocks
        return (
            swaps * self.block_bytes / self._pcie
            + shape.copy_blocks * 2 * self.block_bytes / self._byte_rate
        )

    def config(self) -> dict[str, Any]:
        return {
            "kind": "roofline",
            "model": self.model.name,
            "gpu": self.gpu.name,
            "tp": self.tp,
            "dtype_bytes": self.dtype_bytes,
            "block_size": self.block_size,
        }

    def describe(self) -> str:
        """Model, hardware and the efficiency table with sources."""
        head = (
            f"roofline cost model: {self.model.name} on {self.tp} × {self.gpu.name} "
            f"(dtype {self.dtype_bytes} B, block {self.block_size})"
        )
        return f"{head}\n{self.efficiency.describe()}"
