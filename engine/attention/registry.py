"""Attention backends by name.

To add a backend, add one entry to ``_BACKENDS``: name -> ``"module:ClassName"``. The
module is imported only when that backend is requested, so optional dependencies (Triton)
are never needed by callers that do not use them.
"""

from __future__ import annotations

import importlib

from engine.attention.base import AttentionBackend

_BACKENDS: dict[str, str] = {
    "torch": "engine.attention.torch_ref:TorchRefBackend",
    "triton": "engine.attention.triton_backend:TritonAttentionBackend",
}


def available_backends() -> list[str]:
    """Names ``get_backend`` accepts, sorted."""
    return sorted(_BACKENDS)


def get_backend(name: str) -> AttentionBackend:
    """A new instance of the backend registered under ``name``."""
    if name not in _BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; available: {', '.join(available_backends())}"
        )
    module_name, class_name = _BACKENDS[name].split(":")
    backend_cls = getattr(importlib.import_module(module_name), class_name)
    return backend_cls()
