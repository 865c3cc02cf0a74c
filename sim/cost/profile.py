"""Per-operator GPU profiles: kvlab's format and Vidur's, read into one table.

kvlab's format (``experiments/bench/profile_gpu.py`` writes it): ``operator_profile.csv``
with columns ``op,num_tokens,context_tokens,time_ms`` (others, such as ``sweeps_ms``, are
ignored) and a sidecar
``operator_profile.json`` ``{"format": "kvlab-operator-profile/1", "model", "gpu",
"dtype", "tp", "block_size", "date", "command", "torch", "triton"}`` and, since
2026-12-04, ``"attention"`` (the engine's attention backend the decode rows measure; older
CPU profiles name it in ``method``: :func:`attention_backend`). Times are medians in
milliseconds, per decoder layer except ``lm_head`` (whole model):

- ``linear``: the decoder layer's matmuls (QKV, O, MLP) for ``num_tokens`` rows;
- ``other``: norms, activation, residual adds, rotary for ``num_tokens`` rows;
- ``attn_prefill``: causal prefill attention of one sequence of ``num_tokens`` tokens
  (``context_tokens == num_tokens``);
- ``attn_decode``: paged decode attention of ``num_tokens`` sequences whose contexts sum to
  ``context_tokens``;
- ``lm_head``: logits for ``num_tokens`` rows.

Every op is required unless the sidecar lists the ones it holds (``"ops"``, which must
include ``linear`` and ``other``); the cost model prices missing attention or LM-head rows
by the roofline, as for Vidur's tables. Sizes are whole numbers (``num_tokens`` >= 1,
``context_tokens`` >= 0), times finite and > 0, and each op's ``(num_tokens,
context_tokens)`` strictly increase down the file (a size given twice is refused); the ops
priced along token counts (``linear``, ``other``, ``attn_prefill``, ``lm_head``; in either
format) hold at least two counts, while one ``attn_decode`` point is priced in proportion
to its context. The sidecar's ``model`` and ``gpu`` are non-empty strings, ``tp`` a JSON
integer >= 1, ``block_size`` a power-of-two JSON integer or null/absent (not said: the
run's block size is assumed), ``dtype`` and ``attention`` strings or null/absent, ``ops``
a list of op names, ``other_residual_adds`` the residual adds the ``other`` rows timed (0,
1 or 2; absent: 2, what kvlab's profiler times; the profile derived from Vidur's table
says 1), ``linear_fixed_s`` and ``other_fixed_s`` the fixed parts of the ``linear`` and
``other`` rows' times in seconds (:mod:`sim.cost.fixed_latency`; a number >= 0 below the
op's smallest time; absent: 0) and ``linear_fixed_source`` and ``other_fixed_source``
where they come from, and ``allreduce_latency_s`` (seconds in [0, 1); absent: 0) and
``peer_link_efficiency`` (in [0.001, 1]; absent: 1) the tensor-parallel all-reduce's
constants measured on the profile's GPU (:mod:`sim.cost.allreduce`), ``allreduce_source``
where they come from (refused without either of them).

Vidur's format (``mlp_<model>.csv``, e.g. ``../shared/measurements/vidur/a100/``): one row
per ``num_tokens`` and ``num_tensor_parallel_workers`` with ``time_stats.<op>.median``
columns (ms, per layer; a token count that appears twice is averaged). ``linear`` =
attn_pre_proj + attn_post_proj + mlp_up_proj + mlp_down_proj; ``other`` =
input_layernorm + attn_rope + post_attention_layernorm + mlp_act + add. It has no
attention or LM-head rows; the shape comes from its ``n_head``, ``n_kv_head``, ``n_embd``,
``n_expanded_embd``, ``use_gated_mlp`` columns and the GPU from its directory (Vidur
profiles ``a100`` on A100 80GB and ``h100`` on H100, per Vidur's README). Its
``num_tokens`` are whole numbers >= 1 and its medians finite and >= 0. The ``linear`` and
``other`` rows' fixed parts are fitted across the tensor-parallel degrees the table holds
(its shard sizes; :func:`with_fixed_latency`).

Every defect found is a :class:`ProfileError` of one line naming the file and the row (the
line a text editor shows) or the sidecar key.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

import numpy as np

from sim.cost.fixed_latency import fit_fixed_latency, mean_small_batch_time
from sim.cost.work import elementwise_work, layer_work

_REPO_ROOT = Path(__file__).resolve().parents[2]
FORMAT = "kvlab-operator-profile/1"
OPS = ("linear", "other", "attn_prefill", "attn_decode", "lm_head")
REQUIRED_OPS = ("linear", "other")
TOKEN_AXIS_OPS = ("linear", "other", "attn_prefill", "lm_head")  # priced along token counts
VIDUR_LINEAR = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
VIDUR_OTHER = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
VIDUR_GPUS = {"a100": "a100-80gb", "h100": "h100"}
# The residual adds a profile's ``other`` times. kvlab's profiler times the whole layer but
# its matmuls and attention: both adds (experiments/bench/profile_gpu.py, ``other``).
# Vidur's times one: its GPTBlock wraps only the add after the MLP in the ``add`` timer
# (microsoft/vidur, vidur/profiling/mlp/mlp_impl.py, ``_forward_with_post_attn_norm``).
KVLAB_OTHER_RESIDUAL_ADDS = 2
VIDUR_OTHER_RESIDUAL_ADDS = 1
# The dtype of Vidur's operator tables: fp16, the dtype kvlab's embedded copy of the same
# tables records (experiments/lib/embed_profile.py) and Vidur's all-reduce table states
# (docs/validation/allreduce.md); a Vidur CSV read as such prices fp16/bf16 runs only.
VIDUR_DTYPE = "float16"
# Attention backends whose decode reads every block of a sequence whole: the torch reference
# gathers ceil(context / block) blocks before slicing the context out
# (kernels.reference.gather_sequence_kv). The triton kernel visits keys BLOCK_N at a time and
# masks past the context, whatever the block size (kernels.paged_attention).
WHOLE_BLOCK_BACKENDS = frozenset({"torch"})
_METHOD_BACKEND = re.compile(r"\b(torch|triton) attention\b")


class ProfileError(ValueError):
    """A profile file is malformed; the message names the file and row."""


@dataclass(frozen=True)
class LayerShape:
    """What a per-layer profile needs to know about the profiled model to be transferred:
    hidden size, query/KV widths, MLP width and gating, and whether it has rotary
    embeddings."""

    hidden_size: int
    q_size: int
    kv_size: int
    ffn_hidden_size: int
    gated_mlp: bool
    head_dim: int
    num_heads: int
    rotary: bool

    def kv_width_per_gpu(self, tp: int) -> int:
        """Width of each of K and V on one of ``tp`` GPUs: its KV heads (at least one,
        replicated when ``tp`` exceeds them) × head_dim."""
        return max(1, self.kv_size // self.head_dim // tp) * self.head_dim

    def work_per_gpu(self, tp: int) -> tuple[float, float]:
        """``(matmul weight elements, activation elements per token)`` of one layer on one
        of ``tp`` GPUs (:func:`sim.cost.work.layer_work`)."""
        return layer_work(
            self.hidden_size, self.q_size, self.kv_width_per_gpu(tp), self.ffn_hidden_size,
            self.gated_mlp, tp,
        )  # fmt: skip

    def elementwise_per_gpu(self, tp: int, residual_adds: int) -> float:
        """Elements per token that one layer's elementwise operators move on one of ``tp``
        GPUs, counting ``residual_adds`` adds (:func:`sim.cost.work.elementwise_work`)."""
        return elementwise_work(
            self.hidden_size, self.q_size // tp, self.kv_width_per_gpu(tp),
            self.ffn_hidden_size // tp, self.gated_mlp, self.rotary, residual_adds,
        )  # fmt: skip


@dataclass
class OperatorProfile:
    """Per-op arrays ``(num_tokens, context_tokens, time_s)`` sorted by size, with where the
    profile was measured. ``model`` is a catalog name or None (then ``layer_shape``).
    ``other_residual_adds`` is how many of the layer's two residual adds ``other`` timed.
    ``block_size`` is the KV block size the decode rows were measured at, or None when the
    profile does not say (the run's block size is then assumed). ``linear_fixed_s`` and
    ``other_fixed_s`` are the parts of each ``linear`` and ``other`` time that do not scale
    with the layer's size (0: not known), fitted as the ``*_fixed_source`` texts say.
    ``allreduce_latency_s`` and ``peer_link_efficiency`` are the all-reduce's latency and
    achieved fraction of the peer link on the profile's GPU (0 and 1, both: not measured;
    the bandwidth-only lower bound), measured as ``allreduce_source`` says."""

    ops: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    gpu: str
    tp: int
    model: str | None
    layer_shape: LayerShape | None
    block_size: int | None
    source: str
    meta: dict[str, object] = field(default_factory=dict)
    other_residual_adds: int = KVLAB_OTHER_RESIDUAL_ADDS
    linear_fixed_s: float = 0.0
    linear_fixed_source: str | None = None
    other_fixed_s: float = 0.0
    other_fixed_source: str | None = None
    allreduce_latency_s: float = 0.0
    peer_link_efficiency: float = 1.0
    allreduce_source: str | None = None


def attention_backend(meta: dict[str, object]) -> str | None:
    """The attention backend a kvlab profile's decode rows measured: the sidecar's
    ``attention``, else the ``<backend> attention`` its ``method`` names (CPU profiles
    before the key existed), else None (not said: GPU profiles before it, Vidur's)."""
    named = meta.get("attention")
    if isinstance(named, str):
        return named
    found = _METHOD_BACKEND.search(str(meta.get("method", "")))
    return found.group(1) if found else None


def csv_rows(path: Path) -> list[tuple[int, dict[str, str]]]:
    """The data rows of the CSV file ``path``, each with the line it ends on (as a text
    editor numbers them); a ProfileError when the file cannot be read, is not CSV text or
    has no data row."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            rows = [(reader.line_num, r) for r in reader]
    except OSError as e:
        raise ProfileError(f"{path}: cannot read ({e.strerror})") from e
    except (UnicodeDecodeError, csv.Error) as e:
        raise ProfileError(f"{path}: not a CSV text file ({e})") from e
    if not rows:
        raise ProfileError(f"{path}: no data rows (the file is empty or only a header)")
    return rows


def _size(path: Path, row: int, column: str, text: str | None, least: int) -> float:
    """``text``, the ``column`` of ``row``, as a size: a whole number >= ``least`` (a count
    of tokens or sequences), else a ProfileError naming the row and column."""
    if text is None:
        raise ProfileError(f"{path}: row {row}: no {column} column")
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (np.isfinite(value) and value.is_integer() and value >= least):
        raise ProfileError(
            f"{path}: row {row}: {column} is {text!r} (a whole number >= {least} expected)"
        )
    return value


def _check(
    path: Path, op: str, n: np.ndarray, c: np.ndarray, t: np.ndarray, rows: list[int]
) -> None:
    """One op's arrays (``rows``: their line numbers) hold finite times > 0 and finite sizes
    (``n`` >= 1, ``c`` >= 0) whose pairs ``(n, c)`` strictly increase; else a ProfileError
    naming the row (a pair given twice is refused as such)."""
    for i in range(len(t)):
        if not (t[i] > 0 and np.isfinite(t[i])):  # a measured kernel takes some time
            raise ProfileError(
                f"{path}: row {rows[i]}: op {op} has time {t[i] * 1e3:g} ms "
                "(a measured time is finite and > 0)"
            )
        if not (np.isfinite(n[i]) and np.isfinite(c[i]) and n[i] >= 1 and c[i] >= 0):
            raise ProfileError(f"{path}: row {rows[i]}: op {op} has sizes ({n[i]:g}, {c[i]:g})")
    keys = list(zip(n.tolist(), c.tolist(), strict=True))
    for i in range(1, len(keys)):
        if keys[i] == keys[i - 1]:
            raise ProfileError(
                f"{path}: row {rows[i]}: op {op} sizes not increasing: {keys[i]} again "
                f"(row {rows[i - 1]}; each size is measured once)"
            )
        if keys[i] < keys[i - 1]:
            raise ProfileError(
                f"{path}: row {rows[i]}: op {op} sizes not increasing "
                f"({keys[i - 1]} then {keys[i]})"
            )


def _check_slope(path: Path, op: str, n: np.ndarray, rows: list[int]) -> None:
    """An op priced along token counts holds at least two of them: one point gives no slope,
    and every batch would be priced as that one count (flat in tokens)."""
    if op in TOKEN_AXIS_OPS and len(np.unique(n)) < 2:
        raise ProfileError(
            f"{path}: row {rows[0]}: op {op} has one token count ({int(n[0])}); at least two "
            "are needed to price other counts"
        )


def _is_count(value: object) -> bool:
    """A JSON integer >= 1 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_name(value: object) -> bool:
    """A non-empty string."""
    return isinstance(value, str) and value.strip() != ""


def _is_block_size(value: object) -> bool:
    """Null (not known) or a JSON integer that is a power of two."""
    if value is None:
        return True
    return _is_count(value) and not cast(int, value) & (cast(int, value) - 1)


def _is_ops(value: object) -> bool:
    """A list of op names from :data:`OPS`."""
    return isinstance(value, list) and all(o in OPS for o in value)


def _is_seconds(value: object) -> bool:
    """A finite JSON number >= 0 (not a boolean)."""
    if type(value) not in (int, float):
        return False
    try:
        number = float(cast(float, value))
    except OverflowError:  # a JSON integer past a float's range
        return False
    return math.isfinite(number) and number >= 0


def _is_link_fraction(value: object) -> bool:
    """A JSON number in [0.001, 1] (not a boolean): below, a link would not be one."""
    return _is_seconds(value) and 0.001 <= float(cast(float, value)) <= 1


def _is_call_latency(value: object) -> bool:
    """A JSON number of seconds in [0, 1) (not a boolean): a second a call is no latency."""
    return _is_seconds(value) and float(cast(float, value)) < 1


# The sidecar's checked keys: (key, required, valid, what is expected).
_SIDECAR_KEYS: tuple[tuple[str, bool, Callable[[object], bool], str], ...] = (
    ("model", True, _is_name, "a model name"),
    ("gpu", True, _is_name, "a device name"),
    ("tp", True, _is_count, "a whole number >= 1 (a JSON integer)"),
    ("block_size", False, _is_block_size, "a power of two (JSON integer), or null if not known"),
    ("dtype", False, lambda v: v is None or _is_name(v), "a dtype name, or null"),
    ("attention", False, lambda v: v is None or _is_name(v), "a backend name, or null"),
    ("ops", False, _is_ops, f"a list of op names from {', '.join(OPS)}"),
    ("other_residual_adds", False, lambda v: v in (0, 1, 2) and type(v) is int,
     "0, 1 or 2 (a JSON integer): the residual adds 'other' timed"),
    ("linear_fixed_s", False, _is_seconds, "a number of seconds >= 0"),
    ("linear_fixed_source", False, _is_name, "a text saying where linear_fixed_s comes from"),
    ("other_fixed_s", False, _is_seconds, "a number of seconds >= 0"),
    ("other_fixed_source", False, _is_name, "a text saying where other_fixed_s comes from"),
    ("allreduce_latency_s", False, _is_call_latency, "a number of seconds in [0, 1)"),
    ("peer_link_efficiency", False, _is_link_fraction, "a number in [0.001, 1]"),
    ("allreduce_source", False, _is_name,
     "a text saying where allreduce_latency_s and peer_link_efficiency come from"),
)  # fmt: skip


def _read_sidecar(side: Path) -> dict[str, object]:
    """The sidecar ``side``: a JSON object of :data:`FORMAT` whose keys hold what
    :data:`_SIDECAR_KEYS` says; else a ProfileError naming the file and the key."""
    try:
        meta = json.loads(side.read_text())
    except (OSError, ValueError) as e:
        raise ProfileError(f"{side}: cannot read the profile's sidecar ({e})") from e
    if not isinstance(meta, dict):
        raise ProfileError(f"{side}: not a JSON object")
    if meta.get("format") != FORMAT:
        raise ProfileError(f"{side}: format {meta.get('format')!r}, expected {FORMAT!r}")
    for key, required, valid, expected in _SIDECAR_KEYS:
        if key not in meta:
            if required:
                raise ProfileError(f"{side}: missing key {key!r}")
        elif not valid(meta[key]):
            raise ProfileError(f"{side}: key {key!r} is {meta[key]!r}; expected {expected}")
    return meta


_KVLAB_COLUMNS = ("op", "num_tokens", "context_tokens", "time_ms")


def _kvlab_row(path: Path, row: int, r: dict[str, str]) -> tuple[str, float, float, float]:
    """Row ``row`` of kvlab's CSV as ``(op, num_tokens, context_tokens, time_ms)``: a known
    op, whole sizes (num_tokens >= 1, context_tokens >= 0) and a number of ms (checked
    finite and > 0 by :func:`_check`); else a ProfileError naming the row."""
    missing = [k for k in _KVLAB_COLUMNS if r.get(k) is None]
    if missing:
        raise ProfileError(
            f"{path}: row {row}: need {','.join(_KVLAB_COLUMNS)} (no {', '.join(missing)})"
        )
    op = r["op"]
    if op not in OPS:
        raise ProfileError(f"{path}: row {row}: unknown op {op!r}; known: {', '.join(OPS)}")
    n = _size(path, row, "num_tokens", r["num_tokens"], 1)
    c = _size(path, row, "context_tokens", r["context_tokens"], 0)
    try:
        t = float(r["time_ms"])
    except ValueError as e:
        raise ProfileError(f"{path}: row {row}: time_ms is {r['time_ms']!r}, not a number") from e
    return op, n, c, t


def read_kvlab_profile(path: Path | str) -> OperatorProfile:
    """``path``: ``operator_profile.csv`` or the directory holding it and its sidecar."""
    p = Path(path)
    if p.is_dir():
        p = p / "operator_profile.csv"
    side = p.with_suffix(".json")
    meta = _read_sidecar(side)
    by_op: dict[str, list[tuple[float, float, float, int]]] = {}
    for i, r in csv_rows(p):
        op, n, c, t = _kvlab_row(p, i, r)
        by_op.setdefault(op, []).append((n, c, t, i))
    listed = cast("list[str]", meta.get("ops", OPS))  # _read_sidecar checked the types
    expected = dict.fromkeys([*REQUIRED_OPS, *listed])
    missing = [o for o in expected if o not in by_op]
    if missing:
        raise ProfileError(f"{p}: missing operators {', '.join(missing)}")
    ops = {}
    for op, items in by_op.items():
        n, c, t = (np.array([x[j] for x in items]) for j in range(3))
        _check(p, op, n, c, t / 1e3, [x[3] for x in items])
        _check_slope(p, op, n, [x[3] for x in items])
        ops[op] = (n, c, t / 1e3)
    constants = {"allreduce_latency_s", "peer_link_efficiency"}
    if "allreduce_source" in meta and not constants & set(meta):
        raise ProfileError(
            f"{side}: key 'allreduce_source' without allreduce_latency_s or "
            "peer_link_efficiency: give the constants it is the source of, or drop it"
        )
    fixed = {}
    for op in ("linear", "other"):
        fixed[op] = float(cast(float, meta.get(f"{op}_fixed_s", 0.0)))
        if fixed[op] > 0 and fixed[op] >= ops[op][2].min():
            raise ProfileError(
                f"{side}: key '{op}_fixed_s' is {fixed[op]:g}; expected less than the "
                f"smallest {op} time ({float(ops[op][2].min()):g} s)"
            )
    return OperatorProfile(
        ops, str(meta["gpu"]), cast(int, meta["tp"]), str(meta["model"]), None,
        cast("int | None", meta.get("block_size")),
        f"kvlab operator profile {shown_path(p)} ({meta.get('model')} on {meta.get('gpu')}, "
        f"{meta.get('date', 'undated')})",
        meta,
        cast(int, meta.get("other_residual_adds", KVLAB_OTHER_RESIDUAL_ADDS)),
        fixed["linear"],
        cast("str | None", meta.get("linear_fixed_source")),
        fixed["other"],
        cast("str | None", meta.get("other_fixed_source")),
        float(cast(float, meta.get("allreduce_latency_s", 0.0))),
        float(cast(float, meta.get("peer_link_efficiency", 1.0))),
        cast("str | None", meta.get("allreduce_source")),
    )  # fmt: skip


def shown_path(path: Path) -> str:
    """``path`` as a source text shows it: relative to the repository when inside it,
    else its last two parts (never a machine's absolute path)."""
    try:
        return str(path.resolve().relative_to(_REPO_ROOT))
    except ValueError:
        return str(Path(path.parent.name) / path.name)


def _vidur_shape(path: Path, row: int, r: dict[str, str], rotary: bool) -> LayerShape:
    """The model shape Vidur's row ``row`` names: whole widths >= 1, ``n_embd`` a multiple
    of ``n_head`` and ``use_gated_mlp`` true or false; else a ProfileError naming the row
    and column. ``rotary``: whether the table timed rotary embeddings."""
    h, heads, kv_heads, ffn = (
        int(_size(path, row, k, r.get(k), 1))
        for k in ("n_embd", "n_head", "n_kv_head", "n_expanded_embd")
    )
    if h % heads:
        raise ProfileError(f"{path}: row {row}: n_embd {h} is not a multiple of n_head {heads}")
    gated = str(r.get("use_gated_mlp")).strip().lower()
    if gated not in ("true", "false"):
        raise ProfileError(
            f"{path}: row {row}: use_gated_mlp is {r.get('use_gated_mlp')!r} (true or false)"
        )
    hd = h // heads
    return LayerShape(h, heads * hd, kv_heads * hd, ffn, gated == "true", hd, heads, rotary)


def _vidur_time(path: Path, row: int, r: dict[str, str], op: str) -> float:
    """One operator's median time (ms) of a Vidur row: finite and >= 0 (Vidur leaves some
    operators at 0 where a model has none), else a ProfileError naming the column."""
    key = f"time_stats.{op}.median"
    value = float(r[key])
    if not (np.isfinite(value) and value >= 0):
        raise ProfileError(f"{path}: row {row}: {key} is {value:g} ms (finite and >= 0 expected)")
    return value


def read_vidur_profile(path: Path | str, tp: int = 1) -> OperatorProfile:
    """Vidur's ``mlp_<model>.csv``: the rows with ``num_tensor_parallel_workers == tp``,
    with the fixed parts fitted over every degree the table holds (:func:`read_vidur_tables`)."""
    p = Path(path)
    for table in read_vidur_tables(p):
        if table.tp == tp:
            return table
    raise ProfileError(f"{p}: no rows with num_tensor_parallel_workers == {tp}")


def read_vidur_tables(path: Path | str) -> list[OperatorProfile]:
    """Vidur's ``mlp_<model>.csv`` at every tensor-parallel degree it holds, ascending,
    each with the fixed part fitted over all of them (:func:`with_fixed_latency`)."""
    p = Path(path)
    _vidur_gpu(p)
    tables = [_read_vidur_tp(p, tp) for tp in _vidur_tps(p)]
    return with_fixed_latency(tables, f"Vidur's {p.parent.name}/{p.name}")


def with_fixed_latency(tables: list[OperatorProfile], name: str) -> list[OperatorProfile]:
    """``tables`` (one model and GPU at several shard sizes) with ``linear_fixed_s`` and
    ``other_fixed_s`` set to the fixed parts :func:`~sim.cost.fixed_latency.
    fit_fixed_latency` finds across them: the matmuls' against their weights per GPU, the
    elementwise operators' against the elements a token moves on one GPU; each held to 0.9
    of its op's smallest time in any table. Every table is read, so a damaged row at one
    tp refuses the file at all of them."""
    tps = "/".join(str(t.tp) for t in tables)
    parts: dict[str, object] = {}
    for op, size, unit in (("linear", "matmul weights per GPU", 1e6),
                           ("other", "elementwise elements per token per GPU", 1e3)):  # fmt: skip
        shards = []
        for t in tables:
            assert t.layer_shape is not None
            shape = t.layer_shape
            n, _, time = t.ops[op]
            amount = (shape.work_per_gpu(t.tp)[0] if op == "linear"
                      else shape.elementwise_per_gpu(t.tp, t.other_residual_adds))  # fmt: skip
            shards.append((amount, mean_small_batch_time(n, time)))
        fit = fit_fixed_latency(shards, size, unit)
        # below every measured time, as a sidecar's must be (a mean can hide a dip)
        fixed = min(fit.seconds, 0.9 * min(float(t.ops[op][2].min()) for t in tables))
        parts[f"{op}_fixed_s"] = fixed
        parts[f"{op}_fixed_source"] = f"{fit.note} of {name} (tp {tps}): {fixed * 1e6:.1f} us"
    return [replace(t, **parts) for t in tables]  # type: ignore[arg-type]


def _vidur_gpu(p: Path) -> str:
    """The catalog GPU of Vidur's table ``p``, named by its directory."""
    gpu_dir = p.parent.name
    if gpu_dir not in VIDUR_GPUS:
        raise ProfileError(
            f"{p}: GPU directory {gpu_dir!r} unknown; known: {', '.join(VIDUR_GPUS)}"
        )
    return VIDUR_GPUS[gpu_dir]


def _read_vidur_tp(p: Path, tp: int) -> OperatorProfile:
    """The rows of Vidur's table ``p`` at ``tp`` (no fixed part: 0)."""
    gpu_dir = p.parent.name
    picked: list[tuple[float, float, float, int, dict[str, str]]] = []
    for i, r in csv_rows(p):
        try:
            key = "num_tensor_parallel_workers"
            if _size(p, i, key, r.get(key), 1) != tp:  # read as _vidur_tps read it
                continue
            lin = sum(_vidur_time(p, i, r, o) for o in VIDUR_LINEAR)
            oth = sum(_vidur_time(p, i, r, o) for o in VIDUR_OTHER)
            picked.append((_size(p, i, "num_tokens", r.get("num_tokens"), 1), lin, oth, i, r))
        except ProfileError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{p}: row {i}: bad or missing Vidur column ({e})") from e
    if not picked:
        raise ProfileError(f"{p}: no rows with num_tensor_parallel_workers == {tp}")
    picked.sort(key=lambda x: x[0])
    merged: dict[float, list[tuple[float, float, float, int, dict[str, str]]]] = {}
    for x in picked:  # Vidur repeats some token counts: their mean
        merged.setdefault(x[0], []).append(x)
    picked = [
        (k, float(np.mean([x[1] for x in v])), float(np.mean([x[2] for x in v])), v[0][3], v[0][4])
        for k, v in merged.items()
    ]
    n = np.array([x[0] for x in picked])
    rows = [x[3] for x in picked]
    zeros = np.zeros(len(n))
    ops = {}
    for j, op in ((1, "linear"), (2, "other")):
        t = np.array([x[j] for x in picked]) / 1e3
        _check(p, op, n, zeros, t, rows)
        _check_slope(p, op, n, rows)
        ops[op] = (n, zeros, t)
    # Vidur leaves an operator's times at 0 where the model has none
    rotary = any(_vidur_time(p, x[3], x[4], "attn_rope") > 0 for x in picked)
    shape = _vidur_shape(p, picked[0][3], picked[0][4], rotary)
    return OperatorProfile(
        ops, _vidur_gpu(p), tp, None, shape, None,
        f"Vidur profile {gpu_dir}/{p.name} (microsoft/vidur 7d47513, MIT), tp {tp}, "
        f"{len(n)} token counts {int(n[0])}-{int(n[-1])}",
        meta={"dtype": VIDUR_DTYPE},
        other_residual_adds=VIDUR_OTHER_RESIDUAL_ADDS,
    )  # fmt: skip


def read_profile(path: Path | str, tp: int = 1) -> OperatorProfile:
    """Either format: a directory or ``operator_profile.csv`` is kvlab's, any other CSV
    Vidur's (its ``tp`` rows)."""
    p = Path(path)
    if not p.exists():
        raise ProfileError(f"{p}: no such profile file or directory")
    if p.is_dir() or p.name == "operator_profile.csv":
        return read_kvlab_profile(p)
    return read_vidur_profile(p, tp)


def is_profile_set(path: Path | str) -> bool:
    """Whether ``path`` is a directory of profiles rather than one kvlab profile: a
    directory without ``operator_profile.csv``."""
    p = Path(path)
    return p.is_dir() and not (p / "operator_profile.csv").exists()


def _vidur_tps(path: Path) -> list[int]:
    """The tensor-parallel degrees Vidur's table ``path`` holds rows of, ascending."""
    key = "num_tensor_parallel_workers"
    return sorted({int(_size(path, i, key, r.get(key), 1)) for i, r in csv_rows(path)})


def read_profile_set(path: Path | str) -> list[OperatorProfile]:
    """Every profile in the directory ``path``: each subdirectory holding
    ``operator_profile.csv`` (kvlab's format) and each ``mlp_*.csv`` file (Vidur's, once per
    tensor-parallel degree it holds; Vidur's other tables beside them are not profiles), in
    name order; a ProfileError when it holds none or one is malformed."""
    p = Path(path)
    found: list[OperatorProfile] = []
    for entry in sorted(p.iterdir()):
        if entry.is_dir() and (entry / "operator_profile.csv").exists():
            found.append(read_kvlab_profile(entry))
        elif entry.is_file() and entry.name.startswith("mlp_") and entry.suffix == ".csv":
            found += read_vidur_tables(entry)
    if not found:
        raise ProfileError(
            f"{p}: no profiles here (a set holds kvlab profile directories or Vidur "
            "mlp_*.csv tables)"
        )
    return found
