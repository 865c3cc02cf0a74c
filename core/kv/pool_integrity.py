"""The block pool's invariant check, as whole-array operations.

A pool of a small model on a large GPU holds millions of blocks (tiny-llama on an A100-40GB:
9.4 million), so the per-block rules are evaluated as numpy masks over every block at once.
The outcome is the one a block-by-block walk gives: the lowest-numbered block that breaks a
rule is reported, with the first rule it breaks in the order listed in
:func:`check_pool_integrity`, and the whole-pool recounts follow. A check holds about 60
bytes a block of temporary arrays while it runs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, repeat
from typing import TYPE_CHECKING

import numpy as np

from core.kv.base import KVCacheError

if TYPE_CHECKING:
    from core.kv.block_pool import BlockPool


def _counts(blocks: Iterable[int], size: int, num_blocks: int, where: str) -> np.ndarray:
    """How often each block id in ``0 .. num_blocks-1`` occurs in ``blocks`` (``size`` ids);
    an id out of that range is a KVCacheError naming ``where`` it was found."""
    ids = np.fromiter(blocks, dtype=np.int64, count=size)
    out = (ids < 0) | (ids >= num_blocks)
    if out.any():
        raise KVCacheError(
            f"block pool: {where} holds block {ids[out.argmax()]}, not one of its "
            f"{num_blocks} blocks"
        )
    return np.bincount(ids, minlength=num_blocks)


def _first_breach(
    num_blocks: int, rules: list[tuple[np.ndarray, Callable[[int], str]]]
) -> str | None:
    """The message of the first rule broken by the lowest-numbered block that breaks any."""
    firsts = [int(mask.argmax()) for mask, _ in rules if mask.any()]
    if not firsts:
        return None
    block = min(firsts)
    return next(say(block) for mask, say in rules if mask[block])


def check_pool_integrity(pool: BlockPool, expected_refs: Sequence[int] | None = None) -> None:
    """Raise KVCacheError unless every block of ``pool`` is in exactly one state (free,
    used or evictable), fills are within ``[0, block_size]``, the evict queue's stale
    entries, the hash index and the running totals match a recount and, with
    ``expected_refs`` (one count per block), every ref count equals it. Reads the pool's
    internals; changes nothing."""
    n, bs = pool.num_blocks, pool.block_size
    free_count = _counts(pool._free, len(pool._free), n, "the free list")
    if n and free_count.max() > 1:
        raise KVCacheError("block pool: a block is on the free list twice")
    entries = _counts(pool._evict_queue, len(pool._evict_queue), n, "the evict queue")
    stale = np.array(pool._stale, dtype=np.int64)
    if int(stale.sum()) != pool._num_stale:
        raise KVCacheError(f"block pool: num_stale={pool._num_stale}, recount {stale.sum()}")
    ref = np.array(pool.ref, dtype=np.int64)
    fill = np.array(pool.fill, dtype=np.int64)
    hashed = np.fromiter(map(operator.is_not, pool._hash_of, repeat(None)), dtype=bool, count=n)
    live = entries - stale
    in_free, in_evict = free_count == 1, live == 1
    rules: list[tuple[np.ndarray, Callable[[int], str]]] = [
        (
            (live < 0) | (live > 1),
            lambda b: f"block {b} has {entries[b]} evict queue entries, {stale[b]} of them stale",
        ),
        (
            (ref < 0) | (fill < 0) | (fill > bs),
            lambda b: f"block {b} has ref {ref[b]}, fill {fill[b]}",
        ),
        (
            (ref > 0) & (in_free | in_evict),
            lambda b: f"block {b} is referenced ({ref[b]}) and also free",
        ),
        (
            (ref == 0) & (in_free == in_evict),
            lambda b: f"unreferenced block {b} is lost or listed twice",
        ),
        (
            in_free & ((fill != 0) | hashed),
            lambda b: f"free block {b} has fill {fill[b]} or a hash",
        ),
        (
            in_evict & ((fill != bs) | ~hashed),
            lambda b: f"evictable block {b} is not a full cached block",
        ),
    ]
    if expected_refs is not None:
        want = np.asarray(expected_refs, dtype=np.int64)
        rules.append(
            (ref != want, lambda b: f"block {b} has ref {ref[b]} but {want[b]} tables hold it")
        )
    breach = _first_breach(n, rules)
    if breach is not None:
        raise KVCacheError(f"block pool: {breach}")
    num_evictable = int(in_evict.sum())
    if num_evictable != pool._num_evictable:
        raise KVCacheError(
            f"block pool: num_evictable={pool._num_evictable}, recount {num_evictable}"
        )
    _check_hash_index(pool, np.flatnonzero(hashed))
    used = ref > 0
    num_used = int(used.sum())
    if num_used != pool.num_used:
        raise KVCacheError(f"block pool: num_used={pool.num_used}, recount {num_used}")
    filled = int(fill[used].sum())
    if filled != pool.num_filled:
        raise KVCacheError(f"block pool: num_filled={pool.num_filled}, recount {filled}")
    ref_total = int(ref.sum())
    if ref_total != pool.ref_total:
        raise KVCacheError(f"block pool: ref_total={pool.ref_total}, recount {ref_total}")


def _check_hash_index(pool: BlockPool, hashed_blocks: np.ndarray) -> None:
    """Raise KVCacheError unless the hash index maps each registered block's hash to that
    block and holds nothing else; the lowest such block is named."""
    block_of, hash_of = pool._block_of, pool._hash_of
    for b in hashed_blocks.tolist():
        if block_of.get(hash_of[b]) != b:
            raise KVCacheError(f"block pool: hash index disagrees for block {b}")
    if len(block_of) != len(hashed_blocks):
        raise KVCacheError("block pool: hash index and block index differ in size")


def check_block_tables(
    tables: Sequence[list[int]], lengths: np.ndarray, slots: np.ndarray, pool: BlockPool
) -> tuple[np.ndarray, tuple[int, str] | None]:
    """Count the references ``tables`` hold to each block of ``pool`` and find the first
    entry whose block is not in ``pool`` or whose fill is not what its table implies:
    ``block_size`` for every block but a table's last, which holds the rest of the
    sequence's slots.

    ``lengths[k]`` is ``len(tables[k])``, and ``ceil(slots[k] / block_size) >= 1``
    (checked by the caller). Returns the ref count of every block and, at the first
    breach, the index of its table with the message (no sequence named)."""
    bs, n = pool.block_size, pool.num_blocks
    blocks = np.fromiter(chain.from_iterable(tables), dtype=np.int64, count=int(lengths.sum()))
    ends = np.cumsum(lengths) - 1
    out = (blocks < 0) | (blocks >= n)
    want = np.full(blocks.size, bs, dtype=np.int64)
    want[ends] = slots - (lengths - 1) * bs
    fill = np.zeros(blocks.size, dtype=np.int64)
    fill[~out] = np.array(pool.fill, dtype=np.int64)[blocks[~out]]
    bad = out | (fill != want)
    breach = None
    if bad.any():
        e = int(bad.argmax())
        k = int(np.searchsorted(ends, e))
        i, block = e - int(ends[k] - lengths[k] + 1), int(blocks[e])
        what = f"is not one of {n} blocks" if out[e] else f"has fill {fill[e]}, expected {want[e]}"
        breach = (k, f"block {block} (#{i}) {what}")
    return np.bincount(blocks[~out], minlength=n), breach
