"""Behaviour that a mutation audit (one operator changed at a time in core/kv, core/sched
and core/plan) found no test pinned down: each test here fails under such a mutant."""

from __future__ import annotations

import pytest

from core.kv.base import KVCacheError
from core.kv.block_pool import BlockPool
from core.kv.contiguous import ContiguousKVCacheManager
from core.kv.paged import PagedKVCacheManager
from core.plan import BatchShape
from core.sched.base import SchedulerConfig, SchedulerConfigError
from tests.kv_helpers import make_group

IS_EMPTY_FIELDS = ("prefill_tokens", "decode_seqs", "swap_in_blocks", "swap_out_blocks",
                   "copy_blocks")  # fmt: skip


@pytest.mark.parametrize("field", IS_EMPTY_FIELDS)
@pytest.mark.parametrize("value", [1, 2])
def test_a_batch_shape_is_empty_only_when_it_moves_nothing(field: str, value: int) -> None:
    # the calibrated cost model prices an "empty" step at zero: a swap- or copy-only step
    # must not be one
    assert BatchShape().is_empty
    assert not BatchShape(**{field: value}).is_empty


def test_the_smallest_scheduler_configs() -> None:
    with pytest.raises(SchedulerConfigError, match="max_model_len must be >= 2"):
        SchedulerConfig(max_model_len=1)
    ok = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=1, max_model_len=2,
                         chunked_prefill=True)  # fmt: skip
    assert ok.max_num_batched_tokens == 1


def test_the_cpu_table_of_a_sequence_on_the_device_is_refused() -> None:
    m = PagedKVCacheManager(num_device_blocks=4, block_size=4, watermark=0.0)
    g = make_group(6)
    m.allocate(g)
    with pytest.raises(KVCacheError, match="on the device"):
        m.cpu_block_table(g.seqs[0].seq_id)


def test_append_all_agrees_with_can_append_on_a_shared_last_block() -> None:
    # a fork shares the partly filled last block: appending must copy it, which needs a
    # block the full cache does not have
    m = PagedKVCacheManager(num_device_blocks=1, block_size=4, watermark=0.0)
    g = make_group(2)
    m.allocate(g)
    m.fork(g.seqs[0].seq_id, 10**9)
    g.seqs[0].num_generated = 1
    assert not m.can_append(g)
    assert m.append_all([g]) is None


def test_the_block_pool_integrity_check_finds_a_doubly_free_block() -> None:
    p = BlockPool(4, 4)
    b = p.allocate()
    p.decref(b)
    p.check_integrity()
    p._free.append(b)
    with pytest.raises(KVCacheError, match="free list twice"):
        p.check_integrity()


def test_the_block_pool_integrity_check_finds_a_fill_count_drift() -> None:
    p = BlockPool(4, 4)
    b = p.allocate()
    p.add_fill(b, 2)
    p.check_integrity()
    p.num_filled += 1
    with pytest.raises(KVCacheError, match="num_filled"):
        p.check_integrity()


def test_the_contiguous_integrity_check_finds_a_wrong_holder_count() -> None:
    m = ContiguousKVCacheManager(256, "oracle", max_model_len=64, block_size=4)
    g = make_group(6)
    m.allocate(g)
    m.check_integrity()
    m._groups[g.request.request_id].num_held += 1
    with pytest.raises(KVCacheError, match="do not add up"):
        m.check_integrity()


def test_orca_promises_decodes_while_the_head_exceeds_the_token_budget() -> None:
    # two decoding requests leave 64 - 2 = 62 tokens: a 63-token prompt waits on the budget,
    # so every step until request 0's last token is a plain decode (the fast path's promise)
    from core.plan import HELD_BY_TOKEN_BUDGET, StepOutcome
    from core.request import Request
    from core.systems import build_scheduler

    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    s = build_scheduler("orca_oracle", 1024, config=cfg)
    s.add(Request(0, 0.0, 10, 20), 0.0)
    s.add(Request(1, 0.0, 10, 30), 0.0)
    s.update(s.schedule(0.0), StepOutcome(1.0), 1.0)
    s.add(Request(2, 1.0, 63, 1), 1.0)  # 64 tokens in all: max_model_len
    run = s.decode_run(100)
    assert run is not None and [g.request.request_id for g in run.groups] == [0, 1]
    assert len(run.new_blocks) == 19 and run.num_waiting == 1
    assert run.queue_held_by == HELD_BY_TOKEN_BUDGET


def test_a_running_prefill_gets_the_last_token_of_the_budget() -> None:
    # chunked prefill: a group preempted by recompute returns as two sequences using 14 of
    # the 15 tokens; request 2, prefilling, takes the one token left at each step rather
    # than wait for a step with more (vLLM gives running chunks the budget before admission)
    from core.plan import StepOutcome
    from core.request import Request, SamplingParams
    from core.systems import build_scheduler

    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=15, max_model_len=64,
                          chunked_prefill=True)  # fmt: skip
    s = build_scheduler("vllm", 64, config=cfg, block_size=4, watermark=0.0)
    reqs = [Request(0, 0, 8, 20), Request(1, 0, 8, 24, SamplingParams(n=2)), Request(2, 10, 20, 2)]
    chunks: dict[int, list[tuple[int, int]]] = {}
    for now in range(24):
        for r in reqs:
            if r.arrival_time == now:
                s.add(r, float(now))
        plan = s.schedule(float(now))
        got = [(c.start, c.length) for c in plan.prefill if c.seq.group.request.request_id == 2]
        if got:
            chunks[now] = got
        s.update(plan, StepOutcome(1.0), float(now + 1))
        s.check_integrity()
    assert chunks == {20: [(0, 1)], 21: [(1, 1)], 22: [(2, 1)], 23: [(3, 9)]}
