"""The one count of a step's work: FLOPs and bytes per GPU, by part.

Every cost model that prices FLOPs or bytes takes its counts from this module, so they
can not drift apart: the roofline, the calibrated fit's basis and the measured-speed model
from :func:`count_work`; the profiled model, which rescales a per-layer profile from the
profiled model's shape to the target's, from its parts :func:`layer_work` and
:func:`lm_head_work`. Per GPU of a ``tp``-way tensor-parallel group (Megatron-style: heads, MLP
columns and the vocabulary split over ``tp``):

- linear part: FLOPs ``2 × matmul params × tokens`` for the decoder layers plus
  ``2 × embed_dim × vocab`` per sampled row for the LM head (one row per prefill sequence
  and per decode sequence); bytes = the weights, read once per non-empty step, plus the
  activations: each token's through the layers (:func:`layer_work`) and each sampled row's
  through the LM head (:func:`lm_head_work`);
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
from sim.capacity import check_tp, kv_width_per_gpu


def layer_work(
    hidden: int, q_size: int, kv_width: int, ffn: int, gated: bool, tp: int
) -> tuple[float, float]:
    """``(matmul weight elements, activation elements per token)`` of one decoder layer on
    one of ``tp`` GPUs, whose K and V are ``kv_width`` wide each (its KV heads × head_dim,
    replicated heads included: :func:`sim.capacity.kv_width_per_gpu`).

    Weights: q and o projections and the MLP's 2 (3 when gated) matrices split over tp,
    plus this GPU's K and V projections. Activations: each matmul's input read and output
    written once (norms, residual adds and the MLP activation assumed fused into
    neighbours, as a lower bound should). Unsharded (hidden-wide): QKV and fc1 inputs, O
    and fc2 outputs: ``4h``. Sharded over tp: QKV output ``q + 2kv``, attention input q and
    output q, O input q (``3q``), fc1 output and activation input (``2 × g × ffn``, g = 2 if
    gated else 1), activation output and fc2 input (``2 ffn``).
    """
    g = 2 if gated else 1
    params = (2 * hidden * q_size + (g + 1) * hidden * ffn) / tp + 2 * hidden * kv_width
    sharded = q_size + 3 * q_size + 2 * (g + 1) * ffn
    return params, 4 * hidden + sharded / tp + 2 * kv_width


def elementwise_work(
    hidden: int,
    q_width: int,
    kv_width: int,
    ffn_width: int,
    gated: bool,
    rotary: bool,
    residual_adds: int,
) -> float:
    """Elements read and written per token, on one GPU, by a decoder layer's elementwise
    operators (a profile's ``other``). ``q_width``, ``kv_width`` and ``ffn_width`` are this
    GPU's shares (heads and MLP columns split over tp); norms and residual adds act on the
    whole hidden vector on every GPU (Megatron-style tensor parallelism).

    Two norms read and write the hidden vector (``4h``); each of ``residual_adds`` adds
    reads two and writes one (``3h``); rotary, when the layer has it, reads and writes q
    and k (``2 (q + kv)``); the MLP activation reads its input and writes its output
    (``3 ffn`` gated: gate and up in, one out; ``2 ffn`` otherwise). These operators are
    bound by launches at few tokens and by memory bandwidth at many.
    """
    act = (3 if gated else 2) * ffn_width
    rope = 2 * (q_width + kv_width) if rotary else 0
    return 4 * hidden + 3 * residual_adds * hidden + rope + act


def model_layer_work(model: ModelSpec, tp: int) -> tuple[float, float]:
    """:func:`layer_work` of one of ``model``'s decoder layers on one of ``tp`` GPUs."""
    m = model
    return layer_work(
        m.hidden_size, m.q_size, kv_width_per_gpu(m, tp), m.ffn_hidden_size, m.gated_mlp, tp
    )


def lm_head_work(model: ModelSpec, tp: int) -> tuple[float, float]:
    """``(weight elements, activation elements per sampled row)`` of the LM head on one of
    ``tp`` GPUs: ``embed_dim × vocab / tp`` weights; per row its ``embed_dim`` input read
    and its ``vocab / tp`` logits written."""
    return model.lm_head_params() / tp, model.embed_dim + model.vocab_size / tp


@dataclass(frozen=True, slots=True)
class WorkCoefficients:
    """Per-GPU work per unit of each :class:`~core.plan.BatchShape` count."""

    flops_per_token: float  # decoder-layer matmuls
    flops_per_logit: float  # LM head, per sampled row
    flops_per_pair: float  # attention, per (query, key) pair, all layers
    weight_bytes: float  # matmul weights incl. LM head, read once per step
    act_bytes_per_token: float  # decoder layers
    act_bytes_per_logit: float  # LM head, per sampled row
    kv_bytes_per_token: float  # K and V, all layers, this GPU's heads

    @classmethod
    def of(cls, model: ModelSpec, tp: int = 1, dtype_bytes: int = 2) -> WorkCoefficients:
        """The coefficients of ``model`` on ``tp`` GPUs (validates ``tp``)."""
        m, layers = model, model.num_layers
        check_tp(m, tp)
        params, act = model_layer_work(m, tp)  # replicated K/V heads included
        matmul = layers * params
        lm_params, lm_act = lm_head_work(m, tp)
        return cls(
            flops_per_token=2 * matmul,
            flops_per_logit=2 * lm_params,
            flops_per_pair=4 * m.head_dim * (m.num_heads // tp) * layers,
            weight_bytes=(matmul + lm_params) * dtype_bytes,
            act_bytes_per_token=layers * act * dtype_bytes,
            act_bytes_per_logit=lm_act * dtype_bytes,
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
    tokens, rows = prefill_tokens + decode_seqs, prefill_seqs + decode_seqs
    lin_flops = tokens * k.flops_per_token + rows * k.flops_per_logit
    lin_bytes = (
        (tokens > 0) * k.weight_bytes
        + tokens * k.act_bytes_per_token
        + rows * k.act_bytes_per_logit
    )
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
