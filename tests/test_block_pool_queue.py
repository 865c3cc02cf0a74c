"""The block pool's evictable queue (lazy deletion: a revived block leaves a stale entry
behind) evicts in the order of a plain ordered set of releases.

The reference is the pool as it was before the queue: an ``OrderedDict`` of evictable
blocks, a revived block deleted from it at once. Random verbs (allocate, batch allocate,
decref, release, incref of a held or a cached block, register with repeating hashes) must
hand out the same blocks and leave the same evictable order, ``takes_sparing`` answers and
hash index, through enough revivals that the queue is compacted.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from core.kv.block_pool import BlockPool


class _ReferencePool:
    """Free list, ref counts and an ordered dict of evictable blocks (oldest first)."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(num_blocks - 1, -1, -1))
        self.ref = [0] * num_blocks
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.hash_of: dict[int, int] = {}
        self.block_of: dict[int, int] = {}

    def allocate(self) -> int:
        if self.free:
            block = self.free.pop()
        else:
            block, _ = self.evictable.popitem(last=False)
            del self.block_of[self.hash_of.pop(block)]
        self.ref[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self.ref[block] == 0:
            del self.evictable[block]
        self.ref[block] += 1

    def decref(self, block: int) -> None:
        self.ref[block] -= 1
        if self.ref[block] == 0:
            if block in self.hash_of:
                self.evictable[block] = None
            else:
                self.free.append(block)

    def register(self, block: int, block_hash: int) -> None:
        if block_hash not in self.block_of and block not in self.hash_of:
            self.block_of[block_hash] = block
            self.hash_of[block] = block_hash

    def num_free(self) -> int:
        return len(self.free) + len(self.evictable)


def _same(pool: BlockPool, ref: _ReferencePool, spared: set[int]) -> None:
    assert pool.evictable_blocks() == list(ref.evictable)
    assert pool.num_free() == ref.num_free() and pool.num_evictable() == len(ref.evictable)
    assert pool.ref == ref.ref
    assert dict(pool._block_of) == ref.block_of
    for block in range(pool.num_blocks):
        assert pool.is_evictable(block) == (block in ref.evictable)
    limit = ref.num_free()
    taken = 0
    for block in [*reversed(ref.free), *ref.evictable]:
        if block in spared:
            break
        taken += 1
    assert pool.takes_sparing(spared, limit) == taken
    pool.check_integrity()


@settings(max_examples=80, deadline=None)
@given(
    num_blocks=st.integers(1, 6),
    ops=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 1000)), max_size=150),
)
def test_the_evictable_queue_evicts_as_an_ordered_set_would(
    num_blocks: int, ops: list[tuple[int, int]]
) -> None:
    pool, ref = BlockPool(num_blocks, 1), _ReferencePool(num_blocks)
    held: list[int] = []  # one entry per holder
    for op, x in ops:
        cached = list(ref.evictable)
        if op == 0 and ref.num_free():
            block = pool.allocate()
            assert block == ref.allocate()
            pool.add_fill(block, 1)
            held.append(block)
        elif op == 1 and ref.num_free():
            n = 1 + x % ref.num_free()
            blocks = pool.allocate_many(n)
            assert blocks == [ref.allocate() for _ in range(n)]
            for block in blocks:
                pool.add_fill(block, 1)
            held.extend(blocks)
        elif op == 2 and held:
            block = held.pop(x % len(held))
            pool.decref(block)
            ref.decref(block)
        elif op == 3 and held:  # release several holders, the last first
            k = 1 + x % len(held)
            blocks, held = held[-k:], held[:-k]
            pool.release(blocks)
            for block in reversed(blocks):
                ref.decref(block)
        elif op == 4 and cached:  # a prefix hit revives a cached block
            block = cached[x % len(cached)]
            pool.incref(block)
            ref.incref(block)
            held.append(block)
        elif op == 5 and held:  # a second holder (fork)
            block = held[x % len(held)]
            pool.incref(block)
            ref.incref(block)
            held.append(block)
        elif op == 6 and held:
            block, block_hash = held[x % len(held)], 7000 + x % 5  # hashes repeat
            pool.register_many([block], [block_hash])
            ref.register(block, block_hash)
        _same(pool, ref, set(cached[x % 2 :: 2]))


def test_revival_cycles_keep_the_queue_short_and_in_order() -> None:
    """A cached block revived and released again and again: its stale entries are
    compacted away (the queue stays within twice the blocks), the order stays the
    releases'."""
    pool = BlockPool(3, 1)
    blocks = pool.allocate_many(3)
    for i, block in enumerate(blocks):
        pool.add_fill(block, 1)
        pool.register(block, 100 + i)
    pool.release(blocks)  # evictable: 2, 1, 0
    for _ in range(50):
        pool.incref(1)
        pool.decref(1)  # 1 moves to the tail
        assert len(pool._evict_queue) <= 2 * pool.num_blocks + 1
    assert pool.evictable_blocks() == [2, 0, 1]
    assert pool.allocate_many(3) == [2, 0, 1]
    pool.check_integrity()
