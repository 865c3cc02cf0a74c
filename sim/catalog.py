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
  2048 positions (+2 offset rows) as in the released checkpoints' configs; OPT-350M's
  ``word_embed_proj_dim`` 512 and ``do_layer_norm_before`` false from its released
  ``config.json`` (huggingface.co/facebook/opt-350m; 331,196,416 parameters).
- LLaMA shapes: Touvron et al., "LLaMA: Open and Efficient Foundation Language Models",
  2023, Table 2 (dimension, heads, layers); FFN widths 11008 / 13824 and vocabulary 32000
  from the released configs.
- Llama-3-8B: Meta's released config (GQA with 8 KV heads).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from core.defaults import GIB
from core.mapping_file import read_mapping
from core.model_spec import OPT_POSITION_OFFSET, ModelSpec

log = logging.getLogger(__name__)

# What GPUs have, in a hardware YAML's units: the smallest and largest of today's parts
# (NVIDIA datasheets: RTX 4090 24 GB, 1,008 GB/s, 165 dense TFLOPS; B200 192 GB, 8,000 GB/s,
# 2,250 dense TFLOPS; PCIe Gen3 x16 16 GB/s a direction; GH200's C2C link 450 GB/s and
# NVLink 5 900 GB/s a direction), ten-fold either side. A number outside is most likely in
# another unit (FLOP/s for TFLOPS, TB/s for GB/s): a warning, not an error, so a GPU beyond
# them still runs.
_GPU_RANGE = {
    "memory_gb": (24, 192),
    "mem_bandwidth_gbs": (1008, 8000),
    "peak_tflops": (165.2, 2250),
    "host_link_gbs": (16, 450),
    "peer_link_gbs": (16, 900),
}
PLAUSIBLE_HARDWARE = {key: (low / 10, high * 10) for key, (low, high) in _GPU_RANGE.items()}

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
# Optional numbers (null or absent: not measured): key -> (GPUSpec field, scale to SI units).
# ``reported_memory_gib`` is the device's total memory as the CUDA driver reports it to torch
# (vLLM multiplies that total, from ``torch.cuda.mem_get_info()``, by
# gpu_memory_utilization), a little below the nominal ``memory_gb``.
OPTIONAL_HARDWARE_KEYS: dict[str, tuple[str, float]] = {
    "reported_memory_gib": ("reported_memory_bytes", GIB),
}


class HardwareError(ValueError):
    """A hardware group or YAML that describes no GPU, or a :class:`GPUSpec` value out
    of range; ``key`` is the YAML key at fault (None: the group as a whole)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


# GPUSpec field -> the hardware YAML key it is read from.
_YAML_KEYS: dict[str, str] = {
    attr: key for key, (attr, _) in {**HARDWARE_KEYS, **OPTIONAL_HARDWARE_KEYS}.items()
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
    from.

    ``memory_bytes`` is the nominal memory (the datasheet's 'N GB' read as GiB, as the vLLM
    paper's Table 1 reads it); ``reported_memory_bytes`` is the total the CUDA driver
    reports for the device when it was measured (``None``: not measured). KV capacity
    starts from :attr:`total_memory_bytes`. A value out of range raises
    :class:`HardwareError` keyed by the YAML key it is read from."""

    name: str
    memory_bytes: int
    mem_bandwidth: float
    peak_flops: float
    peer_link_bandwidth: float
    host_link_bandwidth: float
    peer_link: str = "nvlink"
    device_names: tuple[str, ...] = field(default=(), compare=False, hash=False, kw_only=True)
    source: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    reported_memory_bytes: int | None = field(default=None, kw_only=True)

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
                raise HardwareError(
                    f"GPU {self.name!r}: {attr} must be finite and positive", _YAML_KEYS[attr]
                )
        reported = self.reported_memory_bytes
        if reported is not None and (type(reported) is not int or reported <= 0):
            raise HardwareError(
                f"GPU {self.name!r}: reported_memory_bytes must be a whole number > 0 or None, "
                f"got {reported!r}",
                "reported_memory_gib",
            )
        if self.peer_link not in PEER_LINKS:
            raise HardwareError(
                f"GPU {self.name!r}: peer_link must be one of {PEER_LINKS}, got {self.peer_link!r}",
                "peer_link",
            )

    @property
    def total_memory_key(self) -> str:
        """The hardware key :attr:`total_memory_bytes` comes from: ``reported_memory_gib``
        when measured and not above ``memory_bytes``, else ``memory_gb``."""
        reported = self.reported_memory_bytes
        if reported is not None and reported <= self.memory_bytes:
            return "reported_memory_gib"
        return "memory_gb"

    @property
    def total_memory_bytes(self) -> int:
        """The device total a KV budget starts from (vLLM multiplies the driver's total by
        ``gpu_memory_utilization``): the reported total when measured, else the nominal
        ``memory_bytes``. A ``memory_bytes`` set below the reported total after reading
        (``dataclasses.replace``, e.g. to a run's measured total) wins."""
        return min(self.memory_bytes, self.reported_memory_bytes or self.memory_bytes)


# The keys a hardware group may hold: its numbers, the link kind, the names the device
# reports and the sources of the numbers (``configs/hardware/*.yaml``).
HARDWARE_FIELDS = (
    "name", *HARDWARE_KEYS, *OPTIONAL_HARDWARE_KEYS, "peer_link", "device_names", "source",
)  # fmt: skip


def _check_known_keys(cfg: Mapping[str, Any], origin: str) -> None:
    unknown = [str(k) for k in cfg if k not in HARDWARE_FIELDS]
    if unknown:
        raise HardwareError(
            f"{origin}: unknown key {unknown[0]!r} (a hardware YAML holds "
            f"{', '.join(HARDWARE_FIELDS)})",
            unknown[0],
        )


def _hardware_number(cfg: Mapping[str, Any], key: str, origin: str, name: str) -> float:
    """``cfg[key]`` times its SI scale; raises :class:`HardwareError` naming ``key`` unless
    the value is a finite number > 0 and stays finite once scaled."""
    raw = cfg.get(key)
    if raw is None:
        raise HardwareError(f"{origin}: GPU {name!r} lacks {key}", key)
    try:
        value = float(raw) * {**HARDWARE_KEYS, **OPTIONAL_HARDWARE_KEYS}[key][1]
    except (TypeError, ValueError):
        raise HardwareError(f"{origin}: {key} must be a number, got {raw!r}", key) from None
    if isinstance(raw, bool) or not (math.isfinite(value) and value > 0):
        raise HardwareError(f"{origin}: {key} must be a finite number > 0, got {raw!r}", key)
    return value


_warned: set[tuple[str, str, float]] = set()  # a run reads its hardware several times


def forget_warnings() -> None:
    """Let every implausible hardware number warn again: called as a run starts, so that
    each run's log has its own warnings (a sweep's later jobs in one process included)."""
    _warned.clear()


def _warn_implausible(cfg: Mapping[str, Any], origin: str) -> None:
    """Warn, once a run (:func:`forget_warnings`; once a process outside a Hydra job), for
    each number outside :data:`PLAUSIBLE_HARDWARE` (a value in another unit)."""
    for key, (low, high) in PLAUSIBLE_HARDWARE.items():
        value = float(cfg[key])
        if not low <= value <= high and (origin, key, value) not in _warned:
            _warned.add((origin, key, value))
            log.warning(
                "%s: %s=%g is outside what GPUs have (%g to %g): a value in another unit?",
                origin, key, value, low, high,
            )  # fmt: skip


def _hardware_bytes(cfg: Mapping[str, Any], key: str, origin: str, name: str) -> int:
    """``cfg[key]`` in whole bytes (:func:`_hardware_number`); a size under one byte raises
    :class:`HardwareError` naming ``key``."""
    size = int(_hardware_number(cfg, key, origin, name))
    if size < 1:
        raise HardwareError(f"{origin}: {key} is under one byte, got {cfg[key]!r}", key)
    return size


def _reported_memory(
    cfg: Mapping[str, Any], origin: str, name: str, memory_bytes: int
) -> int | None:
    """``reported_memory_gib`` in bytes, ``None`` when null or absent; raises
    :class:`HardwareError` naming the key unless it is a finite number > 0 and at most
    ``memory_bytes`` (the driver reports less than the nominal memory, never more)."""
    if cfg.get("reported_memory_gib") is None:
        return None
    reported = _hardware_bytes(cfg, "reported_memory_gib", origin, name)
    if reported > memory_bytes:
        raise HardwareError(
            f"{origin}: reported_memory_gib ({cfg['reported_memory_gib']}) exceeds memory_gb "
            f"({memory_bytes / GIB:g}) of GPU {name!r}: give the total the device reports "
            "(at most memory_gb), or null to use memory_gb",
            "reported_memory_gib",
        )
    return reported


def gpu_from_config(cfg: Mapping[str, Any], origin: str = "hardware") -> GPUSpec:
    """A GPU from a hardware YAML's keys (see ``configs/hardware/*.yaml``); a missing,
    non-numeric, non-finite or non-positive number raises :class:`HardwareError` naming the
    key and ``origin`` (the file or config group). The optional ``reported_memory_gib``
    (null or absent: not measured) must be a finite number > 0 and at most ``memory_gb``.
    A key that is not one of :data:`HARDWARE_FIELDS` (a misspelt number would otherwise be
    ignored) raises naming it."""
    name = str(cfg.get("name") or Path(origin).stem)
    _check_known_keys(cfg, origin)
    values: dict[str, Any] = {
        attr: _hardware_number(cfg, key, origin, name) for key, (attr, _) in HARDWARE_KEYS.items()
    }
    values["memory_bytes"] = _hardware_bytes(cfg, "memory_gb", origin, name)
    _warn_implausible(cfg, origin)
    reported = _reported_memory(cfg, origin, name, values["memory_bytes"])
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
            source=source, reported_memory_bytes=reported, **values,
        )  # fmt: skip
    except HardwareError as e:
        raise HardwareError(f"{origin}: {e}", e.key) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    return read_mapping(path, yaml.safe_load, yaml.YAMLError, "YAML", "a mapping of keys")


@cache
def _gpu_files() -> dict[str, GPUSpec]:
    return {
        p.stem: gpu_from_config(_read_yaml(p), str(p.relative_to(CONFIGS.parent)))
        for p in sorted((CONFIGS / "hardware").glob("*.yaml"))
    }


def _opt(name: str, layers: int, hidden: int, heads: int, **numerics: Any) -> ModelSpec:
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
        **numerics,
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
        # facebook/opt-350m's config.json: a 512-wide embedding projected to the hidden
        # size, and post-LayerNorm blocks without a final LayerNorm
        _opt("opt-350m", 24, 1024, 16, word_embed_proj_dim=512, do_layer_norm_before=False),
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

# The keys of a run's ``model`` group (a model YAML): what :func:`model_from_config` reads,
# ``tp`` and serve's ``path``; the model's HF config.json keys go under ``shape``.
MODEL_GROUP_KEYS = ("name", "hf_id", "tp", "hf_config", "shape", "path")


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
        catalog. With ``shape``, the group's ``name`` (default: ``origin``'s stem) and ``hf_id``
        label the model. With ``hf_config`` they do too, unless ``name`` is a catalog model of
        another shape: the group then is another model's (``model.hf_config=...`` on the
        default group) and the config labels itself (its ``_name_or_path``, else its folder's
        name; :meth:`ModelSpec.from_json`). Errors name the key, and ``origin`` where it is a
    file (:func:`model_key` names the group's key at fault)."""
    name = cfg.get("name")
    hf_id = cfg.get("hf_id")
    if cfg.get("hf_config"):
        spec = ModelSpec.from_json(str(cfg["hf_config"]))
        if not name or not _may_label(str(name), spec):
            return check_self_label(spec, cfg["hf_config"])
        spec = replace(spec, name=str(name))
    elif cfg.get("shape"):
        shape = dict(cfg["shape"])
        try:
            spec = ModelSpec.from_hf_config(shape, name=name or Path(origin).stem)
        except ValueError as e:
            if origin == "model":
                raise  # the run's own group: the caller names model.shape
            raise ValueError(f"{origin}: {e}") from None
    elif name:
        return get_model(str(name))
    else:
        where = "" if origin == "model" else f"{origin}: "  # the caller names the run's group
        raise ValueError(f"{where}give model.name, model.shape or model.hf_config")
    return replace(spec, hf_id=str(hf_id)) if hf_id else spec


def model_key(cfg: Mapping[str, Any]) -> str:
    """The key of a run's ``model`` group that :func:`model_from_config` reads the model
    from, for an error's key: ``model.hf_config``, ``model.shape`` or ``model``."""
    if cfg.get("hf_config"):
        return "model.hf_config"
    return "model.shape" if cfg.get("shape") else "model"


def differing_fields(a: ModelSpec, b: ModelSpec) -> list[str]:
    """The fields other than the name in which ``a`` and ``b`` differ: two specs that differ
    in one are two models (their work, KV per token or numerics), whatever they are called."""
    keys = [f.name for f in fields(ModelSpec) if f.compare and f.name != "name"]
    return [k for k in keys if getattr(a, k) != getattr(b, k)]


def check_self_label(spec: ModelSpec, path: str | Path) -> ModelSpec:
    """``spec``, read from the config.json at ``path``, under the label it gave itself (its
    ``_name_or_path``, else its folder's name); a ValueError naming the file when that
    label is a catalog model of another shape, which the results, the runs index and the
    calibration check (by name) would take it for."""
    try:
        known = get_model(spec.name)
    except KeyError:
        return spec
    differs = differing_fields(spec, known)
    if not differs:
        return spec
    file = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    raise ValueError(
        f"{file}: labelled {spec.name!r} (its _name_or_path, else its folder's name), the "
        f"catalog's {known.name}, but {', '.join(differs)} differ: give the model a name of "
        "its own in _name_or_path"
    )


def _may_label(name: str, spec: ModelSpec) -> bool:
    """Whether a ``model`` group's ``name`` may label ``spec`` (read from a config.json):
    a name the catalog lacks, or a catalog model of the same shape and numerics."""
    try:
        known = get_model(name)
    except KeyError:
        return True
    return not differing_fields(spec, known)


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


def _credit_overrides(gpu: GPUSpec, where: str) -> GPUSpec:
    """``gpu`` with the source of each number that differs from the catalog entry of its
    name, under that entry's own source, credited to ``where`` (a command-line override
    such as ``hardware.memory_gb=32`` keeps the shipped file's source text otherwise)."""
    shipped = gpus().get(gpu.name)
    if shipped is None:
        return gpu
    source = dict(gpu.source)
    for key, (attr, scale) in HARDWARE_KEYS.items():
        value, was = getattr(gpu, attr), getattr(shipped, attr)
        if math.isclose(value, was, rel_tol=1e-9) or source.get(key) != shipped.source.get(key):
            continue
        source[key] = (
            f"overridden to {value / scale:g} in {where} (the catalog's {gpu.name}: "
            f"{was / scale:g}, {shipped.source.get(key, 'no source given')})"
        )
    return replace(gpu, source=source)


def resolve_gpu(cfg: Mapping[str, Any] | None, origin: str | None = None) -> GPUSpec:
    """A run's ``hardware`` group: its own numbers when it carries any (a user's YAML or
    command-line overrides such as ``hardware.mem_bandwidth_gbs=...``), else the named
    catalog entry (with the group's ``reported_memory_gib`` when it has the key; null:
    the nominal ``memory_gb``).
    ``origin`` names where the group came from in errors (default: the shipped file of its
    name). An empty group, or numbers without a ``name``, raise
    :class:`HardwareError`; an unknown name raises ``KeyError`` (:func:`get_gpu`)."""
    cfg = cfg or {}
    name = cfg.get("name")
    where = origin or (f"hardware/{name}.yaml or hardware.* overrides" if name else "hardware")
    if not cfg:
        raise HardwareError(f"{where}: empty (a GPU's name, and its numbers for a new GPU)")
    _check_known_keys(cfg, where)
    if any(cfg.get(k) is not None for k in HARDWARE_KEYS):
        if name in (None, ""):
            raise HardwareError(f"{where}: the GPU has no name (give name: <gpu>)", "name")
        return _credit_overrides(gpu_from_config(cfg, where), where)
    gpu = get_gpu(str(name))
    if "reported_memory_gib" not in cfg:
        return gpu
    reported = _reported_memory(cfg, where, gpu.name, gpu.memory_bytes)
    source = {**gpu.source, "reported_memory_gib": f"set by {where}"}
    return replace(gpu, reported_memory_bytes=reported, source=source)
