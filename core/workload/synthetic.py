"""Seeded synthetic workloads: dataset-like lengths, shared prefixes, multi-turn chat.

Every generator draws arrivals, lengths and token ids from separate child streams of
``np.random.SeedSequence(seed)``, so the same seed gives the same trace, and switching token
ids on or off leaves arrivals and lengths unchanged. Request ids are 0, 1, ... in arrival
order.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from core.request import Request, RequestError, SamplingParams
from core.workload.arrivals import make_arrivals
from core.workload.filters import MAX_MODEL_LEN, MAX_PROMPT_LEN
from core.workload.lengths import fit

log = logging.getLogger(__name__)

OPT_VOCAB_SIZE = 50272  # OPT's embedding rows (HF OPT config vocab_size)


def _streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """Independent generators for (arrivals, lengths, token ids)."""
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise RequestError(f"seed must be an integer >= 0, got {seed!r}")
    a, b, c = np.random.SeedSequence(int(seed)).spawn(3)
    return np.random.default_rng(a), np.random.default_rng(b), np.random.default_rng(c)


def _arrivals(
    arrival: str,
    rate: float | None,
    num_requests: int | None,
    duration_s: float | None,
    burstiness: float,
    rng: np.random.Generator,
) -> np.ndarray:
    if (num_requests is None) == (duration_s is None):
        raise RequestError("give exactly one of num_requests or duration_s")
    return make_arrivals(arrival, rate, num_requests, duration_s, burstiness, rng)


def _check_vocab(vocab_size: int) -> None:
    if vocab_size < 2:
        raise RequestError(f"vocab_size must be >= 2, got {vocab_size}")


def synthesize(
    dataset: str,
    rate: float | None,
    num_requests: int | None = None,
    duration_s: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    max_model_len: int = MAX_MODEL_LEN,
    seed: int = 0,
    sampling: SamplingParams | None = None,
    with_token_ids: bool = False,
    vocab_size: int = OPT_VOCAB_SIZE,
    sigmas: tuple[float | None, float | None] = (None, None),
) -> list[Request]:
    """Requests with lengths from the fitted ``dataset`` model ("sharegpt" or "alpaca");
    ``sigmas`` (input, output) replace the model's assumed log-space spreads where given.

    Exactly one of ``num_requests`` / ``duration_s`` (every arrival before that time).
    ``rate=None`` puts all requests at t = 0 and needs ``num_requests``. Lengths pass vLLM's
    benchmark filter with a total of at most ``min(max_model_len, 2048)``: the benchmark's
    own cap, whatever the model (vLLM's ``benchmark_serving.py`` of 2023 drops
    ``prompt_len + output_len > 2048``; today's ``vllm bench`` datasets keep
    ``max_total_len=2048``), so a "ShareGPT" trace has the fitted statistics on every model
    whose context reaches it (see :mod:`core.workload.lengths`). With ``with_token_ids``
    each prompt gets uniform random ids in ``[0, vocab_size)``.
    """
    model = fit(dataset, *sigmas)
    _check_vocab(vocab_size)
    arr_rng, len_rng, tok_rng = _streams(seed)
    times = _arrivals(arrival, rate, num_requests, duration_s, burstiness, arr_rng)
    cap = min(max_model_len, MAX_MODEL_LEN)
    prompt, output = model.sample(len(times), len_rng, max_model_len=cap)
    params = sampling if sampling is not None else SamplingParams()
    requests = []
    lengths = zip(np.asarray(times).tolist(), prompt.tolist(), output.tolist(), strict=True)
    for i, (t, p, o) in enumerate(lengths):  # Python floats and ints, as float() and int()
        ids = tuple(tok_rng.integers(0, vocab_size, p).tolist()) if with_token_ids else None
        requests.append(Request(i, t, p, o, params, ids))
    return requests


def _lognormal_lengths(mean: float, sigma: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` lengths >= 1 from a lognormal with the given mean and log-space sigma."""
    if not (mean >= 1 and sigma >= 0):
        raise RequestError(f"length mean must be >= 1 and sigma >= 0, got {mean}, {sigma}")
    mu = math.log(mean) - 0.5 * sigma * sigma
    return np.maximum(np.rint(np.exp(mu + sigma * rng.standard_normal(n))), 1).astype(np.int64)


def shared_prefix(
    prefix_len: int,
    rate: float | None,
    num_requests: int | None = None,
    duration_s: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    suffix_len_mean: float = 30.0,
    output_len_mean: float = 30.0,
    len_sigma: float = 0.5,
    max_model_len: int = MAX_MODEL_LEN,
    seed: int = 0,
    sampling: SamplingParams | None = None,
    vocab_size: int = OPT_VOCAB_SIZE,
) -> list[Request]:
    """Every prompt = one common prefix of ``prefix_len`` ids + its own random suffix.

    The paper's Fig. 16 setting (WMT16 En→De translation with a 1-shot, 80-token, or 5-shot,
    341-token, prefix). The per-request sentence (suffix) and translation (output) lengths
    are lognormal with the given means; the defaults (30 tokens, sigma 0.5) are an assumption
    about WMT16 sentence lengths, not a number from the paper. Outputs are cut so prompt +
    output <= ``max_model_len``, with a warning saying how many. Token ids are always
    generated (prefix sharing needs them).
    """
    if prefix_len < 0:
        raise RequestError(f"prefix_len must be >= 0, got {prefix_len}")
    if prefix_len + 2 > max_model_len:
        raise RequestError(
            f"prefix_len {prefix_len} leaves no room for a suffix and an output "
            f"in max_model_len {max_model_len}",
            key="prefix_len",
        )
    _check_vocab(vocab_size)
    arr_rng, len_rng, tok_rng = _streams(seed)
    times = _arrivals(arrival, rate, num_requests, duration_s, burstiness, arr_rng)
    n = len(times)
    suffix = _lognormal_lengths(suffix_len_mean, len_sigma, n, len_rng)
    suffix = np.minimum(suffix, max_model_len - prefix_len - 1)
    drawn = _lognormal_lengths(output_len_mean, len_sigma, n, len_rng)
    output = np.minimum(drawn, max_model_len - prefix_len - suffix)
    cut = int((output < drawn).sum())
    if cut:
        log.warning(
            "shared_prefix: %d of %d outputs cut to fit max_model_len %d (prefix %d tokens)",
            cut, n, max_model_len, prefix_len,
        )  # fmt: skip
    prefix = tok_rng.integers(0, vocab_size, prefix_len).tolist()
    params = sampling if sampling is not None else SamplingParams()
    requests = []
    for i in range(n):
        ids = (*prefix, *tok_rng.integers(0, vocab_size, int(suffix[i])).tolist())
        requests.append(Request(i, float(times[i]), len(ids), int(output[i]), params, ids))
    return requests


def multi_turn(
    num_conversations: int,
    rounds: int = 4,
    rate: float | None = 1.0,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    think_time_s: float = 10.0,
    dataset: str = "sharegpt",
    max_prompt_len: int = MAX_PROMPT_LEN,
    max_output_len: int = 1024,
    max_model_len: int = MAX_MODEL_LEN,
    seed: int = 0,
    sampling: SamplingParams | None = None,
    with_token_ids: bool = False,
    vocab_size: int = OPT_VOCAB_SIZE,
) -> list[Request]:
    """Chat conversations of ``rounds`` rounds each (the paper's Fig. 17 setting).

    Each round's user message and reply lengths come from the fitted ``dataset`` model
    (unfiltered); a reply is cut to ``max_output_len`` (paper: 1024) and to what fits in
    ``max_model_len``. Round ``r``'s prompt is the conversation so far (earlier messages and
    replies plus this message) truncated to its last ``max_prompt_len`` tokens (paper: 1024).
    No KV is kept between rounds: every round is an independent request.

    Arrivals (an open-loop choice; the paper does not say): conversations start by the
    arrival process at ``rate / rounds`` per second, so ``rate`` is the long-run request
    rate; round ``r`` arrives ``r * think_time_s`` after its conversation starts.
    """
    if num_conversations < 0 or rounds < 1:
        raise RequestError(
            f"need num_conversations >= 0 and rounds >= 1, got {num_conversations}, {rounds}"
        )
    if not (think_time_s >= 0 and math.isfinite(think_time_s)):
        raise RequestError(f"think_time_s must be finite and >= 0, got {think_time_s}")
    if not 1 <= max_prompt_len < max_model_len:
        raise RequestError(
            f"max_prompt_len {max_prompt_len} must be >= 1 and below the model's "
            f"max_model_len {max_model_len} (the chat history is truncated to it)",
            key="max_prompt_len",
        )
    if max_output_len < 1:
        raise RequestError(f"max_output_len must be >= 1, got {max_output_len}")
    model = fit(dataset)
    _check_vocab(vocab_size)
    arr_rng, len_rng, tok_rng = _streams(seed)
    conv_rate = None if rate is None else rate / rounds
    starts = make_arrivals(arrival, conv_rate, num_conversations, None, burstiness, arr_rng)
    params = sampling if sampling is not None else SamplingParams()
    rows: list[tuple[float, int, int, int, int, tuple[int, ...] | None]] = []
    for c, start in enumerate(starts):
        user, reply = model.sample_raw(rounds, len_rng)
        history: list[int] = []  # token ids of the conversation so far
        history_len = 0
        for r in range(rounds):
            if with_token_ids:
                history.extend(tok_rng.integers(0, vocab_size, int(user[r])).tolist())
            history_len += int(user[r])
            prompt_len = min(history_len, max_prompt_len)
            out = int(min(reply[r], max_output_len, max_model_len - prompt_len))
            ids = tuple(history[-prompt_len:]) if with_token_ids else None
            rows.append((float(start) + r * think_time_s, c, r, prompt_len, out, ids))
            if with_token_ids:
                history.extend(tok_rng.integers(0, vocab_size, out).tolist())
                history = history[-max_prompt_len:]
            history_len += out
    rows.sort(key=lambda row: (row[0], row[1], row[2]))
    return [Request(i, t, p, o, params, ids) for i, (t, _c, _r, p, o, ids) in enumerate(rows)]
