"""Tests for the contiguous (buddy-reserved) KV-cache manager."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
)

from core.kv.base import AllocStatus, KVCacheError, KVCacheManager
from core.kv.buddy import next_power_of_two
from core.kv.contiguous import ContiguousKVCacheManager
from core.request import Request, SequenceGroup, SequenceStatus
from tests.kv_helpers import ManagerMachine, make_group, spawn


def expected_reservation(policy: str, prompt: int, output: int, max_len: int) -> int:
    if policy == "max":
        return max_len
    if policy == "pow2":
        return min(prompt + next_power_of_two(output), max_len)
    return prompt + output


@pytest.mark.parametrize(
    ("policy", "want"), [("max", 2048), ("pow2", 10 + 32), ("oracle", 10 + 25)]
)
def test_reservation_per_policy(policy: str, want: int) -> None:
    m = ContiguousKVCacheManager(4096, policy, max_model_len=2048)
    assert isinstance(m, KVCacheManager)
    g = make_group(prompt_len=10, output_len=25)
    assert m.reservation(g.request) == want
    m.allocate(g)
    addr, size = m.region(g.seqs[0].seq_id)
    assert size == max(16, next_power_of_two(want)) and addr % size == 0
    b = m.breakdown()
    assert (b.token_states, b.reserved, b.internal_frag, b.allocator_padding) == (
        10,
        25,
        want - 35,
        size - want,
    )
    assert b.free == 4096 - size
    m.check_integrity()


def test_pow2_is_capped_at_max_model_len() -> None:
    m = ContiguousKVCacheManager(4096, "pow2", max_model_len=100)
    assert m.reservation(Request(0, 0.0, 40, 40)) == 100  # 40 + 64 capped


def test_group_regions_fork_and_release() -> None:
    m = ContiguousKVCacheManager(256, "oracle", max_model_len=64, block_size=4)
    g = make_group(prompt_len=9, output_len=7, n=2)  # 16 slots per sequence
    assert m.can_allocate(g) is AllocStatus.OK
    m.allocate(g)
    parent = g.seqs[0]
    assert m.region(parent.seq_id) == (0, 16)
    assert m.block_table(parent.seq_id) == [0, 1, 2]
    assert m.breakdown().reserved == 7 + 16  # the spare region counts wholly
    parent.num_generated += 1
    assert m.append(g) == []
    child = spawn(parent)
    assert m.fork(parent.seq_id, child.seq_id) == [(0, 4), (1, 5), (2, 6)]
    assert m.num_slots(child.seq_id) == 10 and m.block_table(child.seq_id) == [4, 5, 6]
    third = spawn(parent)
    with pytest.raises(KVCacheError, match="no spare region"):
        m.fork(parent.seq_id, third.seq_id)
    g.seqs.remove(third)
    m.free(parent.seq_id)
    assert m.allocator.free_units == 256 - 32  # the group keeps both regions
    assert m.breakdown().reserved == 6 + 16
    m.check_integrity()
    m.free(child.seq_id)
    assert m.allocator.free_blocks() == m.allocator.initial_blocks()
    assert m.breakdown().free == 256
    m.check_integrity()


def test_admission_statuses() -> None:
    m = ContiguousKVCacheManager(96, "oracle", max_model_len=64, block_size=16)  # 64 + 32
    assert m.can_allocate(make_group(30, 40)) is AllocStatus.NEVER  # longer than the model
    assert m.can_allocate(make_group(30, 30, n=2)) is AllocStatus.NEVER  # two 64s never fit
    assert m.can_allocate(make_group(10, 20, n=3)) is AllocStatus.OK  # three 32s fit
    big = make_group(30, 30)
    m.allocate(big)
    late = make_group(10, 20, n=2)
    assert m.can_allocate(late) is AllocStatus.LATER
    with pytest.raises(KVCacheError, match="LATER"):
        m.allocate(late)
    m.check_integrity()


def test_append_stops_at_reservation_and_swaps_refuse() -> None:
    m = ContiguousKVCacheManager(64, "oracle", max_model_len=64, block_size=4)
    g = make_group(3, 2)
    m.allocate(g)
    seq = g.seqs[0]
    seq.num_generated = 2
    m.append(g)
    assert m.num_slots(seq.seq_id) == 5
    seq.num_generated = 3
    assert not m.can_append(g)
    with pytest.raises(KVCacheError, match="exceed its reservation"):
        m.append(g)
    assert m.num_slots(seq.seq_id) == 5
    assert not m.can_swap_out(g) and not m.can_swap_in(g)
    with pytest.raises(KVCacheError, match="does not swap"):
        m.swap_out(g)
    with pytest.raises(KVCacheError, match="does not swap"):
        m.swap_in(g)


def test_errors() -> None:
    m = ContiguousKVCacheManager(64, "max", max_model_len=32, block_size=4)
    for verb in (m.free, m.block_table, m.num_slots, m.region):
        with pytest.raises(KVCacheError, match="unknown seq_id 99"):
            verb(99)
    with pytest.raises(KVCacheError, match="unknown seq_id"):
        m.fork(99, 100)
    g = make_group(4, 4)
    with pytest.raises(KVCacheError, match="unknown seq_id"):
        m.append(g)
    m.allocate(g)
    with pytest.raises(KVCacheError, match="already holds"):
        m.allocate(g)
    with pytest.raises(ValueError, match="unknown contiguous policy"):
        ContiguousKVCacheManager(64, "best", 32)
    with pytest.raises(ValueError, match="multiple of block_size"):
        ContiguousKVCacheManager(60, "max", 32, block_size=16)
    with pytest.raises(ValueError, match="power of two"):
        ContiguousKVCacheManager(60, "max", 32, block_size=3)


class ContiguousMachine(ManagerMachine[ContiguousKVCacheManager]):
    """Random admissions, growth, forks and frees against brute-force recounts."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[SequenceGroup] = []

    @initialize(
        blocks=st.integers(1, 48),
        bs=st.sampled_from([1, 4, 16]),
        policy=st.sampled_from(["max", "pow2", "oracle"]),
        max_len=st.integers(8, 200),
    )
    def init(self, blocks: int, bs: int, policy: str, max_len: int) -> None:
        self.m = ContiguousKVCacheManager(blocks * bs, policy, max_len, bs)

    @rule(prompt=st.integers(1, 120), output=st.integers(1, 120), n=st.integers(1, 3))
    def admit(self, prompt: int, output: int, n: int) -> None:
        m = self.manager()
        g = make_group(prompt, output, n)
        r = expected_reservation(m.policy, prompt, output, m.max_model_len)
        size = max(m.block_size, next_power_of_two(r))
        status = m.can_allocate(g)
        never = prompt + output > m.max_model_len or n * size > m.capacity_slots
        assert (status is AllocStatus.NEVER) == never
        assert (status is AllocStatus.OK) == (not never and m.allocator.count_fit(size) >= n)
        if status is not AllocStatus.OK:
            before = m.breakdown()
            with pytest.raises(KVCacheError):
                m.allocate(g)
            assert m.breakdown() == before
            return
        free = m.allocator.free_units
        assert m.allocate(g) == 0
        assert m.allocator.free_units == free - n * size
        assert m.reservation(g.request) == r
        addr, got = m.region(g.seqs[0].seq_id)
        assert got == size and addr % size == 0
        g.seqs[0].status = SequenceStatus.RUNNING
        self.groups.append(g)

    @precondition(lambda self: self.groups)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        m = self.manager()
        g = data.draw(st.sampled_from(self.groups))
        r = m.reservation(g.request)
        for s in g.live_seqs():
            s.num_generated += 1
        fits = all(s.num_tokens <= r for s in g.live_seqs())
        assert m.can_append(g) == fits
        if not fits:
            with pytest.raises(KVCacheError):
                m.append(g)
            for s in g.live_seqs():
                s.num_generated -= 1
        else:
            assert m.append(g) == []
        for s in g.live_seqs():
            assert m.num_slots(s.seq_id) == s.num_tokens

    @precondition(lambda self: self.groups)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        m = self.manager()
        g = data.draw(st.sampled_from(self.groups))
        parent = data.draw(st.sampled_from(g.live_seqs()))
        child = spawn(parent)
        if len(g.live_seqs()) > g.sampling.num_seqs:
            with pytest.raises(KVCacheError, match="no spare region"):
                m.fork(parent.seq_id, child.seq_id)
            g.seqs.remove(child)
            return
        copies = m.fork(parent.seq_id, child.seq_id)
        assert m.num_slots(child.seq_id) == m.num_slots(parent.seq_id)
        assert [s for s, _ in copies] == m.block_table(parent.seq_id)
        assert [d for _, d in copies] == m.block_table(child.seq_id)

    @precondition(lambda self: self.groups)
    @rule(data=st.data())
    def finish_seq(self, data: st.DataObject) -> None:
        m = self.manager()
        g = data.draw(st.sampled_from(self.groups))
        s = data.draw(st.sampled_from(g.live_seqs()))
        _, size = m.region(s.seq_id)
        free = m.allocator.free_units
        m.free(s.seq_id)
        s.status = SequenceStatus.FINISHED
        g.seqs.remove(s)
        if g.seqs:
            assert m.allocator.free_units == free
        else:
            assert m.allocator.free_units == free + size * g.sampling.num_seqs
            self.groups.remove(g)

    @precondition(lambda self: self.groups)
    @rule()
    def free_everything(self) -> None:
        m = self.manager()
        for g in self.groups:
            for s in g.seqs:
                m.free(s.seq_id)
        self.groups.clear()
        assert m.allocator.free_blocks() == m.allocator.initial_blocks()

    @invariant()
    def recount(self) -> None:
        m = self.manager()
        m.check_integrity()
        tokens = reserved = frag = padding = 0
        regions = m.allocator.allocated_blocks()
        for (a, sa), (b, _) in itertools.pairwise(regions):
            assert a + sa <= b, "regions overlap"
        seq_regions = set()
        for g in self.groups:
            t = g.request.total_len
            r = m.reservation(g.request)
            for s in g.seqs:
                addr, size = m.region(s.seq_id)
                assert (addr, size) in regions
                seq_regions.add(addr)
                stored = m.num_slots(s.seq_id)
                tokens += stored
                reserved += max(t - stored, 0)
                frag += r - max(t, stored)
                padding += size - r
            reserved += size * (g.sampling.num_seqs - len(g.seqs))
        assert len(seq_regions) == sum(len(g.seqs) for g in self.groups), "regions shared"
        assert len(regions) == sum(g.sampling.num_seqs for g in self.groups)
        b = m.breakdown()
        assert (b.token_states, b.reserved, b.internal_frag, b.allocator_padding) == (
            tokens,
            reserved,
            frag,
            padding,
        )
        assert b.free == m.allocator.free_units and b.total == m.capacity_slots
        if not self.groups:
            assert m.allocator.free_blocks() == m.allocator.initial_blocks()


TestContiguousMachine = ContiguousMachine.TestCase
TestContiguousMachine.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)


def test_growth_past_true_output_takes_from_internal_frag() -> None:
    m = ContiguousKVCacheManager(64, "max", max_model_len=16, block_size=4)
    g = make_group(prompt_len=4, output_len=2)
    m.allocate(g)
    g.seqs[0].num_generated = 4  # two tokens beyond the trace's output length
    m.append(g)
    b = m.breakdown()
    assert (b.token_states, b.reserved, b.internal_frag, b.allocator_padding) == (8, 0, 8, 0)
    m.check_integrity()
