"""Model and GPU catalog: the shapes and datasheet numbers every cost and capacity model uses.

GPUs are data: each ``configs/hardware/<name>.yaml`` holds one GPU's datasheet numbers and
their sources (:func:`gpu_from_config` reads one; a run's ``hardware`` group may carry its
own numbers, so a user adds a GPU with one YAML). Models are :class:`core.model_spec.ModelSpec`
(the type the engine builds from too): the paper's models below, plus every
``configs/model/<name>.yaml`` that carries a ``shape`` (HF ``config.json`` keys), plus any
``config.json`` given by path (:func:`resolve_model`). HF ids (``meta-llama/Llama-3.1-8B``)
are accepted wherever a name is.

Sources of the built-in shapes:

- OPT shapes: Zhang et al., "OPT: Open Pre-trained Transformer Language Models", 2022,
  Table 1 (layers, heads, hidden size); FFN width is 4 × hidden, vocabulary 50272 and
  2048 positions (+2 offset rows) as in the released checkpoints' configs.
- LLaMA shapes: Touvron et al., "LLaMA: Open and Efficient Foundation Language Models",
  2023, Table 2 (dimension, heads, layers); FFN widths 11008 / 13824 and vocabulary 32000
  from the released configs.
- Llama-3-8B: Meta's released config (GQA with 8 KV heads).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from core.mapping_file import read_mapping
from core.model_spec import OPT_POSITION_OFFSET, ModelSpec

GIB = 1 << 30
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PEER_LINKS = ("nvlink", "pcie")
# A hardware YAML's numbers: key -> (GPUSpec field, scale to SI units).
HARDWARE_KEYS: dict[str, tuple[str, float]] = {
    "memory_gb": ("memory_bytes", GIB),
    "mem_bandwidth_gbs": ("mem_bandwidth", 1e9),
    "peak_tflops": ("peak_flops", 1e12),
    "host_link_gbs": ("host_link_bandwidth", 1e9),
    "peer_link_gbs": ("peer_link_bandwidth", 1e9),
}


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """Datasheet numbers of one GPU. Bandwidths in bytes/s per direction (half the
    datasheet's bidirectional totals), ``peak_flops`` is dense fp16/bf16 tensor-core
    FLOP/s. ``peer_link`` says how tensor-parallel peers talk (``nvlink`` or ``pcie``) at
    ``peer_link_bandwidth``; ``host_link_bandwidth`` is the CPU link swaps use.
    ``device_names`` are the names the device reports for itself
    (``torch.cuda.get_device_name``, as an operator profile's sidecar records it), by which
    :func:`get_gpu` finds the entry too. ``source`` maps each YAML key to where it comes
    from."""

    name: str
    memory_bytes: int
    mem_bandwidth: float
    peak_flops: float
    peer_link_bandwidth: float
    host_link_bandwidth: float
    peer_link: str = "nvlink"
    device_names: tuple[str, ...] = field(default=(), compare=False, hash=False, kw_only=True)
    source: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for attr in (
            "memory_bytes",
            "mem_bandwidth",
            "peak_flops",
            "peer_link_bandwidth",
            "host_link_bandwidth",
        ):
            value = getattr(self, attr)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"GPU {self.name!r}: {attr} must be finite and positive")
        if self.peer_link not in PEER_LINKS:
            raise ValueError(
                f"GPU {self.name!r}: peer_link must be one of {PEER_LINKS}, got {self.peer_link!r}"
            )


class HardwareError(ValueError):
    """A hardware group or YAML that describes no GPU; ``key`` is the YAML key at fault
    (None: the group as a whole)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


# The keys a hardware group may hold: its numbers, the link kind, the names the device
# reports and the sources of the numbers (``configs/hardware/*.yaml``).
HARDWARE_FIELDS = ("name", *HARDWARE_KEYS, "peer_link", "device_names", "source")


def _hardware_number(cfg: Mapping[str, Any], key: str, origin: str, name: str) -> float:
    """``cfg[key]`` times its SI scale; raises :class:`HardwareError` naming ``key`` unless
    the value is a finite number > 0 and stays finite once scaled."""
    raw = cfg.get(key)
    if raw is None:
        raise HardwareError(f"{origin}: GPU {name!r} lacks {key}", key)
    try:
        value = float(raw) * HARDWARE_KEYS[key][1]
    except (TypeError, ValueError):
        raise HardwareError(f"{origin}: {key} must be a number, got {raw!r}", key) from None
    if isinstance(raw, bool) or not (math.isfinite(value) and value > 0):
        raise HardwareError(f"{origin}: {key} must be a finite number > 0, got {raw!r}", key)
    return value


def gpu_from_config(cfg: Mapping[str, Any], origin: str = "hardware") -> GPUSpec:
    """A GPU from a hardware YAML's keys (see ``configs/hardware/*.yaml``); a missing,
    non-numeric, non-finite or non-positive number raises :class:`HardwareError` naming the
    key and ``origin`` (the file or config group)."""
    name = str(cfg.get("name") or Path(origin).stem)
    values: dict[str, Any] = {
        attr: _hardware_number(cfg, key, origin, name) for key, (attr, _) in HARDWARE_KEYS.items()
    }
    values["memory_bytes"] = int(values["memory_bytes"])
    if cfg.get("peer_link") is None:
        raise HardwareError(f"{origin}: GPU {name!r} lacks peer_link (nvlink or pcie)", "peer_link")
    source = {str(k): str(v) for k, v in (cfg.get("source") or {}).items()}
    device_names = cfg.get("device_names") or []
    if (
        not isinstance(device_names, Sequence)
        or isinstance(device_names, str)
        or not all(isinstance(d, str) for d in device_names)
    ):
        raise HardwareError(
            f"{origin}: device_names must be a list of strings, got {device_names!r}",
            "device_names",
        )
    try:
        return GPUSpec(
            name, peer_link=str(cfg["peer_link"]), device_names=tuple(device_names),
            source=source, **values,
        )  # fmt: skip
    except ValueError as e:
        raise HardwareError(f"{origin}: {e}", "peer_link") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    return read_mapping(path, yaml.safe_load, yaml.YAMLError, "YAML", "a mapping of keys")


@cache
def _gpu_files() -> dict[str, GPUSpec]:
    return {
        p.stem: gpu_from_config(_read_yaml(p), str(p.relative_to(CONFIGS.parent)))
        for p in sorted((CONFIGS / "hardware").glob("*.yaml"))
    }


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
        hf_id=f"facebook/{name}",
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
    **numerics: Any,
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
        **numerics,
    )


BUILTIN_MODELS: dict[str, ModelSpec] = {
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
            hf_id="meta-llama/Meta-Llama-3-8B",
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


MODELS = BUILTIN_MODELS  # the paper's models (the shape YAMLs: ``models()``)


def _model_files() -> dict[str, ModelSpec]:
    """The ``configs/model/*.yaml`` files that carry a ``shape`` (HF config keys)."""
    out = {}
    for p in sorted((CONFIGS / "model").glob("*.yaml")):
        doc = _read_yaml(p)
        if doc.get("shape"):
            out[p.stem] = model_from_config(doc, str(p.relative_to(CONFIGS.parent)))
    return out


def model_from_config(cfg: Mapping[str, Any], origin: str = "model") -> ModelSpec:
    """A model from a run's ``model`` group: ``hf_config`` (path to a ``config.json`` or its
    directory), else ``shape`` (HF config keys inline), else ``name`` looked up in the
    catalog. Errors name ``origin`` and the key."""
    name = cfg.get("name")
    if cfg.get("hf_config"):
        return ModelSpec.from_json(str(cfg["hf_config"]))
    if cfg.get("shape"):
        shape = dict(cfg["shape"])
        try:
            spec = ModelSpec.from_hf_config(shape, name=name or Path(origin).stem)
        except ValueError as e:
            raise ValueError(f"{origin}: {e}") from None
        hf_id = cfg.get("hf_id")
        if hf_id:
            spec = replace(spec, hf_id=str(hf_id))
        return spec
    if not name:
        raise ValueError(f"{origin}: give model.name, model.shape or model.hf_config")
    return get_model(str(name))


@cache
def models() -> dict[str, ModelSpec]:
    """Every known model by lower-case name: the built-ins and the shape YAMLs."""
    return {**BUILTIN_MODELS, **_model_files()}


@cache
def gpus() -> dict[str, GPUSpec]:
    """Every known GPU by name: the ``configs/hardware`` YAMLs."""
    return _gpu_files()


def _aliases(table: Mapping[str, ModelSpec]) -> dict[str, str]:
    return {spec.hf_id.lower(): key for key, spec in table.items() if spec.hf_id}


def get_model(name: str | ModelSpec) -> ModelSpec:
    """Catalog lookup by (case-insensitive) name or HF id; a spec is returned unchanged.
    An unknown name raises ``KeyError`` listing the known ones."""
    if isinstance(name, ModelSpec):
        return name
    table = models()
    key = name.lower()
    key = _aliases(table).get(key, key)
    if key not in table:
        raise KeyError(f"unknown model {name!r}; valid names: {', '.join(sorted(table))}")
    return table[key]


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """Catalog lookup by (case-insensitive) name or by a name the device reports for itself
    (an entry's ``device_names``); a spec is returned unchanged."""
    if isinstance(name, GPUSpec):
        return name
    table = gpus()
    key = name.lower()
    if key not in table:  # a catalog name first, then a device's own name
        by_device = {d.lower(): k for k, spec in table.items() for d in spec.device_names}
        key = by_device.get(key, key)
    if key not in table:
        raise KeyError(
            f"unknown GPU {name!r}; valid names: {', '.join(sorted(table))} (a device's own "
            "name, as torch.cuda.get_device_name reports it, goes in its hardware YAML's "
            "device_names)"
        )
    return table[key]


def resolve_gpu(cfg: Mapping[str, Any] | None, origin: str | None = None) -> GPUSpec:
    """A run's ``hardware`` group: its own numbers when it carries any (a user's YAML or
    command-line overrides such as ``hardware.mem_bandwidth_gbs=...``), else the named
    catalog entry. ``origin`` names where the group came from in errors (default: the
    shipped file of its name). An empty group, or numbers without a ``name``, raise
    :class:`HardwareError`; an unknown name raises ``KeyError`` (:func:`get_gpu`)."""
    cfg = cfg or {}
    name = cfg.get("name")
    where = origin or (f"hardware/{name}.yaml or hardware.* overrides" if name else "hardware")
    if not cfg:
        raise HardwareError(f"{where}: empty (a GPU's name, and its numbers for a new GPU)")
    if any(cfg.get(k) is not None for k in HARDWARE_KEYS):
        if name in (None, ""):
            raise HardwareError(f"{where}: the GPU has no name (give name: <gpu>)", "name")
        return gpu_from_config(cfg, where)
    return get_gpu(str(name))
