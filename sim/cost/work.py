"""The one count of a step's work: FLOPs and bytes per GPU, by part.

Every cost model that prices FLOPs or bytes (the roofline, the calibrated fit's basis, the
measured-speed and profiled models) takes its counts from :func:`count_work`, so they can
not drift apart. Per GPU of a ``tp``-way tensor-parallel group (Megatron-style: heads, MLP
columns and the vocabulary split over ``tp``):

- linear part: FLOPs ``2 × matmul params × tokens`` for the decoder layers plus
  ``2 × hidden × vocab`` per sampled row for the LM head (one row per prefill sequence and
  per decode sequence); bytes = the weights, read once per non-empty step, plus the
  activations (:func:`act_elems_per_token`);
- attention part: FLOPs ``4 × head_dim × heads × pairs`` per layer (QKᵀ and PV, 2 FLOPs
  per multiply-add) over ``prefill_attn_pairs + decode_ctx_tokens`` pairs; bytes = K/V
  read (``decode_ctx_tokens + prefill_kv_read_tokens`` tokens) plus K/V written (new
  tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.model_spec import ModelSpec, kv_bytes_per_token
from core.plan import BatchShape
from sim.capacity import check_tp, kv_width_per_gpu, replicated_kv_params


def act_elems_per_token(model: ModelSpec, tp: int) -> float:
    """Activation elements one token moves through HBM in one layer, counting each
    matmul's input read and output written once (norms, residual adds and the MLP
    activation assumed fused into neighbours, as a lower bound should).

    Unsharded (hidden-wide): QKV and fc1 inputs, O and fc2 outputs: ``4h``. Sharded over
    tp: QKV output ``q + 2kv``, attention input q and output q, O input q (``3q``), fc1
    output and activation input (``2 × g × ffn``, g = 2 if gated else 1), activation output
    and fc2 input (``2 ffn``). K and V are this GPU's heads (:func:`kv_width_per_gpu`).
    """
    g = 2 if model.gated_mlp else 1
    sharded = model.q_size + 3 * model.q_size + 2 * (g + 1) * model.ffn_hidden_size
    return 4 * model.hidden_size + sharded / tp + 2 * kv_width_per_gpu(model, tp)


@dataclass(frozen=True, slots=True)
class WorkCoefficients:
    """Per-GPU work per unit of each :class:`~core.plan.BatchShape` count."""

    flops_per_token: float  # decoder-layer matmuls
    flops_per_logit: float  # LM head, per sampled row
    flops_per_pair: float  # attention, per (query, key) pair, all layers
    weight_bytes: float  # matmul weights incl. LM head, read once per step
    act_bytes_per_token: float
    kv_bytes_per_token: float  # K and V, all layers, this GPU's heads

    @classmethod
    def of(cls, model: ModelSpec, tp: int = 1, dtype_bytes: int = 2) -> WorkCoefficients:
        """The coefficients of ``model`` on ``tp`` GPUs (validates ``tp``)."""
        m, layers = model, model.num_layers
        check_tp(m, tp)
        replicated = replicated_kv_params(m, tp, biases=False)  # K/V heads on every GPU
        matmul = layers * m.layer_matmul_params() / tp + replicated
        return cls(
            flops_per_token=2 * matmul,
            flops_per_logit=2 * m.lm_head_params() / tp,
            flops_per_pair=4 * m.head_dim * (m.num_heads // tp) * layers,
            weight_bytes=(matmul + m.lm_head_params() / tp) * dtype_bytes,
            act_bytes_per_token=layers * act_elems_per_token(m, tp) * dtype_bytes,
            kv_bytes_per_token=kv_bytes_per_token(m, dtype_bytes, tp),
        )


def count_work(
    k: WorkCoefficients,
    prefill_tokens: Any,
    prefill_seqs: Any,
    prefill_attn_pairs: Any,
    prefill_kv_read_tokens: Any,
    decode_seqs: Any,
    decode_ctx_tokens: Any,
) -> tuple[Any, Any, Any, Any]:
    """``(linear_flops, linear_bytes, attn_flops, attn_bytes)`` of one step, per GPU.

    Arguments are the :class:`~core.plan.BatchShape` counts as numbers or numpy arrays
    (elementwise). An empty step (no tokens) has zero work, weights included.
    """
    tokens = prefill_tokens + decode_seqs
    lin_flops = tokens * k.flops_per_token + (prefill_seqs + decode_seqs) * k.flops_per_logit
    lin_bytes = (tokens > 0) * k.weight_bytes + tokens * k.act_bytes_per_token
    attn_flops = (prefill_attn_pairs + decode_ctx_tokens) * k.flops_per_pair
    attn_bytes = (decode_ctx_tokens + prefill_kv_read_tokens + tokens) * k.kv_bytes_per_token
    return lin_flops, lin_bytes, attn_flops, attn_bytes


def shape_counts(shape: BatchShape) -> tuple[int, int, int, int, int, int]:
    """The six :class:`~core.plan.BatchShape` counts :func:`count_work` takes, in its order."""
    return (
        shape.prefill_tokens,
        shape.prefill_seqs,
        shape.prefill_attn_pairs,
        shape.prefill_kv_read_tokens,
        shape.decode_seqs,
        shape.decode_ctx_tokens,
    )
