"""Operator profile of kvlab's engine on one GPU, the table the simulator's ``cost=profiled``
interpolates: ``python -m experiments.bench.profile_gpu --out DIR [--dry | --cpu]
[--model NAME] [--block-size B]``.

Format ``kvlab-operator-profile/1``, two files in ``DIR``:

- ``operator_profile.csv``, columns
  ``op,num_tokens,context_tokens,time_ms,sweeps_ms,sweep_units``: one row per measured
  point, sorted by op, then num_tokens, then context_tokens; ``time_ms`` is
  the median GPU time in milliseconds, over the sweeps when ``--passes`` > 1 (their mean with
  ``--single-calls``); ``sweeps_ms`` each sweep's time in sweep order, ``;``-separated;
  ``sweep_units`` where in each sweep the point was timed (its unit's position, from 0; the
  four ops of a point timed in one forward share one), so a drift within a sweep can be
  located (readers need only the first four columns). Ops (per decoder layer unless stated):

  - ``linear``: all the decoder layer's matmuls (QKV, O, MLP, biases included) for
    ``num_tokens`` token rows; ``context_tokens`` 0;
  - ``other``: the rest of the layer for ``num_tokens`` rows: norms, activation, residual
    adds, rotary embedding (Llama); ``context_tokens`` 0;
  - ``attn_prefill``: causal prefill attention of one sequence of ``num_tokens`` tokens
    (``context_tokens`` = ``num_tokens``), K/V store included;
  - ``attn_decode``: paged decode attention of ``num_tokens`` sequences whose contexts
    (equal within the batch) sum to ``context_tokens``, K/V store included, through the
    Triton kernels at the sidecar's block size;
  - ``lm_head``: logits for ``num_tokens`` rows, whole model (not per layer);
    ``context_tokens`` 0.

- ``operator_profile.json``, the sidecar: ``{"format": "kvlab-operator-profile/1", "model",
  "gpu" (device name), "dtype", "tp": 1, "block_size", "date", "command", "torch",
  "triton"}`` plus ``"dry"``, ``"method"`` and ``"complete"`` (false in the copy written
  after the token sweep, before the decode sweep); readers ignore keys they do not know.

What runs is kvlab's own code: one decoder layer and the LM head built by
``engine.models.build_model`` (seeded dummy weights), attention through the engine's
``triton`` backend (``kernels.store_kv`` + ``kernels.paged_attention``, split-KV chosen as
in the engine), block tables a random permutation of a shared cache. ``other`` is the same
layer's forward with every ``nn.Linear`` replaced by a preset output and attention by the
identity, so only the remaining operations launch kernels.

Sweep: ``num_tokens`` over powers of two 1 … 4096; decode batches of ``num_tokens``
sequences with per-sequence contexts 16 … 2048 (powers of two), totals up to 2^17 tokens.
Timing (``experiments.bench.timing``): CUDA events, warm-up then the median of repeats,
a ~0.5 ms GPU sleep before each repeat so host launch overhead is not timed, and a 256 MiB
write before each (cold L2). GPU default: OPT-13B's layer shape, fp16, block size 16 (the
engine runs' settings). ``--dry`` runs the same code on CPU under the Triton interpreter
with tiny-opt, fp32 and a small sweep; its times are meaningless and labelled so.
``--cpu`` measures this CPU as kvlab's CPU engine runs on it (one torch thread, the torch
attention backend, OPT-125M fp32 by default), by the calling thread's CPU time, every row
count from 1 to 64 (CPU GEMM time is not monotone in the rows there), decode batches of
1 … 64 sequences. Points of at most 64 tokens or sequences are timed inside the forward of
the whole model, each op summed over its layers (:mod:`experiments.bench.in_model`: the
cache state the engine's ops meet, neither warm nor cold); larger ones, whose time is
compute, one op at a time after a write of twice the last-level cache
(:func:`cpu_flush_bytes`). With ``--single-calls`` each sweep visits the points in its own
seeded random order, so that a drift of the machine's speed within a sweep does not fall
alike on neighbouring row counts (sorted, their errors were correlated: 0.64-0.73 between
adjacent points). The sidecar's
``gpu`` is ``cpu``; the simulator has no hardware entry for a CPU, so ``cost=profiled``
cannot transfer it, but
``experiments.calibrate RUN --profile DIR`` uses it as measured for runs of the same model
on the same machine and fits only the per-step terms on top (see
``docs/validation/cpu-engine.md``).
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from experiments.lib.args import OneLineParser, out_dir_problem
from experiments.lib.malloc import malloc_state, pin_malloc

FORMAT = "kvlab-operator-profile/1"
COLUMNS = ("op", "num_tokens", "context_tokens", "time_ms", "sweeps_ms", "sweep_units")
OPS = ("linear", "other", "attn_prefill", "attn_decode", "lm_head")


def format_sweeps(times_ms: list[float]) -> str:
    """A point's ``sweeps_ms`` cell: each sweep's time, in sweep order, ``;``-separated."""
    return ";".join(f"{x:.6g}" for x in times_ms)


def parse_sweeps(cell: object) -> list[float]:
    """The sweep times of a ``sweeps_ms`` cell (:func:`format_sweeps`'s inverse)."""
    return [float(x) for x in str(cell).split(";")]


def parse_units(cell: object) -> list[int]:
    """The per-sweep unit positions of a ``sweep_units`` cell."""
    return [int(x) for x in str(cell).split(";")]


@dataclass(frozen=True)
class ProfilePlan:
    """What to measure and how often (full on a GPU, tiny for ``--dry``)."""

    device: torch.device
    dry: bool
    model: str
    dtype: torch.dtype
    block_size: int
    token_counts: tuple[int, ...]  # num_tokens of every op; decode batch sizes too
    seq_contexts: tuple[int, ...]  # per-sequence contexts of decode batches
    max_context_tokens: int  # decode: largest total context
    repeats: int
    warmup: int
    flush_bytes: int
    sleep_cycles: int
    backend: str = "triton"  # the engine's attention backend the profile measures
    decode_batches: tuple[int, ...] = ()  # decode batch sizes; () = token_counts
    thread_clock: bool = False  # CPU: time the calling thread's CPU time, not wall time
    passes: int = 1  # sweeps over every point; a point's time summarises its sweeps
    across_sweeps: str = "median"  # how: "median" (robust), "mean" (a drifting machine's average)
    in_model_tokens: int = 0  # CPU: points of at most this many tokens timed in the forward
    # None: each sweep visits its points in sorted order; an int: each sweep in its own random
    # order, seeded by (order_seed, sweep), so a drift within a sweep falls on neighbouring
    # row counts independently instead of all alike
    order_seed: int | None = None
    # one unrecorded call of every point before the first sweep: a point's first call in a
    # process is cold (up to 4.9 times its other calls' median: experiments.bench.cold_sweep),
    # which a profile without warm-up calls would average in and read as the machine's speed
    warm_up_sweep: bool = False


# --cpu: every row count to 64 (CPU GEMM time is not monotone in rows there), then coarser
CPU_TOKENS = (*range(1, 65), 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def cpu_flush_bytes(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Bytes written before each timed CPU call so that it starts with a cold cache, as the
    engine's operators do (each layer's weights and K/V are evicted by the other layers'
    before they are read again): twice the last-level cache the kernel reports, 64 MiB when
    it reports none."""
    sizes = []
    for index in sysfs.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        if text[:-1].isdigit() and text[-1] in units:
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return 2 * max(sizes) if sizes else 64 << 20


def make_plan(
    dry: bool,
    model: str | None = None,
    block_size: int = 16,
    cpu: bool = False,
    passes: int = 1,
    single_calls: bool = False,
) -> ProfilePlan:
    """The plan of a GPU, ``dry`` or ``cpu`` profile. ``single_calls`` (CPU): each sweep times
    one call per point, with no warm-up, in its own seeded random order, and a point's time is
    the mean over the sweeps; every point is called once, unrecorded, before the first sweep
    (its first call in the process is cold): for many sweeps spread over a sitting whose
    machine drifts, so that each point samples the sitting as the runs' steps do, each call
    meets the cache another's work left, and neighbouring row counts meet the drift
    independently."""
    if cpu:
        repeats, warmup = (1, 0) if single_calls else (5, 1)
        return ProfilePlan(torch.device("cpu"), False, model or "opt-125m", torch.float32,
                           block_size, CPU_TOKENS, tuple(2**i for i in range(4, 12)), 2**15,
                           repeats, warmup, cpu_flush_bytes(), 0, backend="torch",
                           decode_batches=tuple(2**i for i in range(7)),
                           thread_clock=True, passes=passes, in_model_tokens=64,
                           across_sweeps="mean" if single_calls else "median",
                           order_seed=0 if single_calls else None,
                           warm_up_sweep=single_calls)  # fmt: skip
    if single_calls:
        raise ValueError("single calls per sweep are a CPU profile's (--cpu)")
    if dry:
        return ProfilePlan(torch.device("cpu"), True, model or "tiny-opt", torch.float32,
                           block_size, (1, 2, 4), (16, 32), 64, 2, 1, 0, 0,
                           passes=passes)  # fmt: skip
    return ProfilePlan(
        torch.device("cuda"), False, model or "opt-13b", torch.float16, block_size,
        tuple(2**i for i in range(13)), tuple(2**i for i in range(4, 12)), 2**17,
        30, 5, 256 << 20, 1_000_000, passes=passes,
    )  # fmt: skip


def decode_points(plan: ProfilePlan) -> list[tuple[int, int]]:
    """``(num_seqs, context_tokens)`` of every decode batch, in sorted order."""
    return [(n, n * c) for n in plan.decode_batches or plan.token_counts
            for c in plan.seq_contexts if n * c <= plan.max_context_tokens]  # fmt: skip


def cache_blocks(plan: ProfilePlan) -> int:
    """Blocks of the profiler's KV cache: enough for the largest total context or token
    count of ``plan`` at its block size."""
    return -(-max(plan.max_context_tokens, max(plan.token_counts)) // plan.block_size)


def blocks_short(plan: ProfilePlan) -> str | None:
    """Why ``plan``'s cache (:func:`cache_blocks`) cannot hold one of its decode batches, each
    sequence in whole blocks, naming the largest power-of-two block size that fits; None
    when every batch fits."""

    def worst(p: ProfilePlan) -> tuple[int, int, int]:
        return max((n * -(-(total // n) // p.block_size), n, total // n)
                   for n, total in decode_points(p))  # fmt: skip

    if not decode_points(plan):
        return None
    need, seqs, context = worst(plan)
    if need <= cache_blocks(plan):
        return None
    fits = [
        b
        for b in (2**i for i in range(plan.block_size.bit_length()))
        if worst(replace(plan, block_size=b))[0] <= cache_blocks(replace(plan, block_size=b))
    ]
    return (f"{plan.block_size} is too large for this profile: a decode batch of {seqs} "
            f"sequences of {context} tokens needs {need} blocks and the cache holds "
            f"{cache_blocks(plan)} (at most {max(fits, default=1)} here)")  # fmt: skip


class _PresetOutput(nn.Module):
    """Stands in for an ``nn.Linear``: returns rows of a preset tensor, launching nothing."""

    def __init__(self, out: torch.Tensor) -> None:
        super().__init__()
        self.out = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out[: x.shape[0]]


class _IdentityAttention:
    """Stands in for the attention backend: returns the queries, launching nothing."""

    name = "identity"

    def forward(self, q: torch.Tensor, *_: Any) -> torch.Tensor:
        return q


class Profiler:
    """One decoder layer, the LM head and a paged KV cache of ``plan.model`` on the device."""

    def __init__(self, plan: ProfilePlan) -> None:
        from dataclasses import replace

        from engine.attention.registry import get_backend
        from engine.config import check_engine_support
        from engine.models import build_model
        from engine.weights import init_dummy_weights
        from sim.catalog import get_model

        self.plan = plan
        self.config = replace(check_engine_support(get_model(plan.model)), num_layers=1)
        self.model = build_model(self.config, plan.backend, plan.dtype, plan.device)
        init_dummy_weights(self.model, seed=0)
        self.layer = self.model.decoder().layers[0]
        self.backend = get_backend(plan.backend)
        self.gen = torch.Generator(device=plan.device).manual_seed(0)
        rows = max(plan.token_counts)
        self.linears = [m for m in self.layer.modules() if isinstance(m, nn.Linear)]
        widths = {m.in_features for m in self.linears} | {self.config.embed_dim}
        self.inputs = {w: self._randn(rows, w) for w in widths}
        num_blocks = cache_blocks(plan)
        shape = (num_blocks, plan.block_size, self.config.num_kv_heads, self.config.head_dim)
        self.k_cache, self.v_cache = self._randn(*shape), self._randn(*shape)
        self.stub = self._stub_layer(rows)
        self.whole = None
        if plan.in_model_tokens:
            from experiments.bench.in_model import InModelTimer

            whole_model = replace(self.config, num_layers=get_model(plan.model).num_layers)
            self.whole = InModelTimer(
                whole_model, plan.backend, plan.dtype, num_blocks, plan.block_size
            )

    def _randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, device=self.plan.device).to(self.plan.dtype)

    def _stub_layer(self, rows: int) -> nn.Module:
        stub = copy.deepcopy(self.layer)
        for module in stub.modules():
            if hasattr(module, "backend"):
                module.backend = _IdentityAttention()
        for name, module in list(stub.named_modules()):
            if isinstance(module, nn.Linear):
                parent, _, attr = name.rpartition(".")
                out = self._randn(rows, module.out_features)
                setattr(stub.get_submodule(parent), attr, _PresetOutput(out))
        return stub

    def time(self, fn: Callable[[], object]) -> float:
        from experiments.bench.timing import time_ms

        p = self.plan
        clock = time.thread_time if p.thread_clock else time.perf_counter
        return time_ms(fn, p.device, p.repeats, p.warmup, p.flush_bytes, p.sleep_cycles, clock)

    def linear(self, tokens: int) -> float:
        xs = [(m, self.inputs[m.in_features][:tokens]) for m in self.linears]
        return self.time(lambda: [m(x) for m, x in xs])

    def other(self, tokens: int) -> float:
        x = self.inputs[self.config.hidden_size][:tokens]
        meta = self._meta([tokens], [tokens])
        args: tuple[Any, ...] = ((self.k_cache, self.v_cache), meta)
        if self.config.family == "llama":
            from engine.models.llama import rope_cos_sin

            positions = torch.arange(tokens, device=self.plan.device)
            cfg = self.config
            args = (rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, x.dtype), *args)
        return self.time(lambda: self.stub(x, *args))

    def attention(self, query_lens: list[int], context_lens: list[int]) -> float:
        cfg = self.config
        tokens = sum(query_lens)
        q = self._randn(tokens, cfg.num_heads, cfg.head_dim)
        k = self._randn(tokens, cfg.num_kv_heads, cfg.head_dim)
        v = self._randn(tokens, cfg.num_kv_heads, cfg.head_dim)
        meta = self._meta(query_lens, context_lens)
        scale = cfg.head_dim**-0.5
        fn = lambda: self.backend.forward(q, k, v, self.k_cache, self.v_cache, meta, scale)  # noqa: E731
        return self.time(fn)

    def in_model(self, query_lens: list[int], context_lens: list[int]) -> dict[str, float]:
        """Per-layer ``linear``, ``other`` and ``attn`` and the ``lm_head`` of these sequences,
        timed inside the whole model's forward (:mod:`experiments.bench.in_model`)."""
        assert self.whole is not None, "the plan measures nothing in the model"
        meta = self._meta(query_lens, context_lens)
        pairs = zip(query_lens, context_lens, strict=True)
        positions = torch.cat([torch.arange(c - q, c) for q, c in pairs])
        # a quick plan's contexts may pass a small model's positions; the lookup costs alike
        positions = positions.clamp(max=self.config.max_model_len - 1)
        return self.whole.time(meta, positions, self.plan.repeats, self.plan.warmup)

    def lm_head(self, tokens: int) -> float:
        hidden = self.inputs[self.config.embed_dim][:tokens]
        return self.time(lambda: self.model.compute_logits(hidden))

    def _meta(self, query_lens: list[int], context_lens: list[int]) -> Any:
        """Attention metadata of sequences with these lengths, each in randomly chosen blocks
        of the shared cache; the new tokens are the last ``query_lens[i]`` of each."""
        from engine.attention.metadata import AttentionMetadata

        bs, dev = self.plan.block_size, self.plan.device
        q_lens = torch.tensor(query_lens, device=dev)
        ctx = torch.tensor(context_lens, device=dev)
        per_seq = (ctx + bs - 1) // bs
        if int(per_seq.sum()) > self.k_cache.shape[0]:
            raise ValueError(
                f"contexts {context_lens} need more than {self.k_cache.shape[0]} blocks"
            )
        first = torch.cumsum(per_seq, 0) - per_seq  # each sequence's run in the permutation
        cols = torch.arange(int(per_seq.max()), device=dev)
        used = cols[None, :] < per_seq[:, None]
        perm = torch.randperm(self.k_cache.shape[0], generator=self.gen, device=dev)
        picks = perm[(first[:, None] + cols[None, :]).clamp(max=perm.numel() - 1)]
        tables = torch.where(used, picks, 0)
        starts = torch.cumsum(torch.cat([q_lens.new_zeros(1), q_lens]), 0)
        seq = torch.repeat_interleave(torch.arange(len(query_lens), device=dev), q_lens)
        pos = ctx[seq] - q_lens[seq] + torch.arange(int(starts[-1]), device=dev) - starts[seq]
        return AttentionMetadata(
            query_start_loc=starts.to(torch.int32),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=dev),
            block_tables=tables.to(torch.int32),
            slot_mapping=tables[seq, pos // bs] * bs + pos % bs,
            max_query_len=max(query_lens),
            max_context_len=max(context_lens),
        )


def measure(
    plan: ProfilePlan,
    log: Callable[[str], None] = print,
    partial: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every row of the profile (see the module doc), in sorted order. ``partial`` gets the
    rows measured so far (each point's median over the sweeps so far) after every sweep's
    token part and after every sweep but the last, so a run killed later keeps them."""
    from engine.engine import run_to_end  # imports triton: only after --dry set the interpreter

    return run_to_end(measuring(plan, log, partial))


def num_points(plan: ProfilePlan) -> int:
    """How many points :func:`measuring` measures, every sweep counted (its yields)."""
    return plan.passes * len(sweep_points(plan, 0))


def in_model(plan: ProfilePlan, tokens: int) -> bool:
    """Whether points of ``tokens`` tokens (or decode sequences) are timed inside the whole
    model's forward (one point gives all four token ops) rather than one op at a time."""
    return tokens <= plan.in_model_tokens


TOKEN_OPS = ("linear", "other", "attn_prefill", "lm_head")
IN_MODEL_OPS = {"attn": "attn_prefill"}  # Profiler.in_model's keys for a prefill's token ops


def _attention_ms(timed: float | dict[str, float]) -> float:
    """A decode point's attention time from ``Profiler.attention`` or ``.in_model``."""
    return timed["attn"] if isinstance(timed, dict) else timed


# One unit of a sweep: ("model", tokens, 0) times all four token ops in one forward;
# (op, tokens, 0) one token op alone; ("attn_decode", sequences, total context).
Point = tuple[str, int, int]


def sweep_points(plan: ProfilePlan, sweep: int) -> list[Point]:
    """The units of sweep ``sweep`` in the order it measures them: every token count (all four
    ops in one forward when :func:`in_model`, else each op alone), then every decode batch;
    shuffled by ``(plan.order_seed, sweep)`` when the plan has a seed."""
    points: list[Point] = []
    for t in plan.token_counts:
        if in_model(plan, t):
            points.append(("model", t, 0))
        else:
            points.extend((op, t, 0) for op in TOKEN_OPS)
    points.extend(("attn_decode", n, total) for n, total in decode_points(plan))
    if plan.order_seed is not None:
        order = np.random.default_rng((plan.order_seed, sweep)).permutation(len(points))
        points = [points[i] for i in order]
    return points


def point_rows(point: Point) -> list[tuple[str, int, int]]:
    """The profile's rows ``(op, num_tokens, context_tokens)`` that one unit of a sweep
    measures: the four token ops of a forward, or one op."""
    kind, tokens, total = point
    if kind == "attn_decode":
        return [(kind, tokens, total)]
    ops = TOKEN_OPS if kind == "model" else (kind,)
    return [(op, tokens, tokens if op == "attn_prefill" else 0) for op in ops]


def measuring(
    plan: ProfilePlan,
    log: Callable[[str], None] = print,
    partial: Callable[[list[dict[str, Any]]], None] | None = None,
) -> Generator[None, None, list[dict[str, Any]]]:
    """:func:`measure` a point at a time: yields after each measured point
    (:func:`num_points` in all) and returns the rows; between points the caller may run
    other work (``experiments.bench.interleave``). With ``plan.passes`` > 1 the whole sweep
    runs that many times and each point's time is the median of its sweeps (a sweep's
    point is measured in one burst, which a machine's momentary speed can sway).
    ``partial`` gets the rows so far after each sweep but the last and, in a sorted sweep,
    after its token part."""
    prof = Profiler(plan)
    times: dict[tuple[str, int, int], list[float]] = {}
    units: dict[tuple[str, int, int], list[int]] = {}  # each sweep's unit position of a point

    def add(op: str, tokens: int, context: int, ms: float, unit: int) -> None:
        if not (ms > 0 and ms < float("inf")):
            raise RuntimeError(f"{op} at {tokens} tokens, context {context}: time {ms} ms")
        times.setdefault((op, tokens, context), []).append(ms)
        units.setdefault((op, tokens, context), []).append(unit)

    def rows() -> list[dict[str, Any]]:
        """Each point measured so far, at the median (or mean: ``plan.across_sweeps``) of its
        sweeps (each kept, in order, in ``sweeps_ms``), in sorted order."""
        summary = np.mean if plan.across_sweeps == "mean" else np.median
        return sorted_rows([
            {"op": op, "num_tokens": t, "context_tokens": c, "time_ms": float(summary(ms)),
             "sweeps_ms": format_sweeps(ms), "sweep_units": ";".join(map(str, units[op, t, c]))}
            for (op, t, c), ms in times.items()
        ])  # fmt: skip

    if plan.warm_up_sweep:
        for point in sweep_points(plan, 0):
            time_point(prof, point)
    for sweep in range(plan.passes):
        last: dict[int, dict[str, float]] = {}  # this sweep's token ops by token count
        points = sweep_points(plan, sweep)
        token_units = sum(kind != "attn_decode" for kind, _, _ in points)
        for i, point in enumerate(points):
            kind, t, _ = point
            ms = time_point(prof, point)
            for op, tokens, context in point_rows(point):
                add(op, tokens, context, ms[op], i)
            if kind != "attn_decode":
                last.setdefault(t, {}).update(ms)
                done = last[t]
                if len(done) == len(TOKEN_OPS):
                    log(f"{t} tokens: linear {done['linear']:.4g} ms, other {done['other']:.4g}, "
                        f"prefill attention {done['attn_prefill']:.4g}, "
                        f"lm_head {done['lm_head']:.4g}")  # fmt: skip
            yield
            sorted_token_part_ends = plan.order_seed is None and i + 1 == token_units < len(points)
            if partial is not None and sorted_token_part_ends:
                partial(rows())
        if partial is not None and sweep < plan.passes - 1:
            partial(rows())
    return rows()


def time_point(prof: Profiler, point: Point) -> dict[str, float]:
    """Milliseconds of each op one unit of a sweep measures (:func:`point_rows`' ops)."""
    plan, (kind, t, total) = prof.plan, point
    with torch.inference_mode():
        if kind == "attn_decode":
            timed = prof.in_model if in_model(plan, t) else prof.attention
            return {kind: _attention_ms(timed([1] * t, [total // t] * t))}
        if kind == "model":
            by_op = prof.in_model([t], [t])
            return {IN_MODEL_OPS.get(op, op): value for op, value in by_op.items()}
        token_ops = {
            "linear": prof.linear,
            "other": prof.other,
            "attn_prefill": lambda n: prof.attention([n], [n]),
            "lm_head": prof.lm_head,
        }
        return {kind: token_ops[kind](t)}


def sorted_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` by op (in ``OPS`` order), then num_tokens, then context_tokens."""
    return sorted(rows, key=lambda r: (OPS.index(r["op"]), r["num_tokens"], r["context_tokens"]))


def sidecar(plan: ProfilePlan, argv: list[str]) -> dict[str, Any]:
    import triton

    if plan.device.type == "cpu":
        gpu = "cpu (Triton interpreter)" if plan.dry else "cpu"
    else:
        gpu = torch.cuda.get_device_name(plan.device)
    if plan.dry:
        method = "MEANINGLESS: dry run on CPU under the Triton interpreter"
    elif plan.device.type == "cpu":
        calls = (
            "one call per point and sweep, no warm-up"
            if (plan.repeats, plan.warmup) == (1, 0)
            else f"median of {plan.repeats} after {plan.warmup} warm-up calls"
        )
        if plan.warm_up_sweep:
            calls = calls.replace("no warm-up", "no warm-up but one unrecorded call of every "
                                  "point before the first sweep")  # fmt: skip
        method = (
            f"CPU: the calling thread's CPU time, one torch thread, {plan.backend} "
            f"attention, {calls}"
            + (f", {plan.flush_bytes >> 20} MiB written before each" if plan.flush_bytes else "")
        )
    else:
        method = (f"CUDA events, median of {plan.repeats} after {plan.warmup} warm-up calls, "
                  "launch overhead hidden, cold L2")  # fmt: skip
    if plan.in_model_tokens:
        method += (f"; points of at most {plan.in_model_tokens} tokens or decode sequences "
                   "timed inside the whole model's forward, summed over its layers (no write "
                   "before: the other layers evict each one's data)")  # fmt: skip
    if plan.passes > 1 and "sweeps" not in method:
        method += f"; {plan.across_sweeps} of {plan.passes} sweeps"
    if plan.order_seed is not None:
        method += f"; each sweep in its own random order (seed {plan.order_seed}, sweep)"
    if plan.device.type == "cpu" and not plan.dry:
        method += f"; malloc thresholds {malloc_state()}"
    return {
        "format": FORMAT,
        "model": plan.model,
        "gpu": gpu,
        "dtype": str(plan.dtype).removeprefix("torch."),
        "tp": 1,
        "block_size": plan.block_size,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m experiments.bench.profile_gpu", *argv]),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dry": plan.dry,
        "attention": plan.backend,
        "method": method,
    }


def write_profile(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Write ``operator_profile.csv`` and ``.json`` in ``out``, each atomically."""
    out.mkdir(parents=True, exist_ok=True)
    csv_tmp = out / "operator_profile.csv.tmp"
    with csv_tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({**r, "time_ms": f"{r['time_ms']:.6g}"} for r in rows)
    json_tmp = out / "operator_profile.json.tmp"
    json_tmp.write_text(json.dumps(meta, indent=2) + "\n")
    csv_tmp.replace(out / "operator_profile.csv")
    json_tmp.replace(out / "operator_profile.json")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m experiments.bench.profile_gpu", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry", action="store_true", help="tiny CPU run under the interpreter")
    mode.add_argument(
        "--cpu", action="store_true",
        help="real times on this CPU: one torch thread, thread CPU time, torch attention "
        "(kvlab's CPU engine settings; default model opt-125m, fp32)",
    )  # fmt: skip
    parser.add_argument(
        "--model", help="catalog model (default opt-13b; --cpu: opt-125m; --dry: tiny-opt)"
    )
    parser.add_argument("--block-size", type=int, default=16, help="KV block size (default 16)")
    parser.add_argument("--passes", type=int, default=1,
                        help="sweeps over every point, median per point (default 1)")  # fmt: skip
    parser.add_argument("--single-calls", action="store_true",
                        help="with --cpu: one call per point and sweep, no warm-up, the mean "
                        "over the sweeps (many sweeps spread over a drifting machine)")  # fmt: skip
    args_list = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(args_list)
    if args.dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module imports triton
    elif args.cpu:
        torch.set_num_threads(1)  # the thread clock counts only the calling thread
        pin_malloc()  # as the CPU engine's runs do (experiments.lib.malloc)
    elif not torch.cuda.is_available():
        parser.error("no CUDA device; use --dry for a CPU check of the script")
    if args.block_size < 1 or args.block_size & (args.block_size - 1):
        parser.error(f"--block-size must be a power of two, got {args.block_size}")
    problem = engine_model_problem(args.model or "opt-13b")
    if problem is not None:
        parser.error(problem)
    if args.passes < 1:
        parser.error(f"--passes must be >= 1, got {args.passes}")
    if args.single_calls and not args.cpu:
        parser.error("--single-calls needs --cpu")
    refused = out_dir_problem(args.out)
    if refused:
        parser.error(f"--out: {refused}")
    plan = make_plan(args.dry, args.model, args.block_size, cpu=args.cpu, passes=args.passes,
                     single_calls=args.single_calls)  # fmt: skip
    short = blocks_short(plan)
    if short:
        parser.error(f"--block-size {short}")
    meta = sidecar(plan, args_list)
    rows = measure(plan, partial=lambda r: write_profile(args.out, r, {**meta, "complete": False}))
    write_profile(args.out, rows, {**meta, "complete": True})
    from experiments.bench.tables import print_table

    note = " (dry: times meaningless)" if plan.dry else " (CPU thread time)" if args.cpu else ""
    print_table(f"operator profile, {plan.model}, ms{note}", _wide(rows))
    print(f"wrote {args.out / 'operator_profile.csv'} ({len(rows)} rows) and its .json")
    return 0


def engine_model_problem(name: str) -> str | None:
    """Why the engine cannot build the catalog model ``name`` (not in the catalog, or a
    feature its models lack: :func:`engine.config.check_engine_support`), or None."""
    from engine.config import check_engine_support
    from sim.catalog import get_model

    try:
        check_engine_support(get_model(name))
    except (KeyError, ValueError) as exc:
        return str(exc.args[0])
    return None


def _wide(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per num_tokens: each op's time; decode at its largest context."""
    table: dict[int, dict[str, Any]] = {}
    for r in rows:
        line = table.setdefault(r["num_tokens"], {"num_tokens": r["num_tokens"]})
        line[r["op"]] = r["time_ms"]
        if r["op"] == "attn_decode":
            line["decode_ctx"] = r["context_tokens"]
    return [{"num_tokens": t, **{k: line.get(k, "") for k in (*OPS, "decode_ctx")}}
            for t, line in sorted(table.items())]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
