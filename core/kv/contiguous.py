"""Contiguous-reservation KV-cache manager (the Orca baselines of Kwon et al., SOSP 2023).

Every sequence owns one contiguous region of slots from a :class:`BuddyAllocator`
(unit = slot, ``min_block = block_size`` so regions are block-aligned). At admission a
group reserves ``sampling.num_seqs`` regions, one per parallel sample or beam (§6.1,
"Orca" baselines). The reservation per sequence follows the policy:

- ``max``: ``max_model_len`` slots (Orca (Max));
- ``pow2``: ``prompt_len + next_power_of_two(output_len)``, capped at ``max_model_len``
  (Orca (Pow2): "true output 25 -> 32 positions");
- ``oracle``: ``prompt_len + output_len`` (Orca (Oracle)).

The buddy rounds a reservation up to a power of two (``allocator_padding``).

Choices where the paper is silent:

- A request whose ``prompt_len + output_len`` exceeds ``max_model_len`` is NEVER admitted,
  under every policy, since no reservation may be smaller than the true need.
- The first sequence uses region 0; ``fork`` moves the child into a spare region of the
  group and returns the block copies of the parent's filled blocks, so a scheduler must
  ``free`` dropped beams before forking new ones. ``free`` returns a region to its group;
  when the group holds no sequence any more, all its regions go back to the buddy.
- Orca does not preempt: ``can_swap_out`` / ``can_swap_in`` are False.

Breakdown per sequence with stored slots S, true need T = prompt_len + output_len,
reservation R and allocated block A: token_states = S, reserved = T - S,
internal_frag = R - T, allocator_padding = A - R; a spare region counts wholly (A) as
reserved; free is the buddy's free units. Should S ever pass T, the excess counts as
token states taken from internal fragmentation.
"""

from __future__ import annotations

from typing import ClassVar

from core.defaults import DEFAULT_BLOCK_SIZE
from core.kv.base import (
    GROWTH_VERBS,
    AllocStatus,
    KVCacheError,
    MemoryBreakdown,
    new_breakdown,
    overrides,
)
from core.kv.buddy import BuddyAllocator, next_power_of_two
from core.request import Request, Sequence, SequenceGroup

POLICIES = ("max", "pow2", "oracle")


class _Group:
    """The regions reserved for one request."""

    __slots__ = ("need", "num_held", "regions", "request_id", "reservation", "size", "spare")

    def __init__(
        self, request_id: int, regions: list[int], size: int, reservation: int, need: int
    ) -> None:
        self.request_id = request_id
        self.regions = regions  # region start addresses (slots)
        self.size = size  # A: allocated slots per region
        self.reservation = reservation  # R
        self.need = need  # T
        self.spare = list(range(len(regions) - 1, -1, -1))  # pop() gives region 0 first
        self.num_held = 0


class _Seq:
    __slots__ = ("group", "region", "slots")

    def __init__(self, group: _Group, region: int, slots: int) -> None:
        self.group = group
        self.region = region
        self.slots = slots


class ContiguousKVCacheManager:
    """Implements :class:`core.kv.base.KVCacheManager` with one buddy region per sequence. A
    subclass (a KV manager plugin, ``core.systems.SystemSpec.manager``) may override
    :meth:`reservation`; one that overrides a verb of :data:`core.kv.base.GROWTH_VERBS` has
    the fast forms of growth defer to it."""

    # False in a subclass overriding one of GROWTH_VERBS
    _fast_growth: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._fast_growth = not overrides(cls, ContiguousKVCacheManager, GROWTH_VERBS)

    def __init__(
        self,
        capacity_slots: int,
        policy: str,
        max_model_len: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown contiguous policy {policy!r}; expected one of {POLICIES}")
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {block_size}")
        if capacity_slots < block_size or capacity_slots % block_size:
            raise ValueError(
                f"capacity_slots={capacity_slots} must be a positive multiple of "
                f"block_size={block_size}"
            )
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        self.policy = policy
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.capacity_slots = capacity_slots
        self.num_device_blocks = capacity_slots // block_size
        self.allocator = BuddyAllocator(capacity_slots, min_block=block_size)
        self._groups: dict[int, _Group] = {}  # request_id -> regions
        self._seqs: dict[int, _Seq] = {}
        self._tokens = 0
        self._reserved = 0
        self._frag = 0
        self._padding = 0

    # -- policy -----------------------------------------------------------------------
    def reservation(self, request: Request) -> int:
        """Slots reserved per sequence of ``request`` under this manager's policy."""
        if self.policy == "max":
            return self.max_model_len
        if self.policy == "pow2":
            return min(
                request.prompt_len + next_power_of_two(request.output_len), self.max_model_len
            )
        return request.total_len

    def reservation_said(self, request: Request) -> str:
        """What :meth:`reservation` holds for ``request``, for a rejection: whose rule (the
        shipped policy's, or a subclass's own) gives how many slots per sequence, and the
        buddy's size class where it rounds them up."""
        slots = self.reservation(request)
        if type(self).reservation is ContiguousKVCacheManager.reservation:
            text = f"the {self.policy} policy reserves {slots} slots per sequence"
        else:  # a plugin's manager (core.systems.SystemSpec.manager) reserves its own
            text = f"{type(self).__name__}.reservation gives {slots} slots per sequence"
        held = self.allocator.block_size_for(slots)
        if held != slots:  # the buddy's size class is what must fit
            text += f", which the buddy allocator rounds up to {held}"
        return text

    def _reservation_of(self, request: Request) -> int:
        """:meth:`reservation`, held to a whole number of slots (a subclass's may return a
        float, e.g. ``1.1 * request.total_len``, which the buddy cannot size)."""
        slots = self.reservation(request)
        if isinstance(slots, bool) or not isinstance(slots, int):
            raise KVCacheError(
                f"{type(self).__name__}.reservation gave {slots!r} ({type(slots).__name__}) "
                f"for request {request.request_id}: a reservation is a whole number of slots, "
                "an int"
            )
        return slots

    def region(self, seq_id: int) -> tuple[int, int]:
        """``(start slot, allocated slots)`` of the sequence's region."""
        s = self._state(seq_id)
        return s.group.regions[s.region], s.group.size

    # -- helpers ----------------------------------------------------------------------
    def _state(self, seq_id: int) -> _Seq:
        s = self._seqs.get(seq_id)
        if s is None:
            raise KVCacheError(f"unknown seq_id {seq_id}: it holds no KV region")
        return s

    @staticmethod
    def _parts(slots: int, g: _Group) -> tuple[int, int, int]:
        """(token_states, reserved, internal_frag) of one sequence."""
        used = max(g.need, slots)
        return slots, used - slots, g.reservation - used

    def _add_seq(self, g: _Group, slots: int, sign: int) -> None:
        tok, res, frag = self._parts(slots, g)
        self._tokens += sign * tok
        self._reserved += sign * res
        self._frag += sign * frag
        self._padding += sign * (g.size - g.reservation)
        self._reserved -= sign * g.size  # the region stops (or starts) being spare

    def _set_slots(self, s: _Seq, slots: int) -> None:
        g = s.group
        tok0, res0, frag0 = self._parts(s.slots, g)
        tok1, res1, frag1 = self._parts(slots, g)
        self._tokens += tok1 - tok0
        self._reserved += res1 - res0
        self._frag += frag1 - frag0
        s.slots = slots

    # -- admission --------------------------------------------------------------------
    def can_allocate(self, group: SequenceGroup, first_chunk: int | None = None) -> AllocStatus:
        """NEVER if the request is longer than ``max_model_len``, or ``num_seqs`` regions
        cannot fit even in an empty allocator; LATER if they do not fit now; else OK.
        ``first_chunk`` is ignored: a reservation is whole."""
        request = group.request
        if group.request_id in self._groups:
            raise KVCacheError(f"request {group.request_id} already holds KV regions")
        reservation = self._reservation_of(request)
        n = group.sampling.num_seqs
        if request.total_len > self.max_model_len or len(group.live_seqs()) > n:
            return AllocStatus.NEVER
        if any(seq.num_tokens > reservation for seq in group.live_seqs()):
            return AllocStatus.NEVER
        size = self.allocator.block_size_for(reservation)
        if n > self.capacity_slots // size:  # an empty buddy holds capacity // size blocks
            return AllocStatus.NEVER
        return AllocStatus.OK if self.allocator.count_fit(size) >= n else AllocStatus.LATER

    def allocate(self, group: SequenceGroup, first_chunk: int | None = None) -> int:
        """Reserve ``num_seqs`` regions; live sequences take regions 0, 1, ... with
        ``seq.num_tokens`` stored slots each. Returns 0 (no prefix caching)."""
        status = self.can_allocate(group)
        if status is not AllocStatus.OK:
            raise KVCacheError(f"allocate of request {group.request_id}: can_allocate is {status}")
        reservation = self._reservation_of(group.request)
        size = self.allocator.block_size_for(reservation)
        regions = []
        for _ in range(group.sampling.num_seqs):
            addr = self.allocator.alloc(size)
            assert addr is not None  # count_fit said they fit
            regions.append(addr)
        g = _Group(group.request_id, regions, size, reservation, group.request.total_len)
        self._groups[group.request_id] = g
        self._reserved += size * len(regions)
        for seq in group.live_seqs():
            self._take_region(g, seq.seq_id, seq.num_tokens)
        return 0

    def _take_region(self, g: _Group, seq_id: int, slots: int) -> _Seq:
        s = _Seq(g, g.spare.pop(), slots)
        g.num_held += 1
        self._seqs[seq_id] = s
        self._add_seq(g, slots, +1)
        return s

    # -- growth -----------------------------------------------------------------------
    def can_append(self, group: SequenceGroup) -> bool:
        for seq in group.live_seqs():
            if seq.num_tokens > self._state(seq.seq_id).group.reservation:
                return False
        return True

    def append(self, group: SequenceGroup) -> list[tuple[int, int]]:
        """Advance each live sequence's stored length to ``seq.num_tokens``."""
        if not self.can_append(group):
            raise KVCacheError(
                f"append for request {group.request_id} would exceed its reservation of "
                f"{self.reservation(group.request)} slots"
            )
        for seq in group.live_seqs():
            s = self._seqs[seq.seq_id]
            if seq.num_tokens > s.slots:
                self._set_slots(s, seq.num_tokens)
        return []

    def lockstep_blocks(self, seqs: list[Sequence], steps: int) -> list[int] | None:
        """No new blocks (regions are reserved whole), if each sequence is one slot short
        of its tokens and stays within its true length and its reservation for all
        ``steps`` (so each append fits its reservation and only moves slots from reserved to
        token states; a subclass's :meth:`reservation` short of the true length is outgrown
        in a step run alone, which stops the run); None in a subclass with growth verbs of
        its own (:data:`~core.kv.base.GROWTH_VERBS`)."""
        if not self._fast_growth:
            return None
        states = self._seqs
        for seq in seqs:
            s = states.get(seq.seq_id)
            if s is None or seq.num_tokens - s.slots != 1:
                return None
            if s.slots + steps > min(s.group.need, s.group.reservation):
                return None
        return [0] * steps

    def lockstep_breakdowns(self, num_seqs: int, new_blocks: list[int]) -> list[MemoryBreakdown]:
        free = self.allocator.free_units
        blocks = (self.capacity_slots - free) // self.block_size
        tokens, reserved, frag, padding = self._tokens, self._reserved, self._frag, self._padding
        out = []
        for _ in new_blocks:
            tokens += num_seqs
            reserved -= num_seqs  # within the true length: used stays at need
            out.append(new_breakdown(tokens, reserved, frag, padding, free, blocks, blocks))
        return out

    def advance_lockstep(self, seqs: list[Sequence], steps: int) -> None:
        states = self._seqs
        for seq in seqs:
            s = states[seq.seq_id]
            self._set_slots(s, s.slots + steps)

    def register_run(self, seqs: list[Sequence], lag: int) -> None:
        """Nothing: contiguous KV has no prefix cache."""

    def try_append(self, group: SequenceGroup) -> list[tuple[int, int]] | None:
        return self.append(group) if self.can_append(group) else None

    def append_all(self, groups: list[SequenceGroup]) -> list[tuple[int, int]] | None:
        """``append`` for every group in order if every one fits its reservation; else
        None and nothing changes. Regions are private, so the result is identical. None at
        once in a subclass with growth verbs of its own (:data:`~core.kv.base.GROWTH_VERBS`)."""
        if not self._fast_growth:
            return None
        states = self._seqs
        advanced: list[tuple[_Seq, int]] = []  # (sequence, slots before), to undo
        tokens = reserved = frag = 0
        for group in groups:
            prompt_len = group.request.prompt_len
            for seq in group.live_seqs():
                s = states.get(seq.seq_id)
                target = prompt_len + seq.num_generated
                if s is None or target > s.group.reservation:
                    for t, slots in advanced:
                        t.slots = slots
                    if s is None:
                        raise KVCacheError(f"unknown seq_id {seq.seq_id}: it holds no KV region")
                    return None
                slots = s.slots
                if target > slots:
                    # _set_slots inlined: reserved max(T, S) - S, frag R - max(T, S)
                    need = s.group.need
                    used0 = need if need > slots else slots
                    used1 = need if need > target else target
                    tokens += target - slots
                    reserved += (used1 - target) - (used0 - slots)
                    frag += used0 - used1
                    s.slots = target
                    advanced.append((s, slots))
        self._tokens += tokens
        self._reserved += reserved
        self._frag += frag
        return []

    def fork(self, parent_seq_id: int, child_seq_id: int) -> list[tuple[int, int]]:
        """Put the child in a spare region of the parent's group; return the block copies
        ``(src, dst)`` of the parent's filled blocks."""
        parent = self._state(parent_seq_id)
        g = parent.group
        if child_seq_id in self._seqs:
            raise KVCacheError(f"fork: child seq {child_seq_id} already holds a KV region")
        if not g.spare:
            raise KVCacheError(
                f"fork of seq {parent_seq_id}: its group has no spare region "
                f"({len(g.regions)} reserved, all in use); free a sequence first"
            )
        child = self._take_region(g, child_seq_id, parent.slots)
        bs = self.block_size
        src = g.regions[parent.region] // bs
        dst = g.regions[child.region] // bs
        return [(src + i, dst + i) for i in range(-(-parent.slots // bs))]

    def note_computed(self, seq: Sequence) -> None:
        """Nothing: contiguous regions are not shared by prefix."""

    def free(self, seq_id: int) -> None:
        s = self._state(seq_id)
        g = s.group
        del self._seqs[seq_id]
        self._add_seq(g, s.slots, -1)
        g.spare.append(s.region)
        g.num_held -= 1
        if g.num_held == 0:
            for addr in g.regions:
                self.allocator.free(addr)
            self._reserved -= g.size * len(g.regions)
            del self._groups[g.request_id]

    # -- swapping: Orca does not preempt ------------------------------------------------
    def can_swap_out(self, group: SequenceGroup) -> bool:
        return False

    def swap_out(self, group: SequenceGroup) -> list[tuple[int, int]]:
        raise KVCacheError("the contiguous manager does not swap (Orca does not preempt)")

    def can_swap_in(self, group: SequenceGroup) -> bool:
        return False

    def swap_in(self, group: SequenceGroup) -> list[tuple[int, int]]:
        raise KVCacheError("the contiguous manager does not swap (Orca does not preempt)")

    # -- inspection -------------------------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]:
        """Consecutive block ids of the region covering the sequence's stored slots."""
        s = self._state(seq_id)
        first = s.group.regions[s.region] // self.block_size
        return list(range(first, first + -(-s.slots // self.block_size)))

    def num_slots(self, seq_id: int) -> int:
        return self._state(seq_id).slots

    def num_free_blocks(self) -> int:
        return self.allocator.free_units // self.block_size

    def breakdown(self) -> MemoryBreakdown:
        free = self.allocator.free_units
        blocks = (self.capacity_slots - free) // self.block_size
        return new_breakdown(
            token_states=self._tokens,
            reserved=self._reserved,
            internal_frag=self._frag,
            allocator_padding=self._padding,
            free=free,
            physical_blocks=blocks,
            logical_blocks=blocks,
        )

    def held_seq_ids(self) -> set[int]:
        return set(self._seqs)

    def check_integrity(self) -> None:
        """Check the buddy, that each group's regions are allocated at their size, that no
        two sequences share a region, stored lengths fit their reservations, and that the
        breakdown counters match a recount."""
        self.allocator.check_integrity()
        tokens = reserved = frag = padding = 0
        owned: dict[int, int] = {}
        held_by: dict[int, list[_Seq]] = {}
        for s in self._seqs.values():
            held_by.setdefault(id(s.group), []).append(s)
        for rid, g in self._groups.items():
            if g.num_held < 1:
                raise KVCacheError(f"request {rid} holds regions but no sequence")
            for addr in g.regions:
                if self.allocator.allocated_size(addr) != g.size:
                    raise KVCacheError(f"request {rid}: region {addr} is not {g.size} slots")
            held = held_by.pop(id(g), [])
            if len(held) != g.num_held or len(held) + len(g.spare) != len(g.regions):
                raise KVCacheError(f"request {rid}: regions held and spare do not add up")
            if sorted([s.region for s in held] + g.spare) != list(range(len(g.regions))):
                raise KVCacheError(f"request {rid}: a region is used twice or lost")
            reserved += g.size * len(g.spare)
        if held_by:
            raise KVCacheError("a sequence holds a region of a group that was released")
        for sid, s in self._seqs.items():
            g = s.group
            addr = g.regions[s.region]
            if addr in owned:
                raise KVCacheError(f"seqs {owned[addr]} and {sid} share region {addr}")
            owned[addr] = sid
            if not 1 <= s.slots <= g.reservation:
                raise KVCacheError(f"seq {sid}: {s.slots} slots, reservation {g.reservation}")
            t, r, f = self._parts(s.slots, g)
            tokens, reserved, frag = tokens + t, reserved + r, frag + f
            padding += g.size - g.reservation
        counted = (tokens, reserved, frag, padding)
        kept = (self._tokens, self._reserved, self._frag, self._padding)
        if counted != kept:
            raise KVCacheError(f"breakdown counters {kept} but recount gives {counted}")
        total = self.breakdown().total
        if total != self.capacity_slots:
            raise KVCacheError(f"breakdown sums to {total}, capacity {self.capacity_slots}")
