"""Synthetic prompt/output length distributions fitted to the published dataset statistics.

Targets (Kwon et al., SOSP 2023, §6.1, "Workloads"): ShareGPT has mean input 161.31 and
mean output 337.99 tokens; Alpaca has mean input 19.31 and mean output 58.45 tokens. The
paper gives only these means, that ShareGPT has "higher variance", and histograms that span
0-2000 tokens; it does not say whether the means are before or after a length filter.
kvlab's choice: they are the means after vLLM's benchmark filter
(:mod:`core.workload.filters`, max model length 2048), which the fits below match.

Family (a choice; the paper is silent): prompt and output lengths are independent, each
``max(1, round(exp(mu + sigma * Z)))`` with ``Z ~ N(0, 1)``, and the pair is then put
through the benchmark filter (rejection sampling). The sigmas are assumptions, chosen so
that ShareGPT is at least as wide as Alpaca in log space (in tokens its standard deviation is
several times Alpaca's: the paper's "higher variance"; the 2048 cap trims ShareGPT's output
tail, so its post-filter output CV ends slightly below Alpaca's):

=========  ========  =========  ==========================================
dataset    sigma_in  sigma_out  reason
=========  ========  =========  ==========================================
sharegpt   1.2       1.0        user turns range from one line to long pastes
alpaca     0.6       0.9        short instructions, answers of varied length
=========  ========  =========  ==========================================

Procedure that derives the mus (run by :func:`fit`, cached): with the sigmas fixed, the
filtered means are computed *exactly* from the discretized lognormal pmfs over the filter's
region ``4 <= p <= 1024, 4 <= o, p + o <= 2048``; ``mu_in`` and ``mu_out`` are then solved
so both filtered means equal the published ones (alternating bisection; each filtered mean is
increasing in its own mu; a mu that puts a narrow distribution wholly outside the filter
reads as too low or too high, and the search interval widens for wide ones, so every sigma
in [0.05, 3] solves). The fit always uses the paper's filter (2048), and
:func:`core.workload.synthetic.synthesize` filters at 2048 on any model whose context
reaches it, as vLLM's benchmark does; sampling with a smaller ``max_model_len`` changes
only the filter, so the means then drift from the targets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache, partial

import numpy as np

from core.request import RequestError
from core.workload.filters import MAX_MODEL_LEN, MAX_PROMPT_LEN, MIN_LEN, keep_mask


@dataclass(frozen=True, slots=True)
class DatasetStats:
    """Published post-filter mean lengths and the assumed log-space spreads."""

    mean_input: float
    mean_output: float
    sigma_input: float
    sigma_output: float


# Means: Kwon et al. 2023, §6.1. Sigmas: assumptions documented in the module docstring.
PUBLISHED: dict[str, DatasetStats] = {
    "sharegpt": DatasetStats(161.31, 337.99, 1.2, 1.0),
    "alpaca": DatasetStats(19.31, 58.45, 0.6, 0.9),
}


@dataclass(frozen=True, slots=True)
class LengthModel:
    """Independent discretized lognormals for prompt and output lengths (before filtering)."""

    mu_input: float
    sigma_input: float
    mu_output: float
    sigma_output: float

    def sample_raw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` unfiltered (prompt_len, output_len) pairs, each >= 1."""
        prompt = _draw(self.mu_input, self.sigma_input, n, rng)
        output = _draw(self.mu_output, self.sigma_output, n, rng)
        return prompt, output

    def sample(
        self,
        n: int,
        rng: np.random.Generator,
        max_model_len: int = MAX_MODEL_LEN,
        max_prompt_len: int = MAX_PROMPT_LEN,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``n`` pairs that pass the benchmark filter (rejection sampling)."""
        if n < 0:
            raise RequestError(f"number of samples must be >= 0, got {n}")
        prompts: list[np.ndarray] = []
        outputs: list[np.ndarray] = []
        have = 0
        for _ in range(1000):
            if have >= n:
                break
            p, o = self.sample_raw(max(64, 2 * (n - have)), rng)
            mask = keep_mask(p, o, max_model_len, max_prompt_len)
            prompts.append(p[mask])
            outputs.append(o[mask])
            have += int(mask.sum())
        if have < n:
            raise RequestError(
                f"the length model's requests rarely pass the filter at max_model_len "
                f"{max_model_len} (prompts of at most {max_prompt_len} tokens): raise "
                "system.max_model_len"
            )
        prompt = np.concatenate(prompts)[:n] if prompts else np.zeros(0, dtype=np.int64)
        output = np.concatenate(outputs)[:n] if outputs else np.zeros(0, dtype=np.int64)
        return prompt, output


def _draw(mu: float, sigma: float, n: int, rng: np.random.Generator) -> np.ndarray:
    values = np.rint(np.exp(mu + sigma * rng.standard_normal(n)))
    return np.maximum(values, 1).astype(np.int64)


def _erf(x: np.ndarray) -> np.ndarray:
    """``math.erf`` elementwise (NumPy has no erf; the same values as a ufunc of it)."""
    return np.fromiter(map(math.erf, x.tolist()), dtype=np.float64, count=x.size)


@lru_cache(maxsize=4)
def _pmf(mu: float, sigma: float, kmax: int) -> np.ndarray:
    """P(L = k) for k = 0..kmax of ``L = max(1, round(exp(mu + sigma Z)))``; read-only
    (cached: a fit's bisections keep one of the two distributions fixed)."""
    edges = np.log(np.arange(1, kmax + 1) + 0.5)  # upper edge of k = 1..kmax
    cdf = 0.5 * (1.0 + _erf((edges - mu) / (sigma * math.sqrt(2.0))))
    pmf = np.zeros(kmax + 1)
    pmf[1:] = np.diff(cdf, prepend=0.0)
    pmf.flags.writeable = False
    return pmf


def _filtered(
    model: LengthModel, max_model_len: int, max_prompt_len: int, min_len: int
) -> tuple[float, float] | None:
    """Exact filtered (prompt, output) means, or None when no probability passes the filter."""
    p = _pmf(model.mu_input, model.sigma_input, max_prompt_len)
    q = _pmf(model.mu_output, model.sigma_output, max_model_len).copy()
    q[:min_len] = 0.0
    k = np.arange(max_model_len + 1)
    q_cum = np.cumsum(q)  # q_cum[m] = P(min_len <= O <= m)
    oq_cum = np.cumsum(k * q)
    i = np.arange(min_len, max_prompt_len + 1)
    room = max_model_len - i
    w = p[i] * q_cum[room]
    total = w.sum()
    if total <= 0:
        return None
    mean_in = float((i * w).sum() / total)
    mean_out = float((p[i] * oq_cum[room]).sum() / total)
    return mean_in, mean_out


def filtered_means(
    model: LengthModel,
    max_model_len: int = MAX_MODEL_LEN,
    max_prompt_len: int = MAX_PROMPT_LEN,
    min_len: int = MIN_LEN,
) -> tuple[float, float]:
    """Exact (prompt, output) means of ``model`` conditioned on passing the filter; raises
    RequestError when no probability passes it."""
    means = _filtered(model, max_model_len, max_prompt_len, min_len)
    if means is None:
        raise RequestError("length model puts no probability inside the filter")
    return means


_PAPER_FILTER = (MAX_MODEL_LEN, MAX_PROMPT_LEN, MIN_LEN)
# When no probability lands inside the filter, a mu below this (the geometric middle of
# 4..1024) has the distribution below the filter's window, one at or above it, above.
_WINDOW_MIDDLE = 0.5 * (math.log(MIN_LEN) + math.log(MAX_PROMPT_LEN))


def _mean_at(model: LengthModel, which: int, mu: float) -> float:
    """Filtered mean ``which`` (0 prompt, 1 output) of ``model``, whose varied mu is ``mu``.

    When no probability passes the filter (a narrow distribution far from the window) the
    result is -inf if ``mu`` lies below the window and +inf if above, so a bisection reads
    "too low" / "too high" instead of failing.
    """
    means = _filtered(model, *_PAPER_FILTER)
    if means is None:
        return -math.inf if mu < _WINDOW_MIDDLE else math.inf
    return means[which]


def _bracket(
    f: Callable[[float], float], target: float, lo: float, hi: float
) -> tuple[float, float]:
    """Widen [lo, hi] (steps of its width, at most 4 each way) until ``f(lo) < target <=
    f(hi)`` for increasing ``f``; a bracket that already holds the root is returned as is."""
    width = hi - lo
    for _ in range(4):
        if f(lo) < target:
            break
        lo, hi = lo - width, lo
    for _ in range(4):
        if f(hi) >= target:
            break
        lo, hi = hi, hi + width
    return lo, hi


def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """Root of increasing ``f(x) = target``, searched in [lo, hi] widened by :func:`_bracket`."""
    lo, hi = _bracket(f, target, lo, hi)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def solve_mus(stats: DatasetStats, tol: float = 1e-9, max_iter: int = 200) -> LengthModel:
    """Solve ``mu_input, mu_output`` so the filtered means equal ``stats``' means.

    The paper's filter (max_model_len 2048, max prompt 1024, min 4) is assumed. Raises
    RequestError when the targets cannot be met (e.g. a mean outside the filter's range).
    """
    for name, target, lo, hi in (
        ("mean_input", stats.mean_input, MIN_LEN, MAX_PROMPT_LEN),
        ("mean_output", stats.mean_output, MIN_LEN, MAX_MODEL_LEN - MIN_LEN),
    ):
        if not lo < target < hi:
            raise RequestError(f"{name} target {target} outside the filter's range ({lo}, {hi})")
    sig_in, sig_out = stats.sigma_input, stats.sigma_output
    if not (sig_in > 0 and sig_out > 0):
        raise RequestError(f"sigmas must be > 0, got {sig_in}, {sig_out}")
    mu_in, mu_out = math.log(stats.mean_input), math.log(stats.mean_output)
    lo, hi = -5.0, 15.0

    def mean_in_at(mu_input: float, mu_output: float) -> float:
        return _mean_at(LengthModel(mu_input, sig_in, mu_output, sig_out), 0, mu_input)

    def mean_out_at(mu_input: float, mu_output: float) -> float:
        return _mean_at(LengthModel(mu_input, sig_in, mu_output, sig_out), 1, mu_output)

    for _ in range(max_iter):
        mu_in = _bisect(partial(mean_in_at, mu_output=mu_out), stats.mean_input, lo, hi)
        mu_out = _bisect(partial(mean_out_at, mu_in), stats.mean_output, lo, hi)
        got = _filtered(LengthModel(mu_in, sig_in, mu_out, sig_out), *_PAPER_FILTER)
        if got is None:
            continue
        if abs(got[0] - stats.mean_input) < tol and abs(got[1] - stats.mean_output) < tol:
            return LengthModel(mu_in, sig_in, mu_out, sig_out)
    raise RequestError(
        f"length fit did not converge: no lognormals with sigma_input={sig_in}, "
        f"sigma_output={sig_out} give filtered means {stats.mean_input} / "
        f"{stats.mean_output}; choose other sigmas"
    )


@cache
def fit(
    dataset: str, sigma_input: float | None = None, sigma_output: float | None = None
) -> LengthModel:
    """The fitted length model of a published dataset ("sharegpt" or "alpaca"); a sigma
    given replaces the documented assumption (the mus are solved again, so the filtered
    means stay the published ones)."""
    key = dataset.lower()
    if key not in PUBLISHED:
        raise RequestError(f"unknown dataset {dataset!r}; expected one of {sorted(PUBLISHED)}")
    stats = PUBLISHED[key]
    for name, value in (("sigma_input", sigma_input), ("sigma_output", sigma_output)):
        if value is not None and not 0.05 <= value <= 3.0:
            raise RequestError(f"{name} must be in [0.05, 3] (log-space spread), got {value}")
    stats = DatasetStats(
        stats.mean_input,
        stats.mean_output,
        stats.sigma_input if sigma_input is None else float(sigma_input),
        stats.sigma_output if sigma_output is None else float(sigma_output),
    )
    return solve_mus(stats)


def describe(dataset: str, n: int = 20000, seed: int = 0) -> dict[str, float]:
    """Statistics of ``n`` filtered samples next to the published targets.

    Keys: ``{input,output}_{mean,std,p50,p90,p99,max}``, ``target_{input,output}_mean``,
    ``mu_{input,output}``, ``sigma_{input,output}``.
    """
    model = fit(dataset)
    prompt, output = model.sample(n, np.random.default_rng(seed))
    stats = PUBLISHED[dataset.lower()]
    out: dict[str, float] = {
        "target_input_mean": stats.mean_input,
        "target_output_mean": stats.mean_output,
        "mu_input": model.mu_input,
        "sigma_input": model.sigma_input,
        "mu_output": model.mu_output,
        "sigma_output": model.sigma_output,
    }
    for name, arr in (("input", prompt), ("output", output)):
        out[f"{name}_mean"] = float(arr.mean())
        out[f"{name}_std"] = float(arr.std())
        for pct in (50, 90, 99):
            out[f"{name}_p{pct}"] = float(np.percentile(arr, pct))
        out[f"{name}_max"] = float(arr.max())
    return out
