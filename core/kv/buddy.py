"""A binary buddy allocator over the address range ``[0, capacity)``.

Blocks are powers of two, at least ``min_block`` units, aligned to their size. A request
is rounded up to ``max(min_block, next power of two)``; a larger free block is split in
halves until it fits, and a freed block merges with its buddy (``addr ^ size``) while the
buddy is free and of the same size. ``capacity`` need not be a power of two: the free
lists start with its aligned binary decomposition (12 units -> ``[0, 8)`` and ``[8, 12)``),
which is also the state every free-everything sequence of operations coalesces back to.

Among free blocks of the chosen size the lowest address is taken (deterministic, and it
keeps allocations packed toward the bottom). ``alloc`` and ``free`` are O(log capacity)
amortized: one size class per bit, a heap per class for the lowest address.
"""

from __future__ import annotations

import heapq

from core.kv.base import KVCacheError


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= ``n`` (``n >= 1``)."""
    if n < 1:
        raise ValueError(f"next_power_of_two needs n >= 1, got {n}")
    return 1 << (n - 1).bit_length()


class BuddyAllocator:
    """Binary buddy allocator; addresses and sizes are in abstract units."""

    def __init__(self, capacity: int, min_block: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"BuddyAllocator capacity must be >= 1, got {capacity}")
        if min_block < 1 or min_block & (min_block - 1):
            raise ValueError(f"BuddyAllocator min_block must be a power of two, got {min_block}")
        if capacity % min_block:
            raise ValueError(
                f"BuddyAllocator capacity={capacity} is not a multiple of min_block={min_block}"
            )
        self.capacity = capacity
        self.min_block = min_block
        self._min_order = min_block.bit_length() - 1
        self._max_order = capacity.bit_length() - 1
        n = self._max_order + 1
        self._free: list[set[int]] = [set() for _ in range(n)]  # order -> free addresses
        self._heaps: list[list[int]] = [[] for _ in range(n)]  # may hold stale addresses
        self._allocated: dict[int, int] = {}  # address -> order
        self.free_units = capacity
        for addr, size in self.initial_blocks():
            self._push(addr, size.bit_length() - 1)

    # -- queries ----------------------------------------------------------------------
    def block_size_for(self, size: int) -> int:
        """The block size a request of ``size`` units gets."""
        if size < 1:
            raise ValueError(f"allocation size must be >= 1, got {size}")
        return max(self.min_block, next_power_of_two(size))

    def initial_blocks(self) -> list[tuple[int, int]]:
        """The free blocks ``(addr, size)`` of an empty allocator, by address."""
        blocks = []
        addr = 0
        for order in range(self._max_order, self._min_order - 1, -1):
            size = 1 << order
            if self.capacity & size:
                blocks.append((addr, size))
                addr += size
        return blocks

    def largest_free_block(self) -> int:
        """Size of the largest free block (0 when full)."""
        for order in range(self._max_order, self._min_order - 1, -1):
            if self._free[order]:
                return 1 << order
        return 0

    def can_alloc(self, size: int) -> bool:
        """Whether ``alloc(size)`` would succeed now."""
        return self.count_fit(size) > 0

    def count_fit(self, size: int) -> int:
        """How many allocations of ``size`` units would succeed one after another now."""
        order = self.block_size_for(size).bit_length() - 1
        count = 0
        for k in range(order, self._max_order + 1):
            count += len(self._free[k]) << (k - order)
        return count

    def allocated_size(self, addr: int) -> int:
        """Size of the allocated block at ``addr``."""
        order = self._allocated.get(addr)
        if order is None:
            raise KVCacheError(f"buddy: no allocated block at address {addr}")
        return 1 << order

    def free_blocks(self) -> list[tuple[int, int]]:
        """Free blocks ``(addr, size)``, by address."""
        return sorted((a, 1 << k) for k, addrs in enumerate(self._free) for a in addrs)

    def allocated_blocks(self) -> list[tuple[int, int]]:
        """Allocated blocks ``(addr, size)``, by address."""
        return sorted((a, 1 << k) for a, k in self._allocated.items())

    # -- verbs ------------------------------------------------------------------------
    def alloc(self, size: int) -> int | None:
        """Allocate a block of ``block_size_for(size)`` units; its address is aligned to
        that size. Returns ``None`` when no free block is large enough."""
        order = self.block_size_for(size).bit_length() - 1
        k = order
        while k <= self._max_order and not self._free[k]:
            k += 1
        if k > self._max_order:
            return None
        addr = self._pop_lowest(k)
        while k > order:
            k -= 1
            self._push(addr + (1 << k), k)
        self._allocated[addr] = order
        self.free_units -= 1 << order
        return addr

    def free(self, addr: int) -> None:
        """Free the block allocated at ``addr`` and merge it with free buddies."""
        order = self._allocated.pop(addr, None)
        if order is None:
            raise KVCacheError(f"buddy: free of address {addr}, which is not allocated")
        self.free_units += 1 << order
        while order < self._max_order:
            buddy = addr ^ (1 << order)
            peers = self._free[order]
            if buddy not in peers:
                break
            peers.remove(buddy)  # its heap entry goes stale
            addr = min(addr, buddy)
            order += 1
        self._push(addr, order)

    # -- internals --------------------------------------------------------------------
    def _push(self, addr: int, order: int) -> None:
        self._free[order].add(addr)
        heap = self._heaps[order]
        heapq.heappush(heap, addr)
        if len(heap) > 2 * len(self._free[order]) + 16:
            # Drop stale entries; amortized over the pushes that created them.
            heap[:] = sorted(self._free[order])

    def _pop_lowest(self, order: int) -> int:
        live = self._free[order]
        heap = self._heaps[order]
        while True:
            addr = heapq.heappop(heap)
            if addr in live:
                live.remove(addr)
                return addr

    # -- invariants -------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise KVCacheError unless blocks tile ``[0, capacity)`` without overlap, every
        block is aligned to its size, no two free buddies are left unmerged, and the
        free-unit counter is right."""
        blocks = [(a, s, "free") for a, s in self.free_blocks()]
        blocks += [(a, s, "allocated") for a, s in self.allocated_blocks()]
        blocks.sort()
        end = 0
        for addr, size, kind in blocks:
            if addr != end:
                what = "overlaps" if addr < end else "leaves a gap before"
                raise KVCacheError(f"buddy: {kind} block [{addr}, {addr + size}) {what} {end}")
            if addr % size or size < self.min_block:
                raise KVCacheError(f"buddy: {kind} block [{addr}, {addr + size}) is misaligned")
            end = addr + size
        if end != self.capacity:
            raise KVCacheError(f"buddy: blocks cover [0, {end}), capacity is {self.capacity}")
        for order, addrs in enumerate(self._free):
            for addr in addrs:
                if addr ^ (1 << order) in addrs:
                    raise KVCacheError(
                        f"buddy: free buddies at {addr} and {addr ^ (1 << order)} "
                        f"(size {1 << order}) were not merged"
                    )
            if not addrs.issubset(self._heaps[order]):
                raise KVCacheError(f"buddy: free list of size {1 << order} lost its heap entry")
        free = sum(s for _, s, kind in blocks if kind == "free")
        if free != self.free_units:
            raise KVCacheError(f"buddy: free_units={self.free_units}, recount gives {free}")
