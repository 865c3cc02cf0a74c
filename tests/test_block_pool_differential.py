"""The block pool against the pool it replaced, verb by verb, in a stateful test.

``_OldBlockPool`` is ``core/kv/block_pool.py`` as it was before the evict queue with lazy
deletion (commit b48f3e7's parent), copied verbatim but for its name: an ``OrderedDict``
of evictable blocks and a dict of hashes. A hypothesis state machine drives both pools,
of 2 to 8 blocks (the queue is compacted once it holds more stale entries than blocks, so
often here), with every verb, the invalid calls too (each must raise the same error
and leave the same state): allocate, allocate_many, add_fill, incref of a free, held or
cached block, decref, release (a list with a block that has no holder stops part-way),
revive-and-release cycles of one cached block (several stale entries of a block that is
evictable again), register and register_many with repeating hashes and blocks. After
every step each observable must agree: the blocks handed out, refs, fills, the free
list, the evictable blocks in eviction order, num_free, num_evictable, is_evictable,
every hash's lookup, the running totals and ``takes_sparing`` for every single spared
block and limit; ``check_integrity`` passes on both.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from core.kv.base import KVCacheError
from core.kv.block_pool import MAX_BLOCKS, BlockPool

HASHES = range(6)  # few hashes: registrations collide often


class _OldBlockPool:
    """Blocks ``0 .. num_blocks-1`` of ``block_size`` slots each; ``num_blocks`` in
    ``[0, MAX_BLOCKS]``."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if not 0 <= num_blocks <= MAX_BLOCKS:
            raise ValueError(
                f"BlockPool num_blocks must be in [0, {MAX_BLOCKS}] (2**26), got {num_blocks}"
            )
        if block_size < 1:
            raise ValueError(f"BlockPool block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref: list[int] = [0] * num_blocks
        self.fill: list[int] = [0] * num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives block 0 first
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest release first
        self._hash_of: dict[int, int] = {}  # block -> hash, for registered blocks
        self._block_of: dict[int, int] = {}  # hash -> block
        self.num_used = 0  # blocks with ref >= 1
        self.num_filled = 0  # sum of fill over used blocks
        self.ref_total = 0  # sum of ref over all blocks

    # -- queries ----------------------------------------------------------------------
    def num_free(self) -> int:
        """Blocks that :meth:`allocate` can hand out (free plus evictable)."""
        return len(self._free) + len(self._evictable)

    def num_evictable(self) -> int:
        return len(self._evictable)

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def takes_sparing(self, blocks: set[int], limit: int) -> int:
        """How many of the next ``limit`` :meth:`allocate` calls (with no release between
        them) leave every block of ``blocks`` where it is: the free list's blocks, then the
        evictable ones released before the first of ``blocks`` to be evicted."""
        n = len(self._free)
        if n >= limit:
            return limit
        for block in self._evictable:
            if n >= limit or block in blocks:
                break
            n += 1
        return n

    def lookup(self, block_hash: int) -> int | None:
        """The block registered under ``block_hash`` (used or evictable), if any."""
        return self._block_of.get(block_hash)

    # -- verbs ------------------------------------------------------------------------
    def allocate(self) -> int:
        """Take a block (ref 1, fill 0): from the free list, else evict the least recently
        released cached block. Raises KVCacheError when none is left."""
        if self._free:
            block = self._free.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            del self._block_of[self._hash_of.pop(block)]
            self.fill[block] = 0
        else:
            raise KVCacheError(f"block pool exhausted ({self.num_blocks} blocks all in use)")
        self.ref[block] = 1
        self.num_used += 1
        self.ref_total += 1
        return block

    def allocate_many(self, n: int) -> list[int]:
        """The blocks of ``n`` :meth:`allocate` calls, in their order; raises KVCacheError
        (taking none) unless ``n`` are free or evictable."""
        if n > self.num_free():
            raise KVCacheError(f"block pool exhausted ({self.num_blocks} blocks all in use)")
        free = self._free
        k = min(n, len(free))
        out = free[len(free) - k :]
        out.reverse()
        del free[len(free) - k :]
        if k < n:
            evictable, fill = self._evictable, self.fill
            hash_of, block_of = self._hash_of, self._block_of
            for _ in range(n - k):
                block, _ = evictable.popitem(last=False)
                del block_of[hash_of.pop(block)]
                fill[block] = 0
                out.append(block)
        ref = self.ref
        for block in out:
            ref[block] = 1
        self.num_used += n
        self.ref_total += n
        return out

    def incref(self, block: int) -> None:
        """Add a holder to a used block, or revive an evictable one."""
        if self.ref[block] == 0:
            if block not in self._evictable:
                raise KVCacheError(f"incref of free block {block}; allocate it instead")
            del self._evictable[block]
            self.num_used += 1
            self.num_filled += self.fill[block]
        self.ref[block] += 1
        self.ref_total += 1

    def decref(self, block: int) -> None:
        """Drop a holder. At ref 0 a registered block becomes evictable (most recently
        released), any other block returns to the free list."""
        r = self.ref[block]
        if r == 0:
            raise KVCacheError(f"decref of block {block}, which has no holder")
        self.ref[block] = r - 1
        self.ref_total -= 1
        if r > 1:
            return
        self.num_used -= 1
        self.num_filled -= self.fill[block]
        if block in self._hash_of:
            self._evictable[block] = None
        else:
            self.fill[block] = 0
            self._free.append(block)

    def release(self, blocks: list[int]) -> None:
        """:meth:`decref` each of ``blocks``, the last first."""
        ref, fill, hash_of = self.ref, self.fill, self._hash_of
        evictable, free = self._evictable, self._free
        dropped = emptied = unfilled = 0
        try:
            for block in reversed(blocks):
                r = ref[block]
                if r == 0:
                    raise KVCacheError(f"decref of block {block}, which has no holder")
                ref[block] = r - 1
                dropped += 1
                if r > 1:
                    continue
                emptied += 1
                unfilled += fill[block]
                if block in hash_of:
                    evictable[block] = None
                else:
                    fill[block] = 0
                    free.append(block)
        finally:
            self.ref_total -= dropped
            self.num_used -= emptied
            self.num_filled -= unfilled

    def add_fill(self, block: int, slots: int) -> None:
        """Record ``slots`` more written slots in a used block."""
        f = self.fill[block] + slots
        if f > self.block_size or self.ref[block] == 0:
            raise KVCacheError(
                f"block {block}: fill {f} exceeds block_size={self.block_size} or block unused"
            )
        self.fill[block] = f
        self.num_filled += slots

    def register(self, block: int, block_hash: int) -> bool:
        """Index a full used block under ``block_hash`` for prefix reuse. Returns False
        (and indexes nothing) if the hash already names a block or this block has a hash."""
        if self.fill[block] != self.block_size or self.ref[block] == 0:
            raise KVCacheError(f"only full used blocks can be cached; block {block} is not")
        if block_hash in self._block_of or block in self._hash_of:
            return False
        self._block_of[block_hash] = block
        self._hash_of[block] = block_hash
        return True

    def register_many(self, blocks: list[int], hashes: list[int]) -> None:
        """:meth:`register` each block under its hash, in order."""
        fill, ref, bs = self.fill, self.ref, self.block_size
        block_of, hash_of = self._block_of, self._hash_of
        for block, block_hash in zip(blocks, hashes, strict=True):
            if fill[block] != bs or ref[block] == 0:
                raise KVCacheError(f"only full used blocks can be cached; block {block} is not")
            if block_hash in block_of or block in hash_of:
                continue
            block_of[block_hash] = block
            hash_of[block] = block_hash

    # -- invariants -------------------------------------------------------------------
    def check_integrity(self, expected_refs: list[int] | None = None) -> None:
        """Raise KVCacheError unless every block is in exactly one state, fills are within
        ``[0, block_size]`` and the running totals match a recount. With
        ``expected_refs``, also compare every ref count with it."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise KVCacheError("block pool: a block is on the free list twice")
        for b in range(self.num_blocks):
            r, f = self.ref[b], self.fill[b]
            in_free, in_evict = b in free, b in self._evictable
            if r < 0 or not 0 <= f <= self.block_size:
                raise KVCacheError(f"block pool: block {b} has ref {r}, fill {f}")
            if r > 0 and (in_free or in_evict):
                raise KVCacheError(f"block pool: block {b} is referenced ({r}) and also free")
            if r == 0 and in_free == in_evict:
                raise KVCacheError(f"block pool: unreferenced block {b} is lost or listed twice")
            if in_free and (f != 0 or b in self._hash_of):
                raise KVCacheError(f"block pool: free block {b} has fill {f} or a hash")
            if in_evict and (f != self.block_size or b not in self._hash_of):
                raise KVCacheError(f"block pool: evictable block {b} is not a full cached block")
            if expected_refs is not None and r != expected_refs[b]:
                raise KVCacheError(
                    f"block pool: block {b} has ref {r} but {expected_refs[b]} tables hold it"
                )
        for b, h in self._hash_of.items():
            if self._block_of.get(h) != b:
                raise KVCacheError(f"block pool: hash index disagrees for block {b}")
        if len(self._block_of) != len(self._hash_of):
            raise KVCacheError("block pool: hash index and block index differ in size")
        used = [b for b in range(self.num_blocks) if self.ref[b] > 0]
        if len(used) != self.num_used:
            raise KVCacheError(f"block pool: num_used={self.num_used}, recount {len(used)}")
        filled = sum(self.fill[b] for b in used)
        if filled != self.num_filled:
            raise KVCacheError(f"block pool: num_filled={self.num_filled}, recount {filled}")
        if sum(self.ref) != self.ref_total:
            raise KVCacheError(f"block pool: ref_total={self.ref_total}, recount {sum(self.ref)}")


def _outcome(call: Callable[[], object]) -> tuple[str, object]:
    """What a call returned, or the KVCacheError it raised (its message)."""
    try:
        return ("ok", call())
    except KVCacheError as e:
        return ("error", str(e))


class PoolMachine(RuleBasedStateMachine):
    """The same verbs on the new pool and the old one; every outcome must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.new = BlockPool(0, 1)
        self.old = _OldBlockPool(0, 1)

    @initialize(num_blocks=st.integers(2, 8), block_size=st.integers(1, 3))
    def init(self, num_blocks: int, block_size: int) -> None:
        self.new = BlockPool(num_blocks, block_size)
        self.old = _OldBlockPool(num_blocks, block_size)

    def _both(self, verb: str, *args: object) -> object:
        got = _outcome(lambda: getattr(self.new, verb)(*args))
        want = _outcome(lambda: getattr(self.old, verb)(*args))
        assert got == want, f"{verb}{args}: {got} != {want}"
        return got[1]

    def _block(self, data: st.DataObject) -> int:
        return data.draw(st.integers(0, self.old.num_blocks - 1), label="block")

    def _held(self) -> list[int]:
        return [b for b in range(self.old.num_blocks) if self.old.ref[b]]

    @rule()
    def allocate(self) -> None:
        self._both("allocate")

    @rule(block_hash=st.sampled_from(HASHES), release=st.booleans())
    def cache_one(self, block_hash: int, release: bool) -> None:
        """A step's block: allocated, written full, offered to the cache (its hash may name
        another block already), and perhaps let go (cached, it becomes evictable)."""
        block = self._both("allocate")
        if isinstance(block, int):
            self._both("add_fill", block, self.old.block_size)
            self._both("register", block, block_hash)
            if release:
                self._both("decref", block)

    @rule(data=st.data())
    def allocate_many(self, data: st.DataObject) -> None:
        self._both("allocate_many", data.draw(st.integers(0, self.old.num_blocks + 1)))

    @precondition(lambda self: self.old.num_evictable())
    @rule(data=st.data())
    def evict_many(self, data: st.DataObject) -> None:
        """An allocate_many that takes every free block and evicts some cached ones."""
        free = len(self.old._free)
        self._both("allocate_many", data.draw(st.integers(free + 1, self.old.num_free())))

    @rule(data=st.data())
    def add_fill(self, data: st.DataObject) -> None:
        slots = data.draw(st.integers(1, self.old.block_size))
        self._both("add_fill", self._block(data), slots)

    @precondition(lambda self: any(self.old.ref))
    @rule(data=st.data())
    def fill_up(self, data: st.DataObject) -> None:
        block = data.draw(st.sampled_from(self._held()))
        room = self.old.block_size - self.old.fill[block]
        if room:
            self._both("add_fill", block, room)

    @rule(data=st.data())
    def incref(self, data: st.DataObject) -> None:
        self._both("incref", self._block(data))

    @rule(data=st.data())
    def decref(self, data: st.DataObject) -> None:
        self._both("decref", self._block(data))

    @precondition(lambda self: self.old.num_evictable())
    @rule(data=st.data(), head=st.booleans(), times=st.integers(1, 4), release=st.booleans())
    def revive(self, data: st.DataObject, head: bool, times: int, release: bool) -> None:
        """A prefix hit revives a cached block, the next evicted one or any (and its holder
        may let go again, leaving a stale entry at the queue's head)."""
        cached = list(self.old._evictable)
        block = cached[0] if head else data.draw(st.sampled_from(cached))
        for _ in range(times):
            self._both("incref", block)
            if release:
                self._both("decref", block)

    @precondition(lambda self: any(self.old.ref))
    @rule(data=st.data())
    def release_held(self, data: st.DataObject) -> None:
        holders = [b for b in self._held() for _ in range(self.old.ref[b])]
        blocks = data.draw(st.permutations(holders))
        self._both("release", blocks[: data.draw(st.integers(1, len(blocks)))])

    @rule(data=st.data())
    def release_any(self, data: st.DataObject) -> None:
        n = self.old.num_blocks - 1
        self._both("release", data.draw(st.lists(st.integers(0, n), max_size=5)))

    @rule(data=st.data(), block_hash=st.sampled_from(HASHES))
    def register(self, data: st.DataObject, block_hash: int) -> None:
        self._both("register", self._block(data), block_hash)

    @precondition(lambda self: any(self.old.ref))
    @rule(data=st.data())
    def register_many(self, data: st.DataObject) -> None:
        full = [b for b in self._held() if self.old.fill[b] == self.old.block_size]
        pick = st.sampled_from(full or self._held())
        blocks = data.draw(st.lists(pick, max_size=5))
        hashes = data.draw(st.lists(st.sampled_from(HASHES), min_size=len(blocks)))
        self._both("register_many", blocks, hashes[: len(blocks)])

    @invariant()
    def same_observables(self) -> None:
        new, old = self.new, self.old
        nb = old.num_blocks
        assert new.evictable_blocks() == list(old._evictable)
        assert (new.num_free(), new.num_evictable()) == (old.num_free(), old.num_evictable())
        assert [new.is_evictable(b) for b in range(nb)] == [old.is_evictable(b) for b in range(nb)]
        assert (new.ref, new.fill, new._free) == (old.ref, old.fill, old._free)
        assert list(new._hash_of) == [old._hash_of.get(b) for b in range(nb)]
        assert [new.lookup(h) for h in HASHES] == [old.lookup(h) for h in HASHES]
        assert (new.num_used, new.num_filled, new.ref_total) == (
            old.num_used,
            old.num_filled,
            old.ref_total,
        )
        for spared in [set(), *({b} for b in range(nb)), set(range(0, nb, 2))]:
            for limit in range(old.num_free() + 2):
                assert new.takes_sparing(spared, limit) == old.takes_sparing(spared, limit)
        new.check_integrity()
        old.check_integrity()


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
