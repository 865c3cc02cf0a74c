"""Metamorphic relations of the simulator: what must hold between two runs whose configs
differ in one known way, whatever the absolute numbers.

Each relation here follows from the model as documented (the cost model prices a step from
its batch alone, the schedulers are FCFS and deterministic, the KV managers' breakdowns
partition the cache). Relations that are tendencies rather than consequences are left out
on purpose: more KV memory can raise vLLM's preemption count (more admitted requests
later collide; e.g. ``model=opt-13b workload=sharegpt workload.rate=5
workload.num_requests=120 seed=0 system=vllm``: 166 preemptions at ``kv_cache_gb=2``, 171
at 2.25), and Orca's mean batch ordering Oracle >= Pow2 >= Max is not a theorem of FCFS
admission on a buddy allocator, only its per-request reservations are (tested below).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.kv.base import AllocStatus
from core.kv.contiguous import POLICIES, ContiguousKVCacheManager
from core.metrics.summary import summarize_recorder
from core.request import Request
from experiments.lib.setup import build_setup
from experiments.reproduce import compose_config
from experiments.simulate import run
from sim.driver import simulate
from tests.kv_helpers import make_group

SYSTEMS = ("vllm", "vllm_v1", "orca_max", "orca_pow2", "orca_oracle", "fastertransformer")
ORCA = ("orca_oracle", "orca_pow2", "orca_max")
SHARES = (
    "kv_token_states_pct",
    "kv_reserved_pct",
    "kv_internal_frag_pct",
    "kv_external_frag_pct",
    "kv_free_at_limit_pct",
    "kv_free_pct",
)
TIMES = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s")
UNTIMED = ("wall_s", "sim_steps_per_s")  # the host's speed, not the model's
TRACE = Path(__file__).resolve().parents[1] / "../shared/traces/AzureLLMInferenceTrace_conv.csv"


def small(rate: float, n: int = 80, seed: int = 0, model: str = "opt-13b") -> list[str]:
    """Overrides of a small synthetic ShareGPT run on one A100-40GB."""
    return [
        f"model={model}",
        "hardware=a100-40gb",
        "workload=sharegpt",
        f"workload.rate={rate}",
        f"workload.num_requests={n}",
        f"seed={seed}",
    ]


def metrics(overrides: list[str]) -> dict[str, Any]:
    """``experiments.simulate.run`` of the composed overrides (no files)."""
    return run(compose_config(overrides))


def frames(
    overrides: list[str], requests: list[Request] | None = None, **kw: Any
) -> tuple[dict[str, Any], pd.DataFrame]:
    """Summary metrics and the per-request frame of one simulation (``requests`` replaces
    the workload's; ``kw`` goes to :func:`sim.driver.simulate`), rows by request id."""
    s = build_setup(compose_config(overrides))
    reqs = s.requests if requests is None else requests
    rec = simulate(reqs, s.make_scheduler, s.cost_model, **kw).recorder
    frame = rec.requests_frame().sort_values("request_id").reset_index(drop=True)
    return summarize_recorder(rec, None), frame


def same_value(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN."""
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return both_nan or a == b


def assert_same_schedule(a: pd.DataFrame, b: pd.DataFrame, cols: tuple[str, ...] = TIMES) -> None:
    """The two frames (same request ids) have the same timestamps (to 1e-9 s), statuses
    and preemption counts."""
    assert a["request_id"].tolist() == b["request_id"].tolist()
    assert a["status"].tolist() == b["status"].tolist()
    assert a["num_preemptions"].tolist() == b["num_preemptions"].tolist()
    for c in cols:
        np.testing.assert_allclose(b[c].to_numpy(), a[c].to_numpy(), rtol=1e-9, atol=1e-9)


def isolated(f: pd.DataFrame) -> np.ndarray:
    """Per row: the request finished and no other request's [arrival, finish] overlaps its
    own, so the engine served it alone (its latencies depend on its lengths only)."""
    a, e = f["arrival_s"].to_numpy(), f["finish_s"].to_numpy()
    alone = np.zeros(len(f), dtype=bool)
    for i in range(len(f)):
        overlap = (a < e[i]) & (e > a[i])
        overlap[i] = False
        alone[i] = bool(np.isfinite(e[i]) and not overlap.any())
    return alone


# -- determinism ----------------------------------------------------------------------------


@pytest.mark.parametrize("system", SYSTEMS)
def test_same_config_gives_the_same_metrics_and_fast_forward_changes_nothing(
    system: str,
) -> None:
    """Same seed and config: identical metrics; fast-forwarding plain decode steps gives
    the step-by-step run's per-request timestamps (under memory pressure, with
    preemptions where the system has them)."""
    ov = [*small(6, n=60, seed=2), f"system={system}", "kv_cache_gb=3"]
    a, b = metrics(ov), metrics(ov)
    assert {k for k in a if k not in UNTIMED and not same_value(a[k], b[k])} == set()
    m_ff, f_ff = frames(ov, fast_forward=True)
    m_step, f_step = frames(ov, fast_forward=False)
    assert_same_schedule(f_ff, f_step)
    assert m_ff["num_steps"] == m_step["num_steps"]


# -- KV memory ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [["system=vllm"], ["system=vllm_v1"], *[[f"system={s}", "workload.n=2"] for s in ORCA]],
)
def test_more_kv_memory_never_rejects_more(extra: list[str]) -> None:
    """Raising ``kv_cache_gb`` never lowers the slots, never rejects more requests as never
    fitting the cache, never completes fewer; Orca never preempts, and vLLM with room for
    the whole trace does not either."""
    runs = [metrics([*small(6, n=60, seed=2), *extra, f"kv_cache_gb={gb}"]) for gb in (3, 5, 8)]
    slots = [m["kv_slots"] for m in runs]
    rejected = [m["rejected_kv_cache"] for m in runs]
    completed = [m["completed"] for m in runs]
    assert slots == sorted(slots)
    assert rejected == sorted(rejected, reverse=True)
    assert completed == sorted(completed)
    if extra[0].startswith("system=orca"):
        assert [m["num_preemptions"] for m in runs] == [0, 0, 0]
    ample = metrics([*small(1, n=30, seed=2), *extra, "kv_cache_gb=12"])
    assert ample["num_preemptions"] == 0
    assert ample["completed"] == 30


@pytest.mark.parametrize("system", ["vllm", "orca_pow2"])
def test_higher_gpu_memory_utilization_never_shrinks_the_cache(system: str) -> None:
    """A larger ``gpu_memory_utilization`` gives at least as many KV slots and never rejects
    more requests for want of KV memory."""
    runs = [
        metrics([*small(6, n=40, seed=5), f"system={system}", f"gpu_memory_utilization={u}"])
        for u in (0.75, 0.85, 0.95)
    ]
    slots = [m["kv_slots"] for m in runs]
    assert slots == sorted(slots) and slots[0] < slots[-1]
    rejected = [m["rejected_kv_cache"] for m in runs]
    assert rejected == sorted(rejected, reverse=True)


def test_kv_cache_gb_and_the_same_num_gpu_blocks_are_the_same_run() -> None:
    """Fixing the cache by ``num_gpu_blocks`` at the block count that ``kv_cache_gb``
    gives changes nothing but the reported GiB."""
    for system in ("vllm", "orca_pow2"):
        ov = [*small(6, n=60, seed=3), f"system={system}"]
        a = metrics([*ov, "kv_cache_gb=4"])
        b = metrics([*ov, f"num_gpu_blocks={a['kv_slots'] // 16}"])
        differ = {k for k in a if k not in (*UNTIMED, "kv_cache_gib")}
        assert {k for k in differ if not same_value(a[k], b[k])} == set()


# -- Orca's reservations --------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.integers(1, 1500),
    output=st.integers(1, 1500),
    n=st.integers(1, 3),
    blocks=st.integers(1, 400),
)
def test_orca_reservations_nest(prompt: int, output: int, n: int, blocks: int) -> None:
    """Per request that fits ``max_model_len``, Oracle's reservation <= Pow2's <= Max's,
    before and after the buddy's rounding, and a request Max admits to an empty cache Pow2
    and Oracle admit too; a longer one is never admitted by any."""
    mml, bs = 2048, 16
    managers = [
        ContiguousKVCacheManager(blocks * bs, p, mml, bs) for p in ("oracle", "pow2", "max")
    ]
    assert set(POLICIES) == {m.policy for m in managers}
    group = make_group(prompt, output, n=n)
    request = group.request
    if request.total_len > mml:
        assert {m.can_allocate(group) for m in managers} == {AllocStatus.NEVER}
        return
    reserved = [m.reservation(request) for m in managers]
    assert reserved == sorted(reserved)
    assert reserved[0] == request.total_len
    rounded = [m.allocator.block_size_for(r) for m, r in zip(managers, reserved, strict=True)]
    assert rounded == sorted(rounded)
    never = [m.can_allocate(group) is AllocStatus.NEVER for m in managers]
    assert never == sorted(never)  # False (admitted) before True (never)
    assert {m.can_allocate(group) for m in managers} <= {AllocStatus.OK, AllocStatus.NEVER}


def test_orca_policies_agree_when_memory_never_binds() -> None:
    """With room for every request's Max reservation at once, the policy decides nothing:
    Oracle, Pow2 and Max serve the trace identically, and Oracle wastes nothing inside a
    reservation."""
    ov = [*small(1, n=40, seed=1, model="opt-125m"), "workload.arrival=all_at_once"]
    runs = {s: frames([*ov, f"system={s}", "kv_cache_gb=4"]) for s in ORCA}
    for s in ORCA[1:]:
        assert_same_schedule(runs[ORCA[0]][1], runs[s][1])
        assert runs[s][0]["mean_batch_size"] == runs[ORCA[0]][0]["mean_batch_size"]
    assert runs["orca_oracle"][0]["kv_internal_frag_pct"] == 0.0


# -- the clock ------------------------------------------------------------------------------


@pytest.mark.parametrize("system", ["vllm", "vllm_v1", "orca_pow2", "fastertransformer"])
@pytest.mark.parametrize("stack", ["none", "vllm-2023"])
def test_a_faster_gpu_never_slows_a_request_served_alone(system: str, stack: str) -> None:
    """More bandwidth and FLOPs: every step of a given batch is no slower, so a request the
    engine serves alone in both runs has no larger TTFT, TPOT or E2E; at this low rate the
    run's mean TPOT is no larger either."""
    ov = [*small(0.05, n=40, seed=0), f"system={system}", f"cost.stack={stack}"]
    m_slow, slow = frames(ov)
    m_fast, fast = frames([*ov, "hardware.mem_bandwidth_gbs=3000", "hardware.peak_tflops=600"])
    both = isolated(slow) & isolated(fast)
    assert both.sum() >= 20
    for c in ("ttft_s", "tpot_s", "e2el_s"):
        assert (fast[c].to_numpy()[both] <= slow[c].to_numpy()[both] * (1 + 1e-12)).all()
    assert m_fast["mean_tpot_ms"] <= m_slow["mean_tpot_ms"]


@pytest.mark.parametrize("system", SYSTEMS)
def test_stretching_time_leaves_a_lone_request_unchanged(system: str) -> None:
    """Half the rate on the same seed stretches every arrival by 2 (lengths unchanged); a
    request served alone in both runs has the same TTFT, TPOT and E2E."""
    ov = [f"system={system}", "cost.stack=vllm-2023"]
    _, f1 = frames([*small(0.05, n=40, seed=4), *ov])
    _, f2 = frames([*small(0.025, n=40, seed=4), *ov])
    np.testing.assert_allclose(f2["arrival_s"], 2 * f1["arrival_s"], rtol=1e-12)
    assert f1["output_len"].tolist() == f2["output_len"].tolist()
    both = isolated(f1) & isolated(f2)
    assert both.sum() >= 20
    for c in ("ttft_s", "tpot_s", "e2el_s"):
        np.testing.assert_allclose(f2[c].to_numpy()[both], f1[c].to_numpy()[both], rtol=1e-9)


@pytest.mark.skipif(not TRACE.is_file(), reason="../shared/traces absent")
@pytest.mark.parametrize("system", ["vllm", "orca_max"])
def test_azure_time_scale_leaves_a_lone_request_unchanged(system: str) -> None:
    """``workload.time_scale`` at very low load: a request served alone in both replays
    has the same latencies (requests rejected as too long stay rejected)."""
    ov = ["workload=azure_conv", "workload.num_requests=40", f"system={system}"]
    _, f1 = frames([*ov, "workload.time_scale=300"])
    _, f2 = frames([*ov, "workload.time_scale=900"])
    assert f1["status"].tolist() == f2["status"].tolist()
    both = isolated(f1) & isolated(f2)
    assert both.sum() >= 20
    for c in ("ttft_s", "tpot_s", "e2el_s"):
        np.testing.assert_allclose(f2[c].to_numpy()[both], f1[c].to_numpy()[both], rtol=1e-9)


@pytest.mark.parametrize("system", SYSTEMS)
def test_shifting_and_relabelling_the_trace_changes_no_latency(system: str) -> None:
    """Adding 1000 s to every arrival shifts every timestamp by 1000 s; giving the requests
    other ids (same order of arrival) changes nothing."""
    ov = [*small(6, n=60, seed=1), f"system={system}", "kv_cache_gb=3"]
    s = build_setup(compose_config(ov))
    _, base = frames(ov)
    shifted = [dataclasses.replace(r, arrival_time=r.arrival_time + 1000.0) for r in s.requests]
    _, later = frames(ov, shifted)
    for c in TIMES:
        later[c] = later[c] - 1000.0
    assert_same_schedule(base, later)
    relabelled = [dataclasses.replace(r, request_id=5000 - 3 * r.request_id) for r in s.requests]
    _, other = frames(ov, relabelled)
    other["request_id"] = (5000 - other["request_id"]) // 3
    assert_same_schedule(base, other.sort_values("request_id").reset_index(drop=True))


@pytest.mark.parametrize("system", SYSTEMS)
def test_two_replicas_are_two_runs_of_alternate_requests(system: str) -> None:
    """``num_replicas=2`` deals arrivals round-robin: each request's timestamps are those of
    a one-replica run of every other request."""
    ov = [*small(6, n=60, seed=3), f"system={system}", "kv_cache_gb=3"]
    s = build_setup(compose_config(ov))
    ordered = sorted(s.requests, key=lambda r: (r.arrival_time, r.request_id))
    _, both = frames(ov, num_replicas=2)
    halves = pd.concat([frames(ov, ordered[k::2])[1] for k in (0, 1)])
    assert_same_schedule(both, halves.sort_values("request_id").reset_index(drop=True))


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_latency_is_ordered_and_throughput_follows_arrivals(system: str) -> None:
    """Per finished request: arrival <= first scheduled <= first token <= finish, TTFT and
    TPOT >= 0, E2E >= TTFT; the run's request throughput is at most the requests over the
    arrival span (the last finish is no earlier than the last arrival)."""
    m, f = frames([*small(8, n=60, seed=6), f"system={system}", "kv_cache_gb=3"])
    done = f[f["status"] == "finished"]
    assert len(done) == m["completed"] > 0
    assert (done["first_scheduled_s"] >= done["arrival_s"]).all()
    assert (done["first_token_s"] >= done["first_scheduled_s"]).all()
    assert (done["finish_s"] >= done["first_token_s"]).all()
    assert (done["ttft_s"] >= 0).all() and (done["tpot_s"].dropna() >= 0).all()
    assert (done["e2el_s"] >= done["ttft_s"]).all()
    span = f["arrival_s"].max() - f["arrival_s"].min()
    assert m["request_throughput"] <= m["completed"] / span
    assert m["total_output_tokens"] == int((done["output_len"] * done["num_seqs"]).sum())


# -- block size and the memory breakdown ----------------------------------------------------


def test_smaller_blocks_never_waste_more_inside_blocks() -> None:
    """vLLM with room for the whole trace on the bare roofline (block size moves memory
    only): the same schedule at every block size, internal fragmentation non-increasing
    as blocks shrink and zero at one slot per block."""
    ov = [*small(2, n=80, seed=0), "system=vllm", "kv_cache_gb=12"]
    runs = {bs: frames([*ov, f"system.block_size={bs}"]) for bs in (32, 16, 8, 1)}
    for bs in (16, 8, 1):
        assert runs[bs][0]["num_preemptions"] == 0
        assert_same_schedule(runs[32][1], runs[bs][1])
    frag = [runs[bs][0]["kv_internal_frag_pct"] for bs in (32, 16, 8, 1)]
    assert frag == sorted(frag, reverse=True) and frag[0] > 0
    assert frag[-1] == 0.0


@pytest.mark.parametrize(
    "extra",
    [
        *[[f"system={s}"] for s in SYSTEMS],
        ["system=vllm", "system.preemption_mode=swap"],
        ["system=vllm", "system.preemption_mode=swap", "workload.n=2", "swap_space_gb=0.5"],
        ["system=vllm", "system.chunked_prefill=true"],
        ["system=vllm", "workload.beam_width=2"],
        ["system=vllm", "system.block_size=1", "workload.n=3"],
        ["system=vllm_v1", "workload.n=2", "workload.with_token_ids=true"],
        ["system=vllm", "num_replicas=2"],
        ["system=orca_pow2", "workload.n=2"],
    ],
)
def test_kv_shares_partition_the_cache(extra: list[str]) -> None:
    """The six time-weighted KV shares are each in [0, 100] and sum to 100, whatever the
    system, preemption mode, sampling or replicas; Oracle reserves exactly the true need
    (no internal fragmentation)."""
    m = metrics([*small(6, n=60, seed=2), "kv_cache_gb=3", *extra])
    shares = [m[k] for k in SHARES]
    assert all(-1e-9 <= v <= 100 + 1e-9 for v in shares)
    assert sum(shares) == pytest.approx(100.0, abs=1e-6)
    if extra == ["system=orca_oracle"]:
        assert m["kv_internal_frag_pct"] == 0.0


@pytest.mark.parametrize("system", ["vllm", "vllm_v1"])
def test_prefix_caching_without_shared_ids_changes_nothing(system: str) -> None:
    """Seeded random prompt ids share no block between requests: with no preemption (a
    recomputed request would find its own blocks) prefix caching on or off gives the same
    run."""
    ov = [*small(2, n=60, seed=1), f"system={system}", "workload.with_token_ids=true"]
    m_off, off = frames([*ov, "system.enable_prefix_caching=false"])
    m_on, on = frames([*ov, "system.enable_prefix_caching=true"])
    assert m_off["num_preemptions"] == m_on["num_preemptions"] == 0
    assert_same_schedule(off, on)


@pytest.mark.parametrize(
    "extra",
    [
        ["system=orca_pow2", "workload.n=2", "kv_cache_gb=3"],
        ["system=vllm", "workload.beam_width=4", "kv_cache_gb=2"],
    ],
)
def test_a_request_rejected_for_kv_is_rejected_alone(extra: list[str]) -> None:
    """Rejection for KV memory means "never fits an empty cache": a request's fate is the
    same in the full run and served alone."""
    ov = [*small(6, n=60, seed=2), *extra]
    s = build_setup(compose_config(ov))
    _, full = frames(ov)
    assert (full["status"] == "rejected").any()
    by_id = {r.request_id: r for r in s.requests}
    for rid, status in zip(full["request_id"], full["status"], strict=True):
        alone = simulate([by_id[rid]], s.make_scheduler, s.cost_model).recorder
        assert (alone.requests_frame()["status"].iloc[0] == "rejected") == (status == "rejected")
