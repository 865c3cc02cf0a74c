"""Numbers from the vLLM paper (Kwon et al., SOSP 2023, arXiv:2309.06180) that kvlab
puts next to its own. Figures only; each constant cites its figure or section.

These are the numbers ``../shared/PAPER.md`` summarises. The sharing figures' paper numbers
(Fig. 14-17: ``PAPER_RATIO`` / ``PAPER_RANGE`` in their modules) are quoted from the
paper's own text (§6.3-§6.5), which PAPER.md does not reproduce."""

from __future__ import annotations

# Fig. 2: average share of KV-cache memory (percent). "likely" values are read off the
# figure where the text does not print them; None where the paper shows no bar.
FIG2_BREAKDOWN: dict[str, dict[str, float | None]] = {
    "orca_max": {"token_states": 20.4, "reserved": 13.3, "internal_frag": 57.3,
                 "external_frag": 8.9},
    "orca_pow2": {"token_states": 26.8, "reserved": 17.9, "internal_frag": 13.6,
                  "external_frag": 41.6},
    "orca_oracle": {"token_states": 38.2, "reserved": 25.2, "internal_frag": None,
                    "external_frag": 36.6},
    "vllm": {"token_states": 96.3, "reserved": None, "internal_frag": None,
             "external_frag": 3.7},
}  # fmt: skip
# the values above marked "(likely)" in ../shared/PAPER.md: read off the figure's bars
FIG2_LIKELY = frozenset({("orca_oracle", "reserved"), ("orca_oracle", "external_frag")})

# Fig. 13: average number of batched requests, OPT-13B, ShareGPT at 2 req/s.
FIG13_BATCH: dict[str, float] = {
    "orca_max": 7.00,
    "orca_pow2": 9.81,
    "orca_oracle": 13.62,
    "vllm": 30.42,
}

# §6.2 / Fig. 12 (ShareGPT): vLLM's sustainable request rate as a multiple of each
# baseline's, over the three OPT sizes. FasterTransformer: "up to 22x".
FIG12_SHAREGPT_RATIO: dict[str, tuple[float | None, float]] = {
    "orca_oracle": (1.7, 2.7),
    "orca_max": (2.7, 8.0),
    "orca_pow2": (None, None),  # type: ignore[dict-item]
    "fastertransformer": (None, 22.0),
}

SYSTEM_LABELS: dict[str, str] = {
    "fastertransformer": "FasterTransformer",
    "orca_max": "Orca (Max)",
    "orca_pow2": "Orca (Pow2)",
    "orca_oracle": "Orca (Oracle)",
    "vllm": "vLLM",
    "vllm_v1": "vLLM (V1 defaults)",
}
