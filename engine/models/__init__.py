"""Model construction: ``build_model`` picks the class for a config's family."""

from __future__ import annotations

import torch
from torch import nn

from core.model_spec import ModelSpec
from engine.attention.base import AttentionBackend
from engine.attention.registry import get_backend
from engine.models.llama import LlamaCausalLM
from engine.models.opt import OPTCausalLM

CausalLM = OPTCausalLM | LlamaCausalLM

_MODEL_CLASSES: dict[str, type[nn.Module]] = {"opt": OPTCausalLM, "llama": LlamaCausalLM}


def build_model(
    config: ModelSpec,
    backend: AttentionBackend | str,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> CausalLM:
    """Allocate the model for ``config`` on ``device`` in ``dtype``, in eval mode.

    Parameters are allocated but NOT initialised (no wasted init pass, no fp32 copy of a
    large model in host memory): fill them with ``engine.weights.init_dummy_weights`` or
    ``engine.weights.load_checkpoint`` before use. ``backend`` is an ``AttentionBackend``
    or a name known to ``engine.attention.registry``.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"model dtype must be floating point, got {dtype}")
    if isinstance(backend, str):
        backend = get_backend(backend)
    with torch.device("meta"):
        model = _MODEL_CLASSES[config.family](config, backend)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.tie_weights()
    return model.eval()


__all__ = ["CausalLM", "LlamaCausalLM", "OPTCausalLM", "build_model"]
