"""Model shape and numerics of a decoder-only OPT or Llama-family model.

``ModelConfig`` is built from an HF-style ``config.json`` dict (``from_hf_dict`` /
``from_json``) or directly from its fields (e.g. from the simulator's model catalog).
Only features the engine's models implement are accepted; anything else is rejected with
an error naming the offending key, so a checkpoint never silently runs with the wrong math.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Family = Literal["opt", "llama"]

_ACTIVATIONS: dict[str, str] = {"opt": "relu", "llama": "silu"}


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one model.

    ``activation`` is ``"relu"`` (OPT's two-layer FFN) or ``"silu"`` (Llama's SwiGLU).
    Fields one family does not use keep their defaults: OPT ignores ``rms_norm_eps`` and
    ``rope_theta``; Llama ignores ``layer_norm_eps``, ``do_layer_norm_before`` and
    ``word_embed_proj_dim``.
    """

    family: Family
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    max_position_embeddings: int
    activation: str
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    layer_norm_eps: float = 1e-5
    do_layer_norm_before: bool = True
    tie_word_embeddings: bool = False
    word_embed_proj_dim: int | None = None

    def __post_init__(self) -> None:
        if self.family not in _ACTIVATIONS:
            raise ValueError(f"unsupported family {self.family!r}; expected 'opt' or 'llama'")
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "ffn_hidden_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.activation != _ACTIVATIONS[self.family]:
            raise ValueError(
                f"{self.family} models use activation {_ACTIVATIONS[self.family]!r}, "
                f"got {self.activation!r}"
            )
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even, got {self.head_dim}")
        if self.family == "opt":
            if self.num_kv_heads != self.num_heads:
                raise ValueError("OPT has no GQA: num_kv_heads must equal num_heads")
            if self.num_heads * self.head_dim != self.hidden_size:
                raise ValueError(
                    f"OPT needs num_heads * head_dim == hidden_size, got "
                    f"{self.num_heads} * {self.head_dim} != {self.hidden_size}"
                )
            if self.word_embed_proj_dim is not None and self.word_embed_proj_dim <= 0:
                raise ValueError(
                    f"word_embed_proj_dim must be positive, got {self.word_embed_proj_dim}"
                )

    @property
    def embed_dim(self) -> int:
        """Width of the token embedding and of the LM head's input."""
        if self.family == "opt" and self.word_embed_proj_dim is not None:
            return self.word_embed_proj_dim
        return self.hidden_size

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build from an HF ``config.json`` dict with ``model_type`` ``"opt"`` or ``"llama"``."""
        model_type = d.get("model_type")
        if model_type == "opt":
            return _from_opt(d)
        if model_type == "llama":
            return _from_llama(d)
        raise ValueError(f"unsupported model_type {model_type!r}; supported: 'opt', 'llama'")

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        """Read an HF ``config.json`` (or a directory holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no model config at {path}")
        with path.open() as f:
            return cls.from_hf_dict(json.load(f))


def _require(d: dict[str, Any], key: str) -> Any:
    if key not in d:
        raise ValueError(f"{d.get('model_type')} config lacks required key {key!r}")
    return d[key]


def _reject_unless(d: dict[str, Any], key: str, expected: Any, default: Any) -> None:
    value = d.get(key, default)
    if value != expected:
        raise ValueError(
            f"{d.get('model_type')} config has {key}={value!r}; only {expected!r} is supported"
        )


def _from_opt(d: dict[str, Any]) -> ModelConfig:
    hidden = _require(d, "hidden_size")
    heads = _require(d, "num_attention_heads")
    if hidden % heads != 0:
        raise ValueError(
            f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})"
        )
    _reject_unless(d, "enable_bias", True, True)
    _reject_unless(d, "layer_norm_elementwise_affine", True, True)
    _reject_unless(d, "_remove_final_layer_norm", False, False)
    proj = d.get("word_embed_proj_dim")
    return ModelConfig(
        family="opt",
        vocab_size=_require(d, "vocab_size"),
        hidden_size=hidden,
        num_layers=_require(d, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        ffn_hidden_size=_require(d, "ffn_dim"),
        max_position_embeddings=_require(d, "max_position_embeddings"),
        activation=d.get("activation_function", "relu"),
        do_layer_norm_before=bool(d.get("do_layer_norm_before", True)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
        word_embed_proj_dim=None if proj in (None, hidden) else proj,
    )


def _rope_theta(d: dict[str, Any]) -> float:
    # transformers >= 5 nests RoPE settings in ``rope_parameters``; older files use
    # top-level ``rope_theta`` / ``rope_scaling``.
    params = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or {}
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        raise ValueError(f"llama config uses rope_type {rope_type!r}; only 'default' is supported")
    return float(params.get("rope_theta", d.get("rope_theta", 10000.0)))


def _from_llama(d: dict[str, Any]) -> ModelConfig:
    hidden = _require(d, "hidden_size")
    heads = _require(d, "num_attention_heads")
    head_dim = d.get("head_dim")
    if head_dim is None:
        if hidden % heads != 0:
            raise ValueError(
                f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})"
            )
        head_dim = hidden // heads
    _reject_unless(d, "attention_bias", False, False)
    _reject_unless(d, "mlp_bias", False, False)
    return ModelConfig(
        family="llama",
        vocab_size=_require(d, "vocab_size"),
        hidden_size=hidden,
        num_layers=_require(d, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=d.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        ffn_hidden_size=_require(d, "intermediate_size"),
        max_position_embeddings=_require(d, "max_position_embeddings"),
        activation=d.get("hidden_act", "silu"),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(d),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
    )
