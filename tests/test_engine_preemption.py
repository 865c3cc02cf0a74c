"""Preemption (recompute and swap) must not change greedy outputs."""

from __future__ import annotations

import pytest

from core.request import Request, SamplingParams
from tests.engine_helpers import (
    make_engine,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    prompt_ids,
    requests,
)

LENS = [(9, 14), (5, 16), (12, 10), (7, 15), (6, 13)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempted_runs_match_an_unpreempted_run(mode: str, backend: str) -> None:
    lens = LENS if backend == "torch" else [(5, 6), (4, 7), (6, 5)]
    small = 10 if backend == "torch" else 5
    reqs = requests(lens)
    roomy = make_engine(num_blocks=256, backend=backend).generate(reqs)
    tight = make_engine(
        num_blocks=small, num_cpu_blocks=64, preemption_mode=mode, backend=backend
    ).generate(reqs)
    assert roomy.recorder.steps_frame()["num_preempted"].sum() == 0
    steps = tight.recorder.steps_frame()
    assert steps["num_preempted"].sum() > 0
    assert (steps["swap_out_blocks"].sum() > 0) == (mode == "swap")
    assert (steps["swap_in_blocks"].sum() > 0) == (mode == "swap")
    assert tight.outputs == roomy.outputs
    assert (tight.recorder.requests_frame()["status"] == "finished").all()


def test_swapped_parallel_samples_match_an_unpreempted_run() -> None:
    """Swap-preempted parallel-sampling groups come back with the tokens an unpreempted run
    draws, including a step that swaps a group in and copies its shared last block (the
    engine must swap in before it copies)."""
    lens = [(6, 12), (10, 13), (5, 11), (7, 9)]
    reqs = [
        Request(i, 0.0, p, o, SamplingParams(temperature=0.9, n=2, seed=7 + 10 * i),
                prompt_ids(p, 100 + i))
        for i, (p, o) in enumerate(lens)
    ]  # fmt: skip
    roomy = make_engine(num_blocks=256).generate(reqs)
    tight = make_engine(num_blocks=10, num_cpu_blocks=64, preemption_mode="swap").generate(reqs)
    steps = tight.recorder.steps_frame()
    assert ((steps["swap_in_blocks"] > 0) & (steps["copy_blocks"] > 0)).any()
    assert (tight.recorder.requests_frame()["status"] == "finished").all()
    assert all(len(out.token_ids) == 2 for out in roomy.outputs.values())
    assert tight.outputs == roomy.outputs
