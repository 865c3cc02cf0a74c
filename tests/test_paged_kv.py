"""Tests for the paged KV-cache manager: examples plus a rule-based property test."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
)

from core.kv.base import AllocStatus, KVCacheError, KVCacheManager
from core.kv.block_pool import BlockPool
from core.kv.paged import PagedKVCacheManager
from core.request import SequenceGroup, SequenceStatus
from tests.kv_helpers import ManagerMachine, admit_and_fork, make_group, spawn


def grow(m: PagedKVCacheManager, g: SequenceGroup) -> list[tuple[int, int]]:
    for s in g.live_seqs():
        s.num_computed = s.num_tokens
        s.num_generated += 1
        s.output_token_ids.append(7)
    return m.append(g)


def test_protocol_and_basic_growth() -> None:
    m = PagedKVCacheManager(num_device_blocks=10, block_size=4, watermark=0.0)
    assert isinstance(m, KVCacheManager)
    g = make_group(prompt_len=5)
    assert m.can_allocate(g) is AllocStatus.OK
    assert m.allocate(g) == 0
    sid = g.seqs[0].seq_id
    assert m.block_table(sid) == [0, 1] and m.num_slots(sid) == 5
    assert grow(m, g) == [] and m.block_table(sid) == [0, 1]  # 6 slots: last block has room
    grow(m, g), grow(m, g)
    assert m.num_slots(sid) == 8 and len(m.block_table(sid)) == 2
    grow(m, g)
    assert m.num_slots(sid) == 9 and m.block_table(sid) == [0, 1, 2]
    b = m.breakdown()
    assert (b.token_states, b.internal_frag, b.free, b.reserved, b.allocator_padding) == (
        9,
        3,
        7 * 4,
        0,
        0,
    )
    m.check_integrity()
    m.free(sid)
    assert m.num_free_blocks() == 10
    m.check_integrity()


def test_fork_then_copy_on_write() -> None:
    m = PagedKVCacheManager(num_device_blocks=10, block_size=4, watermark=0.0)
    g = make_group(prompt_len=6, n=2)
    m.allocate(g)
    parent = g.seqs[0]
    child = spawn(parent)
    assert m.fork(parent.seq_id, child.seq_id) == []
    assert m.block_table(child.seq_id) == m.block_table(parent.seq_id) == [0, 1]
    assert m.blocks_saved_by_sharing() == 2 and m.blocks_without_sharing() == 4
    copies = grow(m, g)
    # The parent copies the shared half-full block; the child, now its only holder,
    # writes in place.
    assert copies == [(1, 2)]
    assert m.block_table(parent.seq_id) == [0, 2] and m.block_table(child.seq_id) == [0, 1]
    assert m.device_pool.ref[0] == 2 and m.device_pool.ref[1] == m.device_pool.ref[2] == 1
    assert m.blocks_saved_by_sharing() == 1
    assert m.breakdown().token_states == 4 + 3 + 3
    m.check_integrity()


def test_can_append_counts_cow_exactly() -> None:
    m = PagedKVCacheManager(num_device_blocks=3, block_size=4, watermark=0.0)
    g, _ = admit_and_fork(m, 6)
    assert m.num_free_blocks() == 1
    assert grow(m, g) == [(1, 2)]  # exactly one block was needed
    m.check_integrity()


def test_admission_watermark_and_never() -> None:
    m = PagedKVCacheManager(num_device_blocks=100, block_size=16)  # watermark 1 block
    assert m.watermark_blocks == 1
    assert m.can_allocate(make_group(prompt_len=99 * 16)) is AllocStatus.OK
    assert m.can_allocate(make_group(prompt_len=99 * 16 + 1)) is AllocStatus.NEVER
    g = make_group(prompt_len=50 * 16)
    m.allocate(g)
    late = make_group(prompt_len=49 * 16 + 1)
    assert m.can_allocate(late) is AllocStatus.LATER
    with pytest.raises(KVCacheError, match="LATER"):
        m.allocate(late)
    m.check_integrity()
    assert m.num_free_blocks() == 50


def test_swap_round_trip_keeps_sharing() -> None:
    m = PagedKVCacheManager(num_device_blocks=12, block_size=4, num_cpu_blocks=4, watermark=0.0)
    g, b = admit_and_fork(m, 9)
    a = g.seqs[0]
    assert m.can_swap_out(g)
    pairs = m.swap_out(g)
    assert len(pairs) == 3 and m.num_free_blocks() == 12 and m.num_free_cpu_blocks() == 1
    assert m.cpu_block_table(a.seq_id) == m.cpu_block_table(b.seq_id)
    with pytest.raises(KVCacheError, match="swapped out"):
        m.block_table(a.seq_id)
    m.check_integrity()
    assert m.can_swap_in(g)
    back = m.swap_in(g)
    assert [c for c, _ in back] == [c for _, c in pairs]
    assert m.block_table(a.seq_id) == m.block_table(b.seq_id)
    assert m.num_slots(a.seq_id) == m.num_slots(b.seq_id) == 9
    assert m.num_free_cpu_blocks() == 4
    m.check_integrity()


@pytest.mark.parametrize(("cpu", "fits"), [(3, True), (2, False)])
def test_swap_out_may_fill_the_cpu_pool_exactly(cpu: int, fits: bool) -> None:
    """A forked group holding 3 distinct blocks (9 tokens, all shared) swaps out into
    exactly 3 free CPU blocks, not into 2."""
    m = PagedKVCacheManager(num_device_blocks=12, block_size=4, num_cpu_blocks=cpu, watermark=0)
    g, _ = admit_and_fork(m, 9)
    assert m.can_swap_out(g) is fits
    if fits:
        m.swap_out(g)
        assert m.num_free_cpu_blocks() == 0
        m.check_integrity()


def test_swap_in_needs_room_for_the_next_token() -> None:
    m = PagedKVCacheManager(num_device_blocks=4, block_size=4, num_cpu_blocks=4, watermark=0.0)
    g = make_group(prompt_len=12)
    m.allocate(g)
    g.seqs[0].num_generated += 1  # sampled a token whose slot is not yet given
    m.swap_out(g)
    filler = make_group(prompt_len=4)
    m.allocate(filler)
    assert not m.can_swap_in(g)  # 3 blocks + 1 for the next token, 3 free
    g2 = make_group(prompt_len=12)
    m2 = PagedKVCacheManager(num_device_blocks=3, block_size=4, num_cpu_blocks=4, watermark=0)
    m2.allocate(g2)
    m2.swap_out(g2)
    assert m2.can_swap_in(g2)  # no token pending: its 3 blocks are enough
    with pytest.raises(KVCacheError, match="swap_in"):
        m.swap_in(g)
    m.free(filler.seqs[0].seq_id)
    assert m.can_swap_in(g)


def test_swap_in_leaves_the_watermark_free_as_admission_does() -> None:
    """vLLM v0's can_swap_in: free - required >= watermark blocks (here 10% of 40: 4)."""
    m = PagedKVCacheManager(num_device_blocks=40, block_size=4, num_cpu_blocks=8, watermark=0.1)
    g = make_group(prompt_len=20)  # 5 blocks, and 1 more for its next token
    m.allocate(g)
    g.seqs[0].num_generated += 1
    m.swap_out(g)
    filler = make_group(prompt_len=4 * 30)  # 30 blocks: 10 free, 6 needed, 4 left
    m.allocate(filler)
    assert m.can_swap_in(g)
    m.allocate(make_group(prompt_len=1))  # 9 free: 6 needed would leave 3, under 4
    assert not m.can_swap_in(g)
    with pytest.raises(KVCacheError, match="swap_in"):
        m.swap_in(g)
    m.free(filler.seqs[0].seq_id)
    assert m.can_swap_in(g)
    m.swap_in(g)
    m.check_integrity()


def test_errors() -> None:
    m = PagedKVCacheManager(num_device_blocks=2, block_size=4, watermark=0.0)
    with pytest.raises(KVCacheError, match="unknown seq_id 42"):
        m.free(42)
    with pytest.raises(KVCacheError, match="unknown seq_id"):
        m.block_table(42)
    with pytest.raises(KVCacheError, match="unknown seq_id"):
        m.num_slots(42)
    with pytest.raises(KVCacheError, match="unknown seq_id"):
        m.fork(42, 43)
    g = make_group(prompt_len=8)
    with pytest.raises(KVCacheError, match="unknown seq_id"):
        m.can_append(g)
    m.allocate(g)
    with pytest.raises(KVCacheError, match="already holds"):
        m.allocate(g)
    g.seqs[0].num_generated += 1
    assert not m.can_append(g)
    with pytest.raises(KVCacheError, match="needs 1 blocks, 0 free"):
        m.append(g)
    assert m.num_slots(g.seqs[0].seq_id) == 8
    assert not m.can_swap_out(g)  # no CPU pool
    with pytest.raises(KVCacheError, match="CPU pool"):
        m.swap_out(g)
    with pytest.raises(KVCacheError, match="on the device"):
        m.swap_in(g)
    with pytest.raises(KVCacheError, match="already holds"):
        m.fork(g.seqs[0].seq_id, g.seqs[0].seq_id)
    m.check_integrity()
    for bad in (
        dict(num_device_blocks=0),
        dict(num_device_blocks=4, block_size=0),
        dict(num_device_blocks=4, watermark=1.0),
        dict(num_device_blocks=4, num_cpu_blocks=-1),
    ):
        with pytest.raises(ValueError):
            PagedKVCacheManager(**bad)  # type: ignore[arg-type]


def test_prefix_cache_hit_eviction_and_errors() -> None:
    m = PagedKVCacheManager(
        num_device_blocks=6, block_size=4, watermark=0.0, enable_prefix_caching=True
    )
    prompt = tuple(range(100, 112))
    a = make_group(12, prompt=prompt)
    assert m.allocate(a) == 0
    grow(m, a)  # computes the prompt: its 3 full blocks get indexed
    b = make_group(12, prompt=prompt)
    assert m.allocate(b) == 8  # the third block holds the last token: recomputed
    assert m.block_table(b.seqs[0].seq_id)[:2] == m.block_table(a.seqs[0].seq_id)[:2]
    m.free(a.seqs[0].seq_id)
    m.free(b.seqs[0].seq_id)
    assert m.num_free_blocks() == 6 and m.device_pool.num_evictable() == 3
    assert m.breakdown().free == 24
    c = make_group(10, prompt=(*prompt[:8], 1, 2))
    assert m.allocate(c) == 8  # two cached blocks revived; the third stays evictable
    assert m.device_pool.num_evictable() == 1 and m.num_free_blocks() == 3
    m.check_integrity()
    d = make_group(12, prompt=tuple(range(12)))
    assert m.allocate(d) == 0  # takes the two free blocks and evicts the cached one
    assert m.device_pool.num_evictable() == 0 and m.num_free_blocks() == 0
    assert not set(m.block_table(d.seqs[0].seq_id)) & set(m.block_table(c.seqs[0].seq_id))
    m.check_integrity()
    m.free(d.seqs[0].seq_id)
    again = make_group(12, prompt=prompt)
    before = (m.breakdown(), m.num_free_blocks(), m.device_pool.num_evictable())
    assert m.cached_prefix_tokens(again) == 8  # asked before allocating: nothing taken
    assert (m.breakdown(), m.num_free_blocks(), m.device_pool.num_evictable()) == before
    assert m.allocate(again) == 8  # the evicted third block is no longer a hit anyway
    assert m.cached_prefix_tokens(make_group(12, prompt=tuple(range(200, 212)))) == 0
    off = PagedKVCacheManager(6, 4, watermark=0.0)
    assert off.cached_prefix_tokens(make_group(12)) == 0  # no prefix cache: no ids needed
    m.free(again.seqs[0].seq_id)
    # a request of lengths alone (no prompt ids) stands for a prompt of its own
    # (stand_in_prompt_id): it finds its own blocks again after a recompute, no one else's
    own = make_group(8)
    assert m.allocate(own) == 0
    grow(m, own)  # its prompt's 2 full blocks get indexed (and a third block taken)
    m.free(own.seqs[0].seq_id)
    assert m.allocate(own) == 8  # re-admitted (a recompute): its own blocks found again
    m.free(own.seqs[0].seq_id)
    assert m.allocate(make_group(8)) == 0  # another request of lengths alone: no hit
    m.check_integrity()


class PagedMachine(ManagerMachine[PagedKVCacheManager]):
    """Random admissions, growth, forks, frees and swaps against brute-force recounts."""

    prefix_caching = False

    def __init__(self) -> None:
        super().__init__()
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.content: dict[int, tuple[int, ...]] = {}  # device block -> tokens computed there
        rng = random.Random(1)
        self.bases = [tuple(rng.randrange(50) for _ in range(64)) for _ in range(3)]

    @initialize(
        blocks=st.integers(1, 40),
        bs=st.sampled_from([1, 2, 4, 16]),
        cpu=st.integers(0, 30),
        watermark=st.sampled_from([0.0, 0.01, 0.1]),
    )
    def init(self, blocks: int, bs: int, cpu: int, watermark: float) -> None:
        self.m = PagedKVCacheManager(blocks, bs, cpu, watermark, self.prefix_caching)

    def tables(self) -> dict[int, list[int]]:
        m = self.manager()
        return {s.seq_id: m.block_table(s.seq_id) for g in self.running for s in g.seqs}

    @rule(prompt_len=st.integers(1, 60), n=st.integers(1, 3), base=st.integers(0, 2))
    def admit(self, prompt_len: int, n: int, base: int) -> None:
        m = self.manager()
        prompt = self.bases[base][:prompt_len] if self.prefix_caching else None
        g = make_group(prompt_len, 50, n, prompt)
        status = m.can_allocate(g)
        need = -(-prompt_len // m.block_size)
        assert (status is AllocStatus.NEVER) == (need > m.num_device_blocks - m.watermark_blocks)
        if status is not AllocStatus.OK:
            before = (m.breakdown(), m.num_free_blocks())
            with pytest.raises(KVCacheError):
                m.allocate(g)
            assert (m.breakdown(), m.num_free_blocks()) == before
            return
        others = {b for t in self.tables().values() for b in t}
        before = (m.breakdown(), m.num_free_blocks(), m.device_pool.num_evictable())
        probe = m.cached_prefix_tokens(g)  # read-only: the state is as it was
        assert (m.breakdown(), m.num_free_blocks(), m.device_pool.num_evictable()) == before
        cached = m.allocate(g)
        assert cached == probe
        seq = g.seqs[0]
        assert cached % m.block_size == 0 and 0 <= cached < seq.num_tokens
        assert self.prefix_caching or cached == 0
        event("prefix hit" if cached else "no prefix hit")
        table = m.block_table(seq.seq_id)
        hits = cached // m.block_size
        for i, block in enumerate(table[:hits]):
            assert self.content.get(block) == prompt[i * m.block_size : (i + 1) * m.block_size]
        assert not set(table[hits:]) & others, "allocate handed out a block in use"
        assert m.num_free_blocks() >= m.watermark_blocks
        seq.num_computed = cached
        seq.status = SequenceStatus.RUNNING
        self.running.append(g)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        m = self.manager()
        g = data.draw(st.sampled_from(self.running))
        bs, pool = m.block_size, m.device_pool
        for s in g.live_seqs():  # compute every token, record what each full block holds
            s.num_computed = s.num_tokens
            table, tokens = m.block_table(s.seq_id), s.token_ids() if self.prefix_caching else []
            for i in range(s.num_tokens // bs):
                if self.prefix_caching:
                    self.content[table[i]] = tuple(tokens[i * bs : (i + 1) * bs])
        for s in g.live_seqs():
            s.num_generated += 1
            s.output_token_ids.append(data.draw(st.integers(0, 49)))
        before_tables = self.tables()
        before_refs = list(pool.ref)
        shared_fill = {b: pool.fill[b] for b in range(m.num_device_blocks) if pool.ref[b] > 1}
        if not m.can_append(g):
            with pytest.raises(KVCacheError):
                m.append(g)
            assert self.tables() == before_tables
            for s in g.live_seqs():
                s.num_generated -= 1
                s.output_token_ids.pop()
            return
        copies = m.append(g)
        after = self.tables()
        for b, f in shared_fill.items():
            if pool.fill[b] != f:  # only its last holder may write it, once the others copied
                assert pool.ref[b] == 1, f"shared block {b} was written"
                assert sum(src == b for src, _ in copies) == before_refs[b] - 1
        old_blocks = {b for t in before_tables.values() for b in t}
        for s in g.live_seqs():
            t = after[s.seq_id]
            assert m.num_slots(s.seq_id) == s.num_tokens
            assert pool.ref[t[-1]] == 1, "appended into a shared block"
            assert len(t) == -(-s.num_tokens // bs)
            new = set(t) - set(before_tables[s.seq_id])
            assert not new & old_blocks, "append handed out a block already in use"
        for src, dst in copies:
            assert src in old_blocks and dst not in old_blocks

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        m = self.manager()
        g = data.draw(st.sampled_from(self.running))
        parent = data.draw(st.sampled_from(g.live_seqs()))
        refs = list(m.device_pool.ref)
        child = spawn(parent)
        assert m.fork(parent.seq_id, child.seq_id) == []
        table = m.block_table(child.seq_id)
        assert table == m.block_table(parent.seq_id)
        for b in table:
            assert m.device_pool.ref[b] == refs[b] + 1

    @precondition(lambda self: self.running or self.swapped)
    @rule(data=st.data())
    def finish_seq(self, data: st.DataObject) -> None:
        m = self.manager()
        g = data.draw(st.sampled_from(self.running + self.swapped))
        s = data.draw(st.sampled_from(g.live_seqs()))
        m.free(s.seq_id)
        s.status = SequenceStatus.FINISHED
        g.seqs.remove(s)
        with pytest.raises(KVCacheError, match="unknown seq_id"):
            m.free(s.seq_id)
        if not g.seqs:
            (self.running if g in self.running else self.swapped).remove(g)

    def structure(
        self, g: SequenceGroup, table_of: Callable[[int], list[int]]
    ) -> list[tuple[int, list[int]]]:
        """Each seq's slots and its table renamed by first appearance (sharing pattern)."""
        m = self.manager()
        names: dict[int, int] = {}
        out = []
        for s in g.live_seqs():
            renamed = [names.setdefault(b, len(names)) for b in table_of(s.seq_id)]
            out.append((m.num_slots(s.seq_id), renamed))
        return out

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        m = self.manager()
        g = data.draw(st.sampled_from(self.running))
        shape = self.structure(g, m.block_table)
        distinct = {b for s in g.live_seqs() for b in m.block_table(s.seq_id)}
        if not m.can_swap_out(g):
            assert len(distinct) > m.num_free_cpu_blocks()
            with pytest.raises(KVCacheError):
                m.swap_out(g)
            return
        pairs = m.swap_out(g)
        assert sorted(d for d, _ in pairs) == sorted(distinct)
        assert self.structure(g, m.cpu_block_table) == shape
        self.running.remove(g)
        g.set_status(SequenceStatus.SWAPPED)
        self.swapped.append(g)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        m = self.manager()
        g = data.draw(st.sampled_from(self.swapped))
        shape = self.structure(g, m.cpu_block_table)
        if not m.can_swap_in(g):
            with pytest.raises(KVCacheError):
                m.swap_in(g)
            return
        others = {b for t in self.tables().values() for b in t}
        pairs = m.swap_in(g)
        assert not {d for _, d in pairs} & others
        assert self.structure(g, m.block_table) == shape
        self.swapped.remove(g)
        g.set_status(SequenceStatus.RUNNING)
        self.running.append(g)

    @invariant()
    def recount(self) -> None:
        m = self.manager()
        m.check_integrity()
        bs = m.block_size
        dev = [0] * m.num_device_blocks
        cpu = [0] * m.num_cpu_blocks
        held: dict[int, int] = {}  # device block -> slots written there, from slot counts
        for g in self.running:
            for s in g.seqs:
                slots = m.num_slots(s.seq_id)
                for i, b in enumerate(m.block_table(s.seq_id)):
                    dev[b] += 1
                    n = min(bs, slots - i * bs)
                    assert held.setdefault(b, n) == n, "holders of a block disagree on its fill"
        for g in self.swapped:
            for s in g.seqs:
                for b in m.cpu_block_table(s.seq_id):
                    cpu[b] += 1
        assert dev == m.device_pool.ref and cpu == m.cpu_pool.ref
        br = m.breakdown()
        assert br.total == m.num_device_blocks * bs
        assert br.token_states == sum(held.values())
        assert br.internal_frag == len(held) * bs - br.token_states
        assert br.free == (m.num_device_blocks - len(held)) * bs
        assert m.blocks_saved_by_sharing() == sum(dev) - len(held)


class PrefixCachingMachine(PagedMachine):
    prefix_caching = True


_settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPagedMachine = PagedMachine.TestCase
TestPagedMachine.settings = _settings
TestPrefixCachingMachine = PrefixCachingMachine.TestCase
TestPrefixCachingMachine.settings = _settings


def test_prefix_cache_indexes_only_computed_blocks() -> None:
    m = PagedKVCacheManager(
        num_device_blocks=16, block_size=4, watermark=0.0, enable_prefix_caching=True
    )
    prompt = tuple(range(12))
    a = make_group(12, prompt=prompt)
    m.allocate(a)
    assert m.allocate(make_group(12, prompt=prompt)) == 0  # nothing computed yet
    a.seqs[0].num_computed = 4  # a prefill chunk wrote the first block
    assert m.append(a) == []
    assert m.allocate(make_group(12, prompt=prompt)) == 4
    a.seqs[0].num_computed = 12
    m.append(a)
    assert m.allocate(make_group(12, prompt=prompt)) == 8
    assert m.allocate(make_group(13, prompt=(*prompt, 0))) == 12
    m.check_integrity()


def test_recompute_of_a_forked_group_shares_its_full_prompt_blocks_again() -> None:
    """The 6-token prompt's full block is shared again (as after the fork), the rest is
    each sequence's own: 3 blocks, where separate tables took 4 (so a group that fitted
    before its preemption fits after it)."""
    m = PagedKVCacheManager(num_device_blocks=8, block_size=4, watermark=0.0)
    g, _ = admit_and_fork(m, 6)
    grow(m, g)
    for s in g.seqs:  # preempted by recompute
        m.free(s.seq_id)
        s.status = SequenceStatus.WAITING
    assert m.num_free_blocks() == 8
    assert m.can_allocate(g) is AllocStatus.OK
    assert m.allocate(g) == 0
    a, b = (m.block_table(s.seq_id) for s in g.seqs)
    assert len(a) == len(b) == 2 and a[0] == b[0] and a[1] != b[1]
    assert [m.num_slots(s.seq_id) for s in g.seqs] == [7, 7]
    assert m.num_free_blocks() == 5
    m.check_integrity()


def test_a_forked_group_that_fits_only_shared_is_not_never() -> None:
    """Two 13-token sequences of a 12-token prompt: 4 blocks each alone, 5 with the
    prompt's three blocks shared; a 5-block cache takes them back after a recompute."""
    m = PagedKVCacheManager(num_device_blocks=5, block_size=4, watermark=0.0)
    g, _ = admit_and_fork(m, 12)
    grow(m, g)
    for s in g.seqs:
        m.free(s.seq_id)
        s.status = SequenceStatus.WAITING
    assert m.can_allocate(g) is AllocStatus.OK
    m.allocate(g)
    assert m.num_free_blocks() == 0
    m.check_integrity()


def test_a_recomputed_forked_group_hits_the_cache_once_for_its_prompt() -> None:
    """With prefix caching, the shared prompt blocks come from the cache once (pinned
    once per holder), and each sequence's own cached blocks beyond them stay its own."""
    m = PagedKVCacheManager(
        num_device_blocks=16, block_size=4, watermark=0.0, enable_prefix_caching=True
    )
    g = make_group(8, n=2, prompt=tuple(range(8)))
    m.allocate(g)
    child = spawn(g.seqs[0])
    m.fork(g.seqs[0].seq_id, child.seq_id)
    for token in range(4):  # four tokens each, different per sequence: a full own block
        for i, seq in enumerate(g.seqs):
            seq.num_computed = seq.num_tokens
            seq.num_generated += 1
            seq.output_token_ids.append(100 * i + token)
        m.append(g)
    for seq in g.seqs:  # their last block is now computed and cached
        seq.num_computed = seq.num_tokens
    for s in g.seqs:
        m.free(s.seq_id)
        s.status = SequenceStatus.WAITING
    assert m.allocate(g) == 8  # the prompt and each one's generated block, less the last
    a, b = (m.block_table(s.seq_id) for s in g.seqs)
    assert a[:2] == b[:2] and a[2] != b[2]
    m.check_integrity()


def test_pool_evicts_the_least_recently_released_cached_block() -> None:
    """With the free list empty, ``allocate`` reclaims the cached block released first
    (LRU); the one released after it stays in the prefix-cache index."""
    pool = BlockPool(num_blocks=2, block_size=2)
    a, b = pool.allocate(), pool.allocate()
    for block, block_hash in ((a, 111), (b, 222)):
        pool.add_fill(block, 2)
        assert pool.register(block, block_hash)
    pool.decref(a)  # released first
    pool.decref(b)
    assert pool.num_free() == 2 and pool.num_evictable() == 2
    assert pool.allocate() == a
    assert pool.lookup(111) is None and pool.lookup(222) == b and pool.is_evictable(b)
    pool.check_integrity()


def test_a_freed_sequence_keeps_its_prompt_prefix_cached_longest() -> None:
    """A sequence releases its blocks last to first, so under memory pressure its tail
    block is evicted first and a later request with the same prompt still hits the leading
    blocks (vLLM frees a request's blocks in reverse for the same reason)."""
    m = PagedKVCacheManager(
        num_device_blocks=3, block_size=4, watermark=0.0, enable_prefix_caching=True
    )
    prompt = tuple(range(100, 112))
    a = make_group(12, prompt=prompt)
    m.allocate(a)
    a.seqs[0].num_computed = 12
    m.note_computed(a.seqs[0])  # all three full blocks are cached
    first, second, third = m.block_table(a.seqs[0].seq_id)
    m.free(a.seqs[0].seq_id)
    assert m.device_pool.num_evictable() == 3
    other = make_group(4, prompt=(1, 2, 3, 4))
    m.allocate(other)  # the free list is empty: one cached block is evicted
    assert m.block_table(other.seqs[0].seq_id) == [third]
    m.free(other.seqs[0].seq_id)  # uncomputed, so back to the free list, not cached
    again = make_group(12, prompt=prompt)  # its last block holds its last token: no hit
    assert m.allocate(again) == 8  # the first two blocks still hit
    assert m.block_table(again.seqs[0].seq_id)[:2] == [first, second]
    m.check_integrity()


def _recomputed_group_with_one_cached_generated_block(
    m: PagedKVCacheManager,
) -> SequenceGroup:
    """An ``n=2`` group of an 8-token prompt (block size 4), forked, five different tokens
    generated by each sequence; only the child's first generated block (tokens 8..11) is
    computed and cached before both are preempted by recompute. The parent (first in the
    group) then has 2 cached blocks, the child 3."""
    g = make_group(8, n=2, prompt=tuple(range(8)))
    m.allocate(g)
    parent = g.seqs[0]
    parent.num_computed = 8
    child = spawn(parent)
    m.fork(parent.seq_id, child.seq_id)
    for token in range(5):
        for i, seq in enumerate(g.seqs):
            seq.num_computed = seq.num_tokens
            seq.num_generated += 1
            seq.output_token_ids.append(100 * i + token)
        if token == 4:  # the parent's block of tokens 8..11 is not computed at this append
            parent.num_computed = 11
        m.append(g)
    for s in g.seqs:
        m.free(s.seq_id)
        s.status = SequenceStatus.WAITING
        s.num_computed = 0
    assert [s.num_tokens for s in g.seqs] == [13, 13]
    return g


def test_a_recomputed_group_skips_only_the_tokens_every_sequence_has_cached() -> None:
    """``allocate`` returns the cached leading tokens of the sequence with the fewest: the
    child has 12 cached, the parent only the 8 prompt tokens, so 8 (skipping 12 would leave
    the parent's tokens 8..11 without K/V)."""
    m = PagedKVCacheManager(
        num_device_blocks=16, block_size=4, watermark=0.0, enable_prefix_caching=True
    )
    g = _recomputed_group_with_one_cached_generated_block(m)
    assert m.allocate(g) == 8
    a, b = (m.block_table(s.seq_id) for s in g.seqs)
    assert a[:2] == b[:2] and a[2] != b[2] and len(a) == len(b) == 4
    m.check_integrity()


def test_a_recomputed_groups_own_cached_blocks_are_not_reserved() -> None:
    """Chunked prefill of that group from token 8 to 10: the parent has 13 slots and 10
    written or scheduled (3 reserved); the child's first 12 slots are written already (the
    shared prompt by the parent, tokens 8..11 its own cached block), so 1 reserved: 4."""
    m = PagedKVCacheManager(
        num_device_blocks=16, block_size=4, watermark=0.0, enable_prefix_caching=True
    )
    g = _recomputed_group_with_one_cached_generated_block(m)
    cached = m.allocate(g)
    for s in g.seqs:
        s.num_computed = cached
        m.note_scheduled(s, 10)
    b = m.breakdown()
    assert b.reserved == 3 + 1
    # written or scheduled: the 8 shared, parent 8..9, the child's cached block of 4
    assert b.token_states == 8 + 2 + 4
    m.check_integrity()


def test_a_readmitted_group_keeps_no_written_mark_from_an_earlier_admission() -> None:
    """That group admitted with the parent's two cached prompt blocks (written beyond the
    group's minimum), preempted again before any chunk ran, and re-admitted once the cache
    has lost them: nothing of it is written now, so a first chunk of 2 tokens leaves 11 of
    the parent's 13 slots reserved and 5 of the child's (its 8 shared prompt slots are the
    parent's to write), none counted written because of the earlier admission."""
    m = PagedKVCacheManager(
        num_device_blocks=16, block_size=4, watermark=0.0, enable_prefix_caching=True
    )
    g = _recomputed_group_with_one_cached_generated_block(m)
    assert m.allocate(g) == 8
    for s in g.seqs:
        m.free(s.seq_id)
    filler = make_group(64)  # every block, evicting the cached ones; never computed
    m.allocate(filler)
    m.free(filler.seqs[0].seq_id)
    assert m.device_pool.num_evictable() == 0
    assert m.allocate(g) == 0
    for s in g.seqs:
        m.note_scheduled(s, 2)
    b = m.breakdown()
    assert (b.reserved, b.token_states) == (11 + 5, 2)  # 18 slots filled: 8 shared, 5 + 5
    m.check_integrity()


def test_a_prefill_chunk_may_grow_into_exactly_the_last_free_blocks() -> None:
    """Allocating a prompt chunk by chunk (vLLM V1's chunked prefill), the next chunk may
    take every free block: ``can_grow_prefill`` says yes when the blocks it needs are
    exactly the free ones, no when one more would be needed. Five blocks of 4: a prompt of
    16 admitted with a first chunk of 4 holds 1 block; another group holds 1; growing to
    the whole prompt needs the other 3."""
    m = PagedKVCacheManager(num_device_blocks=5, block_size=4, watermark=0.0,
                            allocate_per_chunk=True)  # fmt: skip
    other = make_group(4)
    m.allocate(other)
    g = make_group(16)
    m.allocate(g, first_chunk=4)
    seq = g.seqs[0]
    assert m.num_slots(seq.seq_id) == 4 and m.num_free_blocks() == 3
    assert m.can_grow_prefill(seq, 16)  # 3 more blocks, 3 free
    third = make_group(1)
    m.allocate(third)
    assert not m.can_grow_prefill(seq, 16)  # 3 more blocks, 2 free
    assert m.can_grow_prefill(seq, 12)
    m.free(third.seqs[0].seq_id)
    m.grow_prefill(seq, 16)
    assert m.num_slots(seq.seq_id) == 16 and m.num_free_blocks() == 0
    m.check_integrity()


@pytest.mark.parametrize("hits_first", [True, False])
def test_a_readmitted_groups_own_cache_hits_count_as_token_states_whichever_comes_first(
    hits_first: bool,
) -> None:
    # the first sequence's own hits beyond the group's minimum were counted as reserved,
    # the same hits of a later sequence as token states: the breakdown hung on the order
    from core.request import Request, SamplingParams, Sequence

    m = PagedKVCacheManager(16, 4, watermark=0.0, enable_prefix_caching=True)
    earlier = SequenceGroup(Request(0, 0.0, 9, 1, SamplingParams(), tuple(range(1, 10))), 100)
    m.allocate(earlier)
    seq = earlier.seqs[0]
    seq.num_computed = 9
    m.note_computed(seq)
    m.free(seq.seq_id)  # its blocks of tokens 1..8 stay cached
    group = SequenceGroup(Request(1, 0.0, 4, 8, SamplingParams(n=2), (1, 2, 3, 4)), 0)
    group.seqs.append(Sequence(1, group))
    outputs = [[5, 6, 7, 8, 9], [15, 16, 17, 18, 19]]  # the first hits two blocks, the other one
    for s, out in zip(group.seqs, outputs if hits_first else outputs[::-1], strict=True):
        s.num_generated, s.output_token_ids = 5, list(out)
    computed = m.allocate(group)
    assert computed == 4
    for s in group.seqs:
        s.num_computed = computed
        m.note_scheduled(s, computed + 2)
    shares = m.breakdown()
    assert (shares.token_states, shares.reserved) == (10, 4)
    m.check_integrity()


def _pool_state(pool: BlockPool) -> tuple[object, ...]:
    return (
        list(pool.ref), list(pool.fill), list(pool._free), pool.evictable_blocks(),
        list(pool._hash_of), dict(pool._block_of), pool.num_used, pool.num_filled,
        pool.ref_total, pool.num_evictable(),
    )  # fmt: skip


def _pool_with_history(ops: list[int], num_blocks: int, block_size: int) -> BlockPool:
    """A pool some blocks of which are held, some free and some cached and evictable, in
    an order ``ops`` draws (so that the evictable queue is not in block order)."""
    pool = BlockPool(num_blocks, block_size)
    held: list[int] = []
    for i, op in enumerate(ops):
        if op % 3 and pool.num_free():
            block = pool.allocate()
            pool.add_fill(block, block_size if op % 2 else 1)
            if op % 2:
                pool.register(block, 1000 + i)
            held.append(block)
        elif held:
            pool.decref(held.pop(op % len(held)))
    return pool


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.integers(0, 50), max_size=40),
    num_blocks=st.integers(1, 12),
    block_size=st.integers(1, 4),
    n=st.integers(0, 12),
)
def test_the_pools_batch_verbs_are_their_one_block_verbs_in_order(
    ops: list[int], num_blocks: int, block_size: int, n: int
) -> None:
    """``allocate_many``, ``release`` and ``register_many`` (the paged manager's growth,
    free and prefix-cache registration take blocks with them at once) leave the pool as
    ``allocate``, ``decref`` (last block first) and ``register`` one block at a time."""
    one, many = (_pool_with_history(ops, num_blocks, block_size) for _ in "ab")
    assert _pool_state(one) == _pool_state(many)
    if n > one.num_free():
        with pytest.raises(KVCacheError):
            many.allocate_many(n)
        assert _pool_state(one) == _pool_state(many)  # none taken
        n = one.num_free()
    # takes_sparing: the allocations before the first of some blocks would be evicted
    spared = set(one.evictable_blocks()[1::2])
    taken_before = 0
    for block in [*reversed(one._free), *one.evictable_blocks()][:n]:
        if block in spared:
            break
        taken_before += 1
    assert one.takes_sparing(spared, n) == taken_before
    blocks = [one.allocate() for _ in range(n)]
    assert many.allocate_many(n) == blocks
    assert _pool_state(one) == _pool_state(many)
    for block in blocks:
        for pool in (one, many):
            pool.add_fill(block, block_size)
    hashes = [5000 + b % 3 for b in blocks]  # some repeat: the later ones are not indexed
    for block, block_hash in zip(blocks, hashes, strict=True):
        one.register(block, block_hash)
    many.register_many(blocks, hashes)
    assert _pool_state(one) == _pool_state(many)
    for block in reversed(blocks):
        one.decref(block)
    many.release(blocks)
    assert _pool_state(one) == _pool_state(many)
    one.check_integrity()
    many.check_integrity()
