"""An adversarial state machine over the paged KV-cache manager that models what each block
holds, slot by slot.

Beside what ``tests/test_paged_kv.py``'s machine does, it runs chunked prefill
(``note_scheduled`` / ``note_computed``, per-chunk allocation with ``grow_prefill``,
``cache_scheduled_blocks``), forks at any point (mid-prefill, after a prefix-cache hit),
recompute preemption and re-admission of forked groups, swap-out and swap-in (then the
append the scheduler makes at once) of groups whose blocks other groups share through
the prefix cache, and every growth verb (``append``, ``try_append``, ``append_all`` over
several groups, a lockstep run of lone decodes). A step writes each computed token into
the slot its table names, copies (``(src, dst)``) and swaps move contents, and after every
rule each sequence's computed tokens must be in its cache with the right ids (so no prefix
hit, copy-on-write or swap hands a sequence another's K/V), the ref counts must equal a
recount of the tables, no part of the breakdown may be negative nor count a computed slot
as reserved, and every ``can_*`` that says yes must let its verb succeed (and a no leave
the state as it was). Below it, the bugs it found, one example each."""

from __future__ import annotations

import random

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from core.kv.base import AllocStatus, KVCacheError
from core.kv.paged import PagedKVCacheManager
from core.request import Sequence, SequenceGroup, SequenceStatus
from tests.kv_helpers import ManagerMachine, make_group, spawn

_rng = random.Random(7)
BASES = [tuple(_rng.randrange(4) for _ in range(24)) for _ in range(2)]
TOKENS = st.integers(0, 2)  # few ids: generated blocks repeat across sequences


def _prefilling(g: SequenceGroup) -> bool:
    return any(s.needs_prefill for s in g.live_seqs())


class AdversarialPagedMachine(ManagerMachine[PagedKVCacheManager]):
    """Up to four groups at once on a cache of 1 to 14 blocks of 1 to 4 slots (none of
    them need divide a prompt), with or without prefix caching, or vLLM V1's per-chunk
    allocation and scheduled-block caching; a CPU pool of 0 to 10 blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.waiting: list[SequenceGroup] = []
        self.dev: list[list[int | None]] = []  # device block -> token id in each slot
        self.cpu: list[list[int | None]] = []

    @initialize(
        blocks=st.integers(1, 14),
        bs=st.sampled_from([1, 2, 3, 4]),
        cpu=st.integers(0, 10),
        watermark=st.sampled_from([0.0, 0.1]),
        mode=st.sampled_from(["plain", "prefix", "v1"]),
    )
    def init(self, blocks: int, bs: int, cpu: int, watermark: float, mode: str) -> None:
        v1 = mode == "v1"
        self.m = PagedKVCacheManager(
            blocks, bs, cpu, watermark, enable_prefix_caching=mode != "plain",
            cache_scheduled_blocks=v1, allocate_per_chunk=v1,
        )  # fmt: skip
        self.dev = [[None] * bs for _ in range(blocks)]
        self.cpu = [[None] * bs for _ in range(cpu)]

    # -- helpers --------------------------------------------------------------------
    def snapshot(self) -> tuple[object, ...]:
        m = self.manager()
        d, c = m.device_pool, m.cpu_pool
        tables = {
            s.seq_id: (m.num_slots(s.seq_id), list(m._seqs[s.seq_id].table))
            for g in self.running + self.swapped
            for s in g.live_seqs()
        }
        return (
            list(d.ref), list(d.fill), d.evictable_blocks(), list(c.ref), list(c.fill),
            tables, m.breakdown(), m.num_free_blocks(), m.num_free_cpu_blocks(),
        )  # fmt: skip

    def write(self, seq: Sequence, start: int, end: int) -> None:
        """The step computing ``seq``'s tokens ``[start, end)`` writes their K/V."""
        m = self.manager()
        bs, table, ids = m.block_size, m.block_table(seq.seq_id), seq.token_ids()
        assert m.num_slots(seq.seq_id) >= end, f"{seq} writes past its slots"
        for i in range(start, end):
            self.dev[table[i // bs]][i % bs] = ids[i]

    def apply_copies(self, copies: list[tuple[int, int]]) -> None:
        for src, dst in copies:
            self.dev[dst] = list(self.dev[src])

    def sample(self, seq: Sequence, token: int) -> None:
        seq.num_generated += 1
        seq.output_token_ids.append(token)

    # -- admission ------------------------------------------------------------------
    @rule(
        prompt_len=st.integers(1, 24),
        base=st.integers(0, 1),
        output_len=st.integers(1, 12),
        n=st.integers(1, 2),
        chunk=st.integers(1, 8),
        readmit=st.booleans(),
    )
    def admit(
        self, prompt_len: int, base: int, output_len: int, n: int, chunk: int, readmit: bool
    ) -> None:
        m = self.manager()
        if len(self.running) + len(self.swapped) >= 4:
            return
        prompt_len = 1 + (prompt_len - 1) % (m.num_device_blocks * m.block_size)  # mostly fits
        if readmit and self.waiting:
            g = self.waiting[(prompt_len + base) % len(self.waiting)]
        else:
            g = make_group(prompt_len, output_len, n, BASES[base][:prompt_len])
        first = chunk if m.allocate_per_chunk else None
        status = m.can_allocate(g, first)
        if status is AllocStatus.NEVER and g in self.waiting:
            self.waiting.remove(g)  # aborted
        if status is not AllocStatus.OK:
            before = self.snapshot()
            with pytest.raises(KVCacheError, match=f"request {g.request_id}"):
                m.allocate(g, first)
            assert self.snapshot() == before
            return
        probe = m.cached_prefix_tokens(g)
        cached = m.allocate(g, first)
        seqs = g.live_seqs()
        if len(seqs) == 1:
            assert cached == probe
        event("admit: hit" if cached else "admit: no hit")
        event(f"admit: {len(seqs)} seqs")
        assert m.num_free_blocks() >= m.watermark_blocks
        for s in seqs:
            s.num_computed = cached
            s.status = SequenceStatus.RUNNING
        if g in self.waiting:
            self.waiting.remove(g)
        self.running.append(g)

    # -- steps ----------------------------------------------------------------------
    @rule(
        data=st.data(),
        times=st.integers(1, 6),
        chunk=st.integers(1, 10),
        verb=st.sampled_from(["append", "try", "all", "all_many", "lockstep"]),
    )
    def steps(self, data: st.DataObject, times: int, chunk: int, verb: str) -> None:
        """``times`` steps of a running group: its next prefill chunk, or a decode."""
        if not self.running:
            return
        for _ in range(times):
            if not self.running:
                return
            g = data.draw(st.sampled_from(self.running))
            ok = (
                self.prefill_chunk(g, chunk, data.draw(TOKENS))
                if _prefilling(g)
                else self.decode(g, verb, data)
            )
            if not ok:  # out of blocks: preempt a group, as a scheduler would
                if data.draw(st.booleans()):
                    self.swap_out(data)
                else:
                    self.preempt_by_recompute(data)
                continue
            for x in list(self.running):  # a group ends with its last token
                if x.seqs[0].num_generated >= x.request.output_len:
                    for s in x.live_seqs():
                        self.manager().free(s.seq_id)
                    self.running.remove(x)

    @rule(
        data=st.data(),
        times=st.integers(1, 6),
        chunk=st.integers(1, 10),
        verb=st.sampled_from(["append", "try", "all", "all_many", "lockstep"]),
    )
    def more_steps(self, data: st.DataObject, times: int, chunk: int, verb: str) -> None:
        """The same as :meth:`steps` (two rules: steps are drawn twice as often)."""
        self.steps(data, times, chunk, verb)

    def prefill_chunk(self, g: SequenceGroup, chunk: int, token: int) -> bool:
        m = self.manager()
        seqs = g.live_seqs()
        if len(seqs) == 1 and m.allocate_per_chunk:
            seq = seqs[0]
            end = min(seq.num_tokens, seq.num_computed + chunk)
            if not m.can_grow_prefill(seq, end):
                before = self.snapshot()
                with pytest.raises(KVCacheError, match=f"seq {seq.seq_id}"):
                    m.grow_prefill(seq, end)
                assert self.snapshot() == before
                return False
            m.grow_prefill(seq, end)
        ends = [min(s.num_tokens, s.num_computed + chunk) for s in seqs]  # in lockstep
        if any(end > m.num_slots(s.seq_id) for s, end in zip(seqs, ends, strict=True)):
            return False  # a group forked while allocated by chunk: no scheduler path
        for s, end in zip(seqs, ends, strict=True):
            m.note_scheduled(s, end)
        sampled = False
        for s, end in zip(seqs, ends, strict=True):
            self.write(s, s.num_computed, end)
            s.num_computed = end
            m.note_computed(s)
            if end == s.num_tokens:
                self.sample(s, token)
                sampled = True
        if sampled and len(seqs) == 1 and g.request.sampling.n > 1 and seqs[0].num_generated == 1:
            child = spawn(seqs[0])  # parallel sampling forks at the first token (no slot yet)
            child.output_token_ids[-1] = (token + 1) % 3
            m.fork(seqs[0].seq_id, child.seq_id)
        return True

    def decode(self, g: SequenceGroup, verb: str, data: st.DataObject) -> bool:
        m = self.manager()
        if verb == "lockstep":
            return self.lockstep(data)
        ready = [x for x in self.running if not _prefilling(x)]
        groups = [g] if verb != "all_many" else [x for x in ready if x is not g] + [g]
        before = self.snapshot()
        held = {b for x in self.running for s in x.live_seqs() for b in m.block_table(s.seq_id)}
        if verb == "append":
            if not m.can_append(g):
                with pytest.raises(KVCacheError, match=f"request {g.request_id}"):
                    m.append(g)
                assert self.snapshot() == before
                return False
            copies: list[tuple[int, int]] | None = m.append(g)
        elif verb == "try":
            ok = m.can_append(g)
            copies = m.try_append(g)
            assert (copies is not None) == ok
        else:
            copies = m.append_all(groups)
        if copies is None:
            assert self.snapshot() == before
            return False
        for src, dst in copies:
            assert src in held and dst not in held, "a copy into a block in use"
        self.apply_copies(copies)
        event(f"decode {verb}: {'copies' if copies else 'no copy'}")
        for x in groups:
            for s in x.live_seqs():
                assert m.num_slots(s.seq_id) == s.num_tokens
                self.write(s, s.num_computed, s.num_tokens)
                s.num_computed = s.num_tokens
                self.sample(s, data.draw(TOKENS))
        return True

    def lockstep(self, data: st.DataObject) -> bool:
        """A fast-forwarded run of plain decodes (``lockstep_blocks``, ``advance_lockstep``,
        ``register_run``) of the lone sequences one slot short of their tokens."""
        m = self.manager()
        seqs = [
            x.seqs[0] for x in self.running
            if len(x.seqs) == 1 and not _prefilling(x)
            and x.seqs[0].num_tokens - m.num_slots(x.seqs[0].seq_id) == 1
        ]  # fmt: skip
        steps = data.draw(st.integers(1, 5))
        blocks = m.lockstep_blocks(seqs, steps) if seqs else None
        if blocks is None or sum(blocks) > m.num_free_blocks():
            return False
        before = m.breakdown()
        expected = m.lockstep_breakdowns(len(seqs), blocks)
        m.advance_lockstep(seqs, steps)
        assert m.breakdown() == expected[-1], (before, expected)
        for s in seqs:
            for _ in range(steps):
                self.write(s, s.num_tokens - 1, min(s.num_tokens, m.num_slots(s.seq_id)))
                s.num_computed = s.num_tokens
                self.sample(s, data.draw(TOKENS))
            s.num_computed = s.num_tokens - 1
        m.register_run(seqs, 1)
        event("lockstep run")
        return True

    # -- forks and frees ------------------------------------------------------------
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        if not self.running:
            return
        m = self.manager()
        g = data.draw(st.sampled_from(self.running))
        if len(g.live_seqs()) >= 3:
            return
        parent = data.draw(st.sampled_from(g.live_seqs()))  # mid-prefill too
        child = spawn(parent)
        assert m.fork(parent.seq_id, child.seq_id) == []
        assert m.block_table(child.seq_id) == m.block_table(parent.seq_id)

    @rule(data=st.data(), kind=st.sampled_from(["free", "recompute", "swap"]))
    def disrupt(self, data: st.DataObject, kind: str) -> None:
        """Finish one sequence (a pruned beam, or a group's end), preempt a group by
        recompute (its KV freed; it waits to be admitted again) or swap it out."""
        if kind == "free" and (self.running or self.swapped):
            self.free_seq(data)
        elif kind == "recompute" and self.running:
            self.preempt_by_recompute(data)
        elif kind == "swap" and self.running:
            self.swap_out(data)

    def free_seq(self, data: st.DataObject) -> None:
        m = self.manager()
        g = data.draw(st.sampled_from(self.running + self.swapped))
        s = data.draw(st.sampled_from(g.live_seqs()))
        m.free(s.seq_id)
        s.status = SequenceStatus.FINISHED
        g.seqs.remove(s)
        if not g.seqs:
            (self.running if g in self.running else self.swapped).remove(g)

    def preempt_by_recompute(self, data: st.DataObject) -> None:
        m = self.manager()
        g = data.draw(st.sampled_from(self.running))
        for s in g.live_seqs():
            m.free(s.seq_id)
            s.num_computed = 0
            s.status = SequenceStatus.WAITING
        self.running.remove(g)
        self.waiting.append(g)

    def swap_out(self, data: st.DataObject) -> None:
        m = self.manager()
        g = data.draw(st.sampled_from(self.running))
        before = self.snapshot()
        if not m.can_swap_out(g):
            with pytest.raises(KVCacheError, match=f"request {g.request_id}"):
                m.swap_out(g)
            assert self.snapshot() == before
            return
        tables = [m.block_table(s.seq_id) for s in g.live_seqs()]
        shared = any(m.device_pool.ref[b] > tables.count(t) for t in tables for b in t)
        event(f"swap out: shares blocks with another group: {shared}")
        for dev, cpu in m.swap_out(g):
            self.cpu[cpu] = list(self.dev[dev])
        self.running.remove(g)
        g.set_status(SequenceStatus.SWAPPED)
        self.swapped.append(g)

    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        if not self.swapped:
            return
        m = self.manager()
        g = data.draw(st.sampled_from(self.swapped))
        before = self.snapshot()
        if not m.can_swap_in(g):
            with pytest.raises(KVCacheError, match=f"request {g.request_id}"):
                m.swap_in(g)
            assert self.snapshot() == before
            return
        event(f"swap in: evictable {m.device_pool.num_evictable() > 0}")
        for cpu, dev in m.swap_in(g):
            self.dev[dev] = list(self.cpu[cpu])
        self.swapped.remove(g)
        g.set_status(SequenceStatus.RUNNING)
        self.running.append(g)
        assert m.can_append(g), "can_swap_in promised the group's next append"
        self.apply_copies(m.append(g))

    # -- invariants -----------------------------------------------------------------
    @invariant()
    def recount(self) -> None:
        m = self.manager()
        if m is None:
            return
        m.check_integrity()
        bs = m.block_size
        dev_refs = [0] * m.num_device_blocks
        cpu_refs = [0] * m.num_cpu_blocks
        live = set()
        written: set[tuple[int, int]] = set()  # device slots some holder has computed
        for where, groups, content, refs in (
            ("device", self.running, self.dev, dev_refs),
            ("cpu", self.swapped, self.cpu, cpu_refs),
        ):
            for g in groups:
                for s in g.live_seqs():
                    live.add(s.seq_id)
                    if where == "device":
                        table = m.block_table(s.seq_id)
                    else:
                        table = m.cpu_block_table(s.seq_id)
                    slots = m.num_slots(s.seq_id)
                    assert len(table) == -(-slots // bs) and slots >= s.num_computed
                    for b in table:
                        refs[b] += 1
                    ids = s.token_ids()
                    if where == "device":
                        written.update((table[i // bs], i % bs) for i in range(s.num_computed))
                    for i in range(s.num_computed):
                        got = content[table[i // bs]][i % bs]
                        assert got == ids[i], (
                            f"{s} ({where}): token {i} is {got} in block {table[i // bs]}, "
                            f"expected {ids[i]}"
                        )
        assert m.held_seq_ids() == live
        assert dev_refs == m.device_pool.ref and cpu_refs == m.cpu_pool.ref
        b = m.breakdown()
        assert min(b.token_states, b.reserved, b.internal_frag, b.free) >= 0, b
        assert b.token_states >= len(written), f"computed slots counted as reserved: {b}"
        assert b.total == m.num_device_blocks * bs
        assert b.free == m.num_free_blocks() * bs


TestAdversarialPagedMachine = AdversarialPagedMachine.TestCase
TestAdversarialPagedMachine.settings = settings(
    max_examples=100, stateful_step_count=50, deadline=None
)


def test_a_fork_mid_prefill_counts_the_unwritten_slots_it_shares_once() -> None:
    """A 3-token prompt in one block of 3 forked before its first chunk (no shipped
    scheduler forks there, but ``fork`` allows it): a chunk of 1 token scheduled for both
    sequences leaves the block's other 2 slots reserved once, not once per holder (which
    counted 4 reserved slots in a 3-slot cache and token_states -1)."""
    m = PagedKVCacheManager(num_device_blocks=1, block_size=3, watermark=0.0)
    g = make_group(3)
    m.allocate(g)
    child = spawn(g.seqs[0])
    m.fork(g.seqs[0].seq_id, child.seq_id)
    for s in g.seqs:
        m.note_scheduled(s, 1)
    b = m.breakdown()
    assert (b.token_states, b.reserved, b.internal_frag, b.free) == (1, 2, 0, 0)
    m.check_integrity()


def test_a_prefill_chunk_never_grows_into_a_shared_last_block() -> None:
    """A prompt allocated chunk by chunk and forked after a first chunk of 2 (of a block of
    4): growing it would write the parent's next tokens into the block the child holds too
    (and break the child's fill). Asking or growing names the sequence and the block and
    changes nothing; ``append`` copies the block first."""
    m = PagedKVCacheManager(num_device_blocks=8, block_size=4, watermark=0.0,
                            allocate_per_chunk=True)  # fmt: skip
    g = make_group(10)
    m.allocate(g, first_chunk=2)
    parent = g.seqs[0]
    child = spawn(parent)
    m.fork(parent.seq_id, child.seq_id)
    pool = m.device_pool
    before = (list(pool.ref), list(pool.fill), m.num_slots(parent.seq_id))
    for verb in (m.can_grow_prefill, m.grow_prefill):
        with pytest.raises(KVCacheError, match=rf"seq {parent.seq_id}: .* last block 0 is shared"):
            verb(parent, 6)
    assert (list(pool.ref), list(pool.fill), m.num_slots(parent.seq_id)) == before
    assert m.can_grow_prefill(parent, 2)  # nothing to grow: nothing written
    m.check_integrity()
    assert m.append(g) == [(0, 1)]  # the parent copies the shared block, the child keeps it
    m.check_integrity()


def test_note_scheduled_refuses_an_unknown_or_swapped_out_sequence() -> None:
    """It raised KeyError for an unknown sequence, and marked a swapped-out one's slots as
    scheduled (a step cannot compute a sequence whose KV is on the CPU)."""
    m = PagedKVCacheManager(num_device_blocks=4, block_size=4, num_cpu_blocks=4, watermark=0)
    stranger = make_group(3).seqs[0]
    with pytest.raises(KVCacheError, match=f"unknown seq_id {stranger.seq_id}"):
        m.note_scheduled(stranger, 2)
    g = make_group(8)
    m.allocate(g)
    m.swap_out(g)
    with pytest.raises(KVCacheError, match=f"seq {g.seqs[0].seq_id} is swapped out"):
        m.note_scheduled(g.seqs[0], 4)
    m.swap_in(g)
    assert m.breakdown().reserved == 0  # nothing was marked while it was away
    m.check_integrity()
