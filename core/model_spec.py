"""The one description of a decoder-only model: its shape (what the cost and capacity models
price) and its numerics (what the engine builds from), parsed from an HF ``config.json``.

The simulator's catalog (``sim.catalog``) and the engine (``engine.models``) use this type
directly; :func:`kv_bytes_per_token` is the one formula for the KV cache's size.

``family`` fixes the block layout: ``"opt"`` is LayerNorm with biases on every linear layer
and a learned positional table of ``num_position_embeddings`` rows; ``"llama"`` is RMSNorm,
rotary positions and a SwiGLU MLP without biases (Llama, Mistral and Qwen3 configs; Qwen3
adds a per-head RMSNorm on queries and keys, ``qk_norm``). Features the engine's models do
not implement (``qk_norm``, a non-default RoPE scaling, a sliding window, attention biases)
are recorded, not rejected: the simulator prices such models (a sliding window as full
attention over the whole context, with a warning: ``experiments.lib.setup.warn_unmodelled``),
and the engine refuses them with the feature named (``engine.config.check_engine_support``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from core.mapping_file import read_mapping

Family = Literal["opt", "llama"]

# OPT's learned positional table has 2 extra rows (position ids start at offset 2).
OPT_POSITION_OFFSET = 2

# RoPE types whose max_position_embeddings already is the extended context: vLLM's
# ``_get_and_verify_max_len`` (vllm/config/model.py) scales every other type's by its factor.
UNSCALED_ROPE_TYPES = ("su", "longrope", "llama3")
# the RoPE types of transformers' ROPE_INIT_FUNCTIONS (modeling_rope_utils) that a dense
# decoder here may carry; another is refused rather than scaled by a guess
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", *UNSCALED_ROPE_TYPES)

# An HF Hub repository id, ``org/name`` (huggingface_hub's validate_repo_id: letters, digits,
# '-', '_' and '.'; not starting with '.' or '-').
_HF_ID = re.compile(r"[A-Za-z0-9_][\w.-]*/[A-Za-z0-9_][\w.-]*")

# Bytes per element of the dtypes a run or a profile may name (torch's names).
DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}

_ACTIVATIONS: dict[str, str] = {"opt": "relu", "llama": "silu"}
# HF config keys that count routed experts (Mixtral, Qwen2-MoE, DeepSeek): a config of a
# dense model_type holding one > 1 describes a mixture of experts
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# a quantized checkpoint's config.json (transformers; compressed-tensors' older name)
QUANTIZATION_KEYS = ("quantization_config", "compression_config")
# transformers' Qwen3Config default head_dim (not hidden_size / num_attention_heads)
QWEN3_HEAD_DIM = 128
# transformers' Qwen2Config/Qwen3Config default max_window_layers (5.24)
QWEN_FULL_LAYERS = 28
# HF model_type -> family; all but OPT share the Llama block layout.
MODEL_TYPES: dict[str, Family] = {
    "opt": "opt",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
}


def check_kv_heads_split(spec: ModelSpec, tp: int) -> None:
    """Raise ``ValueError`` unless ``tp`` is >= 1 and divides the KV heads or is a multiple
    of them (they are then replicated), as vLLM requires."""
    if tp < 1:
        raise ValueError(f"tensor-parallel size must be >= 1, got {tp}")
    if spec.num_kv_heads % tp and tp % spec.num_kv_heads:
        raise ValueError(
            f"{spec.name}: {spec.num_kv_heads} KV heads cannot be split or replicated over "
            f"tp={tp} GPUs"
        )


def kv_bytes_per_token(spec: ModelSpec, dtype_bytes: int = 2, tp: int = 1) -> int:
    """K and V bytes one token occupies on each of ``tp`` GPUs, over all layers:
    ``2 × layers × kv_heads_per_gpu × head_dim × dtype_bytes``. KV heads are split over
    ``tp`` and replicated when ``tp`` exceeds them (at least one per GPU); any other ``tp``
    is a ValueError (:func:`check_kv_heads_split`)."""
    check_kv_heads_split(spec, tp)
    kv_heads = max(1, spec.num_kv_heads // tp)
    return 2 * spec.num_layers * kv_heads * spec.head_dim * dtype_bytes


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape and numerics of one model; see the module doc for the families.

    ``max_model_len`` is the model's longest context (HF ``max_position_embeddings``, scaled
    by a RoPE scaling factor as vLLM does: :func:`rope_max_model_len`); a serving run may cap
    it lower (``system.max_model_len``). ``activation`` defaults to the family's (OPT
    ``relu``, Llama ``silu``). ``word_embed_proj_dim`` is OPT's optional embedding
    projection width (``None``: the hidden size; else the token embedding and LM head are
    that wide, and ``project_in`` / ``project_out`` map it to and from the hidden size).
    ``do_layer_norm_before`` false (OPT-350M) is post-LayerNorm, without a final LayerNorm.
    """

    name: str
    family: Family
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    max_model_len: int
    gated_mlp: bool
    tie_word_embeddings: bool
    num_position_embeddings: int = 0
    activation: str = ""
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"
    layer_norm_eps: float = 1e-5
    do_layer_norm_before: bool = True
    word_embed_proj_dim: int | None = None
    qk_norm: bool = False
    attention_bias: bool = False
    sliding_window: int | None = None
    model_type: str = ""
    hf_id: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.family not in _ACTIVATIONS:
            raise ValueError(
                f"model {self.name!r}: family must be 'opt' or 'llama', got {self.family!r}"
            )
        if not self.activation:
            object.__setattr__(self, "activation", _ACTIVATIONS[self.family])
        if not self.model_type:
            object.__setattr__(self, "model_type", self.family)
        for attr in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "ffn_hidden_size",
            "vocab_size",
            "max_model_len",
        ):
            value = getattr(self, attr)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"model {self.name!r}: {attr} must be positive, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name!r}: num_heads ({self.num_heads}) must be a "
                f"multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.activation != _ACTIVATIONS[self.family]:
            raise ValueError(
                f"model {self.name!r}: {self.family} models use activation "
                f"{_ACTIVATIONS[self.family]!r}, got {self.activation!r}"
            )
        if self.head_dim % 2:
            raise ValueError(f"model {self.name!r}: head_dim must be even, got {self.head_dim}")
        if self.family == "opt":
            if self.num_kv_heads != self.num_heads:
                raise ValueError(f"model {self.name!r}: OPT has no GQA (num_kv_heads)")
            if self.num_heads * self.head_dim != self.hidden_size:
                raise ValueError(
                    f"model {self.name!r}: OPT needs num_heads * head_dim == hidden_size, got "
                    f"{self.num_heads} * {self.head_dim} != {self.hidden_size}"
                )

    # -- shape ------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        """Width of the query projection output (``num_heads × head_dim``)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projection outputs."""
        return self.num_kv_heads * self.head_dim

    @property
    def embed_dim(self) -> int:
        """Width of the token embedding and of the LM head's input."""
        if self.family == "opt" and self.word_embed_proj_dim is not None:
            return self.word_embed_proj_dim
        return self.hidden_size

    def layer_matmul_params(self) -> int:
        """Weight-matrix elements of one decoder layer (no biases, no norms):
        q, k, v, o projections plus the MLP's 2 (or 3 when gated) matrices."""
        h, f = self.hidden_size, self.ffn_hidden_size
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        mlp = (3 if self.gated_mlp else 2) * h * f
        return attn + mlp

    def layer_other_params(self) -> int:
        """Bias and norm parameters of one decoder layer.

        OPT: biases of q, k, v, o, fc1, fc2 plus two LayerNorms (weight and bias);
        Llama: two RMSNorm weights (plus the q and k head norms with ``qk_norm``, and the
        q, k, v biases with ``attention_bias``).
        """
        h, f = self.hidden_size, self.ffn_hidden_size
        if self.family == "opt":
            biases = self.q_size + 2 * self.kv_size + h + f + h
            return biases + 2 * 2 * h
        extra = 2 * self.head_dim if self.qk_norm else 0
        bias = self.q_size + 2 * self.kv_size if self.attention_bias else 0
        return 2 * h + extra + bias

    def lm_head_params(self) -> int:
        """Elements of the output projection (``embed_dim × vocab``: the hidden size, or
        OPT's ``word_embed_proj_dim``), shared with the token embedding when
        ``tie_word_embeddings``."""
        return self.embed_dim * self.vocab_size

    def num_params(self) -> int:
        """Parameter count from the shape, as HF's ``OPTForCausalLM`` /
        ``LlamaForCausalLM`` hold them::

            vocab × embed_dim                    (token embedding; embed_dim: see embed_dim)
          + positions × hidden                   (OPT's learned positions, else 0)
          + 2 × hidden × embed_dim               (OPT's project_in / project_out, no bias,
                                                  only when embed_dim != hidden)
          + layers × (matmul + bias/norm params) (see layer_*_params)
          + final norm (OPT: 2 × hidden, none when do_layer_norm_before is false;
                        Llama: hidden)
          + vocab × embed_dim unless embeddings are tied (separate LM head)

        Exact for OPT-350M's released checkpoint (331,196,416).
        """
        h, e = self.hidden_size, self.embed_dim
        embed = self.vocab_size * e + self.num_position_embeddings * h
        projections = 2 * h * e if e != h else 0
        layers = self.num_layers * (self.layer_matmul_params() + self.layer_other_params())
        opt_norm = 2 * h if self.do_layer_norm_before else 0  # OPT-350M: no final LayerNorm
        final_norm = opt_norm if self.family == "opt" else h
        head = 0 if self.tie_word_embeddings else self.lm_head_params()
        return embed + projections + layers + final_norm + head

    def kv_bytes_per_token(self, dtype_bytes: int = 2, tp: int = 1) -> int:
        """See :func:`kv_bytes_per_token`."""
        return kv_bytes_per_token(self, dtype_bytes, tp)

    # -- HF config.json ---------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str | None = None) -> ModelSpec:
        """Build a spec from an HF ``config.json`` dict (OPT, Llama, Mistral, Qwen2/3).

        Errors name the missing, malformed or unsupported key: counts are whole numbers
        >= 1 (an optional one, e.g. ``num_key_value_heads``, may be absent or null: its
        default), flags JSON/YAML booleans, ``rms_norm_eps`` and ``rope_theta`` finite
        numbers > 0, and ``rope_scaling`` / ``rope_parameters`` mappings. ``name`` defaults
        to the config's ``_name_or_path``; ``hf_id`` is ``_name_or_path`` only when it looks
        like an HF Hub id (:func:`looks_like_hf_id`), not a local path. ``max_model_len`` is
        ``max_position_embeddings`` scaled as vLLM does (:func:`rope_max_model_len`). A
        config that counts more than one routed expert (:data:`MOE_KEYS`) is refused."""
        model_type = config.get("model_type")
        if model_type not in MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(MODEL_TYPES)}"
            )
        family = MODEL_TYPES[model_type]
        for key in MOE_KEYS:  # a mixture of experts labelled as a dense type
            if _number_over_one(config.get(key)):
                raise ValueError(
                    f"{model_type} config: {key} is {config[key]!r}: a mixture of experts, "
                    "which the cost model does not price (dense decoders only)"
                )
        for key in QUANTIZATION_KEYS:
            if config.get(key):
                quant = config[key]
                how = quant.get("quant_method", "") if isinstance(quant, dict) else ""
                raise ValueError(
                    f"{model_type} config: {key} is set{f' ({how})' if how else ''}: quantized "
                    "weights, which the cost model does not price (16-bit weights only: "
                    "give the unquantized model's config)"
                )
        hidden = _require(config, "hidden_size")
        heads = _require(config, "num_attention_heads")
        path_or_id = str(config.get("_name_or_path") or "")
        label = name or path_or_id or f"{model_type}-custom"
        head_dim = _optional_count(config, "head_dim")
        if head_dim is None and model_type == "qwen3":
            head_dim = QWEN3_HEAD_DIM
        if head_dim is None:
            if hidden % heads:
                raise ValueError(
                    f"{model_type} config: hidden_size ({hidden}) is not a multiple of "
                    f"num_attention_heads ({heads}) and no head_dim is given"
                )
            head_dim = hidden // heads
        common: dict[str, Any] = {
            "name": label,
            "family": family,
            "num_layers": _require(config, "num_hidden_layers"),
            "hidden_size": hidden,
            "num_heads": heads,
            "head_dim": head_dim,
            "vocab_size": _require(config, "vocab_size"),
            "max_model_len": _require(config, "max_position_embeddings"),
            "model_type": model_type,
            "hf_id": path_or_id if looks_like_hf_id(path_or_id) else "",
        }
        if family == "opt":
            _reject_unless(config, "enable_bias", True, True)
            _reject_unless(config, "layer_norm_elementwise_affine", True, True)
            _reject_unless(config, "_remove_final_layer_norm", False, False)
            proj = _optional_count(config, "word_embed_proj_dim")
            max_len = common["max_model_len"]
            return cls(
                **common,
                num_kv_heads=heads,
                ffn_hidden_size=_require(config, "ffn_dim"),
                gated_mlp=False,
                tie_word_embeddings=_flag(config, "tie_word_embeddings", True),
                num_position_embeddings=max_len + OPT_POSITION_OFFSET,
                activation=str(config.get("activation_function", "relu")),
                layer_norm_eps=_positive(config, "layer_norm_eps", 1e-5),
                do_layer_norm_before=_flag(config, "do_layer_norm_before", True),
                word_embed_proj_dim=None if proj in (None, hidden) else proj,
            )
        _reject_unless(config, "mlp_bias", False, False)
        rope_type, rope_theta = _rope(config)
        common["max_model_len"] = rope_max_model_len(config, common["max_model_len"])
        use_window = _flag(config, "use_sliding_window", True)
        if model_type in ("qwen2", "qwen3") and use_window:
            # Qwen's first max_window_layers layers attend in full (transformers'
            # Qwen2Config/Qwen3Config layer_types): none slides when they are all of them
            full = _optional_count(config, "max_window_layers")
            use_window = (QWEN_FULL_LAYERS if full is None else full) < common["num_layers"]
        kv_heads = _optional_count(config, "num_key_value_heads")
        return cls(
            **common,
            num_kv_heads=heads if kv_heads is None else kv_heads,
            ffn_hidden_size=_require(config, "intermediate_size"),
            gated_mlp=True,
            tie_word_embeddings=_flag(config, "tie_word_embeddings", False),
            activation=str(config.get("hidden_act", "silu")),
            rms_norm_eps=_positive(config, "rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_type=rope_type,
            qk_norm=model_type == "qwen3",
            attention_bias=_flag(config, "attention_bias", model_type == "qwen2"),
            sliding_window=_optional_count(config, "sliding_window") if use_window else None,
        )

    @classmethod
    def from_json(cls, path: str | Path, name: str | None = None) -> ModelSpec:
        """Read an HF ``config.json`` (or a directory holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no model config at {path}")
        config = read_mapping(path, json.loads, json.JSONDecodeError, "JSON", "a JSON object")
        label = name or str(config.get("_name_or_path") or path.parent.name)
        try:
            return cls.from_hf_config(config, label)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def to_hf_config(self) -> dict[str, Any]:
        """The HF-style config dict of this spec; ``from_hf_config`` inverts it."""
        cfg: dict[str, Any] = {
            "_name_or_path": self.name,
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_model_len,
            "tie_word_embeddings": self.tie_word_embeddings,
        }
        if self.family == "opt":
            cfg.update(
                ffn_dim=self.ffn_hidden_size,
                word_embed_proj_dim=self.word_embed_proj_dim or self.hidden_size,
                do_layer_norm_before=self.do_layer_norm_before,
                layer_norm_eps=self.layer_norm_eps,
                activation_function=self.activation,
            )
            return cfg
        cfg.update(
            intermediate_size=self.ffn_hidden_size,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            hidden_act=self.activation,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            attention_bias=self.attention_bias,
            sliding_window=self.sliding_window,
        )
        if self.rope_type != "default":
            cfg["rope_scaling"] = {"rope_type": self.rope_type}
        return cfg


def looks_like_hf_id(text: str) -> bool:
    """True when ``text`` is an HF Hub id (``org/name``: one '/', each part letters,
    digits, '-', '_' or '.', not starting with '.' or '-') and no existing local path
    (``_name_or_path`` holds a folder's path when a model was saved from or loaded from
    one)."""
    if not _HF_ID.fullmatch(text) or ".." in text:
        return False
    return not Path(text).exists()


def rope_max_model_len(d: Mapping[str, Any], max_position_embeddings: int) -> int:
    """The longest context of a RoPE model, as vLLM derives it
    (``_get_and_verify_max_len``): ``max_position_embeddings`` for RoPE types in
    :data:`UNSCALED_ROPE_TYPES` (their table is already the extended one, e.g. Llama-3.1's
    ``llama3``) and without scaling; otherwise times the block's ``factor`` (default 1),
    where ``yarn`` scales ``original_max_position_embeddings`` when given (Qwen3-8B's
    documented YaRN block: factor 4 × 32768 = 131072). The block is ``rope_parameters``
    (transformers >= 5) over ``rope_scaling``, as :func:`_rope` reads them; a malformed one
    raises ``ValueError`` naming the key."""
    scaling, params = _rope_blocks(d)
    block = {**scaling, **params}  # as _rope reads them
    key = "rope_parameters" if params else "rope_scaling"
    rope_type = block.get("rope_type", block.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"{d.get('model_type')} config: {key} has rope type {rope_type!r}; known: "
            f"{', '.join(ROPE_TYPES)}"
        )
    if rope_type in UNSCALED_ROPE_TYPES:
        return max_position_embeddings
    factor = block.get("factor", 1.0)
    if (
        isinstance(factor, bool)
        or not isinstance(factor, int | float)
        or not (math.isfinite(factor) and factor > 0)
    ):
        raise ValueError(
            f"{d.get('model_type')} config: {key}.factor must be a finite number > 0, "
            f"got {factor!r}"
        )
    base = max_position_embeddings
    original = block.get("original_max_position_embeddings")
    if rope_type == "yarn" and original is not None:
        if isinstance(original, bool) or not isinstance(original, int) or original < 1:
            raise ValueError(
                f"{d.get('model_type')} config: {key}.original_max_position_embeddings must "
                f"be a whole number >= 1, got {original!r}"
            )
        base = original
    return int(base * factor)


def _require(d: dict[str, Any], key: str) -> int:
    """A required count of the config (a size, a number of layers or heads): a whole
    number >= 1, else a ValueError naming the key."""
    if key not in d:
        raise ValueError(f"{d.get('model_type')} config lacks required key {key!r}")
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{d.get('model_type')} config: {key} must be a whole number >= 1, got {value!r}"
        )
    return value


def _optional_count(d: Mapping[str, Any], key: str) -> int | None:
    """An optional count of the config: None when absent or null, else as :func:`_require`
    (0, text or a fraction raise a ValueError naming the key)."""
    return None if d.get(key) is None else _require(d, key)


def _flag(d: Mapping[str, Any], key: str, default: bool) -> bool:
    """A flag of the config: ``default`` when absent, false when null (as HF's models test
    the attribute), else a JSON/YAML boolean; anything else (``"false"``, ``"no"``, 0)
    raises a ValueError naming the key."""
    value = d.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise ValueError(
            f"{d.get('model_type')} config: {key} must be true or false, got {value!r}"
        )
    return bool(value)


def _positive(d: Mapping[str, Any], key: str, default: float, block: str | None = None) -> float:
    """A real number of the config (of its mapping ``block`` when given): ``default`` when
    absent or null, else a finite number > 0 (numeric text too: YAML 1.1 reads ``1e-5`` as
    text); anything else raises a ValueError naming the key."""
    value = (d.get(block) or {}).get(key) if block else d.get(key)
    if value is None:
        return default
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        label = f"{block}.{key}" if block else key
        raise ValueError(
            f"{d.get('model_type')} config: {label} must be a finite number > 0, got {value!r}"
        )
    return number


def _rope_blocks(d: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The config's ``rope_scaling`` and ``rope_parameters`` (empty when absent or null);
    either not a mapping raises a ValueError naming the key."""
    blocks = []
    for name in ("rope_scaling", "rope_parameters"):
        block = d.get(name) or {}
        if not isinstance(block, Mapping):
            raise ValueError(
                f"{d.get('model_type')} config: {name} must be a mapping, got {block!r}"
            )
        blocks.append(block)
    return blocks[0], blocks[1]


def _reject_unless(d: dict[str, Any], key: str, expected: Any, default: Any) -> None:
    value = d.get(key, default)
    if value != expected:
        raise ValueError(
            f"{d.get('model_type')} config has {key}={value!r}; only {expected!r} is supported"
        )


def _rope(d: dict[str, Any]) -> tuple[str, float]:
    """RoPE type and base. transformers >= 5 nests them in ``rope_parameters``; older files
    use top-level ``rope_theta`` / ``rope_scaling``. Malformed ones raise a ValueError
    naming the key (:func:`_rope_blocks`, :func:`_positive`)."""
    scaling, params = _rope_blocks(d)
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    theta_block = "rope_parameters" if params.get("rope_theta") is not None else None
    return str(rope_type), _positive(d, "rope_theta", 10000.0, theta_block)


def _number_over_one(value: Any) -> bool:
    """A count above one, however written: an int, a float or a numeric string."""
    if isinstance(value, bool) or value is None:
        return False
    try:
        return float(value) > 1
    except (TypeError, ValueError):
        return False
