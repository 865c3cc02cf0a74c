"""The simulator's beam search (sim/beams.py): real top-``width`` selection, and the fork
and free statistics it implies for the scheduler and the KV managers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.beam_log import COLUMNS, BeamLog, RecordedBeams
from core.kv.base import KVCacheError
from core.plan import BeamChoice, StepOutcome, StepPlan
from core.request import Request, SamplingParams, SequenceGroup
from core.sched.base import SchedulerConfig
from core.systems import build_scheduler
from sim.beams import select_beams, sim_beams
from tests.kv_helpers import spawn

finite = st.floats(-20, 0, allow_nan=False, width=32)


@given(data=st.data(), beams=st.integers(1, 6), width=st.integers(1, 6), ties=st.booleans())
@settings(max_examples=200, deadline=None)
def test_select_beams_keeps_the_top_width_candidates(data, beams, width, ties) -> None:
    elems = st.sampled_from([-1.0, -2.0]) if ties else finite
    scores = np.array(data.draw(st.lists(elems, min_size=beams, max_size=beams)))
    inc = np.array(
        data.draw(
            st.lists(
                st.lists(elems, min_size=width, max_size=width), min_size=beams, max_size=beams
            )
        )
    )
    parent, cand, new = select_beams(scores, inc, width)
    assert len(parent) == min(width, beams * width)
    np.testing.assert_array_equal(new, scores[parent] + inc[parent, cand])
    everything = sorted((scores[:, None] + inc).ravel(), reverse=True)
    np.testing.assert_array_equal(new, everything[: len(new)])  # the best, best first
    pairs = set(zip(parent.tolist(), cand.tolist(), strict=True))
    assert len(pairs) == len(parent)  # no candidate chosen twice


def _scheduler(system: str, slots: int):
    cfg = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=256, max_model_len=128)
    return build_scheduler(system, slots, config=cfg, block_size=4, num_cpu_slots=0)


@given(
    width=st.integers(2, 6),
    lens=st.lists(st.tuples(st.integers(1, 30), st.integers(2, 40)), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
    system=st.sampled_from(["vllm", "orca_oracle"]),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_beams_fork_and_free_as_beam_search_implies(width, lens, seed, system) -> None:
    sched = _scheduler(system, 8192)  # room for everything: no preemption here
    groups = [
        sched.add(Request(i, 0.0, p, o, SamplingParams(beam_width=width)), 0.0)
        for i, (p, o) in enumerate(lens)
    ]
    manager = sched.manager
    rng = np.random.default_rng(seed)
    now = 0.0
    while sched.has_unfinished():
        plan = sched.schedule(now)
        choices = sim_beams(plan, rng)
        before = {id(c.group): {s.seq_id for s in c.group.live_seqs()} for c in choices}
        now += 0.01
        sched.update(plan, StepOutcome(0.01, beams=choices), now)
        sched.check_integrity()
        manager.check_integrity()
        for c in choices:
            g, old = c.group, before[id(c.group)]
            parents = {p for p, _ in c.beams}
            live = g.live_seqs()
            # The number of live beams is the width; every new beam is a parent or a fork.
            assert len(live) == width
            ids = {s.seq_id for s in live}
            assert parents <= old and len(ids - old) == width - len(parents)
            # Parents that leave no child are freed, in the group and in the KV manager.
            assert ids & old == parents
            for gone in old - parents:
                with pytest.raises(KVCacheError):
                    manager.num_slots(gone)
            # The survivors carry the selected scores; scores only decrease.
            assert sorted(s.cum_logprob for s in live) == sorted(c.scores)
            assert max(c.scores) <= 0
    assert all(g.finish_time is not None for g in groups)
    assert manager.breakdown().free == 8192


def test_beams_merge_and_share_blocks() -> None:
    """Top-width selection makes beams merge onto the best lineages: over a long output,
    most steps leave some beam without a child, and the forks share the parents' blocks."""
    sched = _scheduler("vllm", 8192)
    sched.add(Request(0, 0.0, 16, 100, SamplingParams(beam_width=4)), 0.0)
    rng = np.random.default_rng(0)
    now, distinct, saved = 0.0, [], []
    while sched.has_unfinished():
        plan = sched.schedule(now)
        choices = sim_beams(plan, rng)
        now += 0.01
        sched.update(plan, StepOutcome(0.01, beams=choices), now)
        distinct += [len({p for p, _ in c.beams}) for c in choices[:1] if now > 0.015]
        saved.append(sched.manager.blocks_saved_by_sharing())
    assert np.mean(np.array(distinct) < 4) > 0.5
    assert max(saved) >= 4  # at least the prompt's 4 blocks are shared by all beams


def test_seeded() -> None:
    def run(seed: int) -> list[list[tuple[int, int]]]:
        sched = _scheduler("vllm", 8192)
        sched.add(Request(0, 0.0, 8, 30, SamplingParams(beam_width=3)), 0.0)
        rng, now, out = np.random.default_rng(seed), 0.0, []
        while sched.has_unfinished():
            plan = sched.schedule(now)
            choices = sim_beams(plan, rng)
            out += [c.beams for c in choices]
            now += 0.01
            sched.update(plan, StepOutcome(0.01, beams=choices), now)
        return out

    assert run(1) == run(1) and run(1) != run(2)


def _three_beam_group() -> SequenceGroup:
    """Request 5 with beam width 3, its prompt forked into three live sequences."""
    group = SequenceGroup(Request(5, 0.0, 4, 6, SamplingParams(beam_width=3)), first_seq_id=40)
    spawn(group.seqs[0])
    spawn(group.seqs[0])
    return group


def test_the_beam_log_counts_every_step_not_only_those_that_chose() -> None:
    """A row's step is the index of the step whose end chose it, among all the steps the
    log was told of: after two steps without a beam choice, the third step's rows say 2."""
    group = _three_beam_group()
    ids = [s.seq_id for s in group.seqs]
    log = BeamLog()
    log.record([])
    log.record([])
    log.record([BeamChoice(group, [(ids[2], 7), (ids[0], 8)], [-1.0, -1.5])])
    log.record([])
    assert log.steps == 4
    assert log.rows == [(2, 5, 0, 2, 7, -1.0), (2, 5, 1, 0, 8, -1.5)]


def test_a_beams_csv_in_any_row_order_replays_the_same_choices(tmp_path: Path) -> None:
    """Rows of one step are handed out by their beam rank, whatever their order in the
    file: rank 0 (parent 2, token 7), rank 1 (parent 0, token 8), rank 2 (parent 2,
    token 9), the live sequences named by index."""
    group = _three_beam_group()
    ids = [s.seq_id for s in group.seqs]
    ranked = [(0, 5, 0, 2, 7, -1.0), (0, 5, 1, 0, 8, -1.5), (0, 5, 2, 2, 9, -2.0)]
    expected = ([(ids[2], 7), (ids[0], 8), (ids[2], 9)], [-1.0, -1.5, -2.0])
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        path = tmp_path / f"beams-{''.join(map(str, order))}.csv"
        lines = [",".join(COLUMNS), *(",".join(map(str, ranked[i])) for i in order)]
        path.write_text("\n".join(lines) + "\n")
        (choice,) = RecordedBeams.read(path).choices(StepPlan(decode=list(group.seqs)))
        assert choice.group is group
        assert (choice.beams, choice.scores) == expected, order


def test_simulated_beams_carry_stand_in_ids_and_give_no_false_prefix_hits() -> None:
    """The simulator's beam choices name candidate indices (0 .. width-1), not token ids: with
    prefix caching every generated token must stay its sequence's stand-in id, so another
    request whose prompt goes on with those small ids finds only the shared prompt blocks."""
    from core.sched.base import stand_in_token_id
    from tests.sched_harness import run_loop

    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    sched = build_scheduler("vllm", 256, cfg, block_size=4, enable_prefix_caching=True)
    beam = Request(0, 0.0, 8, 9, SamplingParams(beam_width=2), tuple(range(8)))
    res = run_loop(sched, [beam], beams_rng=np.random.default_rng(0))
    for seq in res.groups[0].seqs:
        assert seq.output_token_ids[-1] == stand_in_token_id(seq.seq_id)
        assert all(t < 0 for t in seq.output_token_ids)
    # the candidate indices seed 0 chose for the first beam before the fix
    follower = Request(1, 1.0, 13, 2, SamplingParams(), (*range(8), 0, 1, 1, 1, 7))
    starts: list[int] = []
    run_loop(sched, [follower], on_plan=lambda p: starts.extend(c.start for c in p.prefill))
    assert starts[0] == 8  # the prompt's two blocks, nothing generated


def test_a_prompt_chunk_short_of_its_end_draws_no_beams() -> None:
    # sim_beams drew a choice (and random numbers) for every scheduled beam group, also one
    # whose prompt chunk samples nothing, so the stand-in's stream hung on chunk sizes
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, chunked_prefill=True)
    sched = build_scheduler("vllm", 4096, config)
    sched.add(Request(0, 0.0, 200, 10, SamplingParams(beam_width=4)), 0.0)
    plan = sched.schedule(0.0)
    assert plan.prefill and not plan.prefill[0].samples and plan.sampling_seqs() == []
    rng = np.random.default_rng(0)
    assert sim_beams(plan, rng) == []
    assert rng.random() == np.random.default_rng(0).random()  # nothing drawn
