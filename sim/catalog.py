"""Model and GPU catalog: the shapes and datasheet numbers every cost and capacity model uses.

The engine builds its models from the same :class:`ModelSpec` (``to_hf_config()``), so a
model name means the same network in the simulator and on the GPU.

Sources:

- OPT shapes: Zhang et al., "OPT: Open Pre-trained Transformer Language Models", 2022,
  Table 1 (layers, heads, hidden size); FFN width is 4 × hidden, vocabulary 50272 and
  2048 positions (+2 offset rows) as in the released checkpoints' configs.
- LLaMA shapes: Touvron et al., "LLaMA: Open and Efficient Foundation Language Models",
  2023, Table 2 (dimension, heads, layers); FFN widths 11008 / 13824 and vocabulary 32000
  from the released configs.
- Llama-3-8B: Meta's released config (GQA with 8 KV heads).
- GPUs: NVIDIA datasheets as quoted in PAPER.md (HBM size, HBM bandwidth, dense fp16/bf16
  tensor-core peak). NVLink: A100 SXM 600 GB/s total (NVLink 3, 12 links × 50 GB/s),
  H100/H200 SXM 900 GB/s total (NVLink 4, 18 links × 50 GB/s); both are bidirectional
  sums, so the per-direction rate a ring all-reduce sees is half. Host link: A100 PCIe
  Gen4 x16, H100/H200 PCIe Gen5 x16 (datasheets: 64 / 128 GB/s bidirectional).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Family = Literal["opt", "llama"]

GIB = 1 << 30

# OPT's learned positional table has 2 extra rows (position ids start at offset 2).
OPT_POSITION_OFFSET = 2


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The shape of a decoder-only transformer.

    ``family`` fixes the block layout: ``"opt"`` is pre-LayerNorm with biases on every
    linear layer and a learned positional table of ``num_position_embeddings`` rows;
    ``"llama"`` is pre-RMSNorm without biases and rotary positions (no table).
    ``gated_mlp`` means a SwiGLU MLP with three matrices (gate, up, down).
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
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.family not in ("opt", "llama"):
            raise ValueError(
                f"model {self.name!r}: family must be 'opt' or 'llama', got {self.family!r}"
            )
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
            if getattr(self, attr) <= 0:
                raise ValueError(
                    f"model {self.name!r}: {attr} must be positive, got {getattr(self, attr)}"
                )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name!r}: num_heads ({self.num_heads}) must be a "
                f"multiple of num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def q_size(self) -> int:
        """Width of the query projection output (``num_heads × head_dim``)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projection outputs."""
        return self.num_kv_heads * self.head_dim

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
        Llama: two RMSNorm weights.
        """
        h, f = self.hidden_size, self.ffn_hidden_size
        if self.family == "opt":
            biases = self.q_size + 2 * self.kv_size + h + f + h
            return biases + 2 * 2 * h
        return 2 * h

    def lm_head_params(self) -> int:
        """Elements of the output projection (``hidden × vocab``), shared with the
        token embedding when ``tie_word_embeddings``."""
        return self.hidden_size * self.vocab_size

    def num_params(self) -> int:
        """Parameter count from the shape::

            vocab × hidden                       (token embedding)
          + positions × hidden                   (OPT's learned positions, else 0)
          + layers × (matmul + bias/norm params) (see layer_*_params)
          + final norm (OPT: 2 × hidden, Llama: hidden)
          + vocab × hidden unless embeddings are tied (separate LM head)

        OPT-350M's 512-wide embedding projections are not modelled (its count is ~1% off).
        """
        h = self.hidden_size
        embed = self.vocab_size * h + self.num_position_embeddings * h
        layers = self.num_layers * (self.layer_matmul_params() + self.layer_other_params())
        final_norm = 2 * h if self.family == "opt" else h
        head = 0 if self.tie_word_embeddings else self.lm_head_params()
        return embed + layers + final_norm + head

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V bytes one token occupies over all layers and KV heads:
        ``2 × layers × kv_heads × head_dim × dtype_bytes``."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str | None = None) -> ModelSpec:
        """Build a spec from an OPT or Llama-style Hugging Face ``config.json`` dict."""
        model_type = config.get("model_type")
        if model_type not in ("opt", "llama", "mistral"):
            raise ValueError(
                f"unsupported model_type {model_type!r}: expected 'opt' or a "
                "Llama-style type ('llama', 'mistral')"
            )
        try:
            hidden = int(config["hidden_size"])
            layers = int(config["num_hidden_layers"])
            heads = int(config["num_attention_heads"])
            vocab = int(config["vocab_size"])
            max_len = int(config["max_position_embeddings"])
            ffn = int(config["ffn_dim"] if model_type == "opt" else config["intermediate_size"])
        except KeyError as e:
            raise ValueError(f"HF config for model_type {model_type!r} lacks key {e}") from e
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        label = name or str(config.get("_name_or_path") or f"{model_type}-custom")
        if model_type == "opt":
            return cls(
                label,
                "opt",
                layers,
                hidden,
                heads,
                kv_heads,
                head_dim,
                ffn,
                vocab,
                max_len,
                gated_mlp=False,
                tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
                num_position_embeddings=max_len + OPT_POSITION_OFFSET,
            )
        return cls(
            label,
            "llama",
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            ffn,
            vocab,
            max_len,
            gated_mlp=True,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            extra={k: config[k] for k in ("rope_theta", "rms_norm_eps") if k in config},
        )

    def to_hf_config(self) -> dict[str, Any]:
        """The HF-style config dict of this shape; ``from_hf_config`` inverts it."""
        cfg: dict[str, Any] = {
            "_name_or_path": self.name,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_model_len,
            "tie_word_embeddings": self.tie_word_embeddings,
        }
        if self.family == "opt":
            cfg.update(
                model_type="opt",
                ffn_dim=self.ffn_hidden_size,
                word_embed_proj_dim=self.hidden_size,
                do_layer_norm_before=True,
            )
        else:
            cfg.update(
                model_type="llama",
                intermediate_size=self.ffn_hidden_size,
                num_key_value_heads=self.num_kv_heads,
                head_dim=self.head_dim,
            )
            cfg.update(self.extra)
        return cfg


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """Datasheet numbers of one GPU. Bandwidths in bytes/s, ``peak_flops`` is dense
    fp16/bf16 tensor-core FLOP/s, ``nvlink_bandwidth`` and ``pcie_bandwidth`` are
    per-direction rates (half the datasheet's bidirectional totals)."""

    name: str
    memory_bytes: int
    mem_bandwidth: float
    peak_flops: float
    nvlink_bandwidth: float
    pcie_bandwidth: float

    def __post_init__(self) -> None:
        for attr in (
            "memory_bytes",
            "mem_bandwidth",
            "peak_flops",
            "nvlink_bandwidth",
            "pcie_bandwidth",
        ):
            if getattr(self, attr) <= 0:
                raise ValueError(f"GPU {self.name!r}: {attr} must be positive")


def _opt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name,
        "opt",
        layers,
        hidden,
        heads,
        heads,
        hidden // heads,
        4 * hidden,
        50272,
        2048,
        gated_mlp=False,
        tie_word_embeddings=True,
        num_position_embeddings=2048 + OPT_POSITION_OFFSET,
    )


def _llama(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    vocab: int,
    max_len: int,
    **extra: Any,
) -> ModelSpec:
    return ModelSpec(
        name,
        "llama",
        layers,
        hidden,
        heads,
        kv_heads,
        hidden // heads,
        ffn,
        vocab,
        max_len,
        gated_mlp=True,
        tie_word_embeddings=False,
        extra=extra,
    )


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        _opt("opt-125m", 12, 768, 12),
        _opt("opt-350m", 24, 1024, 16),
        _opt("opt-1.3b", 24, 2048, 32),
        _opt("opt-2.7b", 32, 2560, 32),
        _opt("opt-6.7b", 32, 4096, 32),
        _opt("opt-13b", 40, 5120, 40),
        _opt("opt-30b", 48, 7168, 56),
        _opt("opt-66b", 64, 9216, 72),
        _opt("opt-175b", 96, 12288, 96),
        _llama("llama-7b", 32, 4096, 32, 32, 11008, 32000, 2048, rms_norm_eps=1e-6),
        _llama("llama-13b", 40, 5120, 40, 40, 13824, 32000, 2048, rms_norm_eps=1e-6),
        _llama(
            "llama-3-8b",
            32,
            4096,
            32,
            8,
            14336,
            128256,
            8192,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
        ),
        ModelSpec(
            "tiny-opt",
            "opt",
            2,
            64,
            4,
            4,
            16,
            256,
            512,
            256,
            gated_mlp=False,
            tie_word_embeddings=True,
            num_position_embeddings=256 + OPT_POSITION_OFFSET,
        ),
        ModelSpec(
            "tiny-llama",
            "llama",
            2,
            64,
            4,
            2,
            16,
            176,
            512,
            256,
            gated_mlp=True,
            tie_word_embeddings=False,
        ),
    ]
}

# Memory: the nominal "N GB" read as N GiB, as the paper's Table 1 does (40 GB A100 =
# 40 GiB); the driver reports slightly less on H100/H200: pass a measured GPUSpec there.
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec("a100-40gb", 40 * GIB, 1555e9, 312e12, 300e9, 32e9),
        GPUSpec("a100-80gb", 80 * GIB, 2039e9, 312e12, 300e9, 32e9),
        GPUSpec("h100", 80 * GIB, 3350e9, 989e12, 450e9, 64e9),
        GPUSpec("h200", 141 * GIB, 4800e9, 989e12, 450e9, 64e9),
    ]
}


def _lookup(table: dict[str, Any], kind: str, name: str) -> Any:
    key = name.lower()
    if key not in table:
        raise KeyError(f"unknown {kind} {name!r}; valid names: {', '.join(sorted(table))}")
    return table[key]


def get_model(name: str | ModelSpec) -> ModelSpec:
    """Catalog lookup by (case-insensitive) name; a spec is returned unchanged."""
    return name if isinstance(name, ModelSpec) else _lookup(MODELS, "model", name)


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """Catalog lookup by (case-insensitive) name; a spec is returned unchanged."""
    return name if isinstance(name, GPUSpec) else _lookup(GPUS, "GPU", name)
