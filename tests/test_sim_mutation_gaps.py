"""Behaviours of the simulator body (driver, beams, capacity search, cost models around the
roofline: drifting, recorded, measured stack files, calibrated; the ``simulate`` CLI) that
no other test pinned down, found by a mutation audit."""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.beam_log import RecordedBeams
from core.metrics.phases import CPU_PHASES, PHASE_COLUMNS
from core.plan import BatchShape
from core.request import Request, SequenceGroup
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import build_scheduler
from experiments.reproduce import compose_config
from experiments.simulate import run, unfinished_at_last_arrival
from sim.beams import select_beams
from sim.cost.calibrated import CalibratedCostModel
from sim.cost.drifting import DriftingCostModel
from sim.cost.overhead import A100_CPU_OVERHEAD, A100_CPU_OVERHEAD_RAY, STACKS, get_stack
from sim.cost.recorded import RecordedCostModel, RecordedStepsExhausted
from sim.cost.stack_file import UnsupportedFit, fit_measured_overhead, load_stack_file
from sim.driver import SimulationError, simulate
from sim.search import find_max_rate
from tests.cost_helpers import ConstantCost

REPO = Path(__file__).resolve().parents[1]
SHIPPED_STACK = REPO / "sim/cost/stacks/kvlab-cpu-tiny-opt.json"
STEP = BatchShape(decode_seqs=1, decode_ctx_tokens=8)


# --- sim/search.py -------------------------------------------------------------------------


def test_search_refuses_a_bracket_starting_at_zero_and_a_zero_tolerance() -> None:
    """``lo`` must be > 0 (a rate of 0 is no load) and ``rel_tol`` > 0 (else the bisection
    never meets its tolerance); both are refused before any evaluation."""
    calls: list[float] = []

    def evaluate(rate: float) -> float:
        calls.append(rate)
        return rate

    with pytest.raises(ValueError, match="lo < hi"):
        find_max_rate(evaluate, 1.0, 0.0, 2.0)
    with pytest.raises(ValueError, match="rel_tol"):
        find_max_rate(evaluate, 1.0, 0.5, 2.0, rel_tol=0.0)
    assert calls == []


def test_search_needs_two_evaluations_unless_the_bracket_is_known() -> None:
    """Without ``bracket_known`` the search evaluates both ends, so ``max_evals`` < 2 is
    refused; with it one evaluation (the midpoint) is a search."""
    with pytest.raises(ValueError, match="max_evals >= 2"):
        find_max_rate(lambda r: r, 1.0, 0.5, 2.0, max_evals=1)
    res = find_max_rate(lambda r: r, 1.0, 0.5, 2.0, max_evals=1, bracket_known=True)
    assert [rate for rate, _ in res.evaluations] == [1.25]


def test_search_stops_once_the_bracket_is_within_rel_tol_of_its_upper_end() -> None:
    """The stopping rule compares the bracket's width with ``rel_tol`` times its *upper*
    end: lo=1, hi=2, rel_tol=0.5 is already narrow enough (1 <= 0.5 x 2), so only the two
    ends are evaluated."""
    res = find_max_rate(lambda r: r, threshold=1.5, lo=1.0, hi=2.0, rel_tol=0.5)
    assert [rate for rate, _ in res.evaluations] == [2.0, 1.0]
    assert (res.max_rate, res.first_failing_rate) == (1.0, 2.0)


def test_higher_is_better_passes_a_value_equal_to_the_threshold() -> None:
    """With ``higher_is_better`` a rate passes when its value is >= the threshold (an SLO
    attainment exactly at its target passes), so ``hi`` itself is the answer here."""
    res = find_max_rate(lambda r: 0.9, 0.9, 0.5, 2.0, higher_is_better=True)
    assert res.max_rate == 2.0 and res.first_failing_rate is None


# --- sim/cost/drifting.py ------------------------------------------------------------------


def test_drifting_describe_names_the_slowest_and_fastest_speed_not_the_ends() -> None:
    """The description's range is min-max of all speeds, wherever they lie in the list."""
    drifting = DriftingCostModel(ConstantCost(0.1), [2.0, 0.5, 4.0, 1.0], expected_steps=4)
    assert "0.50-4.00 of the price" in drifting.describe()


# --- sim/cost/recorded.py ------------------------------------------------------------------


def test_a_recording_with_a_nan_step_time_is_refused() -> None:
    """A NaN step time is not a time >= 0: refused when the replay is built, naming it."""
    with pytest.raises(ValueError, match="recorded step time 1 is nan"):
        RecordedCostModel([0.1, math.nan, 0.2])


def test_asking_past_the_recording_raises_its_own_error_not_a_list_index_error() -> None:
    """The step after the last recorded one raises :class:`RecordedStepsExhausted` (the
    replay diverged), and the model's counters stay at the recording's length."""
    model = RecordedCostModel([0.1, 0.2])
    assert [model.step_time(STEP), model.step_time(STEP)] == [0.1, 0.2]
    with pytest.raises(RecordedStepsExhausted, match="diverged"):
        model.step_time(STEP)
    assert model.steps_used == 2 and model.steps_left == 0


# --- sim/cost/stack_file.py ----------------------------------------------------------------


def _steps(seqs: list[int], a: float, b: float) -> pd.DataFrame:
    """Steps whose four CPU phases sum to exactly ``a + b x seqs``."""
    total = a + b * np.asarray(seqs, float)
    frame = pd.DataFrame({"prefill_seqs": 0, "decode_seqs": seqs})
    for col in PHASE_COLUMNS:
        frame[col] = total * (0.25 if col in CPU_PHASES else 0.0)
    return frame


def test_a_fit_with_one_train_point_is_unsupported_not_a_division_by_zero() -> None:
    """One sequence count among the train steps cannot fix a line: UnsupportedFit."""
    with pytest.raises(UnsupportedFit, match="hold 1 sequence count"):
        fit_measured_overhead([("a", _steps([3] * 10, 1e-4, 1e-5))], "half", 3)


def _stack_file(tmp_path: Path, **change: object) -> Path:
    doc = {**json.loads(SHIPPED_STACK.read_text()), **change}
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_stack_file_whose_split_is_not_a_name_is_refused(tmp_path: Path) -> None:
    """``fit.split`` must be a name (it is printed as the fit's source); a number is a bad
    field, named in the error."""
    good = json.loads(SHIPPED_STACK.read_text())
    path = _stack_file(tmp_path, fit={**good["fit"], "split": 5})
    with pytest.raises(ValueError, match=r"stack\.json: fit\.split: not a name \(got 5\)"):
        load_stack_file(path)


def test_a_stack_file_without_base_keeps_the_vllm_2023_kernel_terms(tmp_path: Path) -> None:
    """A stack file that names no ``base`` takes its per-block gather, last-block waste and
    copy latency from ``vllm-2023`` (not from the cost-free ``none`` preset)."""
    doc = json.loads(SHIPPED_STACK.read_text())
    doc.pop("base", None)
    path = tmp_path / "nobase.json"
    path.write_text(json.dumps(doc))
    stack = load_stack_file(path)
    ref = STACKS["vllm-2023"]
    assert stack.gather_tokens_per_block == ref.gather_tokens_per_block > 0
    assert stack.block_granular and stack.copy_latency_s == ref.copy_latency_s > 0
    assert stack.d2d_calls_per_step == ref.d2d_calls_per_step


def test_a_stack_file_whose_cpu_number_is_a_boolean_is_refused(tmp_path: Path) -> None:
    """JSON ``true`` is not a number of seconds even though Python's bool is an int."""
    good = json.loads(SHIPPED_STACK.read_text())
    path = _stack_file(tmp_path, cpu={**good["cpu"], "per_step_s": True})
    with pytest.raises(ValueError, match=r"cpu\.per_step_s: not a number \(got True\)"):
        load_stack_file(path)


def test_a_fit_with_no_held_out_point_reports_null_held_out_errors() -> None:
    """When no held-out sequence count has ``min_steps`` steps the held-out errors are
    None (JSON null, which the loader accepts together), not NaN from an empty mean."""
    steps = _steps([1, 1, 1, 2, 2, 2, 5, 6, 7, 8, 9, 10], 1e-4, 1e-5)
    doc = fit_measured_overhead([("a", steps)], "half", 3)
    assert doc["fit"]["points"]["heldout"] == []
    assert doc["cpu"]["heldout_mape"] is None and doc["cpu"]["heldout_max_err"] is None


# --- sim/cost/overhead.py ------------------------------------------------------------------


def test_two_gpus_take_the_tp2_cpu_fit_with_ray_only_where_the_stack_says() -> None:
    """At tp 2 a stack's CPU fit is the tp >= 2 fit (the Ray term added only for a stack
    with ``ray_workers``); the tp-1 fit is for one GPU alone."""
    assert get_stack("vllm-v1", tp=2).cpu == A100_CPU_OVERHEAD[2]
    assert get_stack("vllm-2023", tp=2).cpu == A100_CPU_OVERHEAD_RAY
    assert get_stack("vllm-v1", tp=1).cpu == A100_CPU_OVERHEAD[1]


# --- sim/driver.py -------------------------------------------------------------------------


def _make_scheduler(max_num_seqs: int = 1) -> Callable[[], BaseScheduler]:

    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=64)
    return lambda: build_scheduler("vllm", 256, config, block_size=4)


def test_a_step_priced_at_zero_seconds_is_a_valid_price() -> None:
    """0 s is a finite time >= 0: a run of free steps finishes at time 0, not an error."""
    reqs = [Request(i, 0.0, 4, 3) for i in range(2)]
    result = simulate(reqs, _make_scheduler(), ConstantCost(0.0))
    assert result.end_time_s == 0.0 and result.recorder.num_requests == 2


def test_requests_arriving_together_are_served_in_id_order_whatever_the_input_order() -> None:
    """Ties in arrival time are broken by request id: the input order does not matter."""
    reqs = [Request(1, 0.0, 4, 3), Request(0, 0.0, 4, 3)]
    frame = simulate(reqs, _make_scheduler(1), ConstantCost(0.01)).recorder.requests_frame()
    first = frame.set_index("request_id")["first_scheduled_s"]
    assert first[0] < first[1]


def test_simulate_refuses_zero_replicas() -> None:
    """``num_replicas`` must be >= 1."""
    with pytest.raises(ValueError, match="num_replicas must be >= 1"):
        simulate([Request(0, 0.0, 4, 3)], _make_scheduler(), ConstantCost(0.01), num_replicas=0)


def test_simulate_refuses_a_request_id_given_twice() -> None:
    """Request ids must be unique: a repeated id is refused, naming it and its count."""
    reqs = [Request(7, 0.0, 4, 3), Request(7, 0.5, 4, 3), Request(1, 0.0, 4, 3)]
    with pytest.raises(ValueError, match="request id 7 appears 2 times"):
        simulate(reqs, _make_scheduler(), ConstantCost(0.01))


def test_a_scheduler_that_loses_a_request_fails_the_run() -> None:
    """A request neither finished nor rejected (a scheduler dropped it) is a
    SimulationError, not a run that reports success with fewer requests; the step loop
    finds it when it goes idle (core.loop.LostRequestError)."""

    def make() -> BaseScheduler:
        sched = _make_scheduler()()
        real_add = sched.add

        def add(request: Request, now: float) -> SequenceGroup:
            if request.request_id == 1:  # accepted, never queued
                return SequenceGroup(request, sched._new_seq_id())
            return real_add(request, now)

        sched.add = add
        return sched

    reqs = [Request(i, 0.0, 4, 3) for i in range(3)]
    with pytest.raises(SimulationError, match=r"lost 1 request\(s\) by step"):
        simulate(reqs, make, ConstantCost(0.01))


def test_recorded_beams_replay_one_replica_only() -> None:
    """Recorded beam choices replay one replica's steps: several replicas are refused."""
    beams = RecordedBeams([])
    with pytest.raises(ValueError, match="num_replicas is 1"):
        simulate(
            [Request(0, 0.0, 4, 3)],
            _make_scheduler(),
            ConstantCost(0.01),
            num_replicas=2,
            recorded_beams=beams,
        )


def test_replicas_share_the_arrivals_round_robin_and_count_all_their_steps() -> None:
    """With two replicas the requests go round-robin, so two requests arriving together run
    side by side (the run ends when one alone would); ``num_steps`` counts every replica's
    steps."""
    reqs = [Request(i, 0.0, 4, 3) for i in range(2)]
    alone = simulate(reqs[:1], _make_scheduler(1), ConstantCost(0.01))
    two = simulate(reqs, _make_scheduler(1), ConstantCost(0.01), num_replicas=2)
    assert two.end_time_s == alone.end_time_s
    steps = two.recorder.steps_frame()
    assert sorted(set(steps["replica"])) == [0, 1]
    assert two.num_steps == len(steps) == 2 * alone.num_steps


def test_a_replica_left_idle_by_the_arrivals_still_ends_the_run() -> None:
    """An engine waiting for work when the last request has arrived (it went to another
    replica, or was rejected) is woken to end: the run finishes and returns."""
    reqs = [Request(0, 0.5, 4, 3)]
    alone = simulate(reqs, _make_scheduler(), ConstantCost(0.01))
    two = simulate(reqs, _make_scheduler(), ConstantCost(0.01), num_replicas=2)
    assert two.end_time_s == alone.end_time_s and two.recorder.num_requests == 1
    too_long = [Request(0, 0.0, 4, 3), Request(1, 0.5, 60, 10)]  # over max_model_len 64
    result = simulate(too_long, _make_scheduler(), ConstantCost(0.01))
    status = result.recorder.requests_frame().set_index("request_id")["status"]
    assert status.tolist() == ["finished", "rejected"]


def test_the_run_ends_at_the_last_steps_end() -> None:
    """``end_time_s`` is the end of the last step (the engine's clock may run ahead of
    SimPy's over steps no event interrupts; the run catches up before it returns)."""
    reqs = [Request(0, 0.0, 4, 20), Request(1, 0.005, 4, 2)]
    for fast in (True, False):
        result = simulate(reqs, _make_scheduler(4), ConstantCost(0.01), fast_forward=fast)
        steps = result.recorder.steps_frame()
        last_end = float((steps["start_s"] + steps["duration_s"]).max())
        assert result.end_time_s == pytest.approx(last_end)
        assert result.end_time_s == pytest.approx(
            float(result.recorder.requests_frame()["finish_s"].max())
        )


def test_simulate_restores_the_garbage_collectors_state() -> None:
    """The cyclic GC is paused during a run and restored afterwards, enabled or not."""
    reqs = [Request(0, 0.0, 4, 3)]
    was = gc.isenabled()
    try:
        gc.enable()
        simulate(reqs, _make_scheduler(), ConstantCost(0.01))
        assert gc.isenabled()
        gc.disable()
        simulate(reqs, _make_scheduler(), ConstantCost(0.01))
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


# --- experiments/simulate.py ---------------------------------------------------------------


def test_unfinished_at_last_arrival_counts_waiting_and_running_requests_only() -> None:
    """A request that finished exactly at the last arrival is done; one unfinished then (or
    never) counts; a rejected one does not; no requests at all is NaN."""
    frame = pd.DataFrame(
        {
            "arrival_s": [0.0, 1.0, 2.0, 4.0],
            "finish_s": [4.0, 5.0, math.nan, 6.0],
            "status": ["finished", "finished", "rejected", "finished"],
        }
    )
    # request 0 finished at the last arrival (4.0); 1 and 3 are unfinished; 2 was rejected
    assert unfinished_at_last_arrival(frame) == pytest.approx(2 / 4)
    assert math.isnan(unfinished_at_last_arrival(frame.iloc[:0]))


# --- sim/cost/calibrated.py ----------------------------------------------------------------

CORE_COEF = {"constant": 0.001, "linear_flop_time": 1.2, "attn_flop_time": 1.0, "byte_time": 1.1}


def _calibration_doc(**change: object) -> dict[str, object]:
    doc = {"kind": "calibrated", "model": "tiny-llama", "gpu": "h200", "coefficients": CORE_COEF}
    return doc | change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tp": 0}, r"tp: expected a whole number >= 1, got 0"),
        ({"block_size": 0}, r"block_size: expected a whole number >= 1, got 0"),
        ({"profile": 5}, r"profile: expected a path or null, got 5"),
        ({"fit_stats": {"weighting": 3}}, r"fit_stats\.weighting: expected a word or null"),
        ({"fit_stats": {"r2": "high"}}, r"fit_stats\.r2: expected a number or null"),
        (
            {"coefficients": {**CORE_COEF, "byte_time": True}},
            r"coefficients\.byte_time: expected a number, got True",
        ),
    ],
)
def test_a_malformed_calibration_document_is_refused_naming_the_key(
    change: dict[str, object], message: str
) -> None:
    """``from_dict`` refuses a field of the wrong type or range, naming it."""
    with pytest.raises(ValueError, match=message):
        CalibratedCostModel.from_dict(_calibration_doc(**change))


def test_a_calibration_document_without_tp_is_for_one_gpu() -> None:
    """``tp`` defaults to 1 when the document omits it."""
    assert CalibratedCostModel.from_dict(_calibration_doc()).roofline.tp == 1


def _fit_steps(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    seqs = rng.integers(1, 8, n)
    return pd.DataFrame(
        {
            "prefill_tokens": rng.integers(0, 64, n),
            "prefill_seqs": rng.integers(0, 2, n),
            "prefill_attn_pairs": rng.integers(0, 500, n),
            "prefill_kv_read_tokens": 0,
            "decode_seqs": seqs,
            "decode_ctx_tokens": seqs * 40,
            "duration_s": rng.uniform(0.01, 0.02, n),
        }
    )


def test_a_fit_needs_as_many_steps_as_terms() -> None:
    """Five non-empty steps cannot determine the six terms: refused before fitting."""
    with pytest.raises(ValueError, match="need at least 6 non-empty steps to fit, got 5"):
        CalibratedCostModel.fit(_fit_steps(5), "tiny-llama", "h200")


def test_a_fit_refuses_negative_counts_and_a_host_target_without_profile() -> None:
    """A negative count is not a step measurement (named with its row); the ``host``
    target fits on top of a profile and needs one."""
    steps = _fit_steps(10)
    steps.loc[3, "decode_seqs"] = -1
    with pytest.raises(ValueError, match=r"column decode_seqs, row 4: -1 is not a finite"):
        CalibratedCostModel.fit(steps, "tiny-llama", "h200")
    ok = _fit_steps(10).assign(forward_s=0.005)
    with pytest.raises(ValueError, match="target 'host' fits on top of an operator profile"):
        CalibratedCostModel.fit(ok, "tiny-llama", "h200", target="host")


def test_the_per_sequence_term_counts_prefill_and_decode_sequences() -> None:
    """``per_sequence`` is paid by every sequence in the step, prefill ones included."""
    zero = dict.fromkeys(CORE_COEF, 0.0)
    model = CalibratedCostModel("tiny-llama", "h200", zero | {"per_sequence": 1e-3})
    shape = BatchShape(
        prefill_tokens=8, prefill_seqs=2, prefill_attn_pairs=36, decode_seqs=3,
        decode_ctx_tokens=30,
    )  # fmt: skip
    assert model.step_time(shape) == pytest.approx(5e-3)


def test_r2_is_nan_when_every_step_took_the_same_time() -> None:
    """With no spread in the measured times R² is undefined (NaN), not a number from a
    division by ~0."""
    fitted = CalibratedCostModel.fit(_fit_steps(20).assign(duration_s=0.01), "tiny-llama", "h200")
    assert math.isnan(fitted.fit_stats["r2"])


def test_a_simulate_run_writes_the_cost_models_description_and_config(tmp_path: Path) -> None:
    """``cost_model.json`` holds the model's description and its ``config()`` (kind,
    model, GPU, stack, ...), so a result directory says what priced its steps."""
    small = ["workload.duration_s=null", "workload.num_requests=5", "workload.rate=4"]
    run(compose_config([*small, "cost.stack=vllm-2023"]), tmp_path)
    doc = json.loads((tmp_path / "cost_model.json").read_text())
    assert "stack vllm-2023" in doc["describe"]
    assert doc["kind"] == "roofline" and doc["stack"] == "vllm-2023"
    assert (doc["model"], doc["gpu"], doc["tp"]) == ("opt-13b", "a100-40gb", 1)


# --- sim/beams.py --------------------------------------------------------------------------


def test_beam_selection_breaks_ties_by_beam_then_candidate_order() -> None:
    """Equal scores keep their order (stable sort): the survivors of a tie are the earlier
    beams' earlier candidates, best first, however many candidates tie."""
    scores = np.zeros(6)
    increments = np.tile([0.0, -1.0], (6, 5))  # each beam: candidates 0, 2, 4, 6, 8 tie at 0
    parent, candidate, new_scores = select_beams(scores, increments, 10)
    assert parent.tolist() == [0] * 5 + [1] * 5
    assert candidate.tolist() == [0, 2, 4, 6, 8] * 2
    assert new_scores.tolist() == [0.0] * 10


def test_simulate_hands_the_configs_seed_checks_and_vocabulary_to_the_simulator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``run`` passes the config's ``seed`` (the beam stand-in's draws),
    ``check_integrity_every`` and the model's vocabulary size (prompt ids outside it are
    rejected) through to :func:`sim.driver.simulate`."""
    import experiments.simulate as app

    seen: dict[str, object] = {}

    def spy(*args: object, **kwargs: object) -> object:
        seen.update(kwargs)
        return simulate(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(app, "simulate", spy)
    small = ["workload.duration_s=null", "workload.num_requests=3", "workload.rate=4"]
    app.run(compose_config([*small, "seed=5", "check_integrity_every=3"]))
    assert seen["seed"] == 5 and seen["check_integrity_every"] == 3
    assert seen["vocab_size"] == 50272  # OPT-13B's


def test_a_plugin_policy_that_breaks_the_loop_is_one_config_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SimulationError caused by a policy plugin's PolicyError becomes a ConfigError
    naming ``system.plugin``; the same error without a plugin keeps its traceback."""
    import experiments.simulate as app
    from core.loop import PolicyError
    from experiments.lib.checks import ConfigError

    def broken(*args: object, **kwargs: object) -> object:
        raise SimulationError("replica 0: stalled") from PolicyError("stalled")

    monkeypatch.setattr(app, "simulate", broken)
    small = ["workload.duration_s=null", "workload.num_requests=3", "workload.rate=4"]
    plugin = ["system.name=vllm_spf", "system.plugin=tests.policy_plugin"]
    with pytest.raises(ConfigError, match=r"the policy of plugin 'tests\.policy_plugin' failed"):
        app.run(compose_config([*small, *plugin]))
    with pytest.raises(SimulationError, match="stalled"):
        app.run(compose_config(small))
