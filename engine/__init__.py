"""The real engine: models over paged KV tensors driven by ``core``'s schedulers."""

from engine.engine import EngineResult, LLMEngine, RequestOutput

__all__ = ["EngineResult", "LLMEngine", "RequestOutput"]
