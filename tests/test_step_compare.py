"""experiments.lib.step_compare: where the simulator's replay parts from the engine's
schedule, step by step and request by request."""

from __future__ import annotations

import math

import pandas as pd

from experiments.lib.step_compare import compare_schedules, describe


def _steps(decodes: list[int]) -> pd.DataFrame:
    n = len(decodes)
    return pd.DataFrame({
        "step": range(n), "start_s": [0.1 * i for i in range(n)], "duration_s": [0.1] * n,
        "decode_seqs": decodes, "num_waiting": [1] * n,
    })  # fmt: skip


def _requests(first: list[float]) -> pd.DataFrame:
    return pd.DataFrame({
        "request_id": range(len(first)), "status": ["finished"] * len(first),
        "first_token_step": first, "finish_step": [9] * len(first),
        "num_preemptions": [0] * len(first),
    })  # fmt: skip


def test_alike_schedules_agree_and_the_clock_and_phases_are_not_compared() -> None:
    engine = _steps([1, 2, 2]).assign(forward_s=[0.3, 0.2, 0.1], start_s=[5.0, 6.0, 7.0])
    found = compare_schedules(engine, _steps([1, 2, 2]), _requests([0, 1]), _requests([0, 1]))
    assert found["columns"] == ["decode_seqs", "num_waiting"]
    assert found["first_divergence"] is None and found["first_request_divergence"] is None
    assert describe(found) == ["schedule: the engine's in all 3 steps and every request"]


def test_the_first_differing_step_and_request_are_named_with_both_values() -> None:
    rejected = _requests([math.nan, 4])  # a missing step on both sides is alike
    late = _requests([math.nan, 6])
    found = compare_schedules(_steps([1, 2, 3, 3]), _steps([1, 2, 2, 3]), rejected, late)
    assert found["first_divergence"] == {
        "step": 2, "columns": {"decode_seqs": {"engine": 3, "simulator": 2}}
    }  # fmt: skip
    assert found["first_request_divergence"] == {
        "request_id": 1, "columns": {"first_token_step": {"engine": 4.0, "simulator": 6.0}}
    }  # fmt: skip
    lines = describe(found)
    assert lines[0] == (
        "schedule: departs from the engine's at step 2 (decode_seqs: engine 3, simulator 2)"
    )
    assert lines[1].startswith("requests: request 1 is served otherwise (first_token_step")


def test_a_replay_shorter_than_the_recording_parts_where_it_ends() -> None:
    found = compare_schedules(_steps([1, 2, 2]), _steps([1, 2]), _requests([0]), _requests([0]))
    assert found["first_divergence"] == {
        "step": 2, "columns": {}, "engine_steps": 3, "simulator_steps": 2
    }  # fmt: skip
    assert "then the engine ran 3 steps and the simulator 2" in describe(found)[0]


def test_a_step_column_missing_in_both_bodies_is_alike() -> None:
    """Two missing values agree in a step column as in a request's (before: the step was
    reported as parting with no column named, and describe() raised a KeyError)."""
    engine = pd.DataFrame({"step": [0, 1], "kv_free": [3.0, float("nan")], "num_waiting": [1, 0]})
    simulator = pd.DataFrame({"step": [0, 1], "num_waiting": [1, 0], "kv_free": [3, None]})
    requests = pd.DataFrame({"request_id": [0], "status": ["finished"], "finish_step": [1]})
    found = compare_schedules(engine, simulator, requests, requests)
    assert found["first_divergence"] is None
    assert describe(found) == ["schedule: the engine's in all 2 steps and every request"]


def test_a_parted_replay_says_when_the_run_was_recorded_by_other_code(tmp_path) -> None:
    """A committed run recorded before a policy changed replays otherwise with no body at
    fault (docs/validation/cpu-engine/twenty-fifth-sitting/run_s, 2026-12-03: step 231's
    prefix-cache hits differ; served again with today's code it replays exactly): the error
    says the recording's code differs, or that the run does not say which code it was."""
    import json

    from experiments.lib.provenance import code_version
    from experiments.validate import recording_code

    assert "no readable provenance.json" in recording_code(tmp_path)
    prov = tmp_path / "provenance.json"
    same = code_version()["code_sha256"]
    prov.write_text(json.dumps({"code": {"code_sha256": same, "git_commit": None}}))
    assert recording_code(tmp_path) == ""
    prov.write_text(json.dumps({"code": {"code_sha256": "0" * 64, "git_commit": "ab" * 20}}))
    said = recording_code(tmp_path)
    assert "recorded by other code (git abababababab, sources sha256 000000000000" in said
