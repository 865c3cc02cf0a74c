"""Paged KV-cache manager: fixed-size blocks, block tables, ref counts, copy-on-write.

The PagedAttention scheme of Kwon et al., SOSP 2023 (§4.2-§4.5): each sequence has a
block table; a new block is taken only when the last one is full, so at most one
partly-filled block per sequence; ``fork`` shares every block (ref + 1) and a write into a
shared, partly-filled last block first copies it (copy-on-write at block granularity).
Preempted groups can be swapped to a CPU pool of blocks (§4.5).

Choices where the paper is silent:

- Admission keeps ``int(watermark * num_device_blocks)`` blocks free (vLLM v0's 1%
  watermark, rounded down as vLLM rounds it: none on a cache of under 100 blocks);
  a group needing more blocks than the device has beyond that watermark is NEVER.
- A waiting group with several live sequences (a forked group preempted by recompute)
  gets its sharing back: every sequence holds the first one's full prompt blocks (as
  after ``fork``); the blocks of tokens generated before a later fork (beams) are not
  re-shared.
- ``can_swap_in`` asks for the swapped blocks plus exactly the blocks the group's next
  ``append`` takes, so each sequence can append right after swap-in (vLLM v0 asks for one
  spare block per sequence instead), and, as vLLM v0 does, leaves the admission
  watermark free. Swap-in does not re-share blocks with the prefix cache,
  and a block the prefix cache shares between requests is copied out once per request that
  swaps (vLLM v0 moves it once): only runs with both prefix caching and swap preemption meet
  it, and no reproduced figure is one.
- Prefix caching (off by default) indexes a *full* block under the chained hash of
  (previous block's hash, its token ids) once all its tokens are computed (at the end of
  the step that computes them, :meth:`note_computed`, and on ``append``), so a later
  request never skips tokens whose K/V is not written yet; with ``cache_scheduled_blocks``
  (vLLM V1: ``KVCacheManager.allocate_slots`` caches the blocks of the tokens it
  schedules), once the step that computes them is scheduled (:meth:`note_scheduled`). A
  hit never covers the last token: at least one token is computed.
  Unreferenced cached blocks stay cached, are evicted least recently released first, and
  count as free. A sequence releases its blocks last-to-first so that prompt-prefix blocks
  are evicted last.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from core.defaults import DEFAULT_BLOCK_SIZE, DEFAULT_WATERMARK
from core.kv.base import (
    GROWTH_VERBS,
    AllocStatus,
    KVCacheError,
    MemoryBreakdown,
    check_at_least,
    new_breakdown,
    overrides,
)
from core.kv.block_pool import BlockPool
from core.kv.pool_integrity import check_block_tables
from core.request import Sequence, SequenceGroup

_ROOT_HASH = 0  # the "previous block hash" of a sequence's first block
# below every generated token's stand-in (core.sched.base.stand_in_token_id: -2 - seq_id)
_STAND_IN_PROMPT_BASE = -(1 << 40)


def stand_in_prompt_id(request_id: int) -> int:
    """The id every prompt token of request ``request_id`` stands as in a block hash when the
    request carries lengths alone (a body that draws no prompt ids: the simulator): one per
    request, never a vocabulary id nor a generated token's stand-in, so a prefix cache finds
    a request's own prompt blocks again (after a recompute preemption) and no other
    request's, as the engine's randomly drawn prompts do."""
    return _STAND_IN_PROMPT_BASE - request_id


class _SeqState:
    """One sequence's blocks. ``table`` holds device blocks, or CPU blocks when swapped."""

    __slots__ = ("last_hash", "n_hashed", "on_cpu", "slots", "table")

    def __init__(self, table: list[int], slots: int, n_hashed: int = 0, last_hash: int = 0):
        self.table = table
        self.slots = slots
        self.on_cpu = False
        self.n_hashed = n_hashed  # leading blocks already offered to the prefix cache
        self.last_hash = last_hash  # chained hash of block n_hashed - 1


class PagedKVCacheManager:
    """Implements :class:`core.kv.base.KVCacheManager` with paged blocks. A subclass (a KV
    manager plugin, ``core.systems.SystemSpec.manager``) that overrides a verb of
    :data:`core.kv.base.GROWTH_VERBS` has the fast forms of growth defer to it."""

    # False in a subclass overriding one of GROWTH_VERBS
    _fast_growth: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._fast_growth = not overrides(cls, PagedKVCacheManager, GROWTH_VERBS)

    def __init__(
        self,
        num_device_blocks: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_cpu_blocks: int = 0,
        watermark: float = DEFAULT_WATERMARK,
        enable_prefix_caching: bool = False,
        cache_scheduled_blocks: bool = False,
        allocate_per_chunk: bool = False,
    ) -> None:
        check_at_least(1, num_device_blocks=num_device_blocks, block_size=block_size)
        check_at_least(0, num_cpu_blocks=num_cpu_blocks)
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.block_size = block_size
        self.num_device_blocks = num_device_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.watermark = watermark
        self.watermark_blocks = int(watermark * num_device_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        # vLLM V1 indexes a block when a step that fills it is scheduled, not once computed
        self.cache_scheduled_blocks = cache_scheduled_blocks
        # vLLM V1 allocates a prompt's blocks chunk by chunk (KVCacheManager.allocate_slots
        # for the tokens each step schedules), not whole at admission
        self.allocate_per_chunk = allocate_per_chunk
        self._device = BlockPool(num_device_blocks, block_size)
        self._cpu = BlockPool(num_cpu_blocks, block_size)
        self._seqs: dict[int, _SeqState] = {}
        # seq id -> slots written or being written by a scheduled step, for the sequences
        # whose allocated prompt has not all been scheduled yet (chunked prefill)
        self._prefilling: dict[int, int] = {}
        # seq id -> leading slots that hold K/V at a group's admission although the step
        # starts below them: another sequence's shared prompt blocks, or its own cache hits
        # beyond the group's minimum
        self._written_by_group: dict[int, int] = {}

    # -- helpers ----------------------------------------------------------------------
    def _state(self, seq_id: int) -> _SeqState:
        st = self._seqs.get(seq_id)
        if st is None:
            raise self._not_on_device(seq_id)
        return st

    def _device_state(self, seq_id: int) -> _SeqState:
        st = self._seqs.get(seq_id)
        if st is None or st.on_cpu:
            raise self._not_on_device(seq_id)
        return st

    def _not_on_device(self, seq_id: int) -> KVCacheError:
        if seq_id not in self._seqs:
            return KVCacheError(f"unknown seq_id {seq_id}: it holds no KV blocks")
        return KVCacheError(f"seq {seq_id} is swapped out to the CPU pool")

    @staticmethod
    def _live(group: SequenceGroup) -> list[Sequence]:
        seqs = group.live_seqs()
        if not seqs:
            raise KVCacheError(f"request {group.request_id} has no live sequence")
        return seqs

    def _blocks_for(self, slots: int) -> int:
        return -(-slots // self.block_size)

    def _token_slice(self, seq: Sequence, start: int, end: int) -> list[int]:
        """The ids ``seq``'s block hashes read, from ``start`` to ``end``: its prompt's and
        generated tokens (a request of lengths alone stands for its prompt by
        :func:`stand_in_prompt_id`), built for that slice only."""
        request = seq.group.request
        p, out = request.prompt_len, seq.output_token_ids
        if start >= p:
            return out[start - p : end - p]
        if request.prompt_token_ids is None:
            part = [stand_in_prompt_id(request.request_id)] * (min(end, p) - start)
        else:
            part = list(request.prompt_token_ids[start:end])
        if end > p:
            part += out[: end - p]
        return part

    def _block_tokens(self, seq: Sequence, first: int, upto: int) -> Iterator[tuple[int, ...]]:
        """The ids of ``seq``'s blocks ``first`` to ``upto - 1`` as its block hashes read
        them, a tuple a block (:meth:`_token_slice` cut into blocks): a block inside a prompt
        that has no ids is one tuple of its stand-in id, made once for all of them."""
        bs = self.block_size
        request = seq.group.request
        p = request.prompt_len
        j = first
        in_prompt = min(upto, p // bs)
        if j < in_prompt:
            ids = request.prompt_token_ids
            if ids is None:
                same = (stand_in_prompt_id(request.request_id),) * bs
                for _ in range(j, in_prompt):
                    yield same
            else:
                for i in range(j * bs, in_prompt * bs, bs):
                    yield tuple(ids[i : i + bs])
            j = in_prompt
        if j < upto and j * bs < p:  # the block the prompt ends in, with the first outputs
            yield tuple(self._token_slice(seq, j * bs, (j + 1) * bs))
            j += 1
        out = seq.output_token_ids
        for i in range(j * bs - p, upto * bs - p, bs):
            yield tuple(out[i : i + bs])

    def _prefix_hits(self, seq: Sequence) -> list[tuple[int, int]]:
        """Leading cached blocks ``(block, hash)`` of the sequence, never covering its last
        token."""
        bs = self.block_size
        known = seq.group.request.prompt_len + len(seq.output_token_ids)
        limit = min((seq.num_tokens - 1) // bs, known // bs)
        lookup = self._device.lookup
        hits = []
        prev = _ROOT_HASH
        for block_tokens in self._block_tokens(seq, 0, limit):
            prev = hash((prev, block_tokens))
            block = lookup(prev)
            if block is None:
                break
            hits.append((block, prev))
        return hits

    def _grow(self, st: _SeqState, target: int) -> None:
        """Give ``st`` slots up to ``target``; its last block must not be shared."""
        pool, bs, table = self._device, self.block_size, st.table
        s = st.slots
        if s >= target:
            return
        off = s % bs
        if off:  # the last block's room first
            k = min(bs - off, target - s)
            pool.add_fill(table[-1], k)
            s += k
        if s < target:  # then new blocks, full but the last (add_fill's, at once)
            n = -(-(target - s) // bs)
            blocks = pool.allocate_many(n)
            fill = pool.fill
            for block in blocks:
                fill[block] = bs
            fill[blocks[-1]] = target - s - (n - 1) * bs
            pool.num_filled += target - s
            table.extend(blocks)
        st.slots = target

    def note_scheduled(self, seq: Sequence, upto: int) -> None:
        """A step computes ``seq``'s tokens up to ``upto``: its slots below ``upto`` stop
        counting as set aside (:meth:`breakdown`). With ``cache_scheduled_blocks`` (vLLM
        V1), the full blocks they complete are offered to the prefix cache now, so a
        request admitted later in the same step finds them; its tokens there are not
        computed again, and its attention reads the K/V the same forward writes first."""
        sid = seq.seq_id
        st = self._device_state(sid)
        written = max(upto, self._written_by_group.get(sid, 0))
        if written >= st.slots:
            self._prefilling.pop(sid, None)
        else:
            self._prefilling[sid] = max(written, self._prefilling.get(sid, 0))
        if self.enable_prefix_caching and self.cache_scheduled_blocks:
            self._register_computed(seq, st, upto)

    def note_computed(self, seq: Sequence) -> None:
        """The step computing ``seq`` up to ``seq.num_computed`` ended: with prefix caching,
        the full blocks below it are offered to the cache now, not at ``seq``'s next
        ``append`` (a prompt whose request finishes on its first token has none). A
        sequence past its prefill (a recomputed one whose last chunk stops one token short
        goes on by decoding) leaves :meth:`unwritten_slots`."""
        if not seq.needs_prefill:
            self._prefilling.pop(seq.seq_id, None)
        if self.enable_prefix_caching:
            self._register_computed(seq, self._device_state(seq.seq_id))

    def _register_computed(self, seq: Sequence, st: _SeqState, upto: int | None = None) -> None:
        """Offer the sequence's newly computed full blocks (those below ``upto`` tokens, by
        default its computed ones) to the prefix cache."""
        bs = self.block_size
        upto = min(seq.num_computed if upto is None else upto, st.slots) // bs
        first = st.n_hashed
        if upto <= first:
            return
        # the ids' length: the prompt's (Request checks its ids against it) and the outputs'
        upto = min(upto, (seq.group.request.prompt_len + len(seq.output_token_ids)) // bs)
        if upto <= first:
            return
        start = first * bs - seq.group.request.prompt_len
        if upto == first + 1 and start >= 0:  # one block of outputs (a decode's): inlined
            prev = hash((st.last_hash, tuple(seq.output_token_ids[start : start + bs])))
            self._device.register(st.table[first], prev)
        else:
            prev, hashes = st.last_hash, []
            for block_tokens in self._block_tokens(seq, first, upto):
                prev = hash((prev, block_tokens))
                hashes.append(prev)
            self._device.register_many(st.table[first:upto], hashes)
        st.n_hashed, st.last_hash = upto, prev

    def _append_need(self, seqs: list[Sequence], on_cpu: bool = False) -> int:
        """Device blocks ``append`` would take for these sequences (exact, CoW included);
        ``on_cpu``: for swapped-out sequences, as if they were swapped in first."""
        bs, states = self.block_size, self._seqs
        ref = (self._cpu if on_cpu else self._device).ref
        need = 0
        cow_seen: dict[int, int] | None = None
        for seq in seqs:
            st = states.get(seq.seq_id)
            if st is None or st.on_cpu is not on_cpu:
                if on_cpu:
                    raise KVCacheError(f"seq {seq.seq_id} is not swapped out")
                raise self._not_on_device(seq.seq_id)
            s = st.slots
            grow = seq.num_tokens - s
            if grow <= 0:
                continue
            off = s % bs
            if off:
                last = st.table[-1]
                r = ref[last]
                if r > 1:
                    # The k-th appender into a shared block sees ref r - k; the last one
                    # writes in place.
                    cow_seen = cow_seen if cow_seen is not None else {}
                    k = cow_seen.get(last, 0)
                    cow_seen[last] = k + 1
                    need += k < r - 1
                grow -= bs - off
            if grow > 0:
                need += -(-grow // bs)
        return need

    def _distinct_blocks(self, seqs: list[Sequence], on_cpu: bool) -> int:
        blocks: set[int] = set()
        for seq in seqs:
            st = self._state(seq.seq_id)
            if st.on_cpu is not on_cpu:
                where = "swapped out" if st.on_cpu else "on the device"
                raise KVCacheError(f"seq {seq.seq_id} is {where}")
            blocks.update(st.table)
        return len(blocks)

    # -- admission --------------------------------------------------------------------
    def can_allocate(self, group: SequenceGroup, first_chunk: int | None = None) -> AllocStatus:
        """NEVER if the group's tokens need more blocks than the device holds beyond the
        watermark; OK if they fit now leaving the watermark free; LATER otherwise. The
        sequences of a group share their full prompt blocks (:meth:`allocate`). With
        ``allocate_per_chunk`` and ``first_chunk`` (the tokens the admitting step computes),
        a one-sequence group needs blocks now only for its cached prefix and that chunk
        (:meth:`_by_chunk`); NEVER still judges its whole length."""
        seqs = self._live(group)
        for seq in seqs:
            if seq.seq_id in self._seqs:
                raise KVCacheError(f"seq {seq.seq_id} already holds KV blocks")
        shared = self._shared_prompt_blocks(seqs)
        total = sum(self._blocks_for(seq.num_tokens) for seq in seqs) - shared * (len(seqs) - 1)
        if total > self.num_device_blocks - self.watermark_blocks:
            return AllocStatus.NEVER
        by_chunk = self._by_chunk(seqs, first_chunk)
        need = min(total, self._blocks_for(first_chunk)) if by_chunk else total
        if self.enable_prefix_caching:
            revived: set[int] = set()
            for i, seq in enumerate(seqs):
                hits = self._prefix_hits(seq)
                own = hits if i == 0 else hits[shared:]  # the shared ones are the first's
                if by_chunk:  # one sequence: its chunk starts after its hits
                    need = min(total, self._blocks_for(len(hits) * self.block_size + first_chunk))
                need -= len(own)
                revived.update(b for b, _ in own if self._device.is_evictable(b))
            need += len(revived)  # evictable hits are counted as free now
        if self._device.num_free() - need >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def cached_prefix_tokens(self, group: SequenceGroup) -> int:
        """Leading tokens of the group's first live sequence (its prompt, and for a group
        re-admitted after a recompute preemption its generated tokens too) that the prefix
        cache holds now (whole blocks, never its last token; 0 without prefix caching): what
        :meth:`allocate` would report as cached for a one-sequence group. Read-only: it
        takes, pins and evicts nothing, so a policy may ask it of every waiting group to
        order its admissions."""
        if not self.enable_prefix_caching:
            return 0
        return len(self._prefix_hits(self._live(group)[0])) * self.block_size

    def takes_sparing_hits(self, group: SequenceGroup, limit: int) -> int:
        """How many of the next ``limit`` block allocations, with no release between them,
        evict none of the prefix-cache hits of waiting ``group``'s live sequences (so its
        :meth:`can_allocate` still counts them cached): ``limit`` without prefix caching."""
        if not self.enable_prefix_caching:
            return limit
        hits = {block for seq in self._live(group) for block, _ in self._prefix_hits(seq)}
        return self._device.takes_sparing(hits, limit)

    def allocate(self, group: SequenceGroup, first_chunk: int | None = None) -> int:
        """Give the live sequences blocks for ``seq.num_tokens`` slots each: the first its
        own, every other one the first's full prompt blocks (shared, as after ``fork``; a
        forked group preempted by recompute gets its sharing back) and its own beyond them;
        prefix-cache hits shared. With ``allocate_per_chunk`` and ``first_chunk``, a
        one-sequence group gets slots for its hits and that chunk only; :meth:`grow_prefill`
        gives the later chunks theirs. Returns the cached leading tokens (the minimum over
        sequences)."""
        status = self.can_allocate(group, first_chunk)
        if status is not AllocStatus.OK:
            raise KVCacheError(f"allocate of request {group.request_id}: can_allocate is {status}")
        seqs = group.live_seqs()
        shared = self._shared_prompt_blocks(seqs)
        # Pin every sequence's hits before any new block is taken, so that no eviction
        # can reclaim a block another sequence of the group was counted as reusing.
        hits_of = []
        for i, seq in enumerate(seqs):
            hits = self._prefix_hits(seq) if self.enable_prefix_caching else []
            for block, _ in hits if i == 0 else hits[shared:]:
                self._device.incref(block)
            hits_of.append(hits)
        first = self._state_with_hits(hits_of[0])
        upto = seqs[0].num_tokens
        if self._by_chunk(seqs, first_chunk):
            upto = min(upto, len(hits_of[0]) * self.block_size + first_chunk)
        self._grow(first, upto)
        self._seqs[seqs[0].seq_id] = first
        if len(seqs) > 1 and hits_of[0]:  # its own hits hold K/V beyond the group's minimum
            self._written_by_group[seqs[0].seq_id] = len(hits_of[0]) * self.block_size
        states = [first]
        for seq, hits in zip(seqs[1:], hits_of[1:], strict=True):
            table = first.table[:shared]
            for block in table:
                self._device.incref(block)
            if len(hits) > shared:  # its own cached blocks beyond the prompt
                st = self._state_with_hits(hits)
                st.table[:shared] = table
            else:
                n = min(first.n_hashed, shared)
                last = hits_of[0][n - 1][1] if n else _ROOT_HASH
                st = _SeqState(table, shared * self.block_size, n, last)
            self._grow(st, seq.num_tokens)
            self._seqs[seq.seq_id] = st
            # the shared prompt blocks are the first sequence's to write
            self._written_by_group[seq.seq_id] = max(len(hits), shared) * self.block_size
            states.append(st)
        return min(st.n_hashed for st in states) * self.block_size

    def _by_chunk(self, seqs: list[Sequence], first_chunk: int | None) -> bool:
        """Whether admission allocates only a first chunk: per-chunk allocation, one
        sequence (a group of several, re-admitted after recompute, is allocated whole), a
        chunk given."""
        if not self.allocate_per_chunk or first_chunk is None or len(seqs) != 1:
            return False
        check_at_least(1, first_chunk=first_chunk)
        return True

    def can_grow_prefill(self, seq: Sequence, upto: int) -> bool:
        """Whether :meth:`grow_prefill` to ``upto`` slots finds its blocks free now. Raises
        if growing would write into a partly filled last block the sequence shares (it was
        forked before its prompt's last chunk; :meth:`append` copies that block first)."""
        st = self._device_state(seq.seq_id)
        if upto > st.slots and st.slots % self.block_size:
            last = st.table[-1]
            if self._device.ref[last] > 1:
                raise KVCacheError(
                    f"grow_prefill of seq {seq.seq_id}: its partly filled last block {last} "
                    "is shared (forked mid-prefill); append copies it first"
                )
        return self._blocks_for(upto) - len(st.table) <= self._device.num_free()

    def grow_prefill(self, seq: Sequence, upto: int) -> None:
        """Slots up to ``upto`` for a prompt allocated chunk by chunk (the step computing
        them is being scheduled); the caller has asked :meth:`can_grow_prefill`."""
        st = self._device_state(seq.seq_id)
        if upto > st.slots:
            if not self.can_grow_prefill(seq, upto):
                raise KVCacheError(f"grow_prefill of seq {seq.seq_id}: not enough free blocks")
            self._grow(st, upto)

    def _shared_prompt_blocks(self, seqs: list[Sequence]) -> int:
        """Full prompt blocks the sequences of a group hold in common (0 for one)."""
        return seqs[0].prompt_len // self.block_size if len(seqs) > 1 else 0

    def _state_with_hits(self, hits: list[tuple[int, int]]) -> _SeqState:
        st = _SeqState([b for b, _ in hits], len(hits) * self.block_size)
        if hits:
            st.n_hashed, st.last_hash = len(hits), hits[-1][1]
        return st

    # -- growth -----------------------------------------------------------------------
    def can_append(self, group: SequenceGroup) -> bool:
        return self._append_need(group.live_seqs()) <= self._device.num_free()

    def append(self, group: SequenceGroup) -> list[tuple[int, int]]:
        seqs = group.live_seqs()
        need = self._append_need(seqs)
        free = self._device.num_free()
        if need > free:
            raise KVCacheError(
                f"append for request {group.request_id} needs {need} blocks, {free} free"
            )
        copies: list[tuple[int, int]] = []
        for seq in seqs:
            self._append_seq(seq, self._seqs[seq.seq_id], copies)
        return copies

    def try_append(self, group: SequenceGroup) -> list[tuple[int, int]] | None:
        """:meth:`append` if :meth:`can_append`, else None: the need counted once."""
        if not self._fast_growth:
            return self.append(group) if self.can_append(group) else None
        seqs = group.live_seqs()
        if len(seqs) == 1 and not self.enable_prefix_caching:
            # one sequence one slot behind (a decode): _append_need and _append_seq inlined
            seq, pool = seqs[0], self._device
            st = self._seqs.get(seq.seq_id)
            if st is not None and not st.on_cpu:
                s = st.slots
                if group.request.prompt_len + seq.num_generated == s + 1:
                    table = st.table
                    if s % self.block_size:
                        if pool.ref[table[-1]] == 1:  # unshared: write in place
                            pool.add_fill(table[-1], 1)
                            st.slots = s + 1
                            return []
                    else:  # the last block is full: one new block
                        if not pool.num_free():
                            return None
                        block = pool.allocate()
                        table.append(block)
                        pool.add_fill(block, 1)
                        st.slots = s + 1
                        return []
        if self._append_need(seqs) > self._device.num_free():
            return None
        copies: list[tuple[int, int]] = []
        for seq in seqs:
            self._append_seq(seq, self._seqs[seq.seq_id], copies)
        return copies

    def append_all(self, groups: list[SequenceGroup]) -> list[tuple[int, int]] | None:
        """``append`` for every group in order, if all of them fit together; else None and
        nothing changes. Each group's need is independent of the others' appends (blocks
        are shared across groups only when full, via the prefix cache), so when the sum
        fits, appending one by one would pass every ``can_append``: the result is
        identical. A lone sequence writing one slot into its own partly filled last block
        takes no block, so it is done at once (and undone if the total does not fit). None
        at once in a subclass with growth verbs of its own (:data:`GROWTH_VERBS`)."""
        if not self._fast_growth:
            return None
        if self.enable_prefix_caching:  # registration order matters: strictly in order
            return self._append_all_in_order(groups)
        bs, states, pool = self.block_size, self._seqs, self._device
        ref, fill = pool.ref, pool.fill
        done: list[_SeqState] = []
        rest: list[list[Sequence]] = []
        need = 0
        try:
            for group in groups:
                seqs = group.live_seqs()
                if len(seqs) == 1:  # _append_need inlined for one unshared sequence
                    seq = seqs[0]
                    st = states.get(seq.seq_id)
                    if st is not None and not st.on_cpu:
                        s = st.slots
                        grow = group.request.prompt_len + seq.num_generated - s
                        if grow <= 0:
                            continue
                        off = s % bs
                        if off:
                            if grow == 1 and ref[st.table[-1]] == 1:
                                fill[st.table[-1]] += 1
                                st.slots = s + 1
                                done.append(st)
                                continue
                            need += ref[st.table[-1]] > 1
                            grow -= bs - off
                        if grow > 0:
                            need += -(-grow // bs)
                        rest.append(seqs)
                        continue
                need += self._append_need(seqs)
                rest.append(seqs)
        except BaseException:
            self._undo_one_slot(done)
            raise
        if need > pool.num_free():
            self._undo_one_slot(done)
            return None
        pool.num_filled += len(done)
        copies: list[tuple[int, int]] = []
        for seqs in rest:
            for seq in seqs:
                self._append_seq(seq, states[seq.seq_id], copies)
        return copies

    def lockstep_blocks(self, seqs: list[Sequence], steps: int) -> list[int] | None:
        """Blocks each of ``steps`` consecutive :meth:`append_all` calls would take if every
        call grew each of ``seqs`` by one slot: element ``j`` for the ``j``-th call. None
        unless each sequence is on the device, exactly one slot short of ``num_tokens``
        (a plain decode step), and its last block is unshared (then the calls allocate
        only, never copy; with prefix caching, the blocks they fill are offered to the cache
        by :meth:`register_run` once the caller has the run's tokens), and no prompt holds
        slots no step was scheduled to write (:meth:`lockstep_breakdowns` counts none), nor
        in a subclass with growth verbs of its own (:data:`GROWTH_VERBS`)."""
        if self._prefilling or not self._fast_growth:
            return None
        bs, states, ref = self.block_size, self._seqs, self._device.ref
        per_offset = [0] * bs  # sequences whose next new block comes after j % bs steps
        for seq in seqs:
            st = states.get(seq.seq_id)
            if st is None or st.on_cpu or seq.num_tokens - st.slots != 1:
                return None
            off = st.slots % bs
            if off and ref[st.table[-1]] != 1:
                return None
            per_offset[-off % bs] += 1
        return [per_offset[j % bs] for j in range(steps)]

    def advance_lockstep(self, seqs: list[Sequence], steps: int) -> None:
        """The state ``steps`` consecutive :meth:`append_all` calls growing each of
        ``seqs`` by one slot leave (blocks taken in the same order: call by call, in the
        order of ``seqs``). The caller has checked :meth:`lockstep_blocks` and that the
        blocks it counts are free."""
        if steps <= 0:
            return
        bs, pool, states = self.block_size, self._device, self._seqs
        fill = pool.fill  # add_fill without its checks: every block written is taken
        # A sequence whose last block has room for every step only fills it; the others
        # take blocks, grouped by how many steps until their first new one (mod bs).
        growing: list[_SeqState] = []
        by_offset: list[list[list[int]]] = [[] for _ in range(bs)]
        for seq in seqs:
            st = states[seq.seq_id]
            s = st.slots
            room = -s % bs
            if room >= steps:
                fill[st.table[-1]] += steps
                st.slots = s + steps
            else:
                by_offset[room].append(st.table)
                growing.append(st)
        allocate = pool.allocate
        for j in range(steps):
            for table in by_offset[j % bs]:
                table.append(allocate())
        for st in growing:
            s, table = st.slots, st.table
            st.slots = target = s + steps
            i, room = divmod(s, bs)
            if room:
                room = bs - room
                fill[table[i]] += room
                s += room
                i += 1
            while target - s > bs:
                fill[table[i]] += bs
                s += bs
                i += 1
            fill[table[i]] += target - s
        pool.num_filled += steps * len(seqs)

    def register_run(self, seqs: list[Sequence], lag: int) -> None:
        """With prefix caching, offer each of ``seqs``' full blocks below ``num_computed -
        lag`` tokens to the cache: what the appends of a lockstep run
        (:meth:`advance_lockstep`) offer one call at a time, each below the tokens computed
        when it was made (``lag`` 1 when the run ended with a step's update, 0 when its next
        step was scheduled too). Nothing looks the run's blocks up before this call: they
        hold generated tokens of running sequences only."""
        if not self.enable_prefix_caching:
            return
        states, bs = self._seqs, self.block_size
        for seq in seqs:
            st = states[seq.seq_id]
            # _register_computed's own first test, inlined: most runs fill no new block
            if min(seq.num_computed - lag, st.slots) // bs > st.n_hashed:
                self._register_computed(seq, st, seq.num_computed - lag)

    def lockstep_breakdowns(self, num_seqs: int, new_blocks: list[int]) -> list[MemoryBreakdown]:
        """What :meth:`breakdown` will say after each of ``len(new_blocks)`` lockstep
        growth steps of ``num_seqs`` sequences (:meth:`lockstep_blocks`), without applying
        them."""
        bs, pool = self.block_size, self._device
        tokens, used, logical = pool.num_filled, pool.num_used, pool.ref_total
        free = pool.num_free()
        out = []
        for taken in new_blocks:
            tokens += num_seqs
            used += taken
            logical += taken
            free -= taken
            out.append(new_breakdown(tokens, 0, used * bs - tokens, 0, free * bs, used, logical))
        return out

    def _undo_one_slot(self, states: list[_SeqState]) -> None:
        fill = self._device.fill
        for st in states:
            st.slots -= 1
            fill[st.table[-1]] -= 1

    def _append_all_in_order(self, groups: list[SequenceGroup]) -> list[tuple[int, int]] | None:
        """:meth:`append_all` with prefix caching: every group's need counted first, changing
        nothing, then each group appended and its blocks offered to the cache in order (the
        order decides which of two blocks of one hash is indexed, and a block one group takes
        may evict a block a later group's hash names). A lone sequence writing one slot into
        its own partly filled last block (:meth:`_append_seq`'s common decode step) is
        counted and appended inline."""
        bs, states, pool = self.block_size, self._seqs, self._device
        ref, fill = pool.ref, pool.fill
        work: list[tuple[_SeqState | None, list[Sequence]]] = []
        need = 0
        for group in groups:
            seqs = group.live_seqs()
            if len(seqs) == 1:
                seq = seqs[0]
                st = states.get(seq.seq_id)
                if st is not None and not st.on_cpu:
                    s = st.slots
                    if (
                        group.request.prompt_len + seq.num_generated == s + 1
                        and s % bs
                        and ref[st.table[-1]] == 1
                    ):
                        work.append((st, seqs))  # needs no block
                        continue
            need += self._append_need(seqs)
            work.append((None, seqs))
        if need > pool.num_free():
            return None
        copies: list[tuple[int, int]] = []
        for st, seqs in work:
            if st is None:
                for seq in seqs:
                    self._append_seq(seq, states[seq.seq_id], copies)
                continue
            seq = seqs[0]
            fill[st.table[-1]] += 1  # add_fill without its checks: room, and held
            pool.num_filled += 1
            st.slots += 1
            if min(seq.num_computed, st.slots) // bs > st.n_hashed:
                self._register_computed(seq, st)
        return copies

    def _append_seq(self, seq: Sequence, st: _SeqState, copies: list[tuple[int, int]]) -> None:
        """Grow one sequence to ``seq.num_tokens`` slots (copying a shared last block
        first); the caller has checked that the blocks are there."""
        pool, bs = self._device, self.block_size
        target = seq.num_tokens
        s = st.slots
        if target > s:
            off = s % bs
            if off and pool.ref[st.table[-1]] > 1:
                old = st.table[-1]
                new = pool.allocate()
                pool.add_fill(new, pool.fill[old])
                pool.decref(old)
                st.table[-1] = new
                copies.append((old, new))
            if target == s + 1 and off:  # the common decode step
                pool.add_fill(st.table[-1], 1)
                st.slots = target
            else:
                self._grow(st, target)
        if self.enable_prefix_caching and min(seq.num_computed, st.slots) // bs > st.n_hashed:
            self._register_computed(seq, st)

    def fork(self, parent_seq_id: int, child_seq_id: int) -> list[tuple[int, int]]:
        """Share every block of the parent with the new child (ref + 1). No copies."""
        parent = self._device_state(parent_seq_id)
        if child_seq_id in self._seqs:
            raise KVCacheError(f"fork: child seq {child_seq_id} already holds KV blocks")
        for block in parent.table:
            self._device.incref(block)
        self._seqs[child_seq_id] = _SeqState(
            list(parent.table), parent.slots, parent.n_hashed, parent.last_hash
        )
        # the slots they share are the parent's to write: a fork before the prompt's prefill
        # ends (no shipped scheduler makes one) counts their unwritten slots once, not twice
        self._written_by_group[child_seq_id] = parent.slots
        return []

    def free(self, seq_id: int) -> None:
        st = self._state(seq_id)
        del self._seqs[seq_id]
        self._prefilling.pop(seq_id, None)
        self._written_by_group.pop(seq_id, None)
        (self._cpu if st.on_cpu else self._device).release(st.table)

    # -- swapping ---------------------------------------------------------------------
    def can_swap_out(self, group: SequenceGroup) -> bool:
        return self._distinct_blocks(self._live(group), on_cpu=False) <= self._cpu.num_free()

    def swap_out(self, group: SequenceGroup) -> list[tuple[int, int]]:
        """Each distinct device block of the live sequences gets one CPU block (blocks
        shared within the group stay shared). Returns ``(device, cpu)`` pairs."""
        if not self.can_swap_out(group):
            raise KVCacheError(f"swap_out of request {group.request_id}: CPU pool too small")
        return self._move(group, self._device, self._cpu)

    def can_swap_in(self, group: SequenceGroup) -> bool:
        """Room for the group's blocks and for the slots its next ``append`` takes (exact;
        vLLM v0 reserves one block per sequence instead, which can strand a group whose
        sequences share their last blocks), leaving the watermark free as admission does
        (vLLM v0's ``BlockSpaceManager.can_swap_in``: free − required ≥ watermark blocks)."""
        seqs = self._live(group)
        need = self._distinct_blocks(seqs, on_cpu=True) + self._append_need(seqs, on_cpu=True)
        return self._device.num_free() - need >= self.watermark_blocks

    def swap_in(self, group: SequenceGroup) -> list[tuple[int, int]]:
        """Reverse of :meth:`swap_out`. Returns ``(cpu, device)`` pairs."""
        if not self.can_swap_in(group):
            raise KVCacheError(f"swap_in of request {group.request_id}: not enough device blocks")
        return self._move(group, self._cpu, self._device)

    def _move(self, group: SequenceGroup, src: BlockPool, dst: BlockPool) -> list[tuple[int, int]]:
        mapping: dict[int, int] = {}
        to_cpu = dst is self._cpu
        for seq in group.live_seqs():
            st = self._seqs[seq.seq_id]
            table = st.table
            for i, block in enumerate(table):
                moved = mapping.get(block)
                if moved is None:
                    moved = dst.allocate()
                    dst.add_fill(moved, src.fill[block])
                    mapping[block] = moved
                else:
                    dst.incref(moved)
                table[i] = moved
                src.decref(block)
            st.on_cpu = to_cpu
        return list(mapping.items())

    # -- inspection -------------------------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the sequence's device block table (raises if swapped out)."""
        return list(self._device_state(seq_id).table)

    def cpu_block_table(self, seq_id: int) -> list[int]:
        """A copy of a swapped-out sequence's CPU block table."""
        st = self._state(seq_id)
        if not st.on_cpu:
            raise KVCacheError(f"seq {seq_id} is on the device, not swapped out")
        return list(st.table)

    def is_swapped(self, seq_id: int) -> bool:
        return self._state(seq_id).on_cpu

    def num_slots(self, seq_id: int) -> int:
        return self._state(seq_id).slots

    @property
    def device_pool(self) -> BlockPool:
        """The device blocks' ref counts and fills (read only; for tests and metrics)."""
        return self._device

    @property
    def cpu_pool(self) -> BlockPool:
        return self._cpu

    def num_free_blocks(self) -> int:
        """Device blocks free or evictable."""
        return self._device.num_free()

    def num_free_cpu_blocks(self) -> int:
        return self._cpu.num_free()

    def blocks_without_sharing(self) -> int:
        """Device blocks the live sequences would use if no block were shared."""
        return self._device.ref_total

    def blocks_saved_by_sharing(self) -> int:
        """Blocks needed without sharing minus blocks used (Kwon et al., Fig. 14/15)."""
        return self._device.ref_total - self._device.num_used

    def breakdown(self) -> MemoryBreakdown:
        """Token states are the filled slots less :meth:`unwritten_slots`, which are
        ``reserved``: a prompt allocated whole at admission (vLLM v0's rule; also a group of
        several sequences under V1's) holds, with chunked prefill, slots of later chunks
        that no step has been scheduled to write yet."""
        bs, pool = self.block_size, self._device
        ahead = self.unwritten_slots() if self._prefilling else 0
        tokens = pool.num_filled - ahead
        return new_breakdown(
            token_states=tokens,
            reserved=ahead,
            internal_frag=pool.num_used * bs - tokens - ahead,
            allocator_padding=0,
            free=pool.num_free() * bs,
            physical_blocks=pool.num_used,
            logical_blocks=pool.ref_total,
        )

    def unwritten_slots(self) -> int:
        """Device slots allocated to prompts that no step has been scheduled to write yet
        (chunked prefill's later chunks)."""
        seqs = self._seqs
        return sum(
            seqs[sid].slots - written
            for sid, written in self._prefilling.items()
            if not seqs[sid].on_cpu
        )

    def held_seq_ids(self) -> set[int]:
        return set(self._seqs)

    def check_integrity(self) -> None:
        """Recount ref counts from every block table (device and CPU) and check each
        table's length and fills against the sequence's slots, then the pools, then that
        the breakdown's parts are not negative and sum to the capacity. The first sequence
        (in admission order) whose table is wrong is named."""
        bs = self.block_size
        for sid, written in self._prefilling.items():
            if sid not in self._seqs or not 0 <= written < self._seqs[sid].slots:
                raise KVCacheError(f"seq {sid}: {written} slots written, a prefill in progress")
        ids, states = list(self._seqs), list(self._seqs.values())
        count = len(states)
        lengths = np.fromiter((len(st.table) for st in states), dtype=np.int64, count=count)
        slots = np.fromiter((st.slots for st in states), dtype=np.int64, count=count)
        on_cpu = np.fromiter((st.on_cpu for st in states), dtype=bool, count=count)
        bad_length = (lengths != -(-slots // bs)) | (slots < 1)
        checked = np.arange(count) < (bad_length.argmax() if bad_length.any() else count)
        refs: dict[bool, np.ndarray] = {}
        breaches = []
        for side, pool in ((False, self._device), (True, self._cpu)):
            picked = np.flatnonzero(checked & (on_cpu == side))
            tables = [states[k].table for k in picked.tolist()]
            refs[side], breach = check_block_tables(tables, lengths[picked], slots[picked], pool)
            if breach is not None:
                at = int(picked[breach[0]])
                breaches.append((at, f"seq {ids[at]}: {breach[1]}"))
        if breaches:
            raise KVCacheError(min(breaches)[1])
        if not checked.all():
            at = int(bad_length.argmax())
            raise KVCacheError(f"seq {ids[at]}: {lengths[at]} blocks for {slots[at]} slots")
        self._device.check_integrity(refs[False])
        self._cpu.check_integrity(refs[True])
        parts = self.breakdown()
        if parts.total != self.num_device_blocks * bs:
            raise KVCacheError(
                f"breakdown sums to {parts.total}, capacity {self.num_device_blocks * bs}"
            )
        for name in ("token_states", "reserved", "internal_frag", "allocator_padding", "free"):
            if getattr(parts, name) < 0:
                raise KVCacheError(f"breakdown has {name} {getattr(parts, name)}: {parts}")
