"""Property tests for the binary buddy allocator."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from core.kv.base import KVCacheError
from core.kv.buddy import BuddyAllocator, next_power_of_two


def test_next_power_of_two() -> None:
    assert [next_power_of_two(n) for n in (1, 2, 3, 25, 32, 33)] == [1, 2, 4, 32, 32, 64]
    with pytest.raises(ValueError, match="n >= 1"):
        next_power_of_two(0)


def test_initial_decomposition_of_non_power_of_two() -> None:
    b = BuddyAllocator(12)
    assert b.initial_blocks() == [(0, 8), (8, 4)]
    assert b.free_blocks() == [(0, 8), (8, 4)]
    assert b.largest_free_block() == 8
    b.check_integrity()


def test_split_and_merge() -> None:
    b = BuddyAllocator(16)
    a = b.alloc(3)
    assert a == 0 and b.allocated_size(a) == 4
    assert b.free_blocks() == [(4, 4), (8, 8)]
    c = b.alloc(1)
    assert c == 4 and b.free_blocks() == [(5, 1), (6, 2), (8, 8)]
    b.free(a)
    assert b.free_blocks() == [(0, 4), (5, 1), (6, 2), (8, 8)]
    b.free(c)
    assert b.free_blocks() == [(0, 16)]
    b.check_integrity()


def test_min_block_rounds_up() -> None:
    b = BuddyAllocator(64, min_block=16)
    a = b.alloc(1)
    assert a is not None and b.allocated_size(a) == 16
    assert b.block_size_for(17) == 32
    assert b.count_fit(16) == 3 and b.count_fit(32) == 1


def test_too_big_or_full_returns_none() -> None:
    b = BuddyAllocator(12)
    assert b.alloc(9) is None and not b.can_alloc(9)
    assert b.alloc(8) == 0
    assert b.alloc(8) is None and not b.can_alloc(8)
    assert b.alloc(4) == 8
    assert b.free_units == 0 and b.largest_free_block() == 0 and b.alloc(1) is None


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="capacity"):
        BuddyAllocator(0)
    with pytest.raises(ValueError, match="power of two"):
        BuddyAllocator(64, min_block=3)
    with pytest.raises(ValueError, match="multiple"):
        BuddyAllocator(40, min_block=16)
    b = BuddyAllocator(8)
    with pytest.raises(ValueError, match="size"):
        b.alloc(0)
    with pytest.raises(KVCacheError, match="not allocated"):
        b.free(3)
    a = b.alloc(2)
    assert a is not None
    b.free(a)
    with pytest.raises(KVCacheError, match="not allocated"):
        b.free(a)
    with pytest.raises(KVCacheError, match="no allocated block"):
        b.allocated_size(a)


@given(
    capacity_blocks=st.integers(1, 200),
    min_block=st.sampled_from([1, 2, 16]),
    sizes=st.lists(st.integers(1, 300), max_size=60),
    seed=st.randoms(use_true_random=False),
)
@settings(max_examples=150, deadline=None)
def test_free_everything_coalesces(
    capacity_blocks: int, min_block: int, sizes: list[int], seed: object
) -> None:
    b = BuddyAllocator(capacity_blocks * min_block, min_block)
    initial = b.free_blocks()
    addrs = [a for a in (b.alloc(s) for s in sizes) if a is not None]
    b.check_integrity()
    seed.shuffle(addrs)  # type: ignore[attr-defined]
    for a in addrs:
        b.free(a)
    b.check_integrity()
    assert b.free_blocks() == initial == b.initial_blocks()
    assert b.free_units == b.capacity


class BuddyMachine(RuleBasedStateMachine):
    """Random alloc/free against a model of the live blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.b: BuddyAllocator | None = None
        self.live: dict[int, tuple[int, int]] = {}  # addr -> (requested, block size)

    @initialize(capacity=st.integers(1, 600), min_block=st.sampled_from([1, 4, 16]))
    def init(self, capacity: int, min_block: int) -> None:
        self.b = BuddyAllocator(capacity * min_block, min_block)

    @rule(size=st.integers(1, 2000))
    def alloc(self, size: int) -> None:
        b = self.b
        assert b is not None
        could = b.can_alloc(size)
        largest = b.largest_free_block()
        addr = b.alloc(size)
        want = max(b.min_block, next_power_of_two(size))
        assert (addr is not None) == could == (want <= largest)
        if addr is None:
            return
        assert addr % want == 0 and addr >= 0 and addr + want <= b.capacity
        assert b.allocated_size(addr) == want
        for other, (_, osize) in self.live.items():
            assert addr + want <= other or other + osize <= addr, "overlapping blocks"
        self.live[addr] = (size, want)

    @precondition(lambda self: self.b is not None and self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        assert self.b is not None
        addr = data.draw(st.sampled_from(sorted(self.live)))
        self.b.free(addr)
        del self.live[addr]

    @invariant()
    def consistent(self) -> None:
        b = self.b
        if b is None:
            return
        b.check_integrity()
        used = sum(size for _, size in self.live.values())
        assert b.free_units == b.capacity - used
        assert b.allocated_blocks() == sorted((a, s) for a, (_, s) in self.live.items())
        if not self.live:
            assert b.free_blocks() == b.initial_blocks()


TestBuddyMachine = BuddyMachine.TestCase
TestBuddyMachine.settings = settings(max_examples=80, stateful_step_count=60, deadline=None)
