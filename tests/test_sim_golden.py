"""The simulator's results are pinned: speed work must not change a single number.

Each case simulates a short trace on a small KV cache (so that preemption, swapping, forking,
beam reselection, chunked prefill and prefix caching all happen) and digests the step and
request tables and the metrics, and checks from the step table that each feature the case
is there for really fired. ``GOLDEN`` holds the digests the straightforward
(pre-optimization) code produced; the batched decode path and its per-group fallback must
both reproduce them, and every run must keep the scheduler and KV invariants.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pandas as pd
import pytest

from core.defaults import DEFAULT_WATERMARK
from core.kv.contiguous import ContiguousKVCacheManager
from core.kv.paged import PagedKVCacheManager
from core.metrics.summary import summarize
from core.request import Request, SamplingParams, SequenceGroup
from core.sched.base import SchedulerConfig
from core.systems import build_scheduler
from core.workload.spec import build_workload
from sim.cost.efficiency import Efficiency
from sim.cost.roofline import RooflineCostModel
from sim.driver import simulate

# name: (system, scheduler/manager overrides, workload overrides, device slots)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], int]] = {
    "vllm": ("vllm", {}, {}, 6000),
    "vllm_swap": ("vllm", {"preemption_mode": "swap"}, {}, 6000),
    "vllm_n2": ("vllm", {}, {"n": 2}, 6000),
    "vllm_n2_small_cpu": (
        "vllm",
        {"num_cpu_slots": 512, "max_num_batched_tokens": 4096},
        {"n": 2},
        6000,
    ),
    "vllm_beam2": ("vllm", {}, {"beam_width": 2, "rate": 2.0}, 6000),
    "vllm_chunked": ("vllm", {"chunked_prefill": True, "max_num_batched_tokens": 512}, {}, 6000),
    "vllm_v1_chunked": (
        "vllm_v1",
        {"chunked_prefill": True, "max_num_batched_tokens": 512},
        {},
        6000,
    ),
    "vllm_prefix": (
        "vllm",
        {"enable_prefix_caching": True},
        {"kind": "shared_prefix", "prefix_len": 200, "rate": 8.0, "dataset": None},
        3000,
    ),
    "vllm_3_replicas": ("vllm", {"replicas": 3}, {"rate": 9.0}, 6000),
    "orca_max": ("orca_max", {}, {}, 16384),
    "orca_pow2": ("orca_pow2", {}, {"n": 2}, 16384),
    "orca_oracle": ("orca_oracle", {}, {}, 16384),
    "fastertransformer": ("fastertransformer", {}, {}, 16384),
}

DIGITS = 12  # significant digits of every float digested (see _round)

# From the reference code, before the speed work; re-pinned once when steps.csv gained
# kv_physical_blocks / kv_logical_blocks and metrics kv_sharing_saving_pct (every earlier
# column and metric was checked byte-identical with the new columns dropped), and vllm_beam2
# once more when the beam stand-in changed from random parents to top-width selection.
# Re-pinned 2026-12-01 with every float rounded to DIGITS significant digits: on a fresh
# environment (numpy 2.4.6, an AMD EPYC VM) four full-precision digests no longer matched
# (vllm_n2, vllm_n2_small_cpu, vllm_beam2, vllm_prefix) with the code unchanged; vllm_prefix's
# pinned digest is reproduced exactly by its metrics here with kv_sharing_saving_pct one ulp
# up, and numpy 1.26.4 against 2.4.6 on the same machine changes vllm_n2's
# kv_internal_frag_pct in its 16th digit only. The rounded digests are the same under both.
# Re-pinned 2026-12-04 for vllm_n2 and vllm_n2_small_cpu: a two-sample group preempted by
# recompute (when the CPU pool cannot take it) now gets its full prompt blocks shared again
# on re-admission, as after its fork (it got a separate copy for each sample). Fewer blocks
# per re-admitted group: vllm_n2_small_cpu's sharing saving 7.5 -> 13.7%, mean batch
# 5.26 -> 5.71, throughput +5.6%; vllm_n2's mean batch 5.65 -> 5.72, throughput +0.9%.
# Re-pinned 2026-12-04 (night), two modelled changes, each checked by reproducing every old
# digest with the change undone: (1) free slots while a request is swapped out count as
# external fragmentation, as while one waits for admission (a metrics audit: they counted as
# free, so Fig. 2's split hung on the preemption mode): vllm_n2's kv_external_frag_pct
# 5.23 -> 5.66, kv_free_pct 5.38 -> 4.94; vllm_n2_small_cpu and vllm_beam2 move by 0.01;
# nothing else; (2) a run of several replicas tags each step row with its replica
# (vllm_3_replicas: the new column alone).
# vllm_v1_chunked added 2026-12-05 for vLLM V1's allocation of a prompt chunk by chunk: with
# allocate_per_chunk off it reproduces vllm_chunked's digest; on, 249 preemptions, not 147.
# Re-pinned 2026-12-05 (all cases): the roofline's count (sim.cost.work.count_work) now
# includes the LM head's activation bytes, each sampled row's embed_dim input and vocab/tp
# logits, which the profiled model counted and the roofline did not (a cost audit: one
# count of the work). Steps lengthen by about 1e-5 (OPT-13B: 110 kB per row against 26 GB of
# weights): throughput -0.001% to -0.005%, mean TPOT up to +0.006% (vllm_prefix's -0.04%,
# its mean batch -0.05%); no case's preemptions or completions changed.
# Re-pinned 2026-12-06 (all cases): steps.csv gains queue_held_by (what holds the queue's
# head: memory, max_num_seqs, the token budget, a request-level batch in flight) and the
# metrics kv_free_at_limit_pct, the free slots while the queue waits on such a limit, which
# kv_external_frag_pct had counted (a metrics audit: a wait on max_num_seqs read as
# fragmentation). Every pinned digest was reproduced with the column dropped and the new share
# added back to kv_external_frag_pct. The share moved: fastertransformer 64.5 points (its
# requests wait for the batch in flight), vllm_v1_chunked 0.42, vllm_chunked 0.26,
# vllm_n2_small_cpu 0.11, vllm_n2 0.06 (prompt steps that left a head no token budget); the
# Orca cases and plain vllm 0 (they wait on memory).
# Re-pinned 2026-12-06 (vllm_3_replicas alone): a run of several replicas tags each request
# row with its replica too, so that its first_token_step and finish_step can be joined to
# the steps of the replica that served it; the old digest was reproduced with the column
# dropped: no number changed.
# Re-pinned 2026-12-07 (all cases): requests.csv gains cached_prompt_tokens (the prompt
# tokens the prefix cache held at a request's first admission) and the metrics
# prefix_cache_hit_tokens / prefix_cache_hit_pct; every pinned digest was reproduced with the
# column and the two keys dropped: no number changed (vllm_prefix hits 83.1%, the rest 0).
# Re-pinned 2026-12-07 (all cases): the metrics gain kv_free_at_<limit>_pct
# (max_num_seqs, token_budget, batch_in_flight, policy_limit), kv_free_at_limit_pct split by
# the limit that held the queue's head; every pinned digest was reproduced with the four keys
# dropped: no number changed. The splits: the vllm cases' share is all token budget,
# fastertransformer's all the batch in flight, no case waits on max_num_seqs.
# Re-pinned 2026-12-07 (all cases): the metrics gain offered_rate (the requests over their
# arrival window; here, with no window given to summarize, over the span to the last arrival:
# 3.81 req/s for the 4 req/s cases' 30-s trace); every pinned digest was reproduced, batched
# and group by group, with the key dropped: no number changed.
# Re-pinned 2026-12-07 (all cases): requests.csv gains readmit_cached_tokens (the tokens the
# prefix cache held at a request's re-admissions after recompute preemptions) and the metrics
# prefix_cache_readmit_tokens; every pinned digest was reproduced, batched and group by group,
# with the column and the key dropped: no number changed (0 in every case: only vllm_prefix
# caches, and it preempts nothing).
# Re-pinned 2026-12-07 (vllm_swap, vllm_n2, vllm_n2_small_cpu, vllm_beam2: the cases that
# swap): a swap-in leaves the admission watermark free, as vLLM v0's can_swap_in does (free -
# required >= watermark blocks; an adversarial review: kvlab swapped in down to the last free
# block). Every old digest was reproduced, batched and group by group, with the check undone.
# On these 375-block caches (3 watermark blocks) preemptions fell: vllm_swap 162 -> 151,
# vllm_n2 231 -> 218, vllm_n2_small_cpu 312 -> 282, vllm_beam2 88 -> 63 (mean TTFT -5.7%);
# their throughput and normalized latency moved by under 1.4%.
# Re-pinned 2026-12-07 (all cases): the metrics gain total_copy_blocks, total_swap_out_blocks
# and total_swap_in_blocks (steps.csv's copy_blocks, swap_out_blocks, swap_in_blocks summed);
# every pinned digest was reproduced, batched and group by group, with the three keys dropped:
# no number changed (copies: vllm_beam2 8751, orca_pow2 1232, vllm_n2 and vllm_n2_small_cpu
# 104, the rest 0).
# The clock the digests were made on, pinned here so that re-sourcing a default efficiency
# (2026-12-04: compute 0.79 -> 0.72, memory 0.90 -> 0.88) does not move them.
PINNED_EFFICIENCY = Efficiency().with_values(
    {"compute": "the golden digests' clock", "memory": "the golden digests' clock"},
    compute=0.79,
    memory=0.90,
)
GOLDEN: dict[str, str] = {
    "fastertransformer": "99a4573e743e20da",
    "orca_max": "d485510a7944fc11",
    "orca_oracle": "c5abe2ee16803419",
    "orca_pow2": "b8344e9a1ebe0b60",
    "vllm": "e7c64562bdd6d8c1",
    "vllm_beam2": "1dae6b85b09b49f7",
    "vllm_chunked": "177a03614b046f02",
    "vllm_v1_chunked": "9cf63d5ebd2b481b",
    "vllm_n2": "7c9affda93172e00",
    "vllm_n2_small_cpu": "0cf3e81d3c35192d",
    "vllm_prefix": "17195177dd4ea1da",
    "vllm_swap": "87bc455304e05d00",
    "vllm_3_replicas": "11fef00ebe394658",
}


def run_case(
    name: str, batched: bool = True, check_every: int = 0
) -> tuple[str, dict[str, Any], pd.DataFrame]:
    """Simulate one case; returns (digest of steps, requests and metrics, metrics, steps).
    ``batched=False`` makes the schedulers reserve decode slots group by group and the
    driver run every step on its own (no fast-forward)."""
    system, sched_over, wl_over, slots = CASES[name]
    wl = {"kind": "synthetic", "dataset": "sharegpt", "rate": 4.0, "duration_s": 30.0}
    wl.update(wl_over)
    requests = build_workload(wl, max_model_len=2048, seed=0)
    config = SchedulerConfig(
        max_num_batched_tokens=sched_over.get("max_num_batched_tokens", 2560),
        preemption_mode=sched_over.get("preemption_mode", "recompute"),
        chunked_prefill=sched_over.get("chunked_prefill", False),
    )

    def make() -> Any:
        sched = build_scheduler(
            system,
            slots,
            config=config,
            num_cpu_slots=sched_over.get("num_cpu_slots", 4096),
            watermark=DEFAULT_WATERMARK,  # every case's, vllm_v1_chunked's too, as pinned
            enable_prefix_caching=sched_over.get("enable_prefix_caching", False),
        )
        sched.batched_append = batched
        return sched

    cost = RooflineCostModel("opt-13b", "a100-40gb", efficiency=PINNED_EFFICIENCY)
    replicas = sched_over.get("replicas", 1)
    result = simulate(
        requests, make, cost, replicas, seed=0, check_integrity_every=check_every,
        fast_forward=batched,
    )  # fmt: skip
    rec = result.recorder
    req, steps = rec.requests_frame(), rec.steps_frame()
    metrics = summarize(req, steps, rec.inter_token_latencies())
    h = hashlib.sha256()
    h.update(_significant(steps).to_csv(index=False).encode())
    h.update(_significant(req).to_csv(index=False).encode())
    rounded = {k: _round(v) if isinstance(v, float) else v for k, v in metrics.items()}
    h.update(json.dumps(rounded, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16], metrics, steps


def _round(x: float) -> float:
    """``x`` to ``DIGITS`` significant digits: a summary's last bits depend on the numpy
    version's summation order (kv_internal_frag_pct of vllm_n2 ends ...4318 on numpy 1.26
    and ...4323 on 2.4), which is not a change of the simulation."""
    return float(f"{x:.{DIGITS}g}")


def _significant(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every float column rounded by :func:`_round`."""
    out = frame.copy()
    for col in out.columns:
        if pd.api.types.is_float_dtype(out[col]):
            out[col] = out[col].map(_round)
    return out


def _mixed_steps(steps: pd.DataFrame) -> pd.Series:
    return (steps["prefill_seqs"] > 0) & (steps["decode_seqs"] > 0)


def _assert_features_fired(name: str, steps: pd.DataFrame, m: dict[str, Any]) -> None:
    """What each case is there to exercise really happened (not only its digest)."""
    swap_out, swap_in = steps["swap_out_blocks"], steps["swap_in_blocks"]
    for col in ("copy_blocks", "swap_out_blocks", "swap_in_blocks"):
        assert m[f"total_{col}"] == steps[col].sum()  # metrics.json's totals
    forked = (steps["decode_seqs"] > steps["batch_requests"]).any()  # >1 sequence a group
    if name.startswith("vllm"):
        assert m["num_preemptions"] > 0 or name == "vllm_prefix"
        # paging reserves nothing ahead, but a chunked prompt's later chunks are set aside
        assert (steps["kv_reserved"].sum() > 0) == (name == "vllm_chunked")
    else:
        assert m["num_preemptions"] == 0 and steps["kv_reserved"].sum() > 0
    assert (m["prefix_cache_hit_pct"] > 0) == (name == "vllm_prefix")
    chunked = name in ("vllm_chunked", "vllm_v1_chunked")
    if not chunked:  # prompts run whole; only prefix hits start a chunk later
        assert (steps["prefill_kv_read_tokens"] > 0).any() == (name == "vllm_prefix")
    if name in ("vllm", "vllm_chunked", "vllm_v1_chunked", "vllm_3_replicas"):
        assert swap_out.sum() == 0  # recompute
    if name in ("vllm_swap", "vllm_n2", "vllm_n2_small_cpu", "vllm_beam2"):
        assert swap_out.sum() > 0 and swap_in.sum() == swap_out.sum()
    if name == "vllm_n2_small_cpu":  # the 32-block CPU pool fills; then recompute instead
        swapped_now = (swap_out - swap_in).cumsum()
        assert swapped_now.max() == 512 // 16
        assert ((steps["num_preempted"] > 0) & (swap_out == 0)).any()
    if name in ("vllm_n2", "vllm_n2_small_cpu", "vllm_beam2", "orca_pow2"):
        assert forked and steps["copy_blocks"].sum() > 0  # samples/beams fork, copy on write
    else:
        assert not forked
    if chunked:
        assert _mixed_steps(steps).any() and (steps["prefill_kv_read_tokens"] > 0).any()
        assert (steps["prefill_tokens"] + steps["decode_seqs"] <= 512).all()
    if name.startswith("orca"):
        assert _mixed_steps(steps).any()  # iteration-level: joins a running batch
    elif not chunked:  # vLLM v0.1 and request-level never mix prompts in
        assert not _mixed_steps(steps).any()
    if name == "orca_oracle":
        assert steps["kv_allocator_padding"].sum() > 0  # buddy rounding of exact reservations
    if name == "vllm_3_replicas":
        assert m["busy_time_s"] > 2 * m["duration_s"]  # three replicas busy at once


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "group_by_group"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_results_match_the_reference_code(name: str, batched: bool) -> None:
    digest, metrics, steps = run_case(name, batched, check_every=7)
    assert metrics["completed"] + metrics["rejected"] == metrics["num_requests"]
    _assert_features_fired(name, steps, metrics)
    assert digest == GOLDEN[name]


def _groups(lens: list[int], first_id: int) -> list[SequenceGroup]:
    return [
        SequenceGroup(Request(first_id + i, 0.0, n, 50, SamplingParams()), first_id + i)
        for i, n in enumerate(lens)
    ]


def _paged_state(m: PagedKVCacheManager, groups: list[SequenceGroup]) -> tuple[Any, ...]:
    pool = m.device_pool
    tables = [(m.block_table(g.seqs[0].seq_id), m.num_slots(g.seqs[0].seq_id)) for g in groups]
    return (tables, list(pool.ref), list(pool.fill), pool.num_filled, m.breakdown())


@pytest.mark.parametrize("blocks", [7, 8, 9, 12])
def test_paged_append_all_is_all_or_nothing_and_matches_one_by_one(blocks: int) -> None:
    """Prompts of 5, 8, 6 and 4 tokens in blocks of 4 (2 + 2 + 2 + 1 blocks): one token
    more needs 0, 1, 0 and 1 new blocks, so the batch fits from 9 blocks on."""
    batched, single = (PagedKVCacheManager(blocks, block_size=4, watermark=0.0) for _ in "ab")
    gb, gs = _groups([5, 8, 6, 4], 0), _groups([5, 8, 6, 4], 0)
    for m, groups in ((batched, gb), (single, gs)):
        for g in groups:
            m.allocate(g)
            g.seqs[0].num_generated += 1
    before = _paged_state(batched, gb)
    fits = blocks - 7 >= 2
    copies = batched.append_all(gb)
    if not fits:
        assert copies is None
        assert _paged_state(batched, gb) == before
        return
    want = []
    for g in gs:
        assert single.can_append(g)
        want.extend(single.append(g))
    assert copies == want
    assert _paged_state(batched, gb) == _paged_state(single, gs)
    batched.check_integrity()


def test_contiguous_append_all_is_all_or_nothing() -> None:
    m = ContiguousKVCacheManager(4096, "oracle", max_model_len=2048)
    groups = _groups([10, 20, 30], 0)
    for g in groups:
        m.allocate(g)
        g.seqs[0].num_generated += 1
    before = (m.breakdown(), [m.num_slots(g.seqs[0].seq_id) for g in groups])
    groups[2].seqs[0].num_generated = 51  # beyond its oracle reservation of 30 + 50
    assert m.append_all(groups) is None
    assert (m.breakdown(), [m.num_slots(g.seqs[0].seq_id) for g in groups]) == before
    groups[2].seqs[0].num_generated = 1
    assert m.append_all(groups) == []
    assert [m.num_slots(g.seqs[0].seq_id) for g in groups] == [11, 21, 31]
    m.check_integrity()


if __name__ == "__main__":
    for case in sorted(CASES):
        d, m, _ = run_case(case)
        print(f'    "{case}": "{d}",  # {m["num_steps"]} steps, {m["num_preemptions"]} preempt')
