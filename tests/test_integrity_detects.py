"""Each detection branch of the KV structures' ``check_integrity()`` fires on the corruption
it names.

The property tests of ``core/kv`` trust ``check_integrity()`` to catch allocator bugs; were a
branch silently broken they would pass vacuously. Each case builds a small valid state
through the public API, checks that it passes, corrupts ONE internal field as a real bug
would, and pins the branch by its message. Also pinned: the verbs' misuse guards raise and
leave the structure as it was, and ``append_all`` undoes the sequences its one-slot fast
path already advanced when a later group raises. The paged manager's check that the
breakdown sums to the capacity is not tested: once both pools pass, used plus free blocks
is every block, so it cannot fire; its check that no part is negative is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from core.kv.base import KVCacheError
from core.kv.block_pool import BlockPool
from core.kv.buddy import BuddyAllocator
from core.kv.contiguous import ContiguousKVCacheManager
from core.kv.paged import PagedKVCacheManager, _SeqState
from core.request import SequenceStatus
from tests.kv_helpers import make_group, spawn

Corrupt = Callable[[Any], object]


# -- block pool -------------------------------------------------------------------------
def valid_pool() -> BlockPool:
    """4 blocks of 4: block 0 evictable (full, hash 100), block 1 used (ref 2, fill 2),
    blocks 2 and 3 free."""
    p = BlockPool(4, 4)
    b0, b1 = p.allocate(), p.allocate()
    p.add_fill(b0, 4)
    assert p.register(b0, 100)
    p.decref(b0)
    p.add_fill(b1, 2)
    p.incref(b1)
    return p


def pool_state(p: BlockPool) -> tuple:
    return (list(p.ref), list(p.fill), list(p._free), list(p._evict_queue), list(p._stale),
            list(p._hash_of), dict(p._block_of), p.num_used, p.num_filled, p.ref_total,
            p.num_evictable())  # fmt: skip


POOL_CASES = [
    ("free-twice", lambda p: p._free.append(3), r"free list twice"),
    ("ref-negative", lambda p: p.ref.__setitem__(2, -1), r"block 2 has ref -1, fill 0"),
    ("overfilled", lambda p: p.fill.__setitem__(1, 5), r"block 1 has ref 2, fill 5"),
    ("used-and-free", lambda p: p._free.append(1), r"block 1 is referenced \(2\) and also free"),
    (
        "revived-still-evictable",
        lambda p: (p.incref(0), p._evict_queue.append(0)),
        r"block 0 is referenced \(1\) and also free",
    ),
    ("lost", lambda p: p._free.remove(2), r"unreferenced block 2 is lost or listed twice"),
    ("free-and-evictable", lambda p: p._free.append(0), r"block 0 is lost or listed twice"),
    ("free-with-fill", lambda p: p.fill.__setitem__(3, 1), r"free block 3 has fill 1 or a hash"),
    ("free-with-hash", lambda p: p._hash_of.__setitem__(3, 7), r"free block 3 has fill 0 or a"),
    ("evictable-part-full", lambda p: p.fill.__setitem__(0, 3), r"evictable block 0 is not a"),
    ("evictable-no-hash", lambda p: p._hash_of.__setitem__(0, None), r"evictable block 0 is not"),
    ("hash-index-lost", lambda p: p._block_of.pop(100), r"hash index disagrees for block 0"),
    ("hash-index-stray", lambda p: p._block_of.__setitem__(5, 3), r"differ in size"),
    ("queued-twice", lambda p: p._evict_queue.append(0), r"block 0 has 2 evict queue entries"),
    ("stale-unqueued", lambda p: p._stale.__setitem__(2, 1), r"num_stale=0, recount 1"),
    (
        "stale-uncounted",
        lambda p: (p._stale.__setitem__(2, 1), setattr(p, "_num_stale", 1)),
        r"block 2 has 0 evict queue entries, 1 of them stale",
    ),
    ("num-evictable", lambda p: setattr(p, "_num_evictable", 2), r"num_evictable=2, recount 1"),
    ("num-used", lambda p: setattr(p, "num_used", 2), r"num_used=2, recount 1"),
    ("num-filled", lambda p: setattr(p, "num_filled", 1), r"num_filled=1, recount 2"),
    ("ref-total", lambda p: setattr(p, "ref_total", 3), r"ref_total=3, recount 2"),
]


@pytest.mark.parametrize(("corrupt", "match"), [c[1:] for c in POOL_CASES],
                         ids=[c[0] for c in POOL_CASES])  # fmt: skip
def test_the_block_pool_check_detects(corrupt: Corrupt, match: str) -> None:
    p = valid_pool()
    p.check_integrity([0, 2, 0, 0])
    corrupt(p)
    with pytest.raises(KVCacheError, match=match):
        p.check_integrity()


def test_the_block_pool_check_detects_a_ref_no_table_holds() -> None:
    p = valid_pool()
    with pytest.raises(KVCacheError, match=r"block 1 has ref 2 but 1 tables hold it"):
        p.check_integrity([0, 1, 0, 0])


POOL_GUARDS = [
    ("incref-free", lambda p: p.incref(2), r"incref of free block 2; allocate it instead"),
    ("decref-free", lambda p: p.decref(3), r"decref of block 3, which has no holder"),
    ("decref-evictable", lambda p: p.decref(0), r"decref of block 0, which has no holder"),
    ("overfill", lambda p: p.add_fill(1, 3), r"block 1: fill 5 exceeds block_size=4"),
    ("fill-unused", lambda p: p.add_fill(2, 1), r"block 2: fill 1 .* or block unused"),
    ("register-part-full", lambda p: p.register(1, 9), r"only full used .*; block 1 is not"),
    ("register-evictable", lambda p: p.register(0, 9), r"only full used .*; block 0 is not"),
]


@pytest.mark.parametrize(("verb", "match"), [c[1:] for c in POOL_GUARDS],
                         ids=[c[0] for c in POOL_GUARDS])  # fmt: skip
def test_a_misused_block_pool_verb_raises_and_changes_nothing(verb: Corrupt, match: str) -> None:
    p = valid_pool()
    before = pool_state(p)
    with pytest.raises(KVCacheError, match=match):
        verb(p)
    assert pool_state(p) == before
    p.check_integrity([0, 2, 0, 0])


def test_an_exhausted_block_pool_raises_and_changes_nothing() -> None:
    p = valid_pool()
    for _ in range(3):  # blocks 2, 3, then the evictable 0
        p.allocate()
    before = pool_state(p)
    with pytest.raises(KVCacheError, match=r"block pool exhausted \(4 blocks all in use\)"):
        p.allocate()
    assert pool_state(p) == before
    p.check_integrity([1, 2, 1, 1])


def test_a_block_pool_needs_a_block_size() -> None:
    with pytest.raises(ValueError, match=r"block_size must be >= 1, got 0"):
        BlockPool(4, 0)


# -- buddy allocator --------------------------------------------------------------------
def valid_buddy() -> BuddyAllocator:
    """16 units, min_block 2: [0, 4) and [4, 6) allocated; [6, 8) and [8, 16) free."""
    b = BuddyAllocator(16, min_block=2)
    assert b.alloc(4) == 0 and b.alloc(2) == 4
    return b


def retile(b: BuddyAllocator, blocks: list[tuple[int, int]]) -> None:
    """Replace the free block [8, 16) by ``blocks`` ``(addr, order)``, heaps included."""
    b._free[3].discard(8)
    for addr, order in blocks:
        b._free[order].add(addr)
        b._heaps[order].append(addr)


BUDDY_CASES = [
    ("overlap", lambda b: b._free[1].add(2), r"free block \[2, 4\) overlaps 4"),
    ("gap", lambda b: b._free[1].discard(6), r"free block \[8, 16\) leaves a gap before 6"),
    ("misaligned", lambda b: retile(b, [(8, 1), (10, 2), (14, 1)]),
     r"free block \[10, 14\) is misaligned"),
    ("below-min-block", lambda b: retile(b, [(8, 0), (9, 0), (10, 1), (12, 2)]),
     r"free block \[8, 9\) is misaligned"),
    ("short", lambda b: b._free[3].discard(8), r"blocks cover \[0, 8\), capacity is 16"),
    ("unmerged", lambda b: retile(b, [(8, 2), (12, 2)]), r"free buddies at .* \(size 4\)"),
    ("heap-lost", lambda b: b._heaps[3].clear(), r"free list of size 8 lost its heap entry"),
    ("free-units", lambda b: setattr(b, "free_units", 8), r"free_units=8, recount gives 10"),
]  # fmt: skip


@pytest.mark.parametrize(("corrupt", "match"), [c[1:] for c in BUDDY_CASES],
                         ids=[c[0] for c in BUDDY_CASES])  # fmt: skip
def test_the_buddy_check_detects(corrupt: Corrupt, match: str) -> None:
    b = valid_buddy()
    b.check_integrity()
    corrupt(b)
    with pytest.raises(KVCacheError, match=match):
        b.check_integrity()


# -- contiguous manager -----------------------------------------------------------------
def valid_contiguous() -> tuple[ContiguousKVCacheManager, int, int]:
    """64 slots, pow2: request A (n=2, forked: regions [0, 16) and [16, 32)) and request B
    (one sequence, region [32, 48)), each reserving 5 + 4 = 9 slots of a 16-slot region.
    Returns the manager and the two request ids."""
    m = ContiguousKVCacheManager(64, "pow2", max_model_len=32, block_size=4)
    a, b = make_group(5, 3, n=2), make_group(5, 3)
    m.allocate(a)
    m.fork(a.seqs[0].seq_id, spawn(a.seqs[0]).seq_id)
    m.allocate(b)
    return m, a.request_id, b.request_id


def contiguous_state(m: ContiguousKVCacheManager) -> tuple:
    seqs = {sid: (s.group.request_id, s.region, s.slots) for sid, s in m._seqs.items()}
    groups = {r: (list(g.regions), list(g.spare), g.num_held) for r, g in m._groups.items()}
    counters = (m._tokens, m._reserved, m._frag, m._padding, m.allocator.free_units)
    return seqs, groups, counters, m.allocator.allocated_blocks(), m.allocator.free_blocks()


def seq_of(m: ContiguousKVCacheManager, rid: int, region: int) -> Any:
    return next(s for s in m._seqs.values() if s.group.request_id == rid and s.region == region)


CONTIGUOUS_CASES = [
    ("no-holder", lambda m, a, b: setattr(m._groups[a], "num_held", 0),
     r"request {a} holds regions but no sequence"),
    ("region-size", lambda m, a, b: setattr(m._groups[b], "size", 32),
     r"request {b}: region 32 is not 32 slots"),
    ("held-count", lambda m, a, b: setattr(m._groups[b], "num_held", 2),
     r"request {b}: regions held and spare do not add up"),
    ("spare-extra", lambda m, a, b: m._groups[a].spare.append(1),
     r"request {a}: regions held and spare do not add up"),
    ("region-twice", lambda m, a, b: setattr(seq_of(m, a, 1), "region", 0),
     r"request {a}: a region is used twice or lost"),
    ("group-released", lambda m, a, b: m._groups.pop(b),
     r"a sequence holds a region of a group that was released"),
    ("shared-region", lambda m, a, b: m._groups[b].regions.__setitem__(0, 16),
     r"seqs \d+ and \d+ share region 16"),
    ("no-slots", lambda m, a, b: setattr(seq_of(m, b, 0), "slots", 0),
     r"seq \d+: 0 slots, reservation 9"),
    ("past-reservation", lambda m, a, b: setattr(seq_of(m, b, 0), "slots", 10),
     r"seq \d+: 10 slots, reservation 9"),
    ("counters", lambda m, a, b: setattr(m, "_frag", m._frag + 1),
     r"breakdown counters \(.*\) but recount gives"),
    ("leaked-region", lambda m, a, b: m.allocator.alloc(8),
     r"breakdown sums to 56, capacity 64"),
]  # fmt: skip


@pytest.mark.parametrize(("corrupt", "match"), [c[1:] for c in CONTIGUOUS_CASES],
                         ids=[c[0] for c in CONTIGUOUS_CASES])  # fmt: skip
def test_the_contiguous_check_detects(corrupt: Callable[..., object], match: str) -> None:
    m, a, b = valid_contiguous()
    m.check_integrity()
    corrupt(m, a, b)
    with pytest.raises(KVCacheError, match=match.format(a=a, b=b)):
        m.check_integrity()


def test_contiguous_guards_raise_and_change_nothing() -> None:
    with pytest.raises(ValueError, match=r"max_model_len must be >= 2, got 1"):
        ContiguousKVCacheManager(64, "pow2", max_model_len=1, block_size=4)
    m = ContiguousKVCacheManager(64, "pow2", max_model_len=32, block_size=4)
    a, b, gone = make_group(5, 3, n=2), make_group(6, 3), make_group(5, 3)
    for g in (a, b, gone):
        m.allocate(g)
    m.free(gone.seqs[0].seq_id)
    before = contiguous_state(m)
    with pytest.raises(KVCacheError, match=rf"child seq {b.seqs[0].seq_id} already holds"):
        m.fork(a.seqs[0].seq_id, b.seqs[0].seq_id)
    for g in (a, b, gone):  # a and b advance before the released group is met
        g.seqs[0].num_generated += 1
    with pytest.raises(KVCacheError, match=rf"unknown seq_id {gone.seqs[0].seq_id}"):
        m.append_all([a, b, gone])
    assert contiguous_state(m) == before
    m.check_integrity()


# -- paged manager ----------------------------------------------------------------------
def valid_paged() -> tuple[PagedKVCacheManager, list[int]]:
    """8 device and 4 CPU blocks of 4: a forked pair sharing 6 slots (2 blocks), a lone
    sequence of 5 slots (2 blocks), and a swapped-out sequence of 3 slots. Returns the
    manager and the seq ids [parent, child, lone, swapped]."""
    m = PagedKVCacheManager(8, block_size=4, num_cpu_blocks=4, watermark=0.0)
    pair, lone, swapped = make_group(6, n=2), make_group(5), make_group(3)
    for g in (pair, lone, swapped):
        m.allocate(g)
    child = spawn(pair.seqs[0])
    m.fork(pair.seqs[0].seq_id, child.seq_id)
    m.swap_out(swapped)
    return m, [s.seq_id for g in (pair, lone, swapped) for s in g.seqs]


def paged_state(m: PagedKVCacheManager) -> tuple:
    seqs = {sid: (list(st.table), st.slots, st.on_cpu, st.n_hashed, st.last_hash)
            for sid, st in m._seqs.items()}  # fmt: skip
    return (pool_state(m.device_pool), pool_state(m.cpu_pool), seqs, dict(m._prefilling),
            dict(m._written_by_group))  # fmt: skip


PAGED_CASES = [
    ("stale-prefill", lambda m, s: m._prefilling.__setitem__(10**9, 0),
     r"seq 1000000000: 0 slots written, a prefill in progress"),
    ("prefill-done", lambda m, s: m._prefilling.__setitem__(s[2], 5),
     r"seq {2}: 5 slots written, a prefill in progress"),
    ("table-short", lambda m, s: setattr(m._seqs[s[2]], "slots", 9), r"seq {2}: 2 blocks for 9"),
    ("no-slots", lambda m, s: setattr(m._seqs[s[2]], "slots", 0), r"seq {2}: 2 blocks for 0"),
    ("empty", lambda m, s: m._seqs.__setitem__(s[2], _SeqState([], 0)),
     r"seq {2}: 0 blocks for 0 slots"),
    ("fill", lambda m, s: setattr(m._seqs[s[2]], "slots", 6),
     r"seq {2}: block 3 \(#1\) has fill 1, expected 2"),
    ("cpu-fill", lambda m, s: setattr(m._seqs[s[3]], "slots", 2),
     r"seq {3}: block 0 \(#0\) has fill 3, expected 2"),
    ("leaked-ref", lambda m, s: m.device_pool.incref(3),
     r"block pool: block 3 has ref 2 but 1 tables hold it"),
    ("leaked-cpu-ref", lambda m, s: m.cpu_pool.incref(0),
     r"block pool: block 0 has ref 2 but 1 tables hold it"),
    ("wrong-block", lambda m, s: m._seqs[s[1]].table.__setitem__(0, 2),
     r"block pool: block 0 has ref 2 but 1 tables hold it"),
    ("pool-counter", lambda m, s: setattr(m.device_pool, "num_filled", 12),
     r"block pool: num_filled=12, recount 11"),
]  # fmt: skip


@pytest.mark.parametrize(("corrupt", "match"), [c[1:] for c in PAGED_CASES],
                         ids=[c[0] for c in PAGED_CASES])  # fmt: skip
def test_the_paged_check_detects(corrupt: Callable[..., object], match: str) -> None:
    m, sids = valid_paged()
    m.check_integrity()
    corrupt(m, sids)
    with pytest.raises(KVCacheError, match=match.format(*sids)):
        m.check_integrity()


def test_paged_guards_raise_and_change_nothing() -> None:
    m = PagedKVCacheManager(3, block_size=4, watermark=0.0, allocate_per_chunk=True)
    done, g, other = make_group(4), make_group(12), make_group(4)
    done.finish_time = 1.0
    done.seqs[0].status = SequenceStatus.FINISHED
    with pytest.raises(KVCacheError, match=rf"request {done.request_id} has no live sequence"):
        m.can_allocate(done)
    m.allocate(g, first_chunk=4)
    m.allocate(other)
    before = paged_state(m)
    with pytest.raises(KVCacheError, match=rf"grow_prefill of seq {g.seqs[0].seq_id}: not"):
        m.grow_prefill(g.seqs[0], 12)
    assert paged_state(m) == before
    m.check_integrity()


class Boom(BaseException):
    """Not an Exception: the rollback must hold for any exception (an interrupt too)."""


@pytest.mark.parametrize("how", ["freed", "swapped", "interrupted"])
def test_append_all_undoes_its_fast_path_when_a_later_group_raises(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Groups a and b take the one-slot fast path (their own partly filled last block),
    c needs a new block (applied only after the loop); then the 4th group raises: a freed
    or swapped-out sequence, or an interrupt while counting a forked group's need. The
    manager must be exactly as before the call."""
    m = PagedKVCacheManager(16, block_size=4, num_cpu_blocks=4, watermark=0.0)
    a, b, c, bad = make_group(5), make_group(6), make_group(8), make_group(5, n=2)
    for g in (a, b, c, bad):
        m.allocate(g)
    if how == "interrupted":
        m.fork(bad.seqs[0].seq_id, spawn(bad.seqs[0]).seq_id)
        seen = []

        def boom(seqs: list) -> int:
            seen.append([m.num_slots(g.seqs[0].seq_id) for g in (a, b, c)])
            raise Boom

        monkeypatch.setattr(m, "_append_need", boom)
    elif how == "swapped":
        m.swap_out(bad)
    else:
        m.free(bad.seqs[0].seq_id)
    before = paged_state(m)
    for g in (a, b, c, bad):
        for s in g.seqs:
            s.num_generated += 1
    expected = {"freed": r"unknown seq_id", "swapped": r"swapped out to the CPU pool"}
    with pytest.raises(Boom if how == "interrupted" else KVCacheError, match=expected.get(how)):
        m.append_all([a, b, c, bad])
    if how == "interrupted":
        assert seen == [[6, 7, 8]]  # the raise came after the fast path had advanced a and b
    assert paged_state(m) == before
    monkeypatch.undo()
    m.check_integrity()
    assert m.append_all([a, b, c]) == []  # and the manager goes on as if never called
    assert [m.num_slots(g.seqs[0].seq_id) for g in (a, b, c)] == [6, 7, 9]
    m.check_integrity()


def test_the_paged_check_detects_a_negative_breakdown_part() -> None:
    """The slots a mid-prefill fork shares counted unwritten once per holder (the bug
    tests/test_paged_adversarial.py pins) made token_states -1 while the parts still summed
    to the capacity: the check names the negative part."""
    m = PagedKVCacheManager(num_device_blocks=1, block_size=3, watermark=0.0)
    g = make_group(3)
    m.allocate(g)
    child = spawn(g.seqs[0])
    m.fork(g.seqs[0].seq_id, child.seq_id)
    m._written_by_group.pop(child.seq_id)  # as fork left it before the fix
    for s in g.seqs:
        m.note_scheduled(s, 1)
    with pytest.raises(KVCacheError, match=r"breakdown has token_states -1"):
        m.check_integrity()
