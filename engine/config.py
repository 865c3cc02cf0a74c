"""What the engine's models implement of a :class:`core.model_spec.ModelSpec`.

The engine builds from the same model type the simulator prices; this module only says
which specs it can run. OPT and Llama-layout models (Llama, Mistral without a sliding
window) run; Qwen3 (q/k norm), Llama-3.1's ``llama3`` RoPE scaling, sliding windows and
attention biases are priced by the simulator only, and the engine refuses them with the
feature named, so a checkpoint never silently runs with the wrong math.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.model_spec import ModelSpec


def check_engine_support(spec: ModelSpec) -> ModelSpec:
    """``spec`` unchanged if the engine's models implement it; else ``ValueError`` naming
    the unsupported feature."""
    label = f"{spec.name} ({spec.model_type} config)"
    if spec.family == "llama":
        if spec.rope_type != "default":
            raise ValueError(
                f"{label} uses rope_type {spec.rope_type!r}; only 'default' is supported "
                "by the engine (the simulator prices it)"
            )
        for feature, value, default in (
            ("qk_norm", spec.qk_norm, False),
            ("attention_bias", spec.attention_bias, False),
            ("sliding_window", spec.sliding_window, None),
        ):
            if value != default:
                raise ValueError(
                    f"{label} has {feature}={value!r}; the engine supports only "
                    f"{default!r} (the simulator prices it)"
                )
    return spec


def spec_from_hf_dict(config: dict[str, Any]) -> ModelSpec:
    """Parse an HF ``config.json`` dict and check the engine supports it."""
    return check_engine_support(ModelSpec.from_hf_config(config))


def spec_from_json(path: str | Path) -> ModelSpec:
    """Read an HF ``config.json`` (or its directory) and check the engine supports it."""
    return check_engine_support(ModelSpec.from_json(path))
