"""Step time from a measured per-operator profile (``cost=profiled``).

Per step: ``layers × (linear(N) + other(N)) + lm_head(rows) + attention`` where ``N`` is the
step's tokens and ``rows`` its sampled rows, plus all-reduces, transfers and the stack's
CPU time (as in :class:`~sim.cost.roofline.RooflineCostModel`).

The profile is one profile, or a directory of them (:func:`~sim.cost.profile.
read_profile_set`), of which :func:`nearest_shard` takes the one to use. A transfer to a
shard far smaller than the profiled one is warned of (:func:`small_shard_note`).

When the profile was measured on the simulated model, GPU and tp (or ``as_measured``: the
profile was taken on the device being modelled, e.g. a CPU, which has no hardware entry),
its times are used as they are (linear interpolation between token counts, linear
extrapolation past the ends, see :func:`interp_points`); a dip between two token counts is
then the device's own behaviour (a CPU's matrix-vector path at one row, say) and is kept.
Otherwise the ``linear`` and ``other`` curves are first made non-decreasing
(:func:`isotonic`) and each operator is *transferred*:

- ``linear``: ``F' + (profile(N) - F) × roofline_target(N) / roofline_profiled(N)``, the
  roofline at datasheet peaks of each side's GPU with the layer's FLOPs and bytes
  (:mod:`sim.cost.work`): the profile gives the achieved fraction of the roofline at each
  token count (small batches reach neither peak), the target keeps that fraction. ``F`` is
  the profile's fixed part (:attr:`~sim.cost.profile.OperatorProfile.linear_fixed_s`,
  :mod:`sim.cost.fixed_latency`: launches and ramps, the same whatever the shard), ``F'``
  it scaled by the GPUs' bandwidth ratio. With ``F`` = 0 (not known) this is the plain
  roofline ratio, which priced shards 8x smaller than the profiled one 38-41% low at 1-64
  tokens on Vidur's tables; with the fixed part fitted on another model's tables, -3.6% on
  the A100 and -8.2% on the H100 (``docs/validation/profile-transfer.md``);
- ``other`` (elementwise: launch-bound at small N, bandwidth-bound at large N):
  ``G + (profile(N × bandwidth_p / bandwidth_t) - G) × e_t / e_p``, ``G`` the profile's
  fixed part (:attr:`~sim.cost.profile.OperatorProfile.other_fixed_s`, the same on any
  GPU: a flat launch-bound part), ``e`` the elements each token's elementwise operators
  read and write on one GPU
  (:func:`~sim.cost.work.elementwise_work`: norms and residual adds on the whole hidden
  vector, rotary and the MLP activation on this GPU's share), counting the residual adds
  the profile timed (:attr:`~sim.cost.profile.OperatorProfile.other_residual_adds`).
  Without a fixed part, ``profile(N × (e_t / e_p) × (bandwidth_p / bandwidth_t))``: the
  flat part is kept whole. Held against Vidur's tables at tp 2-8, on another model and on
  the H100, that is within +1% to +14% at 513-4,096 tokens, where the rule it replaced
  (``N × hidden_t / hidden_p``, nothing split over tp or rescaled between GPUs) was +52%
  to +274% high; but +28% to +55% high at 1-64 tokens on Llama-2-7B's tp 2-8 shards,
  -2.6% to -9.1% with the fixed part (``docs/validation/profile-transfer.md``);
- ``lm_head`` (when not profiled on the target): the LM head's roofline at the linear
  operator's achieved fraction for the same row count;
- attention, when the profile has none (Vidur's tables): the roofline's attention at the
  profile's achieved fractions, memory = the linear operator's at its smallest token count
  (a weight stream), compute = at its largest; the stack's per-block gather and last-block
  waste come on top. With kvlab's ``attn_decode`` rows: per sequence count, time is
  piecewise linear through the measured points in per-sequence context (made
  non-decreasing), interpolated linearly over sequence counts, rescaled by K/V bytes per
  token and bandwidth when transferred. The points fill whole blocks, so the stack's
  gather adjusts for a block size other than the profiled one, and where the kernel reads
  whole blocks (a block-granular stack, or a profile of the engine's torch backend,
  :data:`~sim.cost.profile.WHOLE_BLOCK_BACKENDS`) each sequence's unfilled last block is
  priced as read (``docs/validation/cpu-engine.md``: a half-filled block costs about what a
  full one does). (A least-squares line per count, the earlier model,
  mispriced the CPU engine's short contexts: ``docs/validation/cpu-engine.md``.)
  Decode sequences are priced at the step's mean context (BatchShape keeps sums), so a
  step of a few long contexts and one short one is priced as equal contexts, and on a
  profile where more sequences run more efficiently it can come out cheaper than the long
  ones alone (a cost audit: 5 × 2,900 tokens then a sixth of 200, -5.8% on the H200
  profile). This is not mended, because it cannot be from sums: a price that never falls
  when a sequence joins must price 6 sequences of 2,417 tokens at least as high as 5 of
  2,900, which such a profile measured lower. What holds, with the curves transferred: a
  longer prompt, or more context at a fixed sequence count, never costs less; used as
  measured, the measured dips are kept (above). ``attn_prefill``: prefill chunks
  of the length from position 0 with the chunks' mean causal pairs
  (:func:`prefill_equivalent_length`; a chunk after a cached prefix attends to it),
  rescaled by FLOPs per pair and peak when transferred.

A profile is priced only at the dtype width it was measured in (its sidecar's ``dtype``).
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from core.model_spec import DTYPE_BYTES
from core.plan import BatchShape
from sim.catalog import GPUSpec, ModelSpec, get_gpu, get_model
from sim.cost.efficiency import Efficiency
from sim.cost.overhead import Stack, describe_stack, extra_kv_tokens
from sim.cost.profile import (
    WHOLE_BLOCK_BACKENDS,
    LayerShape,
    OperatorProfile,
    attention_backend,
    is_profile_set,
    read_profile,
    read_profile_set,
    shown_path,
)
from sim.cost.roofline import RooflineCostModel
from sim.cost.work import lm_head_work

log = logging.getLogger(__name__)

DENSE_TOKENS = 8192  # token counts priced by table lookup; larger ones are computed
# A profile with no fixed part whose layer holds more than this many times the target's
# matmul weights per GPU priced the target's matmuls at 1-64 tokens 0.6-39% low on Vidur's
# A100 tables (16 pairs; docs/validation/profile-transfer.md, shard_matrix.csv): the fixed
# part of a small matrix's time weighs more, which the plain roofline ratio does not carry.
# With a fixed part fitted on the other model's tables, every pair was within -6.5..+6.7%.
SMALL_SHARD_RATIO = 2.8
_MEMO_LIMIT = 1 << 16  # prefill lengths remembered before the memo starts over


def interp_points(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Piecewise-linear through the points, linear extrapolation past both ends, >= 0.

    Below the first point the line runs through the first two. Past the last point its slope
    is the least-squares slope over the top half of the measured range (``xp >= xp[-1] / 2``,
    at least the last two points), never negative: the last two points alone carry their
    noise into every larger size (Vidur's A100 linear rows at 4064 and 4096 tokens fall by
    0.1%, which made steps past 4096 tokens cheaper the larger they were)."""
    y = np.interp(x, xp, fp)
    if len(xp) > 1:
        lo, hi = x < xp[0], x > xp[-1]
        y = np.where(lo, fp[0] + (x - xp[0]) * (fp[1] - fp[0]) / (xp[1] - xp[0]), y)
        if hi.any():
            y = np.where(hi, fp[-1] + (x - xp[-1]) * _top_slope(xp, fp), y)
    return np.maximum(y, 0.0)


def _top_slope(xp: np.ndarray, fp: np.ndarray) -> float:
    top = xp >= xp[-1] / 2
    if top.sum() < 2:
        top[-2:] = True
    xs, ys = xp[top], fp[top]
    dx = xs - xs.mean()
    return max(float((dx * (ys - ys.mean())).sum() / (dx * dx).sum()), 0.0)


def isotonic(y: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence nearest ``y`` in least squares (pool adjacent
    violators): a dip is replaced by the mean of the points it pools, so the fit is not
    biased up as a running maximum of noisy points is."""
    means: list[float] = []
    sizes: list[int] = []
    for value in map(float, y):
        means.append(value)
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            n = sizes[-2] + sizes[-1]
            means[-2:] = [(means[-2] * sizes[-2] + means[-1] * sizes[-1]) / n]
            sizes[-2:] = [n]
    return np.repeat(means, sizes)


def prefill_equivalent_length(shape: BatchShape) -> float:
    """The length of a prefill from position 0 with as many causal (query, key) pairs as the
    step's mean prefill chunk, ``L (L + 1) / 2 = prefill_attn_pairs / prefill_seqs``: the
    profile's ``attn_prefill`` rows are whole prompts from position 0, and a chunk after a
    cached prefix (chunked prefill, a prefix-cache hit) attends to every cached key too.
    Prefill attention is compute-bound, so pairs, not new tokens, set its time; a chunk
    after a long prefix also reads that prefix's K/V, which this does not add. Without
    pairs (a shape that does not count them) the mean new tokens per chunk."""
    if shape.prefill_attn_pairs <= 0:
        return shape.prefill_tokens / shape.prefill_seqs
    pairs = shape.prefill_attn_pairs / shape.prefill_seqs
    return (math.sqrt(1.0 + 8.0 * pairs) - 1.0) / 2.0


def small_shard_note(profiled_weights: float, target_weights: float) -> str | None:
    """A warning, for a profile with no fixed part (``linear_fixed_s`` 0), when the profiled
    layer's matmul weights per GPU exceed the target's by more than
    :data:`SMALL_SHARD_RATIO` (a small model, or a high tp), else None."""
    ratio = profiled_weights / target_weights
    if ratio <= SMALL_SHARD_RATIO:
        return None
    return (
        f"the profiled layer holds {profiled_weights / 1e6:.0f} M matmul weights per GPU, "
        f"{ratio:.1f}x the target's {target_weights / 1e6:.0f} M, and the profile gives no "
        "fixed part of its matmul time (linear_fixed_s); on Vidur's A100 tables such "
        "transfers (ratios 2.8-28) priced matmuls at 1-64 tokens 0.6-39% low (see "
        "docs/validation/profile-transfer.md): give the profile a fixed part, profile the "
        "target's own shard, or give cost.profile a directory of profiles to choose the "
        "nearest shard from"
    )


ALL_REDUCE_FACTORS = ("allreduce_latency_s", "peer_link_efficiency")
# A fixed time added to every non-empty step (a sensitivity knob, not measured: the
# reproduction's appendix asks what unmodelled time per step would do)
ADDED_TIME_FACTORS = ("per_step_overhead_s",)


def all_reduce_factors(
    prof: OperatorProfile, overrides: dict[str, float] | None = None
) -> tuple[dict[str, float], dict[str, str]]:
    """The efficiency factors of the all-reduce, and their source texts: ``prof``'s
    measured latency and achieved fraction of the peer link, used as they are at every tp
    and on every GPU (the latency whole, the fraction of the target's own peer link), each
    replaced by ``overrides`` (the run's config; a ValueError for any other factor). Two
    empty dicts when the profile has no measurement and nothing is overridden."""
    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    if prof.allreduce_latency_s != 0 or prof.peer_link_efficiency != 1:
        values = {"allreduce_latency_s": prof.allreduce_latency_s,
                  "peer_link_efficiency": prof.peer_link_efficiency}  # fmt: skip
        where = (
            f"measured on {prof.gpu}, used at every tp and on every GPU: "
            f"{prof.allreduce_source or 'the profile sidecar (no source given)'}"
        )
        sources = dict.fromkeys(values, where)
    for key, value in (overrides or {}).items():
        if key not in ALL_REDUCE_FACTORS:
            raise ValueError(
                f"cost=profiled takes no efficiency override {key!r} (its operator speeds "
                f"are the profile's); {', '.join((*ALL_REDUCE_FACTORS, *ADDED_TIME_FACTORS))} "
                "only"
            )
        values[key] = value
        sources[key] = "set in the run's config (cost group)"
    return values, sources


def profiled_layer(prof: OperatorProfile) -> LayerShape:
    """The decoder layer ``prof`` measured: its catalog model's, or the shape it carries."""
    shape = _layer_of(get_model(prof.model)) if prof.model else prof.layer_shape
    assert shape is not None
    return shape


def shard_weights(prof: OperatorProfile) -> float:
    """Matmul weights of the profiled layer on one GPU of the profile's tp."""
    return profiled_layer(prof).work_per_gpu(prof.tp)[0]


def nearest_shard(
    profiles: list[OperatorProfile], target: LayerShape, tp: int, gpu: str
) -> OperatorProfile:
    """The profile to transfer to ``target`` at ``tp`` on ``gpu``: among those measured on
    ``gpu`` (all, when none was), the one whose layer holds per GPU the matmul weights
    nearest the target's, by ratio; a tie goes to the first listed. Without fixed parts a
    profile carries best to shards of about its own size (``docs/validation/
    profile-transfer.md``: within 1.4x, 1-64-token matmuls -8% to +9% on Vidur's A100
    tables; more than 2.8x apart, up to -39% / +63%); with them, every pair there was
    within -6.5% to +6.7%, and the nearest shard matters less."""
    weights = target.work_per_gpu(tp)[0]

    def on_gpu(prof: OperatorProfile) -> bool:
        try:
            return get_gpu(prof.gpu).name == gpu
        except KeyError:
            return False

    pool = [p for p in profiles if on_gpu(p)] or profiles
    return min(pool, key=lambda p: abs(math.log(shard_weights(p) / weights)))


def _layer_of(spec: ModelSpec) -> LayerShape:
    return LayerShape(
        spec.hidden_size, spec.q_size, spec.kv_size, spec.ffn_hidden_size, spec.gated_mlp,
        spec.head_dim, spec.num_heads, rotary=spec.family == "llama",
    )  # fmt: skip


class ProfiledCostModel:
    """Step time of ``model`` on ``tp`` × ``gpu`` from ``profile``; see the module doc.
    ``efficiency_overrides`` sets ``allreduce_latency_s`` and ``peer_link_efficiency`` in
    place of the profile's all-reduce measurement, and ``per_step_overhead_s``, seconds added
    to every non-empty step (a ValueError for any other factor)."""

    def __init__(
        self,
        profile: OperatorProfile | str | Path,
        model: ModelSpec | str,
        gpu: GPUSpec | str,
        tp: int = 1,
        dtype_bytes: int = 2,
        block_size: int = 16,
        stack: str | Stack | None = None,
        as_measured: bool = False,
        efficiency_overrides: dict[str, float] | None = None,
    ) -> None:
        self.model = m = get_model(model)
        self.gpu = g = get_gpu(gpu)
        self.tp = tp
        self.chosen_from: str | None = None  # the set the profile was chosen from
        layer_t = _layer_of(m)
        if isinstance(profile, OperatorProfile):
            prof = profile
        elif is_profile_set(profile) and not as_measured:
            candidates = read_profile_set(profile)
            prof = nearest_shard(candidates, layer_t, tp, g.name)
            self.chosen_from = f"{len(candidates)} profiles in {shown_path(Path(profile))}"
        else:
            prof = read_profile(profile, tp)
        self.profile = prof
        if as_measured:
            # the profile was taken on the device being modelled, whatever ``gpu`` is called
            # (a CPU has no hardware entry): its times are used as they are
            if prof.model != m.name or prof.tp != tp:
                raise ValueError(
                    f"{prof.source}: measured on {prof.model} at tp {prof.tp}; using it as "
                    f"measured needs {m.name} at tp {tp}"
                )
            try:
                named = get_gpu(prof.gpu).name
            except KeyError:
                named = None  # a CPU, or a device name the catalog does not know
            if named is not None and named != g.name:
                raise ValueError(
                    f"{prof.source}: measured on {named}; using it as measured needs {g.name}"
                )
            gp = g
        else:
            try:
                gp = get_gpu(prof.gpu)
            except KeyError as exc:
                raise ValueError(
                    f"{prof.source}: measured on {prof.gpu!r}, which has no hardware entry to "
                    f"price from ({exc.args[0]})"
                ) from None
        measured_in = prof.meta.get("dtype")  # None: not recorded, nothing to check
        if measured_in is not None and str(measured_in) not in DTYPE_BYTES:
            raise ValueError(
                f"{prof.source}: measured in dtype {measured_in!r}, none kvlab prices "
                f"({', '.join(DTYPE_BYTES)})"
            )
        if measured_in is not None and DTYPE_BYTES[str(measured_in)] != dtype_bytes:
            raise ValueError(
                f"{prof.source}: measured in {measured_in} ({DTYPE_BYTES[str(measured_in)]} bytes "
                f"an element); the run prices {dtype_bytes}-byte elements (cost.dtype_bytes): "
                "profile at the run's dtype, set cost.dtype_bytes to match, or price it with "
                "cost=roofline"
            )
        ref = profiled_layer(prof)
        same_layer = prof.model == m.name or (prof.model is None and ref == layer_t)
        # the profile's device by its numbers too: a run that overrides a number of the
        # same-named GPU (hardware.mem_bandwidth_gbs=...) prices another device
        same_device = gp.name == g.name and (gp.mem_bandwidth, gp.peak_flops) == (
            g.mem_bandwidth,
            g.peak_flops,
        )
        self.same = as_measured or (same_layer and same_device and prof.tp == tp)
        p_t, act_t = layer_t.work_per_gpu(tp)
        p_p, act_p = ref.work_per_gpu(prof.tp)
        known_fixed = prof.linear_fixed_s > 0
        self.transfer_note = None if self.same or known_fixed else small_shard_note(p_p, p_t)
        if self.transfer_note:
            log.warning("cost=profiled: %s", self.transfer_note)

        def roof(params: float, act: float, spec: GPUSpec, n: np.ndarray) -> np.ndarray:
            return np.maximum(
                2 * params * n / spec.peak_flops,
                (params + n * act) * dtype_bytes / spec.mem_bandwidth,
            )

        n_lin, _, t_lin = prof.ops["linear"]
        n_oth, _, t_oth = prof.ops["other"]
        self._achieved = roof(p_p, act_p, gp, n_lin) / t_lin  # fraction of the roofline
        lm_params, lm_act = lm_head_work(m, tp)
        # Each curve is a set of points interpolated by ``interp_points``. Used as measured,
        # the profile's own; otherwise transferred at the profile's token counts, then made
        # non-decreasing (:func:`isotonic`): a dip between two counts is the profiled
        # kernels' choice on that model and GPU (or noise), not a property of the target's.
        if self.same:
            lin_pts, oth_x, oth_pts = t_lin, n_oth, t_oth
        else:
            # Each op's fixed part stays whole; the rest scales with the layer's size on one
            # GPU. Between GPUs a fixed part moves as the op's small-batch time does without
            # it, so a same-shard transfer to another GPU at small batches does not depend
            # on it: the matmuls' by the bandwidth ratio (a weight stream; where they are
            # compute-bound the rest moves by the peak ratio instead), the elementwise
            # operators' not at all (their launch-bound flat part stays flat; the rest moves
            # along the token axis by bandwidth).
            bw_ratio = gp.mem_bandwidth / g.mem_bandwidth
            fixed = prof.linear_fixed_s
            ratio_t = roof(p_t, act_t, g, n_lin) / roof(p_p, act_p, gp, n_lin)
            lin_pts = isotonic(fixed * bw_ratio + (t_lin - fixed) * ratio_t)
            adds = prof.other_residual_adds
            e_ratio = layer_t.elementwise_per_gpu(tp, adds) / ref.elementwise_per_gpu(prof.tp, adds)
            fixed = prof.other_fixed_s
            if fixed > 0:
                oth_x = n_oth / bw_ratio
                oth_pts = isotonic(fixed + (t_oth - fixed) * e_ratio)
            else:  # no fixed part known: along the token axis alone, the flat part kept
                oth_x = n_oth / (e_ratio * bw_ratio)
                oth_pts = isotonic(t_oth)
        if self.same and "lm_head" in prof.ops:
            lm_x, _, lm_pts = prof.ops["lm_head"]
        else:  # the LM head's roofline at the linear operator's achieved fraction
            lm_x = n_lin
            lm_pts = isotonic(roof(lm_params, lm_act, g, n_lin) / self._achieved)

        self._op_points = {"linear": (n_lin, lin_pts), "other": (oth_x, oth_pts)}

        def layer_s(n: np.ndarray) -> np.ndarray:
            return m.num_layers * (
                self.layer_op_seconds("linear", n) + self.layer_op_seconds("other", n)
            )

        def lm_head_s(rows: np.ndarray) -> np.ndarray:
            return interp_points(rows, lm_x, lm_pts)

        self._layer_fn, self._lm_fn = layer_s, lm_head_s
        dense = np.arange(DENSE_TOKENS + 1, dtype=float)
        self._layer = [0.0, *layer_s(dense[1:]).tolist()]
        self._lm = [0.0, *lm_head_s(dense[1:]).tolist()]
        mem = float(min(1.0, self._achieved[0]))
        comp = float(min(1.0, self._achieved[-1]))
        overrides = dict(efficiency_overrides or {})
        added = {k: overrides.pop(k) for k in ADDED_TIME_FACTORS if k in overrides}
        all_reduce, all_reduce_sources = all_reduce_factors(prof, overrides)
        eff = Efficiency().with_values(
            {
                "compute": f"achieved fraction of the roofline of the profile's linear "
                f"operator at its largest token count ({int(n_lin[-1])}): {prof.source}",
                "memory": f"achieved fraction of the roofline of the profile's linear "
                f"operator at its smallest token count ({int(n_lin[0])}): {prof.source}",
                **all_reduce_sources,
                **dict.fromkeys(added, "set in the run's config (cost group): added to every "
                                "step beyond the profile's operators and the stack's CPU time"),
            },
            compute=comp,
            memory=mem,
            **all_reduce,
            **added,
        )  # fmt: skip
        self.roofline = RooflineCostModel(m, g, tp, dtype_bytes, eff, block_size, stack)
        self.stack = self.roofline.stack
        self.block_size = block_size
        self._decode = self._decode_curves(prof, m, g, gp, ref, tp)
        self._prefill = self._prefill_table(prof, m, g, gp, ref, tp)
        self.whole_blocks = self.stack.block_granular or (
            attention_backend(prof.meta) in WHOLE_BLOCK_BACKENDS
        )
        self._kernel = replace(self.stack, block_granular=self.whole_blocks)
        self._decode_memo: dict[tuple[int, int], float] = {}
        self._prefill_memo: dict[float, float] = {}

    def layer_op_seconds(self, op: str, tokens: np.ndarray) -> np.ndarray:
        """Seconds of one decoder layer's ``op`` (``linear`` or ``other``, the profile's two
        token operators) for each of ``tokens`` rows on one GPU of the target, as priced:
        the profile's points as measured or transferred (module doc), interpolated."""
        if op not in self._op_points:
            raise ValueError(f"op must be 'linear' or 'other', got {op!r}")
        xs, ys = self._op_points[op]
        return interp_points(np.asarray(tokens, dtype=float), xs, ys)

    def _decode_curves(
        self, prof: OperatorProfile, m: ModelSpec, g: GPUSpec, gp: GPUSpec,
        ref: LayerShape, tp: int,
    ) -> tuple[list[int], list[tuple[np.ndarray, np.ndarray]]] | None:  # fmt: skip
        """Per profiled sequence count, ascending: (per-sequence contexts, seconds of all
        layers of the target), the times made non-decreasing in context (a running
        maximum: a later point measured faster is noise, not a cheaper context) and in the
        count at equal per-sequence context (each curve at least the one below it at its
        own points and the lower curve's points inside its range: one more sequence of
        the same context is never cheaper)."""
        if "attn_decode" not in prof.ops:
            return None
        n, c, t = prof.ops["attn_decode"]
        scale = float(m.num_layers)
        if not self.same:
            kv_t = 2 * _layer_of(m).kv_width_per_gpu(tp)
            kv_p = 2 * ref.kv_width_per_gpu(prof.tp)
            scale *= (kv_t / kv_p) * (gp.mem_bandwidth / g.mem_bandwidth)
        counts: list[int] = []
        curves: list[tuple[np.ndarray, np.ndarray]] = []
        for s in np.unique(n):
            sel = n == s
            per_seq, secs = c[sel] / s, np.maximum.accumulate(t[sel]) * scale
            if len(per_seq) == 1:  # one point: proportional to context
                per_seq, secs = np.array([0.0, per_seq[0]]), np.array([0.0, secs[0]])
            if curves:
                below_x, below_y = curves[-1]
                inside = below_x[(below_x > per_seq[0]) & (below_x < per_seq[-1])]
                grid = np.union1d(per_seq, inside)
                secs = np.maximum(interp_points(grid, per_seq, secs),
                                  interp_points(grid, below_x, below_y))  # fmt: skip
                per_seq = grid
            counts.append(int(s))
            curves.append((per_seq, secs))
        return counts, curves

    def _prefill_table(
        self, prof: OperatorProfile, m: ModelSpec, g: GPUSpec, gp: GPUSpec,
        ref: LayerShape, tp: int,
    ) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
        if "attn_prefill" not in prof.ops:
            return None
        n, _, t = prof.ops["attn_prefill"]
        scale = float(m.num_layers)
        if not self.same:
            t = isotonic(t)  # as the linear curves: a dip is the profiled kernel's, not ours
            heads_t, heads_p = m.num_heads // tp, ref.num_heads // prof.tp
            scale *= (heads_t * m.head_dim) / (heads_p * ref.head_dim)
            scale *= gp.peak_flops / g.peak_flops
        return n, t * scale

    def _decode_table_s(self, seqs: int, per_seq: float) -> float:
        """Decode attention seconds of ``seqs`` sequences of ``per_seq`` context each:
        piecewise linear in context along each profiled sequence count (linear past the
        ends), linear in the count between the two profiled counts around ``seqs``, in
        proportion to it beyond them."""
        assert self._decode is not None
        counts, curves = self._decode

        def at(i: int) -> float:
            xs, ys = curves[i]
            return float(interp_points(np.array([per_seq]), xs, ys)[0])

        if seqs <= counts[0]:
            return at(0) * seqs / counts[0]
        if seqs >= counts[-1]:
            return at(-1) * seqs / counts[-1]
        hi = bisect.bisect_left(counts, seqs)
        if counts[hi] == seqs:
            return at(hi)
        w = (seqs - counts[hi - 1]) / (counts[hi] - counts[hi - 1])
        return (1 - w) * at(hi - 1) + w * at(hi)

    def _prefill_seq_s(self, length: float) -> float:
        """Attention seconds of one prefill of ``length`` tokens from position 0,
        interpolated in the profile; memoised by ``length`` (bounded)."""
        hit = self._prefill_memo.get(length)
        if hit is None:
            assert self._prefill is not None
            n, tt = self._prefill
            hit = float(interp_points(np.array([length]), n, tt)[0])
            if len(self._prefill_memo) >= _MEMO_LIMIT:
                self._prefill_memo.clear()
            self._prefill_memo[length] = hit
        return hit

    def _extra_tokens(self, seqs: int, ctx: int) -> float:
        """K/V tokens beyond ``ctx`` at which to price the decode attention of ``seqs``
        sequences. The profile's points fill whole blocks (kvlab's plans: per-sequence
        contexts 16 … 2048 at block 16), so they hold the stack's gather for ``ctx /
        profiled block`` blocks and no unfilled last block. Added: the gather of the blocks
        this block size reads beyond those and, where the kernel priced reads whole blocks
        (:attr:`whole_blocks`), each sequence's unfilled last block."""
        bs_p = self.profile.block_size or self.block_size
        return (
            extra_kv_tokens(self._kernel, seqs, ctx, self.block_size)
            - self.stack.gather_tokens_per_block * ctx / bs_p
        )

    def _decode_attn_s(self, seqs: int, ctx: int) -> float:
        """Memoised by ``(seqs, ctx)`` (bounded): the same floats, without the
        interpolations every step."""
        hit = self._decode_memo.get((seqs, ctx))
        if hit is None:
            hit = max(self._decode_table_s(seqs, (ctx + self._extra_tokens(seqs, ctx)) / seqs), 0.0)
            if len(self._decode_memo) >= _MEMO_LIMIT:
                self._decode_memo.clear()
            self._decode_memo[(seqs, ctx)] = hit
        return hit

    def decode_attention_seconds(self, shape: BatchShape) -> float:
        """The part of :meth:`gpu_seconds` that is ``shape``'s decode attention: 0 without
        decodes, or when the profile has no attention rows at all (attention is then the
        roofline's, not priced apart); the roofline's when it has prefill rows only."""
        seqs, ctx = shape.decode_seqs, shape.decode_ctx_tokens
        if not seqs or (self._decode is None and self._prefill is None):
            return 0.0
        if self._decode is None:
            return self.roofline.gpu_parts(BatchShape(decode_seqs=seqs, decode_ctx_tokens=ctx))[1]
        return self._decode_attn_s(seqs, ctx)

    def _attention_s(self, shape: BatchShape) -> float:
        """Attention seconds: the profile's decode and prefill tables where it has them,
        each missing one priced by the roofline (both missing: the roofline's attention of
        the whole step)."""
        if self._decode is None and self._prefill is None:
            return self.roofline.gpu_parts(shape)[1]
        t = 0.0
        if shape.decode_seqs and self._decode is not None:  # the per-step path: memoised
            t += self._decode_attn_s(shape.decode_seqs, shape.decode_ctx_tokens)
        elif shape.decode_seqs:
            t += self.decode_attention_seconds(shape)
        if shape.prefill_seqs:
            if self._prefill is not None:
                t += shape.prefill_seqs * self._prefill_seq_s(prefill_equivalent_length(shape))
            else:
                t += self.roofline.gpu_parts(BatchShape(
                    prefill_tokens=shape.prefill_tokens, prefill_seqs=shape.prefill_seqs,
                    prefill_attn_pairs=shape.prefill_attn_pairs,
                    prefill_kv_read_tokens=shape.prefill_kv_read_tokens))[1]  # fmt: skip
        return t

    def gpu_seconds(self, shape: BatchShape) -> float:
        """Operator seconds of a step (no transfers, no CPU)."""
        tokens = shape.prefill_tokens + shape.decode_seqs
        if not tokens:
            return 0.0
        rows = shape.prefill_seqs + shape.decode_seqs
        if tokens <= DENSE_TOKENS:
            lin = self._layer[tokens] + self._lm[rows]
        else:
            lin = float(self._layer_fn(np.array([float(tokens)]))[0])
            lin += float(self._lm_fn(np.array([float(rows)]))[0])
        return lin + self._attention_s(shape) + self.roofline.allreduce_time(tokens)

    def step_time(self, shape: BatchShape) -> float:
        """Seconds for one step; 0 for an empty shape."""
        return self.roofline.finish(self.gpu_seconds(shape), shape)

    def config(self) -> dict[str, Any]:
        rf = self.roofline
        return {
            "kind": "profiled",
            "model": self.model.name,
            "gpu": self.gpu.name,
            "tp": self.tp,
            "block_size": self.block_size,
            "stack": self.stack.name,
            "profile": self.profile.source,
            "chosen_from": self.chosen_from,
            "transferred": not self.same,
            "linear_fixed_s": self.profile.linear_fixed_s,
            "other_fixed_s": self.profile.other_fixed_s,
            "allreduce_latency_s": self.roofline.efficiency.allreduce_latency_s,
            "peer_link_efficiency": self.roofline.efficiency.peer_link_efficiency,
            "dtype_bytes": rf.dtype_bytes,
        }

    def describe(self) -> str:
        prof = self.profile
        how = "used as measured" if self.same else (
            f"transferred from {prof.model or 'the profiled layer shape'} on {prof.gpu} "
            f"(tp {prof.tp}): matmuls by the roofline ratio at each token count"
            + (f" beyond a fixed part ({prof.linear_fixed_source or 'its sidecar'})"
               if prof.linear_fixed_s > 0 else "")
            + ", elementwise operators by the elements a token moves on one GPU and memory "
            "bandwidth"
            + (f" beyond a fixed part ({prof.other_fixed_source or 'its sidecar'})"
               if prof.other_fixed_s > 0 else "")
        )  # fmt: skip
        n, _, _ = prof.ops["linear"]
        pts = [1, 16, 64, 256, 1024, 4096]
        frac = interp_points(np.array(pts, dtype=float), n, self._achieved)
        curve = ", ".join(f"{p}: {f:.2f}" for p, f in zip(pts, frac, strict=True))
        attn = {
            (True, True): "profiled",
            (True, False): "decode profiled, prefill by the roofline at the efficiencies below",
            (False, True): "prefill profiled, decode by the roofline at the efficiencies below",
            (False, False): "roofline at the efficiencies below",
        }[(self._decode is not None, self._prefill is not None)]
        if self._decode is not None and self.whole_blocks:
            attn += (
                "; decode at whole blocks (each sequence's unfilled last block read: "
                + ("the stack's kernel)" if self.stack.block_granular else
                   f"the profile's {attention_backend(prof.meta)} backend)")
            )  # fmt: skip
        chosen = (
            f"; chosen by the nearest shard size from {self.chosen_from}"
            if self.chosen_from
            else ""
        )
        lines = [
            f"profiled cost model: {self.model.name} on {self.tp} × {self.gpu.name} "
            f"(block {self.block_size})",
            f"  profile: {prof.source}; {how}{chosen}",
            f"  linear operator, achieved fraction of roofline by tokens/step: {curve}",
            f"  attention: {attn}",
            self.roofline.describe_hardware(),
            self.roofline.efficiency.describe(),
            describe_stack(self.stack),
        ]
        if self.transfer_note:
            lines.insert(2, f"  note: {self.transfer_note}")
        return "\n".join(lines)
