"""The batch limits vLLM picks when a run gives none: ``max_num_seqs`` and
``max_num_batched_tokens`` by the system's vLLM version (``core.systems.SystemSpec``'s
``batch_defaults``), the served context and the GPU.

- **vLLM v0** (``v0``: the paper's systems, chunked prefill on or off): 256 sequences, and
  ``max(2560, max_model_len)`` tokens. 2560 is vLLM v0.1's default (``EngineArgs``, the
  paper's version); from v0.2 vLLM raises its default to ``max_model_len`` where that is
  larger (``SchedulerConfig``: ``max(max_model_len, 2048)``), since a prompt-only step must
  hold the longest prompt (v0.1 instead dropped any prompt longer than the budget).
- **vLLM V1** (``v1``: ``vllm_v1``): ``vllm serve``'s defaults (``EngineArgs.get_batch_defaults``,
  usage context ``OPENAI_API_SERVER``): 1024 sequences and 8192 tokens on a GPU with at
  least 70 GiB of memory whose name does not say A100 ("setting large
  max_num_batched_tokens for A100 reduces throughput", vLLM PR #17885), else 256 and 2048
  (the RTX 4090 run's ``meta.json`` shows 256 / 2048). No GPU: the latter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

V0_MAX_NUM_SEQS = 256
V0_MAX_NUM_BATCHED_TOKENS = 2560
V1_LARGE_GPU_GIB = 70.0
V1_LARGE = (1024, 8192)  # (max_num_seqs, max_num_batched_tokens)
V1_OTHER = (256, 2048)
VERSIONS = ("v0", "v1")


class DeviceFacts(NamedTuple):
    """What vLLM's rule reads of the GPU: its name and total memory in GiB."""

    name: str
    memory_gib: float


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """Resolved limits and, per limit, where it came from (``given`` or the rule's words)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    seqs_source: str
    tokens_source: str

    def describe(self) -> str:
        return (
            f"max_num_seqs {self.max_num_seqs} ({self.seqs_source}), max_num_batched_tokens "
            f"{self.max_num_batched_tokens} ({self.tokens_source})"
        )


def batch_limits(
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    version: str,
    max_model_len: int,
    device: DeviceFacts | None = None,
) -> BatchLimits:
    """The limits a run serves with: each given one as given, each None by vLLM's rule
    (module doc) for ``version`` (``v0`` or ``v1``), ``max_model_len`` and the GPU (None:
    none)."""
    if version not in VERSIONS:
        raise ValueError(f"batch defaults {version!r}: expected one of {', '.join(VERSIONS)}")
    if version == "v1":
        large = (
            device is not None
            and device.memory_gib >= V1_LARGE_GPU_GIB
            and "a100" not in device.name.lower()
        )
        seqs, tokens = V1_LARGE if large else V1_OTHER
        where = (
            f"vllm serve's default on a GPU of >= {V1_LARGE_GPU_GIB:g} GiB, not an A100"
            if large
            else f"vllm serve's default below {V1_LARGE_GPU_GIB:g} GiB or on an A100"
        )
        seqs_why = tokens_why = where
    else:
        seqs, tokens = V0_MAX_NUM_SEQS, max(V0_MAX_NUM_BATCHED_TOKENS, max_model_len)
        seqs_why = "vLLM v0's default"
        tokens_why = (
            "vLLM v0.1's default"
            if tokens == V0_MAX_NUM_BATCHED_TOKENS
            else "max_model_len, as vLLM v0.2+ raises its default to hold the longest prompt"
        )
    return BatchLimits(
        seqs if max_num_seqs is None else int(max_num_seqs),
        tokens if max_num_batched_tokens is None else int(max_num_batched_tokens),
        seqs_why if max_num_seqs is None else "given",
        tokens_why if max_num_batched_tokens is None else "given",
    )
