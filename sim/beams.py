"""The simulator's stand-in for beam search: real top-``width`` selection on seeded scores.

The simulator has no logits, so the log-probabilities are drawn; the *selection* is the real
one. Each step, every live beam ``i`` of a group (cumulative log-probability ``s_i``, kept
in ``Sequence.cum_logprob``) proposes ``width`` candidate tokens with log-probability
increments ``d_ij``; the ``width`` candidates with the largest ``s_i + d_ij`` survive, as in
beam search with length penalty 1 and EOS ignored (output lengths come from the trace).
Proposing ``width`` candidates per beam is exact, not an approximation: no beam can place
more than ``width`` children among the top ``width``. A beam none of whose candidates
survives leaves no child and is freed; one with ``k`` surviving candidates continues as one
of them and forks ``k - 1`` children (the scheduler's ``_apply_beams`` does both), so
blocks are shared exactly where real beam search would share them.

The stated distribution: increments are i.i.d. ``d_ij = -X_ij`` with ``X_ij ~ Exponential(1)``
(the negative log-probability of a candidate token), drawn from the simulator's seeded
generator. Which beams survive is invariant to the scale of ``X``: every score is a sum of
increments, so a common factor cannot change a ranking. A group's first beam-search step
(its prompt's first token) proposes ``width`` candidates from its one sequence, which forks
into ``width`` beams. Ties are broken by beam order, then candidate order (stable sort).
"""

from __future__ import annotations

import numpy as np

from core.plan import BeamChoice, StepPlan


def select_beams(
    scores: np.ndarray, increments: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-``width`` candidates of live beams with cumulative ``scores`` (shape ``[B]``) and
    candidate ``increments`` (shape ``[B, C]``). Returns ``(parent, candidate, new_score)``,
    each of length ``min(width, B * C)``, best first: ``parent[k]`` indexes ``scores``,
    ``candidate[k]`` the candidate within its beam."""
    totals = (scores[:, None] + increments).ravel()
    best = np.argsort(-totals, kind="stable")[:width]
    parent, candidate = np.divmod(best, increments.shape[1])
    return parent, candidate, totals[best]


def sim_beams(plan: StepPlan, rng: np.random.Generator) -> list[BeamChoice]:
    """Beam reselection for every beam-search group in ``plan`` that will still generate
    after this step's token. Each choice names ``(parent seq_id, candidate index)`` per new
    beam (the simulator has no token ids) and the new beams' cumulative scores."""
    groups = {}
    for seq in plan.sampling_seqs():  # a prompt chunk short of its end samples nothing
        g = seq.group
        if g.sampling.use_beam_search and g.num_generated + 1 < g.request.output_len:
            groups[id(g)] = g
    choices = []
    for g in groups.values():
        live = g.live_seqs()
        width = g.sampling.beam_width
        scores = np.fromiter((s.cum_logprob for s in live), dtype=float, count=len(live))
        increments = -rng.exponential(1.0, size=(len(live), width))
        parent, candidate, new_scores = select_beams(scores, increments, width)
        beams = [(live[p].seq_id, int(c)) for p, c in zip(parent, candidate, strict=True)]
        choices.append(BeamChoice(g, beams, new_scores.tolist()))
    return choices
