"""vLLM's benchmark length filter, the one the paper's dataset statistics are taken after.

The rule (vLLM ``benchmarks/benchmark_serving.py`` sampling of ShareGPT, 2023; the paper,
Kwon et al., SOSP 2023, does not state it): drop a request when its prompt or its output
is shorter than 4 tokens, its prompt is longer than 1024 tokens, or prompt + output exceeds
the model's maximum length (2048 for OPT).

A request that breaks several rules is counted once, under the first rule it breaks in the
order of :data:`REASONS`.

The length cap (``workload.max_total_tokens``, :func:`total_cap` and :func:`over_cap`) is
the filter's last rule alone: it drops a request whose prompt + output exceeds a token
count (``auto``: the served ``max_model_len``, so it drops exactly the rows the scheduler
would reject as over ``max_model_len``), and keeps every other length.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.request import Request, RequestError

MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_MODEL_LEN = 2048

REASONS: tuple[str, ...] = (
    "prompt_too_short",
    "output_too_short",
    "prompt_too_long",
    "total_too_long",
)


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Requests that passed, and how many were dropped under each reason of REASONS."""

    kept: list[Request]
    dropped: dict[str, int]

    @property
    def num_dropped(self) -> int:
        return sum(self.dropped.values())


def _check_limits(min_len: int, max_prompt_len: int, max_model_len: int) -> None:
    if min_len < 1:
        raise RequestError(f"filter min_len must be >= 1, got {min_len}")
    if max_prompt_len < min_len:
        raise RequestError(f"filter max_prompt_len must be >= min_len, got {max_prompt_len}")
    if max_model_len < 2 * min_len:
        raise RequestError(
            f"filter max_model_len must be >= 2 * min_len = {2 * min_len}, got {max_model_len}"
        )


def drop_reasons(
    prompt_lens: np.ndarray,
    output_lens: np.ndarray,
    max_model_len: int = MAX_MODEL_LEN,
    max_prompt_len: int = MAX_PROMPT_LEN,
    min_len: int = MIN_LEN,
) -> np.ndarray:
    """Per request, the index into REASONS of the first rule it breaks, or -1 if kept.

    Vectorized form of the filter for length arrays of equal shape.
    """
    _check_limits(min_len, max_prompt_len, max_model_len)
    p = np.asarray(prompt_lens)
    o = np.asarray(output_lens)
    if p.shape != o.shape:
        raise RequestError(f"prompt_lens shape {p.shape} != output_lens shape {o.shape}")
    rules = (p < min_len, o < min_len, p > max_prompt_len, p + o > max_model_len)
    reason = np.full(p.shape, -1, dtype=np.int64)
    for idx in reversed(range(len(rules))):
        reason[rules[idx]] = idx
    return reason


def keep_mask(
    prompt_lens: np.ndarray,
    output_lens: np.ndarray,
    max_model_len: int = MAX_MODEL_LEN,
    max_prompt_len: int = MAX_PROMPT_LEN,
    min_len: int = MIN_LEN,
) -> np.ndarray:
    """Boolean mask of the requests the filter keeps."""
    return drop_reasons(prompt_lens, output_lens, max_model_len, max_prompt_len, min_len) < 0


def filter_requests(
    requests: Iterable[Request],
    max_model_len: int = MAX_MODEL_LEN,
    max_prompt_len: int = MAX_PROMPT_LEN,
    min_len: int = MIN_LEN,
) -> FilterResult:
    """Apply the filter to requests; order of the kept ones is preserved."""
    reqs = list(requests)
    p = np.fromiter((r.prompt_len for r in reqs), dtype=np.int64, count=len(reqs))
    o = np.fromiter((r.output_len for r in reqs), dtype=np.int64, count=len(reqs))
    reason = drop_reasons(p, o, max_model_len, max_prompt_len, min_len)
    counts = np.bincount(reason[reason >= 0], minlength=len(REASONS))
    kept = [r for r, why in zip(reqs, reason, strict=True) if why < 0]
    return FilterResult(kept, {name: int(c) for name, c in zip(REASONS, counts, strict=True)})


AUTO = "auto"  # max_total_tokens: the served max_model_len


def total_cap(value: Any, max_model_len: int) -> int | None:
    """The token count ``workload.max_total_tokens`` caps prompt + output at: None (no cap)
    for None, ``max_model_len`` for ``"auto"``, else ``value``, a whole number >= 1. Anything
    else (0, a negative, a fraction, a boolean, other text) is a :class:`RequestError`
    naming the key."""
    if value is None:
        return None
    if value == AUTO:
        return int(max_model_len)
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise RequestError(
            f"max_total_tokens must be 'auto' (the served max_model_len), a whole number of "
            f"tokens >= 1 or null (no cap), got {value!r}",
            key="max_total_tokens",
        )
    return int(value)


def over_cap(prompt_lens: np.ndarray, output_lens: np.ndarray, cap: int) -> np.ndarray:
    """Per request, whether its prompt + output exceeds ``cap`` tokens (the length cap's
    one rule; a request of exactly ``cap`` tokens is kept, as ``max_model_len`` keeps it)."""
    p, o = np.asarray(prompt_lens), np.asarray(output_lens)
    if p.shape != o.shape:
        raise RequestError(f"prompt_lens shape {p.shape} != output_lens shape {o.shape}")
    return p + o > cap
