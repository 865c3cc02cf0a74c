"""KV-cache capacity of a model on ``tp`` GPUs, and the paper's Table 1 recomputed.

Per GPU: ``kv_bytes = gpu_memory_utilization × memory − weights / tp − peak activations
− CUDA-graph pool − non-torch memory`` (vLLM's accounting; the paper's v0.1 had no CUDA
graphs). ``memory`` is the total the CUDA driver reports for the device where a hardware
YAML records it (``reported_memory_gib``: vLLM multiplies ``torch.cuda.mem_get_info()``'s
total), else the nominal ``memory_gb`` (:attr:`sim.catalog.GPUSpec.total_memory_bytes`).
Table 1's A100s have no reported total: the paper's nominal GiB stand.
``gpu_memory_utilization = 0.9`` is vLLM's documented default for its
``gpu_memory_utilization`` engine argument; it is not tuned to match Table 1.
``num_gpu_blocks`` (the count vLLM prints at start-up) overrides the estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from core.defaults import DEFAULT_BLOCK_SIZE
from core.model_spec import ModelSpec, check_kv_heads_split, kv_bytes_per_token
from core.sched.batch_defaults import V0_MAX_NUM_BATCHED_TOKENS, V0_MAX_NUM_SEQS
from sim.catalog import GIB, GPUSpec, get_gpu, get_model

LOGITS_BYTES = 4  # samplers upcast logits to fp32
# fp32 logits + sorted fp32 values + int64 sort indices + fp32 softmax (activation_bytes)
SAMPLER_BYTES_PER_LOGIT = LOGITS_BYTES + 4 + 8 + 4


def check_tp(model: ModelSpec, tp: int) -> None:
    """Raise unless ``tp`` is a positive divisor of the attention heads (and of the KV
    heads, or a multiple of them: KV heads are then replicated)."""
    if tp < 1:
        raise ValueError(f"tensor-parallel size must be >= 1, got {tp}")
    if model.num_heads % tp:
        raise ValueError(
            f"{model.name}: {model.num_heads} attention heads cannot be split over tp={tp} GPUs"
        )
    check_kv_heads_split(model, tp)


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads each GPU stores: ``kv_heads / tp``, at least 1 (replicated when
    ``tp > kv_heads``)."""
    check_tp(model, tp)
    return max(1, model.num_kv_heads // tp)


def kv_width_per_gpu(model: ModelSpec, tp: int) -> int:
    """Width of each of the K and V projections on one GPU: its KV heads × head_dim.
    Above ``kv_size / tp`` when ``tp > kv_heads``: each GPU then holds and computes a whole
    replicated head (vLLM's ``QKVParallelLinear``)."""
    return kv_heads_per_gpu(model, tp) * model.head_dim


def replicated_kv_params(model: ModelSpec, tp: int, biases: bool = True) -> float:
    """Parameters each GPU holds beyond ``num_params / tp`` because its K and V heads are
    replicated (0 unless ``tp > kv_heads``): per layer ``2 × (hidden [+ 1 for the
    biases]) × (kv_width_per_gpu − kv_size / tp)``. ``biases=False``: matmul weights only."""
    excess = kv_width_per_gpu(model, tp) - model.kv_size / tp
    if excess <= 0:
        return 0.0
    bias = biases and (model.family == "opt" or model.attention_bias)
    return model.num_layers * 2 * (model.hidden_size + bias) * excess


def activation_bytes(
    model: ModelSpec,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int = V0_MAX_NUM_SEQS,
    dtype_bytes: int = 2,
) -> int:
    """Peak activation memory per GPU of the largest prefill batch.

    With ``T = max_num_batched_tokens`` tokens in flight, the live tensors at the peak are
    the residual stream and its normed copy (``2 × T × hidden``), the largest per-layer
    intermediate — the QKV output ``T × (q/tp + 2 kv_width_per_gpu)`` or the MLP's ``T × ffn/tp``
    (×2 for the gate and up halves of a gated MLP) plus its activated output
    ``T × ffn/tp`` — all in ``dtype_bytes``. Attention scores are not materialized
    (memory-efficient attention), so there is no ``T²`` term.

    The sampler runs after the forward pass has freed its intermediates, so the peak is the
    larger of the two, plus the final hidden states (``T × hidden``). The sampler's peak, on
    ``min(T, max_num_seqs)`` rows × vocab: fp32 logits, and top-k/top-p by sorting (vLLM's
    profile run samples with both on; its torch path sorts the logits), which holds the
    sorted fp32 values, their int64 indices and the fp32 softmax of the sorted values:
    ``SAMPLER_BYTES_PER_LOGIT`` = 4 + 4 + 8 + 4 bytes per element. The count of live copies
    is read from the algorithm, not measured.
    """
    t = max_num_batched_tokens
    qkv = model.q_size // tp + 2 * kv_width_per_gpu(model, tp)
    mlp = ((2 if model.gated_mlp else 1) + 1) * model.ffn_hidden_size // tp
    hidden = 2 * model.hidden_size
    forward = t * (hidden + max(qkv, mlp)) * dtype_bytes
    sampler = min(t, max_num_seqs) * model.vocab_size * SAMPLER_BYTES_PER_LOGIT
    return max(forward, sampler + t * model.hidden_size * dtype_bytes)


class DoesNotFit(ValueError):
    """The weights and the memory reserved beside them exceed the usable memory.
    ``problem``: what exceeds what (and, where the weights fit, which part of the profile
    run makes the peak); ``peak``: ``"forward"`` (its ``max_num_batched_tokens`` tokens) or
    ``"sampler"`` (its ``max_num_seqs`` rows) when the weights fit, else None;
    ``more_memory``: the ``gpu_memory_utilization`` that would do, as advice, or ''. The
    message is the problem with that advice."""

    def __init__(self, problem: str, peak: str | None, more_memory: str) -> None:
        joint = "; or " if peak is not None else "; "
        super().__init__(problem + (joint + more_memory if more_memory else ""))
        self.problem, self.peak, self.more_memory = problem, peak, more_memory


@dataclass(frozen=True, slots=True)
class KVCapacity:
    """KV-cache budget, following vLLM's accounting (``Worker.determine_available_memory``):
    ``kv = utilization × memory − weights − peak activations of the profile run − CUDA-graph
    pool − non-torch memory``. Byte fields are per GPU; ``num_slots`` counts tokens (each
    token's K/V is spread over the ``tp`` GPUs, so slots are the same on every GPU).
    ``total_bytes`` is the device total the budget starts from (the reported total, else
    the nominal memory: :attr:`sim.catalog.GPUSpec.total_memory_bytes`).
    ``source`` says where each term comes from (:meth:`describe` prints them)."""

    tp: int
    total_bytes: int
    weight_bytes: int
    activation_bytes: int
    kv_bytes: int
    bytes_per_token_per_gpu: int
    num_slots: int
    cuda_graph_bytes: int = 0
    non_torch_bytes: int = 0
    usable_bytes: int = 0
    source: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def num_blocks(self, block_size: int) -> int:
        """Whole KV blocks of ``block_size`` token slots."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        return self.num_slots // block_size

    @property
    def kv_bytes_total(self) -> int:
        return self.kv_bytes * self.tp

    @property
    def weight_bytes_total(self) -> int:
        return self.weight_bytes * self.tp

    def block_slots(self, block_size: int) -> int:
        """The token slots a run holds: whole blocks of ``block_size``
        (:meth:`num_blocks`), the capacity every KV-cache manager is built with."""
        return self.num_blocks(block_size) * block_size

    def describe(self, block_size: int | None = None, contiguous: bool = False) -> str:
        """Each term of the budget (GiB per GPU) with its source, and the slots (with
        ``block_size``: also the whole blocks a run holds, :meth:`block_slots`; with
        ``contiguous``, said as the slots a contiguous manager holds, not as blocks)."""
        rows = [
            ("usable", self.usable_bytes, "+"),
            ("weights", self.weight_bytes, "-"),
            ("activations", self.activation_bytes, "-"),
            ("cuda_graphs", self.cuda_graph_bytes, "-"),
            ("non_torch", self.non_torch_bytes, "-"),
            ("kv_cache", self.kv_bytes, "="),
        ]
        lines = [f"KV capacity per GPU (tp={self.tp}):"]
        for name, value, sign in rows:
            lines.append(f"  {sign} {name:<12} {value / GIB:8.3f} GiB  {self.source.get(name, '')}")
        lines.append(
            f"  -> {self.num_slots} token slots of {self.bytes_per_token_per_gpu} B per GPU"
        )
        if block_size is not None and contiguous:
            lines.append(
                f"  -> {self.block_slots(block_size)} slots in the run (whole blocks of "
                f"{block_size}, as vLLM sizes a cache; the manager allocates them contiguously)"
            )
        elif block_size is not None:
            lines.append(
                f"  -> {self.num_blocks(block_size)} blocks of {block_size}: "
                f"{self.block_slots(block_size)} slots in the run"
            )
        return "\n".join(lines)


def kv_capacity(
    model: ModelSpec | str,
    gpu: GPUSpec | str,
    tp: int = 1,
    dtype_bytes: int = 2,
    gpu_memory_utilization: float = 0.9,
    max_num_batched_tokens: int = V0_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = V0_MAX_NUM_SEQS,
    kv_cache_bytes: int | None = None,
    max_model_len: int | None = None,
    num_gpu_blocks: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    cuda_graph_max_size: int = 0,
    non_torch_bytes: int = 0,
) -> KVCapacity:
    """KV slots for ``model`` on ``tp`` × ``gpu``, as vLLM sizes its cache.

    Terms: ``gpu_memory_utilization × memory`` (``gpu.total_memory_bytes``: the total the
    driver reports when the hardware YAML records it, else the nominal ``memory_gb``;
    :meth:`KVCapacity.describe` says which) minus the weights / tp, minus the peak
    activations of a profile run of ``max_num_batched_tokens`` tokens with
    ``max_num_seqs`` sampled rows (:func:`activation_bytes`), minus the CUDA-graph pool
    (``cuda_graph_max_size`` > 0: graphs are captured largest first into one shared pool,
    which then holds the largest capture's intermediates, :func:`activation_bytes` at that
    many tokens without sampling; 0: no graphs, as vLLM v0.1), minus ``non_torch_bytes``.

    Overrides: ``num_gpu_blocks`` (vLLM prints it at start-up) fixes the cache at that many
    blocks of ``block_size``; ``kv_cache_bytes`` at a byte total over all ``tp`` GPUs (e.g.
    the paper's 12 GB for OPT-13B). Raises ``ValueError`` when the weights and reserved
    memory exceed the usable memory, when a given cache and the weights exceed the GPU's
    memory, when ``num_gpu_blocks`` or ``block_size`` is below 1 (the error names which),
    or when the cache cannot hold one ``max_model_len`` sequence (default: the model's
    maximum context).
    """
    model, gpu = get_model(model), get_gpu(gpu)
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    check_tp(model, tp)
    per_token = kv_bytes_per_token(model, dtype_bytes, tp)
    replicated = replicated_kv_params(model, tp)
    weights = -(-model.num_params() * dtype_bytes // tp) + math.ceil(replicated * dtype_bytes)
    acts = activation_bytes(model, tp, max_num_batched_tokens, max_num_seqs, dtype_bytes)
    graphs = (
        activation_bytes(model, tp, cuda_graph_max_size, 0, dtype_bytes)
        if cuda_graph_max_size > 0
        else 0
    )
    total, total_key = gpu.total_memory_bytes, gpu.total_memory_key
    kind = "reported total" if total_key == "reported_memory_gib" else "nominal memory"
    usable = int(gpu_memory_utilization * total)
    reserved = weights + acts + graphs + non_torch_bytes
    source = {
        "usable": f"gpu_memory_utilization {gpu_memory_utilization} × {gpu.name} {kind} "
        f"{total / GIB:.3f} GiB ({total_key}: {gpu.source.get(total_key, 'hardware config')})"
        + (
            "; the driver reports less than the nominal memory, which vLLM sizes from: "
            "hardware.reported_memory_gib sets the measured total"
            if total_key != "reported_memory_gib"
            else ""
        ),
        "weights": f"{model.num_params() / 1e9:.2f}B parameters × {dtype_bytes} B / tp"
        + (f" + {replicated / 1e9:.3f}B of K/V heads replicated over tp" if replicated else ""),
        "activations": f"profile run: max(forward of {max_num_batched_tokens} tokens, sampler "
        f"on {max_num_seqs} rows: fp32 logits + top-k/top-p sort)",
        "cuda_graphs": f"shared graph pool = intermediates of the largest capture "
        f"({cuda_graph_max_size} tokens)"
        if cuda_graph_max_size
        else "no CUDA graphs",
        "non_torch": "set by the run's config" if non_torch_bytes else "not modelled (0)",
        "kv_cache": "the rest",
    }
    derived = num_gpu_blocks is None and kv_cache_bytes is None  # else the given cache's
    need = model.max_model_len if max_model_len is None else max_model_len
    # the derived cache's way out: enough of the GPU for the reserved memory and one sequence
    one_sequence = -(-need // max(block_size, 1)) * max(block_size, 1) * per_token
    more_memory = (
        f"raise gpu_memory_utilization to {_utilization_for(reserved + one_sequence, total)}"
        if derived and reserved + one_sequence <= total
        else ""
    )
    if derived and weights + acts + graphs + non_torch_bytes >= usable:
        peak, why = None, ""
        if weights + graphs + non_torch_bytes < usable:  # the profile run's peak is too much
            forward = activation_bytes(model, tp, max_num_batched_tokens, 0, dtype_bytes)
            peak = "forward" if acts <= forward else "sampler"
            why = (
                f"; the weights fit: the activations are a profile run of "
                f"{max_num_batched_tokens} tokens (max_num_batched_tokens)"
                if peak == "forward"
                else f"; the weights fit: the activations are the profile run's sampler on "
                f"{min(max_num_batched_tokens, max_num_seqs)} rows (max_num_seqs) × "
                f"{model.vocab_size} logits"
            )
        raise DoesNotFit(
            f"{model.name} does not fit on {tp} × {gpu.name}: weights {weights / GIB:.2f} GiB "
            f"+ activations {acts / GIB:.2f} GiB + CUDA graphs {graphs / GIB:.2f} GiB "
            f"+ non-torch {non_torch_bytes / GIB:.2f} GiB per GPU exceed {usable / GIB:.2f} "
            f"GiB ({gpu_memory_utilization:.0%} of the {total / GIB:.2f} GiB {kind}){why}",
            peak, more_memory,
        )  # fmt: skip
    if num_gpu_blocks is not None:
        for key, value in (("num_gpu_blocks", num_gpu_blocks), ("block_size", block_size)):
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        kv = num_gpu_blocks * block_size * per_token
        source["kv_cache"] = f"num_gpu_blocks={num_gpu_blocks} × {block_size} tokens (given)"
    elif kv_cache_bytes is not None:
        kv = kv_cache_bytes // tp
        source["kv_cache"] = f"kv_cache_bytes={kv_cache_bytes} over {tp} GPUs (given)"
    else:
        kv = usable - reserved
    if weights + kv > total:  # a given cache: it and the weights must fit at all
        raise ValueError(
            f"the given KV cache ({kv / GIB:.2f} GiB per GPU) and {model.name}'s weights "
            f"({weights / GIB:.2f} GiB per GPU) exceed {gpu.name}'s {total / GIB:.2f} GiB "
            f"{kind}"
        )
    slots = kv // per_token
    whole = slots // block_size * block_size  # a sequence holds whole blocks
    if whole < need:
        fixes = [
            *(["lower system.max_model_len"] if whole else []),
            *([more_memory] if more_memory else []),
            *([] if derived else ["give a larger cache"]),
        ]
        fix = " or ".join(fixes) or "the GPU is too small for it"
        raise ValueError(
            f"KV cache of {model.name} on {tp} × {gpu.name} holds {whole} tokens "
            f"({whole // block_size} block(s) of {block_size}), fewer than one "
            f"max_model_len={need} sequence; {fix}"
        )
    return KVCapacity(
        tp, total, weights, acts, kv, per_token, slots, graphs, non_torch_bytes,
        usable, source,
    )  # fmt: skip


def _utilization_for(needed: int, total: int) -> str:
    """A ``gpu_memory_utilization`` (2 decimals, rounded up) whose share of ``total`` bytes
    holds ``needed`` bytes."""
    return f"{min(1.0, math.floor(needed / total * 100 + 1) / 100):.2f}"


@dataclass(frozen=True, slots=True)
class Table1Row:
    """One row of Kwon et al. 2023 Table 1 (§6.1), computed beside the paper's numbers.

    The paper mixes units: parameters are decimal GB (OPT-13B: 12.85e9 × 2 B = 26 GB) while
    the KV cache is GiB (12 GiB / 800 KiB per token = 15.7K slots), so ``params_gb`` is
    1e9 bytes and ``kv_gib`` is 2^30 bytes.
    """

    model: str
    gpu: str
    num_gpus: int
    total_mem_gib: float
    params_gb: float
    kv_gib: float
    max_slots: int
    paper_params_gb: float
    paper_kv_gib: float
    paper_slots: int

    @property
    def slots_rel_diff(self) -> float:
        return self.max_slots / self.paper_slots - 1.0

    @property
    def kv_rel_diff(self) -> float:
        return self.kv_gib / self.paper_kv_gib - 1.0

    @property
    def params_rel_diff(self) -> float:
        return self.params_gb / self.paper_params_gb - 1.0


PAPER_TABLE1: tuple[tuple[str, str, int, float, float, int], ...] = (
    ("opt-13b", "a100-40gb", 1, 26.0, 12.0, 15_700),
    ("opt-66b", "a100-40gb", 4, 132.0, 21.0, 9_700),
    ("opt-175b", "a100-80gb", 8, 346.0, 264.0, 60_100),
)


def table1(**capacity_kw: float) -> list[Table1Row]:
    """Table 1 recomputed with :func:`kv_capacity` (keyword arguments pass through)."""
    rows = []
    for name, gpu_name, n, p_params, p_kv, p_slots in PAPER_TABLE1:
        model, gpu = get_model(name), get_gpu(gpu_name)
        cap = kv_capacity(model, gpu, tp=n, **capacity_kw)  # type: ignore[arg-type]
        rows.append(
            Table1Row(
                name,
                gpu_name,
                n,
                n * gpu.memory_bytes / GIB,
                model.num_params() * 2 / 1e9,
                cap.kv_bytes_total / GIB,
                cap.num_slots,
                p_params,
                p_kv,
                p_slots,
            )
        )
    return rows


def table1_gap_lines(rows: list[Table1Row]) -> list[str]:
    """One computed line per Table 1 row: the paper's KV over the model's KV bytes a token
    (the slots its KV figure read as GiB gives, against its printed slots), and kvlab's KV
    less the paper's split into the weights' difference and the difference in the memory
    that holds neither weights nor KV (the paper's ``params GB`` read as 10^9 bytes)."""
    lines = []
    for r in rows:
        per_token = kv_bytes_per_token(get_model(r.model))
        implied = r.paper_kv_gib * GIB / per_token
        weights, paper_weights = r.params_gb * 1e9 / GIB, r.paper_params_gb * 1e9 / GIB
        rest = r.total_mem_gib - weights - r.kv_gib
        paper_rest = r.total_mem_gib - paper_weights - r.paper_kv_gib
        lines.append(
            f"- {r.model}: the paper's {r.paper_kv_gib:g} GiB at {per_token / 1024:,.0f} KiB a "
            f"token is {implied:,.0f} slots (it prints {r.paper_slots:,}). KV, kvlab − paper: "
            f"{r.kv_gib - r.paper_kv_gib:+.1f} GiB = {paper_weights - weights:+.1f} GiB from "
            f"the weights ({r.params_gb:.1f} against {r.paper_params_gb:g} GB) and "
            f"{paper_rest - rest:+.1f} GiB from the memory holding neither (kvlab "
            f"{rest:.1f} GiB, {rest / r.total_mem_gib:.1%} of {r.total_mem_gib:g}: "
            f"gpu_memory_utilization's headroom and the profile run's activations; the "
            f"paper's {paper_rest:.1f} GiB, {paper_rest / r.total_mem_gib:.1%})."
        )
    return lines


def format_table1(rows: list[Table1Row]) -> str:
    """Printable Table 1: computed values, the paper's, and the relative differences."""
    head = (
        f"{'model':<9} {'GPUs':<12} {'mem GiB':>8} {'params GB':>10} {'(paper)':>8} "
        f"{'KV GiB':>7} {'(paper)':>8} {'slots':>7} {'(paper)':>8} {'Δslots':>7}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r.model:<9} {f'{r.num_gpus}×{r.gpu}':<12} {r.total_mem_gib:>8.0f} "
            f"{r.params_gb:>10.1f} {r.paper_params_gb:>8.0f} {r.kv_gib:>7.1f} "
            f"{r.paper_kv_gib:>8.0f} {r.max_slots:>7} {r.paper_slots:>8} "
            f"{r.slots_rel_diff:>+7.1%}"
        )
    return "\n".join(lines)
