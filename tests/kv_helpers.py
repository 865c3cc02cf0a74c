"""Groups and forked sequences for the KV-cache manager tests (ids unique per process)."""

from __future__ import annotations

import itertools
from typing import Generic, TypeVar

from hypothesis.stateful import RuleBasedStateMachine

from core.kv.base import KVCacheManager
from core.request import Request, SamplingParams, Sequence, SequenceGroup

_next_id = itertools.count()

M = TypeVar("M")


def make_group(
    prompt_len: int,
    output_len: int = 10,
    n: int = 1,
    prompt: tuple[int, ...] | None = None,
) -> SequenceGroup:
    rid = next(_next_id)
    req = Request(rid, 0.0, prompt_len, output_len, SamplingParams(n=n), prompt)
    return SequenceGroup(req, first_seq_id=next(_next_id))


def spawn(parent: Sequence) -> Sequence:
    """A child of ``parent`` in the same state, appended to its group (as a fork makes)."""
    child = Sequence(next(_next_id), parent.group)
    child.num_generated = parent.num_generated
    child.num_computed = parent.num_computed
    child.output_token_ids = list(parent.output_token_ids)
    child.status = parent.status
    parent.group.seqs.append(child)
    return child


def admit_and_fork(m: KVCacheManager, prompt_len: int) -> tuple[SequenceGroup, Sequence]:
    """An ``n=2`` group of ``prompt_len`` admitted to ``m``, then its first sequence forked
    (as parallel sampling starts); returns the group and the child."""
    g = make_group(prompt_len, n=2)
    m.allocate(g)
    child = spawn(g.seqs[0])
    m.fork(g.seqs[0].seq_id, child.seq_id)
    return g, child


class ManagerMachine(RuleBasedStateMachine, Generic[M]):
    """A state machine over one KV-cache manager ``self.m``, built by its initialize rule
    (Hypothesis runs rules and invariants only after the initialize rules)."""

    def __init__(self) -> None:
        super().__init__()
        self.m: M | None = None

    def manager(self) -> M:
        assert self.m is not None, "the initialize rule builds the manager"
        return self.m
