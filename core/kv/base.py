"""The KV-cache manager protocol shared by the paged and contiguous managers.

Units: every size is in *token slots* unless named ``*_blocks``. A slot holds the K and V
of one token for all layers; the byte size of a slot is the model's business
(``sim.catalog``), not the manager's.

Ask-then-commit: a caller asks ``can_allocate`` / ``can_append`` / ``can_swap_in`` /
``can_swap_out`` and only then calls the committing verb. A committing verb called when
its question would have said no raises :class:`KVCacheError` (the state is unchanged).

Sequences are identified by ``seq_id`` (unique within one scheduler). Group-level verbs
take a :class:`~core.request.SequenceGroup`; they act on the group's live sequences.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from core.request import Sequence, SequenceGroup


class KVCacheError(RuntimeError):
    """A manager verb was misused (no room, unknown sequence, broken invariant)."""


def check_at_least(minimum: int, error: type[Exception] = ValueError, **sizes: int) -> None:
    """Raise ``error("<name> must be >= <minimum>, got <value>")`` for the first of
    ``sizes`` below ``minimum`` (the geometry checks of the managers and the engine's
    cache)."""
    for name, value in sizes.items():
        if value < minimum:
            raise error(f"{name} must be >= {minimum}, got {value}")


# The verbs a manager of one's own (a subclass of a shipped manager) may override to change
# how sequences grow or how memory is counted. The shipped managers' fast forms of growth
# (``try_append``, ``append_all`` and the lockstep verbs of the simulator's runs of decode
# steps) do the same work inline; in a subclass that overrides any of these verbs they defer
# to them instead (``try_append`` asks ``can_append`` and calls ``append``, ``append_all`` and
# ``lockstep_blocks`` return None), so both bodies call the subclass's verbs.
GROWTH_VERBS = ("can_append", "append", "breakdown")


def overrides(cls: type, base: type, names: tuple[str, ...]) -> bool:
    """Whether ``cls``, a subclass of ``base``, defines any of ``names`` otherwise."""
    return any(getattr(cls, name) is not getattr(base, name) for name in names)


class AllocStatus(enum.Enum):
    OK = "ok"  # can be allocated now
    LATER = "later"  # not now, but would fit in an empty cache
    NEVER = "never"  # would not fit even in an empty cache


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Where the device KV slots are at one instant; the five parts sum to ``total``.

    - ``token_states``: slots holding K/V of tokens (prompt and generated so far);
      a physical slot shared by several sequences counts once.
    - ``reserved``: slots set aside for tokens the request *will* generate (its true
      output, not yet produced). Paged: the slots of a prompt allocated whole at admission
      that no step has been scheduled to write yet (chunked prefill's later chunks).
    - ``internal_frag``: slots allocated that hold no token and are not reserved for one:
      over-reservation beyond the true output (contiguous) or the unfilled slots of
      allocated blocks (paged; see below).
    - ``allocator_padding``: slots lost to the allocator's size classes (buddy rounding
      of a reservation up to a power of two). Zero for paged allocation.
    - ``free``: slots not allocated to anyone.

    Paged blocks that are allocated but not yet filled by a still-growing sequence count
    as ``internal_frag`` (they are the paper's "within one block per sequence" waste).

    Beside the slots, two block counts (not part of ``total``) measure sharing:

    - ``physical_blocks``: device blocks allocated (a block shared by k sequences once);
    - ``logical_blocks``: device blocks the sequences' block tables reference, a shared
      block once per holder, i.e. the blocks needed if nothing were shared.

    ``logical_blocks - physical_blocks`` is the paper's "blocks saved by sharing"
    (Kwon et al., Fig. 15). Contiguous managers never share: both count allocated slots
    in blocks of ``block_size``.
    """

    token_states: int
    reserved: int
    internal_frag: int
    allocator_padding: int
    free: int
    physical_blocks: int = 0
    logical_blocks: int = 0

    @property
    def total(self) -> int:
        return (
            self.token_states
            + self.reserved
            + self.internal_frag
            + self.allocator_padding
            + self.free
        )


def _breakdown_factory() -> Callable[..., MemoryBreakdown]:
    """``MemoryBreakdown(*parts)`` that writes the slots directly: the same (frozen) object
    for half the cost of the generated frozen ``__init__`` (managers build one per step)."""
    new = object.__new__
    setters = (getattr(MemoryBreakdown, n).__set__ for n in MemoryBreakdown.__slots__)
    s0, s1, s2, s3, s4, s5, s6 = setters

    def make(
        token_states: int,
        reserved: int,
        internal_frag: int,
        allocator_padding: int,
        free: int,
        physical_blocks: int,
        logical_blocks: int,
    ) -> MemoryBreakdown:
        obj = new(MemoryBreakdown)
        s0(obj, token_states)
        s1(obj, reserved)
        s2(obj, internal_frag)
        s3(obj, allocator_padding)
        s4(obj, free)
        s5(obj, physical_blocks)
        s6(obj, logical_blocks)
        return obj

    return make


new_breakdown = _breakdown_factory()


@runtime_checkable
class KVCacheManager(Protocol):
    """What schedulers and executors may ask of a KV-cache manager."""

    block_size: int  # slots per block (paged) or the allocation granule (contiguous)
    num_device_blocks: int  # device capacity in blocks (capacity in slots = x * block_size)

    # -- admission ------------------------------------------------------------------
    def can_allocate(self, group: SequenceGroup, first_chunk: int | None = None) -> AllocStatus:
        """Whether the group's prompt (or, for a preempted-by-recompute group, its prompt
        plus generated tokens) can get slots now, and for contiguous policies its whole
        reservation for every sequence the group will fork into."""
        ...

    def allocate(self, group: SequenceGroup, first_chunk: int | None = None) -> int:
        """Give the waiting group's live sequence slots for its ``num_tokens`` tokens
        (contiguous: reserve regions for all ``sampling.num_seqs`` sequences up front).
        Returns how many leading tokens already have their K/V cached (a prefix-cache
        hit; always 0 without prefix caching); the scheduler starts prefill there."""
        ...

    # -- growth ---------------------------------------------------------------------
    def can_append(self, group: SequenceGroup) -> bool:
        """Whether every live sequence of the group can take one more token slot."""
        ...

    def append(self, group: SequenceGroup) -> list[tuple[int, int]]:
        """Give every live sequence a slot for its next token (so that its stored length
        equals ``seq.num_tokens``). Returns copy-on-write block copies ``(src, dst)``
        the executor must perform before the step (paged; empty for contiguous)."""
        ...

    def lockstep_blocks(self, seqs: list[Sequence], steps: int) -> list[int] | None:
        """New blocks each of ``steps`` consecutive decode appends of ``seqs`` (each one
        slot short of its tokens, growing one slot a step, in this order) would take; None
        unless such appends are plain (no copy, no registration, nothing outgrown)."""
        ...

    def lockstep_breakdowns(self, num_seqs: int, new_blocks: list[int]) -> list[MemoryBreakdown]:
        """The breakdown after each of those appends, without applying them."""
        ...

    def advance_lockstep(self, seqs: list[Sequence], steps: int) -> None:
        """The state ``steps`` of those appends leave, at once."""
        ...

    def register_run(self, seqs: list[Sequence], lag: int) -> None:
        """After a lockstep run, what the appends would have registered in a prefix cache:
        full blocks below ``num_computed - lag`` tokens (nothing without a cache)."""
        ...

    def try_append(self, group: SequenceGroup) -> list[tuple[int, int]] | None:
        """``append(group)`` if ``can_append(group)``, else None and nothing changes."""
        ...

    def append_all(self, groups: list[SequenceGroup]) -> list[tuple[int, int]] | None:
        """The batched decode step: if ``can_append`` would hold for every group with the
        groups appended one after another, ``append`` each in order and return all their
        copies (exactly what the one-by-one calls give); otherwise change nothing and
        return None (the caller then goes group by group, preempting as it must)."""
        ...

    def fork(self, parent_seq_id: int, child_seq_id: int) -> list[tuple[int, int]]:
        """Make ``child`` hold the same tokens as ``parent``. Paged: share every block
        (ref counts +1). Contiguous: move into one of the group's reserved regions and
        return the block copies ``(src, dst)`` the executor must perform."""
        ...

    def note_computed(self, seq: Sequence) -> None:
        """The step that computed ``seq``'s tokens up to ``seq.num_computed`` has ended.
        Paged with prefix caching: its full blocks are now offered to the cache (a request
        admitted in the next step finds them; so does one after ``seq`` finished). Others:
        nothing."""
        ...

    def free(self, seq_id: int) -> None:
        """Release the sequence's device (or swapped CPU) slots. Unknown ids raise."""
        ...

    # -- swapping -------------------------------------------------------------------
    def can_swap_out(self, group: SequenceGroup) -> bool: ...

    def swap_out(self, group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the group's device blocks to the CPU pool: returns ``(device, cpu)``."""
        ...

    def can_swap_in(self, group: SequenceGroup) -> bool: ...

    def swap_in(self, group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the group's CPU blocks back to the device: returns ``(cpu, device)``."""
        ...

    # -- inspection -----------------------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]:
        """Device block ids holding the sequence's slots, in token order."""
        ...

    def num_slots(self, seq_id: int) -> int:
        """Token slots the sequence holds K/V for (or has been given for its next token)."""
        ...

    def breakdown(self) -> MemoryBreakdown:
        """The device memory breakdown now. O(1): managers keep running counters."""
        ...

    def num_free_blocks(self) -> int: ...

    def held_seq_ids(self) -> set[int]:
        """The sequences holding KV now, on the device or swapped to the CPU (not blocks
        kept for a prefix cache). O(sequences); for checks."""
        ...

    def check_integrity(self) -> None:
        """Recompute every counter from scratch and raise KVCacheError on a mismatch
        (overlaps, ref counts, free lists, breakdown). For tests; may be slow."""
        ...
