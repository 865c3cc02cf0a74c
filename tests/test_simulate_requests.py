"""``experiments.simulate.simulate_requests``: one's own list of requests on a configured
model, GPU, system and clock, as a workload's would run."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.request import Request
from core.workload.spec import build_workload
from experiments.lib.checks import ConfigError
from experiments.lib.setup import as_dict
from experiments.reproduce import compose_config
from experiments.simulate import run, simulate_requests

SETTING = ["system=vllm_v1", "model=llama-3.1-8b", "hardware=h100"]
WORKLOAD = ["workload.rate=4", "workload.duration_s=20"]


def test_a_workloads_requests_run_as_the_workload_does() -> None:
    cfg = as_dict(compose_config([*SETTING, *WORKLOAD]))
    requests = build_workload(cfg["workload"], max_model_len=131072, seed=0)
    mine = simulate_requests(requests, SETTING)
    theirs = run(compose_config([*SETTING, *WORKLOAD]))
    for key in ("completed", "mean_ttft_ms", "mean_tpot_ms", "kv_token_states_pct", "kv_slots"):
        assert mine.metrics[key] == pytest.approx(theirs[key]), key
    assert len(mine.requests) == len(requests) and len(mine.steps) > 0


def test_prefix_caching_follows_the_requests_token_ids() -> None:
    # build_setup with one's own requests decided prefix caching from the placeholder
    # workload (no ids): off, a shared 300-token prefix saved nothing
    prefix = tuple(range(1, 301))
    ids = [Request(i, 0.05 * i, 330, 40, prompt_token_ids=prefix + tuple(range(1000 + 30 * i,
           1030 + 30 * i))) for i in range(20)]  # fmt: skip
    lengths = [Request(i, 0.05 * i, 330, 40) for i in range(20)]
    assert simulate_requests(ids, SETTING).metrics["kv_sharing_saving_pct"] > 20
    assert simulate_requests(lengths, SETTING).metrics["kv_sharing_saving_pct"] == 0


def test_a_config_that_cannot_run_raises_before_any_step() -> None:
    with pytest.raises(ConfigError, match=r"model\.tp"):
        simulate_requests([Request(0, 0.0, 10, 10)], ["model.tp=3"])


@pytest.mark.parametrize("override", ["workload.rate=9", "+workload.n=2", "workload=alpaca"])
def test_a_workload_override_is_refused_not_ignored(override: str) -> None:
    # the requests are the workload: a workload override changed nothing, silently
    with pytest.raises(ConfigError, match=r"^error: workload.*replays the requests given"):
        simulate_requests([Request(0, 0.0, 10, 10)], ["model=opt-125m", override])


def test_requests_given_as_an_iterator_all_run() -> None:
    # the list was built twice from the argument: an iterator gave the prefix-caching
    # decision every request and the run none (0 requests, no error)
    requests = [Request(i, 0.05 * i, 100, 20) for i in range(10)]
    run_ = simulate_requests(iter(requests), ["model=opt-125m"])
    assert len(run_.requests) == 10 and run_.metrics["completed"] == 10


def test_check_integrity_every_reaches_the_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    # simulate's override was taken and ignored: the run checked no invariant
    import experiments.simulate as app

    seen: dict[str, object] = {}
    real = app.simulate

    def spy(*args: object, **kwargs: object) -> object:
        seen.update(kwargs)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(app, "simulate", spy)
    simulate_requests([Request(0, 0.0, 10, 10)],
                      ["model=opt-125m", "check_integrity_every=2", "progress=true"])  # fmt: skip
    assert seen["check_integrity_every"] == 2 and seen["progress"] is True


def test_a_step_priced_out_of_range_is_one_config_line() -> None:
    # as run() says it: a StepPriceError escaped instead of the line naming cost
    with pytest.raises(ConfigError, match=r"^error: cost: the simulated clock overflowed"):
        simulate_requests([Request(0, 0.0, 10, 10)], ["cost.per_step_overhead_s=1e308"])


def test_overrides_given_as_one_string_are_refused() -> None:
    # its characters were read as overrides: "Error parsing override 's'"
    with pytest.raises(TypeError, match="list of strings, got the string 'system=vllm'"):
        simulate_requests([Request(0, 0.0, 10, 10)], "system=vllm")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="list of strings"):
        compose_config("system=vllm")  # type: ignore[arg-type]


def test_run_writes_into_an_out_dir_given_as_a_string(tmp_path: Path) -> None:
    # the whole run was simulated, then str.mkdir raised AttributeError at the write
    out = tmp_path / "run"
    metrics = run(compose_config(["model=opt-125m", "workload.num_requests=5"]), str(out))
    assert (out / "metrics.json").is_file() and metrics["num_requests"] == 5


def test_no_requests_or_an_item_that_is_no_request_is_refused() -> None:
    # none gave a run of NaN metrics; a tuple in the list an AttributeError deep in intake
    with pytest.raises(ValueError, match=r"^requests: none given"):
        simulate_requests([], ["model=opt-125m"])
    with pytest.raises(TypeError, match=r"^requests\[1\] is a tuple, not a core.request.Request"):
        simulate_requests([Request(0, 0.0, 10, 10), (1, 0.0, 10, 10)], ["model=opt-125m"])  # type: ignore[list-item]
