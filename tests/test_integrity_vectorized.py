"""The whole-array invariant checks (``core/kv/pool_integrity.py``) against the
block-by-block walks they replaced, on corrupted states.

``_walk_pool`` and ``_walk_manager`` are ``BlockPool.check_integrity`` and
``PagedKVCacheManager.check_integrity`` as they were before (commit c3d90fb), copied but
for taking the structure as an argument. Hypothesis builds a small valid pool or manager
through the public verbs, corrupts one to three internal fields as a bug would, and both
checks must agree: both pass, or both raise the same message. Where the walk failed with
an IndexError (a table naming a block its pool does not have) the new check must name it
instead.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.kv.base import AllocStatus, KVCacheError
from core.kv.block_pool import BlockPool
from core.kv.paged import PagedKVCacheManager
from tests.kv_helpers import make_group, spawn


def _walk_pool(p: BlockPool, expected_refs: list[int] | None = None) -> None:
    free = set(p._free)
    if len(free) != len(p._free):
        raise KVCacheError("block pool: a block is on the free list twice")
    entries = [0] * p.num_blocks
    for b in p._evict_queue:
        entries[b] += 1
    if sum(p._stale) != p._num_stale:
        raise KVCacheError(f"block pool: num_stale={p._num_stale}, recount {sum(p._stale)}")
    num_evictable = 0
    for b in range(p.num_blocks):
        r, f, h = p.ref[b], p.fill[b], p._hash_of[b]
        live = entries[b] - p._stale[b]
        if not 0 <= live <= 1:
            raise KVCacheError(
                f"block pool: block {b} has {entries[b]} evict queue entries, "
                f"{p._stale[b]} of them stale"
            )
        in_free, in_evict = b in free, live == 1
        num_evictable += in_evict
        if r < 0 or not 0 <= f <= p.block_size:
            raise KVCacheError(f"block pool: block {b} has ref {r}, fill {f}")
        if r > 0 and (in_free or in_evict):
            raise KVCacheError(f"block pool: block {b} is referenced ({r}) and also free")
        if r == 0 and in_free == in_evict:
            raise KVCacheError(f"block pool: unreferenced block {b} is lost or listed twice")
        if in_free and (f != 0 or h is not None):
            raise KVCacheError(f"block pool: free block {b} has fill {f} or a hash")
        if in_evict and (f != p.block_size or h is None):
            raise KVCacheError(f"block pool: evictable block {b} is not a full cached block")
        if expected_refs is not None and r != expected_refs[b]:
            raise KVCacheError(
                f"block pool: block {b} has ref {r} but {expected_refs[b]} tables hold it"
            )
    if num_evictable != p._num_evictable:
        raise KVCacheError(f"block pool: num_evictable={p._num_evictable}, recount {num_evictable}")
    hashed = [(b, h) for b, h in enumerate(p._hash_of) if h is not None]
    for b, h in hashed:
        if p._block_of.get(h) != b:
            raise KVCacheError(f"block pool: hash index disagrees for block {b}")
    if len(p._block_of) != len(hashed):
        raise KVCacheError("block pool: hash index and block index differ in size")
    used = [b for b in range(p.num_blocks) if p.ref[b] > 0]
    if len(used) != p.num_used:
        raise KVCacheError(f"block pool: num_used={p.num_used}, recount {len(used)}")
    filled = sum(p.fill[b] for b in used)
    if filled != p.num_filled:
        raise KVCacheError(f"block pool: num_filled={p.num_filled}, recount {filled}")
    if sum(p.ref) != p.ref_total:
        raise KVCacheError(f"block pool: ref_total={p.ref_total}, recount {sum(p.ref)}")


def _walk_manager(m: PagedKVCacheManager) -> None:
    bs = m.block_size
    for sid, written in m._prefilling.items():
        if sid not in m._seqs or not 0 <= written < m._seqs[sid].slots:
            raise KVCacheError(f"seq {sid}: {written} slots written, a prefill in progress")
    refs = {False: [0] * m.num_device_blocks, True: [0] * m.num_cpu_blocks}
    for sid, seq in m._seqs.items():
        pool = m._cpu if seq.on_cpu else m._device
        n = len(seq.table)
        if n != m._blocks_for(seq.slots) or seq.slots < 1:
            raise KVCacheError(f"seq {sid}: {n} blocks for {seq.slots} slots")
        for i, block in enumerate(seq.table):
            refs[seq.on_cpu][block] += 1
            want = bs if i < n - 1 else seq.slots - (n - 1) * bs
            if pool.fill[block] != want:
                raise KVCacheError(
                    f"seq {sid}: block {block} (#{i}) has fill {pool.fill[block]}, expected {want}"
                )
    _walk_pool(m._device, refs[False])
    _walk_pool(m._cpu, refs[True])
    total = m.breakdown().total
    if total != m.num_device_blocks * bs:
        raise KVCacheError(f"breakdown sums to {total}, capacity {m.num_device_blocks * bs}")


def _outcome(check: Callable[[], None]) -> str:
    try:
        check()
    except KVCacheError as e:
        return f"error: {e}"
    except IndexError:
        return "index error"
    return "ok"


@st.composite
def pools(draw: st.DrawFn) -> BlockPool:
    """A pool of 1-6 blocks after random verbs (refused ones skipped)."""
    p = BlockPool(draw(st.integers(1, 6)), draw(st.integers(1, 3)))
    for _ in range(draw(st.integers(0, 12))):
        verb = draw(st.sampled_from(["allocate", "fill", "register", "decref", "incref"]))
        block = draw(st.integers(0, p.num_blocks - 1))
        try:
            if verb == "allocate":
                p.allocate()
            elif verb == "fill":
                p.add_fill(block, draw(st.integers(1, p.block_size)))
            elif verb == "register":
                p.register(block, draw(st.integers(0, 3)))
            elif verb == "decref":
                p.decref(block)
            else:
                p.incref(block)
        except KVCacheError:
            pass
    return p


LIST_FIELDS = ["ref", "fill", "_stale", "_hash_of"]
COUNTERS = ["_num_stale", "_num_evictable", "num_used", "num_filled", "ref_total"]


@st.composite
def corruption(draw: st.DrawFn, p: BlockPool) -> None:
    """Change one internal field of ``p`` as a bug would (block ids stay in range)."""
    n = p.num_blocks
    kind = draw(st.sampled_from(["list", "counter", "free", "queue", "index"]))
    block = draw(st.integers(0, n - 1))
    if kind == "list":
        field = draw(st.sampled_from(LIST_FIELDS))
        hashes = st.one_of(st.none(), st.integers(0, 5))
        getattr(p, field)[block] = draw(hashes if field == "_hash_of" else st.integers(-1, 4))
    elif kind == "counter":
        field = draw(st.sampled_from(COUNTERS))
        setattr(p, field, getattr(p, field) + draw(st.sampled_from([-1, 1])))
    elif kind == "free":
        if p._free and draw(st.booleans()):
            p._free.remove(draw(st.sampled_from(p._free)))
        else:
            p._free.append(block)
    elif kind == "queue":
        p._evict_queue.append(block)
    elif p._block_of and draw(st.booleans()):
        p._block_of.pop(draw(st.sampled_from(sorted(p._block_of))))
    else:
        p._block_of[draw(st.integers(0, 5))] = block


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_pool_check_agrees_with_the_walk(data: st.DataObject) -> None:
    p = data.draw(pools())
    assert _outcome(p.check_integrity) == "ok"
    for _ in range(data.draw(st.integers(1, 3))):
        data.draw(corruption(p))
    expected = None
    if data.draw(st.booleans()):
        expected = list(p.ref)
        expected[data.draw(st.integers(0, p.num_blocks - 1))] += data.draw(st.integers(-1, 1))
    want = _outcome(lambda: _walk_pool(p, expected))
    assert _outcome(lambda: p.check_integrity(expected)) == want


@st.composite
def managers(draw: st.DrawFn) -> PagedKVCacheManager:
    """A paged manager with a few admitted groups, some forked, some swapped out."""
    bs = draw(st.integers(1, 4))
    m = PagedKVCacheManager(draw(st.integers(4, 16)), bs, draw(st.integers(0, 8)), watermark=0)
    for _ in range(draw(st.integers(1, 5))):
        g = make_group(draw(st.integers(1, 3 * bs + 1)), n=2)
        if m.can_allocate(g) is not AllocStatus.OK:
            continue
        m.allocate(g)
        if draw(st.booleans()):
            child = spawn(g.seqs[0])
            m.fork(g.seqs[0].seq_id, child.seq_id)
        if draw(st.booleans()) and m.can_swap_out(g):
            m.swap_out(g)
    return m


@st.composite
def table_corruption(draw: st.DrawFn, m: PagedKVCacheManager) -> None:
    """Change one sequence's table, slots or side, or one block's fill."""
    seq = m._seqs[draw(st.sampled_from(sorted(m._seqs)))]
    pool = m._cpu if seq.on_cpu else m._device
    blocks = st.integers(0, max(m.num_device_blocks, m.num_cpu_blocks) - 1)
    kind = draw(st.sampled_from(["entry", "slots", "append", "pop", "side", "fill"]))
    if kind == "entry" and seq.table:
        seq.table[draw(st.integers(0, len(seq.table) - 1))] = draw(blocks)
    elif kind == "slots":
        seq.slots += draw(st.sampled_from([-1, 1]))
    elif kind == "append":
        seq.table.append(draw(blocks))
    elif kind == "pop" and seq.table:
        seq.table.pop()
    elif kind == "side":
        seq.on_cpu = not seq.on_cpu
    elif kind == "fill" and pool.num_blocks:
        held = [b for b in seq.table if b < pool.num_blocks]
        block = draw(st.sampled_from(held)) if held else draw(blocks) % pool.num_blocks
        pool.fill[block] += draw(st.sampled_from([-1, 1]))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_manager_check_agrees_with_the_walk(data: st.DataObject) -> None:
    m = data.draw(managers())
    assert _outcome(m.check_integrity) == "ok"
    for _ in range(data.draw(st.integers(1, 3))):
        data.draw(table_corruption(m))
    want = _outcome(lambda: _walk_manager(m))
    got = _outcome(m.check_integrity)
    if want == "index error":
        assert "is not one of" in got
    else:
        assert got == want


def test_a_table_naming_a_block_the_pool_lacks_is_named() -> None:
    m = PagedKVCacheManager(4, 2, 2)
    g = make_group(3)
    m.allocate(g)
    m._seqs[g.seqs[0].seq_id].table[1] = 9
    with pytest.raises(
        KVCacheError, match=rf"seq {g.seqs[0].seq_id}: block 9 \(#1\) is not one of 4"
    ):
        m.check_integrity()


@pytest.mark.parametrize("field", ["_free", "_evict_queue"])
def test_a_pool_list_naming_a_block_out_of_range_is_named(field: str) -> None:
    p = BlockPool(3, 2)
    getattr(p, field).append(7)
    with pytest.raises(KVCacheError, match=r"holds block 7, not one of its 3 blocks"):
        p.check_integrity()
