"""A pool of fixed-size KV blocks: free list, reference counts, fills, prefix-cache index.

Every block is in exactly one state:

- *free*: on the free list, ref 0, fill 0;
- *used*: ref >= 1 (held by that many block tables);
- *evictable*: ref 0 but registered in the prefix-cache index under a hash; it keeps
  its contents and can be revived by :meth:`BlockPool.incref`, or reclaimed (least
  recently released first) by :meth:`BlockPool.allocate` when the free list is empty.

That order is vLLM's: in current V1 (``vllm/v1/core/block_pool.py``, ``free_blocks``) a
freed block without a hash goes to the head of the one free queue, a cached one to its tail,
and new blocks come from the head; v0's prefix-caching allocator evicted only when no free
block was left. Earlier V1 releases appended every freed block to the tail, so under memory
pressure they evicted cached blocks sooner and hit the cache less than kvlab does.

``fill[b]`` counts the slots of block ``b`` that have been written. The pool keeps running
totals (used blocks, sum of fills of used blocks, sum of refs) so that memory breakdowns
are O(1). The pool knows nothing of sequences; callers keep block tables.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from core.kv.base import KVCacheError
from core.kv.pool_integrity import check_pool_integrity

# The most blocks a pool holds: it keeps about 66 bytes of Python state a block (four
# lists and the free list's ints), so 2**26 blocks is about 4.4 GB.
MAX_BLOCKS = 1 << 26


class BlockPool:
    """Blocks ``0 .. num_blocks-1`` of ``block_size`` slots each; ``num_blocks`` in
    ``[0, MAX_BLOCKS]``.

    The evictable blocks are kept in a queue of release order with lazy deletion: a block
    revived by :meth:`incref` leaves its entry behind, counted in ``_stale[block]``, and
    an entry of a block whose stale count is positive is one of its stale ones (only a
    block's newest entry can be live), skipped and uncounted when it reaches the head.
    So a block has ``_stale[block]`` entries in the queue, plus one if it is
    evictable. The queue is compacted once it holds more stale entries than blocks."""

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
        self._evict_queue: deque[int] = deque()  # oldest release first, stale entries too
        self._stale: list[int] = [0] * num_blocks  # stale entries of each block in the queue
        self._num_stale = 0
        self._num_evictable = 0
        self._hash_of: list[int | None] = [None] * num_blocks  # block -> hash, if registered
        self._block_of: dict[int, int] = {}  # hash -> block
        self.num_used = 0  # blocks with ref >= 1
        self.num_filled = 0  # sum of fill over used blocks
        self.ref_total = 0  # sum of ref over all blocks

    # -- queries ----------------------------------------------------------------------
    def num_free(self) -> int:
        """Blocks that :meth:`allocate` can hand out (free plus evictable)."""
        return len(self._free) + self._num_evictable

    def num_evictable(self) -> int:
        return self._num_evictable

    def is_evictable(self, block: int) -> bool:
        """Unreferenced and cached (an unreferenced block with a hash is evictable)."""
        return self.ref[block] == 0 and self._hash_of[block] is not None

    def evictable_blocks(self) -> list[int]:
        """The evictable blocks, least recently released (the next evicted) first."""
        return list(self._live_entries())

    def _live_entries(self) -> Iterator[int]:
        """The evict queue's live entries in order, skipping each block's stale ones."""
        stale, skipped = self._stale, {}
        for block in self._evict_queue:
            s = stale[block]
            if s:
                k = skipped.get(block, 0)
                if k < s:
                    skipped[block] = k + 1
                    continue
            yield block

    def takes_sparing(self, blocks: set[int], limit: int) -> int:
        """How many of the next ``limit`` :meth:`allocate` calls (with no release between
        them) leave every block of ``blocks`` where it is: the free list's blocks, then the
        evictable ones released before the first of ``blocks`` to be evicted."""
        n = len(self._free)
        if n >= limit:
            return limit
        for block in self._live_entries():
            if n >= limit or block in blocks:
                break
            n += 1
        return n

    def lookup(self, block_hash: int) -> int | None:
        """The block registered under ``block_hash`` (used or evictable), if any."""
        return self._block_of.get(block_hash)

    # -- verbs ------------------------------------------------------------------------
    def _evict(self) -> int:
        """Pop the least recently released evictable block off the queue and uncache it
        (fill 0); the caller has checked that one is evictable."""
        queue, stale = self._evict_queue, self._stale
        block = queue.popleft()
        while stale[block]:
            stale[block] -= 1
            self._num_stale -= 1
            block = queue.popleft()
        self._num_evictable -= 1
        del self._block_of[self._hash_of[block]]
        self._hash_of[block] = None
        self.fill[block] = 0
        return block

    def allocate(self) -> int:
        """Take a block (ref 1, fill 0): from the free list, else evict the least recently
        released cached block. Raises KVCacheError when none is left."""
        if self._free:
            block = self._free.pop()
        elif self._num_evictable:
            block = self._evict()
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
        if k < n:  # _evict inlined
            popleft, stale = self._evict_queue.popleft, self._stale
            if self._num_stale:
                evicted = []
                for _ in range(n - k):
                    block = popleft()
                    while stale[block]:
                        stale[block] -= 1
                        self._num_stale -= 1
                        block = popleft()
                    evicted.append(block)
            else:  # no stale entry: the next n - k entries
                evicted = [popleft() for _ in range(n - k)]
            fill, hash_of, block_of = self.fill, self._hash_of, self._block_of
            for block in evicted:
                del block_of[hash_of[block]]  # type: ignore[index]
                hash_of[block] = None
                fill[block] = 0
            out += evicted
            self._num_evictable -= n - k
        ref = self.ref
        for block in out:
            ref[block] = 1
        self.num_used += n
        self.ref_total += n
        return out

    def incref(self, block: int) -> None:
        """Add a holder to a used block, or revive an evictable one."""
        if self.ref[block] == 0:
            if self._hash_of[block] is None:
                raise KVCacheError(f"incref of free block {block}; allocate it instead")
            self._stale[block] += 1  # its queue entry stays behind, stale
            self._num_stale += 1
            self._num_evictable -= 1
            self.num_used += 1
            self.num_filled += self.fill[block]
            if self._num_stale > self.num_blocks:
                self._compact()
        self.ref[block] += 1
        self.ref_total += 1

    def _compact(self) -> None:
        """Drop the evict queue's stale entries (so it holds the evictable blocks alone)."""
        self._evict_queue = deque(self._live_entries())
        self._stale = [0] * self.num_blocks
        self._num_stale = 0

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
        if self._hash_of[block] is not None:
            self._evict_queue.append(block)
            self._num_evictable += 1
        else:
            self.fill[block] = 0
            self._free.append(block)

    def release(self, blocks: list[int]) -> None:
        """:meth:`decref` each of ``blocks``, the last first."""
        ref, fill, hash_of = self.ref, self.fill, self._hash_of
        evict, free = self._evict_queue.append, self._free
        dropped = emptied = unfilled = cached = 0
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
                if hash_of[block] is not None:
                    evict(block)
                    cached += 1
                else:
                    fill[block] = 0
                    free.append(block)
        finally:
            self.ref_total -= dropped
            self.num_used -= emptied
            self.num_filled -= unfilled
            self._num_evictable += cached

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
        if block_hash in self._block_of or self._hash_of[block] is not None:
            return False
        self._block_of[block_hash] = block
        self._hash_of[block] = block_hash
        return True

    def register_many(self, blocks: list[int], hashes: list[int]) -> None:
        """:meth:`register` each block under its hash, in order."""
        fill, ref, bs = self.fill, self.ref, self.block_size
        setdefault, hash_of = self._block_of.setdefault, self._hash_of
        for block, block_hash in zip(blocks, hashes, strict=True):
            if fill[block] != bs or ref[block] == 0:
                raise KVCacheError(f"only full used blocks can be cached; block {block} is not")
            # a block keeps its hash, a hash the block it names (one lookup: setdefault)
            if hash_of[block] is None and setdefault(block_hash, block) == block:
                hash_of[block] = block_hash

    # -- invariants -------------------------------------------------------------------
    def check_integrity(self, expected_refs: Sequence[int] | None = None) -> None:
        """Raise KVCacheError unless every block is in exactly one state, fills are within
        ``[0, block_size]`` and the running totals match a recount. With
        ``expected_refs``, also compare every ref count with it. See
        :func:`core.kv.pool_integrity.check_pool_integrity`."""
        check_pool_integrity(self, expected_refs)
