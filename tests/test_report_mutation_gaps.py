"""What the reproduction report prints for its computed numbers: the bound marks (≥, ≤, >, <)
on rates and ratios, the gap and inside/outside verdicts against the paper's ranges
(Fig. 12 and the sharing figures), Fig. 2's largest differences, Fig. 13's ratios, Fig.
18b's best block sizes and Fig. 19's price table, each on small hand-made inputs."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from experiments.report import bound_text, clock, fig12_rates, markdown, selection

NAN = math.nan


def cap_frame(**systems: tuple[float, float | None]) -> pd.DataFrame:
    """Capacity rows indexed by system: ``system=(max_rate, first_failing_rate)`` (None: no
    rate failed), with the seed interval equal to the rate and no open seed end."""
    rows = []
    for system, (rate, fail) in systems.items():
        is_open = fail is None and rate > 0
        rows.append({
            "system": system, "max_rate": rate, "first_failing_rate": NAN if fail is None else fail,
            "rate_lo": rate, "rate_hi": rate, "rate_open": is_open, "rate_lo_open": is_open,
            "rate_hi_open": is_open, "ratio_lo": NAN, "ratio_hi": NAN,
            "ratio_lo_bound": "exact", "ratio_hi_bound": "exact",
        })  # fmt: skip
    return pd.DataFrame(rows).set_index("system")


# --- bound_text -------------------------------------------------------------------------


def test_why_bound_names_a_system_that_passed_every_rate() -> None:
    """The note beside a bounded ratio says which system passed every rate tried."""
    c = cap_frame(vllm=(8.0, None), orca_oracle=(2.0, 3.0))
    assert bound_text.why_bound(c, "orca_oracle") == "vLLM passed every rate tried"
    c = cap_frame(vllm=(8.0, 9.0), orca_oracle=(2.0, None))
    assert bound_text.why_bound(c, "orca_oracle") == "Orca (Oracle) passed every rate tried"


def test_has_bounds_counts_a_system_that_passed_no_rate() -> None:
    """A system with no passing rate (max_rate 0) makes the section print the bounds note,
    even when no rate or seed end is open."""
    closed = cap_frame(vllm=(8.0, 9.0), orca_oracle=(2.0, 3.0)).reset_index()
    assert not bound_text.has_bounds(closed)
    none_passed = cap_frame(vllm=(8.0, 9.0), orca_oracle=(0.0, 1.0)).reset_index()
    assert bound_text.has_bounds(none_passed)


def test_rate_text_marks_only_the_zero_seed_end_below_the_grid() -> None:
    """When no rate passed on every seed, a seed end of 0 reads "< lowest rate tried", but a
    seed that did pass a rate keeps its own number."""
    r = cap_frame(orca_oracle=(0.0, 1.0)).loc["orca_oracle"].copy()
    r["rate_hi"] = 1.0
    assert bound_text.rate_text(r, interval=True) == "< 1.00 [< 1.00, 1.00]"


def test_ratio_text_on_vllms_own_row_is_a_dash_when_vllm_passed_no_rate() -> None:
    """vLLM / vLLM is not printed as 1.00× when vLLM has no sustained rate at all."""
    c = cap_frame(vllm=(0.0, 1.0), orca_oracle=(2.0, 3.0))
    assert bound_text.ratio_text(c, "vllm") == "—"
    c = cap_frame(vllm=(4.0, 5.0), orca_oracle=(2.0, 3.0))
    assert bound_text.ratio_text(c, "vllm") == "1.00×"


def test_gap_text_is_decided_when_the_paper_sits_on_the_low_end() -> None:
    """An exact ratio whose resolution bracket [v passed / s failed, v failed / s passed]
    starts at the paper's value lies wholly above it (the bracket is open there): a number,
    not "not decided"."""
    c = cap_frame(vllm=(2.0, 4.0), orca_oracle=(0.5, 1.0))  # bracket [2, 8], point 4
    assert bound_text.gap_text(c, "orca_oracle", 2.0) == "+2.00×"
    assert bound_text.gap_text(c, "orca_oracle", 3.0).startswith("not decided (+1.00×")


def test_gap_text_of_an_upper_bound_below_the_paper_is_marked_at_most() -> None:
    """A baseline that passed every rate makes vLLM / it an upper bound; below the paper's
    value, the gap reads "≤ -x×" (at most), never "≥"."""
    c = cap_frame(vllm=(2.0, 3.0), orca_oracle=(2.0, None))  # ratio <= 3 / 2 = 1.5
    assert bound_text.ratio_estimate(c, "orca_oracle") == ("≤", 1.5)
    assert bound_text.gap_text(c, "orca_oracle", 2.0) == "≤ -0.50×"
    c = cap_frame(vllm=(8.0, None), orca_oracle=(2.0, 3.0))  # ratio >= 8 / 3
    assert bound_text.gap_text(c, "orca_oracle", 2.0) == "≥ +0.67×"


def test_fmt_prints_infinity_and_missing_values() -> None:
    """A ratio with a zero denominator reads "∞"; a missing value "—"."""
    assert bound_text.fmt(math.inf) == "∞"
    assert bound_text.fmt(NAN) == "—"
    assert bound_text.fmt(None) == "—"
    assert bound_text.fmt(2.0) == "2.00"


# --- fig12_rates gap line ---------------------------------------------------------------

SHAREGPT = fig12_rates.BY_LETTER["a"]  # axis 2 req/s
ALPACA = fig12_rates.BY_LETTER["d"]  # axis 30 req/s; the paper prints no ratio


def test_alpaca_gap_line_gives_no_verdict_against_the_paper() -> None:
    """The paper's ratios are ShareGPT's: an Alpaca panel's gap line prints kvlab's ratios
    with no paper range and no inside/outside verdict."""
    c = cap_frame(vllm=(20.0, 21.0), orca_oracle=(4.0, 4.2))
    line = fig12_rates.gap_line(ALPACA, c)
    assert "vLLM / Orca (Oracle) = 5.00×" in line
    assert "paper" not in line.replace("the paper's axis", "")
    assert "outside" not in line and "inside (0" not in line


def test_up_to_range_reads_a_ratio_below_one_as_outside() -> None:
    """FasterTransformer's paper ratio is "up to 22×", i.e. vLLM at least as fast: a bound
    that keeps vLLM / FasterTransformer below 1 is outside it, not inside."""
    c = cap_frame(vllm=(2.0, 3.0), fastertransformer=(4.0, None))  # ratio <= 3 / 4
    line = fig12_rates.gap_line(SHAREGPT, c)
    assert "vLLM / FasterTransformer ≤ 0.75×" in line
    assert "paper up to 22×: outside: at most 0.75×, below the range by ≥ 0.25×" in line


def test_vllm_rate_at_the_axis_end_is_inside_not_beyond() -> None:
    """vLLM's rate against the paper's axis at the boundary: a rate below the lowest rate
    tried equal to the axis's end is inside the axis; a lower bound equal to it is not
    called beyond."""
    none_passed = cap_frame(vllm=(0.0, 2.0)).loc["vllm"]
    assert fig12_rates._vllm_part(SHAREGPT, none_passed) == (
        "vLLM passes none of the rates tried, so it sustains < 2 req/s, inside the paper's "
        "axis (0–2)"
    )
    all_passed = cap_frame(vllm=(2.0, None)).loc["vllm"]
    assert fig12_rates._vllm_part(SHAREGPT, all_passed) == (
        "vLLM passes every rate tried, so it sustains ≥ 2 req/s"
    )
    beyond = cap_frame(vllm=(2.5, None)).loc["vllm"]
    assert fig12_rates._vllm_part(SHAREGPT, beyond).endswith(", beyond the paper's axis (0–2)")


def test_exact_verdict_at_the_ranges_ends() -> None:
    """A point ratio equal to either end of the paper's range is inside it; a resolution
    bracket that only touches a range end (it is open there) does not make it undecided."""
    top = cap_frame(vllm=(4.0, 5.4), orca_oracle=(2.0, 2.2))  # bracket [1.82, 2.7]
    assert fig12_rates.resolution_bracket(top, "orca_oracle")[1] == 2.7
    assert fig12_rates._exact_verdict(top, "orca_oracle", 2.0, 1.7, 2.7) == "inside"
    bottom = cap_frame(vllm=(3.4, 3.5), orca_oracle=(1.5, 2.0))  # bracket [1.7, 2.33]
    assert fig12_rates.resolution_bracket(bottom, "orca_oracle")[0] == 1.7
    assert fig12_rates._exact_verdict(bottom, "orca_oracle", 1.7, 1.7, 2.7) == "inside"
    assert fig12_rates._exact_verdict(top, "orca_oracle", 2.7, 1.7, 2.7) == "inside"
    far = cap_frame(vllm=(3.4, 3.5), orca_oracle=(2.0, 2.1))  # bracket [1.62, 1.75]
    assert fig12_rates._exact_verdict(far, "orca_oracle", 1.7, 1.7, 2.7).startswith("not decided")


def test_exact_verdict_reads_up_to_as_from_one() -> None:
    """The paper's "up to 22×" (no lower end) is the range [1, 22]: a ratio below 1 is outside,
    measured from 1."""
    c = cap_frame(vllm=(4.0, 4.1), fastertransformer=(5.0, 5.1))  # bracket [0.78, 0.82]
    assert fig12_rates._exact_verdict(c, "fastertransformer", 0.8, None, 22.0) == (
        "outside by -0.20×"
    )


# --- Fig. 2, Fig. 13 (markdown) ---------------------------------------------------------


def fig2_runs() -> pd.DataFrame:
    shares = {  # token states, reserved, internal, external, free at limit, free
        "orca_max": (20.0, 10.0, 60.0, 8.0, 1.0, 1.0),
        "orca_pow2": (30.0, 20.0, 10.0, 39.0, 0.0, 1.0),
        "orca_oracle": (40.0, 20.0, 0.0, 38.0, 1.0, 1.0),
        "vllm": (90.0, 0.0, 1.0, 4.0, 3.0, 2.0),
    }
    return pd.DataFrame([
        {"system": s, **{f"kv_{p}_pct": v for p, v in zip(markdown.KV_PARTS, vals, strict=True)}}
        for s, vals in shares.items()
    ])  # fmt: skip


def test_largest_differences_are_the_biggest_absolute_gaps_signed_kvlab_minus_paper() -> None:
    """Fig. 2's "largest differences": the four largest |kvlab − paper| over the shares the
    paper prints, signed kvlab − paper, largest first; shares with no paper bar are left
    out."""
    assert markdown._largest_gaps(markdown.fig2_table(fig2_runs())) == [
        "vLLM Token states: -6.3 points",
        "Orca (Oracle) Reservation: -5.2 points",
        "Orca (Pow2) Internal frag.: -3.6 points",
        "Orca (Max) Reservation: -3.3 points",
    ]


def test_breakdown_marks_only_the_paper_values_read_off_the_bars() -> None:
    """The Fig. 2 table marks with "≈" the paper values the text does not print (Orca
    (Oracle)'s reservation and external fragmentation), and no other."""
    rows = markdown._breakdown_rows(markdown.fig2_table(fig2_runs()))
    oracle = next(r for r in rows if r[0] == "Orca (Oracle)")
    assert oracle[1:5] == ["40.0 (38.2)", "20.0 (≈25.2)", "0.0 (—)", "38.0 (≈36.6)"]
    assert sum(cell.count("≈") for r in rows for cell in r) == 2


def test_tokens_per_request_line_numbers() -> None:
    """The Fig. 2 × Fig. 13 check: tokens per batched request (share × slots ÷ batch) for
    kvlab and for the paper (Table 1's 15,700 slots), how many fewer the paper's Orca runs
    hold than its vLLM run, kvlab's batch gaps as absolute shares, and kvlab's Orca
    token-state share gaps (kvlab − paper, Orca systems only)."""
    runs = pd.DataFrame({
        "system": ["orca_max", "orca_pow2", "orca_oracle", "vllm"],
        "kv_token_states_pct": [21.4, 24.8, 41.2, 90.0],
        "mean_batch_size": [7.7, 9.81 * 0.95, 13.62, 30.42 * 1.2],
    })  # fmt: skip
    line = markdown.tokens_per_request_line(runs, 20000.0)
    assert line is not None
    assert markdown.PAPER_KV_SLOTS == 15_700
    assert "kvlab 556, 532, 605, 493;" in line
    assert "(15,700 slots) give 458, 429, 440, 497." in line
    assert "kvlab's agree within 23%;" in line
    assert "the paper's Orca runs hold 8%–14% fewer tokens per request" in line
    assert "kvlab's batches are within 0%–20% of the paper's" in line
    assert "differ from the paper's by -2.0 to +3.0 points." in line


# --- Fig. 18b, Fig. 19 and the gap lines (clock) ----------------------------------------


def test_best_block_sizes_are_those_within_ten_percent_of_the_lowest() -> None:
    """A block size whose latency is exactly (1 + NEAR_BEST) × the lowest counts as best;
    one 15% above it does not."""
    lat = pd.Series({1: 30.0, 8: 11.5, 16: 10.0, 32: (1 + clock.NEAR_BEST) * 10.0, 64: 12.0})
    assert clock.best_block_sizes(lat) == [16, 32]


LATENCY = {1: 0.3, 16: 0.1, 64: 0.15, 256: 0.2}


def block_runs(sizes: tuple[int, ...] = (1, 16, 64, 256)) -> pd.DataFrame:
    """Fig. 18b recompute runs (ShareGPT and a slower Alpaca) and Fig. 19 swap runs."""
    rows = []
    for bs, lat in ((b, LATENCY[b]) for b in sizes):
        for wl, rate, lat_wl, pre in (("sharegpt", 2.0, lat, 3), ("alpaca", 25.0, 0.9, 7)):
            rows.append({"study": "fig18b", "workload": wl, "rate": rate, "block_size": bs,
                         "preemption_mode": "recompute", "normalized_latency": lat_wl,
                         "mean_batch_size": 20.0, "num_preemptions": pre})  # fmt: skip
        rows.append({"study": "fig19", "workload": "sharegpt", "rate": 2.0, "block_size": bs,
                     "preemption_mode": "swap", "normalized_latency": 2 * lat,
                     "mean_batch_size": 20.0, "num_preemptions": 4})  # fmt: skip
    return pd.DataFrame(rows)


def test_fig18b_gap_line_gives_latency_relative_to_block_16() -> None:
    """The ShareGPT gap line: best block size and, when blocks 1, 16 and 256 were all run
    (and no other), the latency at blocks 1 and 256 as multiples of block 16's."""
    text = "\n".join(clock.fig18b_section(block_runs((1, 16, 256)), "Clock: test"))
    line = next(x for x in text.splitlines() if x.startswith("- Gap (sharegpt)"))
    assert "kvlab's best block size is 16 (within 10% of the best: 16)" in line
    assert line.endswith("Latency at block 1 is 3.00× block 16's, at block 256 2.00×.")


PRICE = pd.DataFrame({
    "block_size": [1, 16, 64, 256], "blocks": [512, 32, 8, 2],
    "swap_total_ms": [10.0, 1.0, 0.5, 0.6], "recompute_ms": [1.0, 1.2, 1.0, 1.0],
})  # fmt: skip


def test_fig19_gap_line_numbers() -> None:
    """Fig. 19's gap line: block sizes where a swap is priced below a recompute, the price
    ratio at block 1 and at block 16, its range, and the block sizes strictly above the
    paper's 1.2 (a ratio of exactly 1.2 is not above it)."""
    text = "\n".join(clock.fig19_section(block_runs(), PRICE, "Clock: test"))
    line = next(x for x in text.splitlines() if x.startswith("- Gap:"))
    assert "prices a swap below a recompute at block sizes 16, 64, 256;" in line
    assert "is 0.10 at block 1, 1.20 at block 16, and 0.10–2.00 over all block sizes" in line
    assert line.endswith("above the paper's 1.2 at block sizes 64, 256.")


def test_fig19_tables_give_recompute_over_swap_and_the_sharegpt_runs() -> None:
    """(a) per block size, recompute / swap of the price; (b) the ShareGPT recompute runs
    (not Alpaca's) beside the swap runs, each with its own preemption count."""
    text = "\n".join(clock.fig19_section(block_runs(), PRICE, "Clock: test"))
    assert "| 16 | 32 | 1.00 | 1.20 | 1.20 |" in text
    assert "| 16 | 0.100 (3) | 0.200 (4) | 2.00 |" in text


class _Roofline:
    """A cost model whose prices show what they were asked: a swap costs 1 ms per block
    out and 2 ms per block in; a prefill 1 µs per attention pair and 1 ms per token."""

    def transfer_time(self, shape: Any) -> float:
        return shape.swap_out_blocks * 1e-3 + shape.swap_in_blocks * 2e-3

    def gpu_parts(self, shape: Any) -> tuple[float, float]:
        return shape.prefill_tokens * 1e-3, shape.prefill_attn_pairs * 1e-6


def test_preemption_cost_prices_whole_blocks_both_ways_and_the_full_prefill() -> None:
    """One 512-token sequence: ceil(512 / block) blocks (a partial last block is a whole
    copy), out and back in; recompute is one prefill with its causal 512·513/2 attention
    pairs, linear plus attention time."""
    price = clock.preemption_cost(lambda bs: _Roofline(), (3, 16)).set_index("block_size")
    assert price.loc[3, "blocks"] == 171
    assert price.loc[16, "swap_out_ms"] == pytest.approx(32.0)
    assert price.loc[16, "swap_in_ms"] == pytest.approx(64.0)
    assert price.loc[16, "swap_total_ms"] == pytest.approx(96.0)
    assert price.loc[16, "recompute_ms"] == pytest.approx(512.0 + 512 * 513 / 2 * 1e-3)


def test_fig13_gap_line_gives_vllms_batch_relative_to_the_paper() -> None:
    """The Fig. 13 gap line: vLLM's batch over the paper's 30.42, as a signed percentage."""
    runs = pd.DataFrame([
        {"system": "vllm", "kv_token_states_pct": 90.0, "kv_free_pct": 5.0,
         "mean_batch_size": 27.378},
        {"system": "orca_oracle", "kv_token_states_pct": 39.0, "kv_free_pct": 1.0,
         "mean_batch_size": 12.0},
    ])  # fmt: skip
    (line,) = clock.gap_lines(runs, ["fig13"])
    assert line.endswith("vLLM 27.38 vs paper 30.42 (-10%).")


def test_a_row_with_no_measured_rate_is_neither_passed_all_nor_a_ratio() -> None:
    """A system whose traces held no request (max_rate 0, no failing rate) did not pass
    every rate, and vLLM / it is not bounded ("?", NaN) rather than a division by zero."""
    c = cap_frame(vllm=(4.0, 5.0), orca_oracle=(0.0, None))
    assert not bound_text.passed_all(c.loc["orca_oracle"])
    kind, value = bound_text.ratio_estimate(c, "orca_oracle")
    assert kind == "?" and math.isnan(value)


def test_bound_verdict_texts() -> None:
    """A bound's verdict: below the range by lo − high (positive), and an interval open
    above printed with "∞)"."""
    assert fig12_rates._bound_verdict((0.5, 1.2), 1.7, 2.7) == (
        "outside: at most 1.20×, below the range by ≥ 0.50×"
    )
    assert fig12_rates._bound_verdict((3.0, math.inf), 1.7, 2.7) == (
        "outside: at least 3.00×, above the range by ≥ 0.30×"
    )
    assert fig12_rates._bound_verdict((2.0, math.inf), 1.7, 2.7) == (
        "not decided: the rates tried put the ratio in [2.00, ∞), across the range"
    )
    assert fig12_rates._bound_verdict((1.0, 2.0), 1.7, 2.7) == (
        "not decided: the rates tried put the ratio in [1.00, 2.00], across the range"
    )


def test_a_bound_end_on_the_papers_bound_decides() -> None:
    """The ends of :func:`bound_text.ratio_bounds` are excluded (a sustainable rate is below
    the lowest failing one), so an end equal to a bound of the paper's range lies outside
    it: e.g. vLLM failing a rate FasterTransformer passed puts the ratio below 1."""
    assert fig12_rates._bound_verdict((0.5, 1.0), 1.0, 22.0) == (
        "outside: below 1.00×, the range's low end"
    )
    assert fig12_rates._bound_verdict((2.7, 4.0), 1.7, 2.7) == (
        "outside: above 2.70×, the range's high end"
    )


def test_resolution_bracket_needs_a_passing_and_a_failing_rate_on_both_sides() -> None:
    """The search's resolution bracket exists only where both systems passed a rate and
    failed one; a system that passed none (max_rate 0) gives None."""
    assert fig12_rates.resolution_bracket(
        cap_frame(vllm=(4.0, 5.0), orca_oracle=(2.0, 2.5)), "orca_oracle"
    ) == (1.6, 2.5)
    assert (
        fig12_rates.resolution_bracket(
            cap_frame(vllm=(4.0, 5.0), orca_oracle=(0.0, 2.5)), "orca_oracle"
        )
        is None
    )


def narrowing_cap(d: tuple[tuple[float, float | None], ...], f: tuple) -> pd.DataFrame:
    frames = []
    for letter, ((v_rate, v_fail), (o_rate, o_fail)) in (("d", d), ("f", f)):
        c = cap_frame(vllm=(v_rate, v_fail), orca_oracle=(o_rate, o_fail)).reset_index()
        frames.append(c.assign(panel=letter))
    return pd.concat(frames, ignore_index=True)


def test_alpaca_narrowing_needs_a_smaller_ratio_and_two_exact_ones() -> None:
    """The §6.2 statement: the gap narrows on (f) only when every ratio its runs allow is
    below every ratio (d)'s allow (equal point ratios with overlapping ranges are not
    decided, ranges wholly above do not narrow), and it is not decided when either ratio
    is only a bound."""
    equal = narrowing_cap(((20.0, 21.0), (10.0, 11.0)), ((8.0, 9.0), (4.0, 5.0)))
    assert (
        "kvlab's gap is not decided: the searches' resolution puts (f) in [1.60, 2.25] and "
        "(d) in [1.82, 2.10], which overlap" in fig12_rates._narrowing(equal)[0]
    )
    wider = narrowing_cap(((20.0, 21.0), (10.0, 11.0)), ((40.0, 41.0), (4.0, 4.1)))
    assert "kvlab's gap does not narrow" in fig12_rates._narrowing(wider)[0]
    narrower = narrowing_cap(((20.0, 21.0), (10.0, 11.0)), ((8.0, 8.5), (9.0, 9.5)))
    text = fig12_rates._narrowing(narrower)[0]
    assert "kvlab's gap narrows, and inverts" in text
    close_to_one = narrowing_cap(((20.0, 21.0), (10.0, 11.0)), ((8.0, 9.0), (8.5, 9.0)))
    text = fig12_rates._narrowing(close_to_one)[0]
    assert "kvlab's gap narrows (the paper" in text  # (f) in [0.89, 1.06]: may not invert
    # (f)'s range ends where (d)'s begins (20/11): the ends are excluded, so no overlap
    touching = narrowing_cap(((20.0, 21.0), (10.0, 11.0)), ((10.0, 20.0), (11.0, 12.0)))
    assert "kvlab's gap narrows (the paper" in fig12_rates._narrowing(touching)[0]
    one_bound = narrowing_cap(((20.0, 21.0), (10.0, 11.0)), ((8.0, None), (8.0, 9.0)))
    text = fig12_rates._narrowing(one_bound)[0]
    assert "is ≥ 0.89× vs 2.00×" in text
    assert "kvlab's gap is not decided (a rate in it is only a bound)" in text


def test_paper_ratio_cell_is_not_stated_for_alpaca() -> None:
    """The paper's ratios are ShareGPT's only: Alpaca's table says "not stated"."""
    assert fig12_rates._paper_ratio(SHAREGPT, "orca_oracle") == "1.7–2.7×"
    assert fig12_rates._paper_ratio(SHAREGPT, "fastertransformer") == "up to 22×"
    assert fig12_rates._paper_ratio(ALPACA, "orca_oracle") == "not stated"
    assert fig12_rates._paper_ratio(ALPACA, "vllm") == "1"


def test_recorded_threshold_must_be_positive(tmp_path: Any) -> None:
    """A fig12_capacity.csv whose threshold column is 0 is refused; a positive one is read."""
    from experiments.lib.checks import ConfigError

    path = tmp_path / "fig12_capacity.csv"
    assert fig12_rates.recorded_threshold(pd.DataFrame({"threshold": [1.5, 1.5]}), path) == 1.5
    with pytest.raises(ConfigError):
        fig12_rates.recorded_threshold(pd.DataFrame({"threshold": [0.0, 0.0]}), path)


def test_curves_passing_exactly_at_the_threshold_are_consistent(tmp_path: Any) -> None:
    """A rate passes at normalized latency <= threshold, so a passing row exactly at the
    threshold is no sign of a different run; one above it is."""
    from experiments.lib.checks import ConfigError

    path = tmp_path / "fig12_curves.csv"
    at = pd.DataFrame({"passes": [True, False], "normalized_latency_max": [1.0, 3.0]})
    fig12_rates.check_curves(at, 1.0, path)
    above = pd.DataFrame({"passes": [True], "normalized_latency_max": [1.01]})
    with pytest.raises(ConfigError):
        fig12_rates.check_curves(above, 1.0, path)


def test_clock_lines_treat_whitespace_as_the_same_clock() -> None:
    """A panel whose clock description adds only blank lines uses the report's clock."""
    assert fig12_rates._clock_lines({"a": " \n "}, "a") == [
        "Clock: the one under *Cost model*.",
        "",
    ]
    changed = fig12_rates._clock_lines({"a": "tp 4"}, "a")
    assert changed[0] == "Clock: as under *Cost model*, except:"


def test_report_lists_the_figures_made_only_for_a_subset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report names the figures made only when ``--figures`` left some out."""
    monkeypatch.setattr(markdown, "FIGURES", ("fig12", "fig14"))
    empty = pd.DataFrame()

    def report(figures: tuple[str, ...]) -> str:
        return markdown._report(empty, empty, empty, [], "clock", empty, 600.0, 1.0, [], figures)

    assert "Figures made" not in report(("fig12", "fig14"))
    assert "Figures made (`--figures`): fig12.\n" in report(("fig12",))


def test_selection_ignores_empty_names() -> None:
    """Blank names in ``--figures`` (a trailing comma, spaces) are ignored, and the order is
    the report's."""
    assert selection.select("fig13, fig2,") == ("fig2", "fig13")


class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    ("flags", "evals"),
    [
        ([], 2),
        (["--full"], 4),
        (["--fig12-rate-tol", "0.01"], 2 + 2),  # 0.03 / 0.01 = 3: two more halvings
        (["--full", "--fig12-rate-tol", "0.015"], 4 + 1),
    ],
)
def test_reproduce_bisects_fig12_once_more_per_halving_of_the_tolerance(
    flags: list[str], evals: int, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fig. 12's bisection steps: 2 by default, 4 with ``--full``, plus one per halving (or
    part of one) of ``--fig12-rate-tol`` below the default."""
    from experiments import reproduce
    from experiments.report.rate_search import RATE_TOL

    assert RATE_TOL == 0.03
    seen: dict[str, Any] = {}

    def searches(*args: Any, **kw: Any) -> list:
        seen.update(kw)
        raise _Stop

    monkeypatch.setattr(reproduce.fig12_rates, "searches", searches)
    argv = ["--out", str(tmp_path), "--figures", "fig12", "--workers", "1", *flags]
    with pytest.raises(_Stop):
        reproduce.main(argv)
    assert seen["bisect_evals"] == evals


class _Pool:
    """Records the label of every job submitted."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    def submit(self, fn: Any, label: str, *args: Any) -> None:
        self.labels.append(label)


def test_fig19_alone_runs_only_the_sharegpt_recompute_runs_it_compares_with() -> None:
    """Fig. 19 without Fig. 18b runs its swap runs and the ShareGPT recompute runs beside
    them, no Alpaca run; with Fig. 18b both workloads."""
    from experiments.reproduce import BLOCK_SIZES, block_study

    pool = _Pool()
    keys = [k for k, _ in block_study(pool, [], ("fig19",))]  # type: ignore[arg-type]
    assert not any("alpaca" in label for label in pool.labels)
    assert {k["workload"] for k in keys} == {"sharegpt"}
    assert len(keys) == 2 * len(BLOCK_SIZES)
    pool = _Pool()
    block_study(pool, [], ("fig18b",))  # type: ignore[arg-type]
    assert sum("alpaca" in label for label in pool.labels) == len(BLOCK_SIZES)


def test_an_empty_fig12_panel_list_is_refused() -> None:
    """``--fig12-panels ''`` names no panel: an error, not a Fig. 12 of nothing."""
    import argparse

    from experiments.reproduce import _panels

    parser = argparse.ArgumentParser()
    with pytest.raises(SystemExit):
        _panels(parser, "")
    assert [p.letter for p in _panels(parser, "da")] == ["a", "d"]
