"""``python -m experiments.capacity``: each system's sustainable rate for any setting."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pandas as pd
import pytest

from experiments import capacity

SMALL = ["workload.duration_s=60", "--systems", "vllm,orca_max", "--seeds", "2",
         "--rates", "0.25,0.5,1", "--workers", "1", "--bisect-evals", "2"]  # fmt: skip


def test_a_search_writes_each_systems_rate_and_the_runs_behind_it(tmp_path: Path, capsys) -> None:
    out = capacity.main([*SMALL, "--out", str(tmp_path / "a")])
    cap = pd.read_csv(out / "capacity.csv")
    runs = pd.read_csv(out / "runs.csv")
    assert list(cap["system"]) == ["vllm", "orca_max"]  # --systems' order
    assert set(runs["trace_s"]) == {60.0}  # a drawn trace's length, the same at every rate
    assert {"capacity.png", "capacity.pdf", "curves.csv"} <= {p.name for p in out.iterdir()}
    for _, row in cap.iterrows():
        mine = runs[runs["system"] == row["system"]]
        at = mine[mine["rate"] == row["max_rate"]]
        assert len(at) == 2 and at["passes"].all()  # the rate passed on every seed
        if not row["rate_open"]:
            failing = mine[mine["rate"] == row["first_failing_rate"]]
            assert row["first_failing_rate"] > row["max_rate"] and not failing["passes"].all()
        assert row["output_throughput_at_rate"] == pytest.approx(at["output_throughput"].mean())
        assert row["normalized_latency_at_rate"] <= row["threshold"] == 1.0
    assert cap.loc[0, "over_vllm"] == 1.0
    ratio = cap.loc[1, "max_rate"] / cap.loc[0, "max_rate"]
    assert cap.loc[1, "over_vllm"] == pytest.approx(ratio)
    printed = capsys.readouterr().out
    assert "opt-13b on 1 x a100-40gb, sharegpt, cost=roofline (stack none)" in printed
    assert "vllm" in printed and "orca_max" in printed
    # seeded: the same command gives the same table
    again = capacity.main([*SMALL, "--out", str(tmp_path / "b")])
    pd.testing.assert_frame_equal(pd.read_csv(again / "capacity.csv"), cap)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--systems", "vllm,my_sys"], "error: --systems: unknown system (got 'my_sys'"),
        (  # the hint was simulate's (system.plugin=...), which capacity refuses
            ["--systems", "my_sys"],
            "error: --systems: unknown system (got 'my_sys'; expected one of fastertransformer,"
            " orca_max, orca_oracle, orca_pow2, vllm, vllm_v1; a policy plugin is searched as a"
            " system YAML of its own",
        ),
        (["--systems", "vllm, vllm"], "error: --systems: name each system once"),
        (
            ["workload=vllm_log", "workload.path=run"],
            "error: workload: kind 'vllm_log' replays logged arrivals that no key rescales",
        ),
        (["workload.rate=3"], "error: workload.rate: set by the search: leave it out"),
        (  # each row was labelled vllm while the plugin's policy ran
            ["system.plugin=tests.policy_plugin", "system.name=vllm_spf"],
            "error: system.plugin: capacity searches the systems named by --systems; a "
            "policy plugin is searched as a system YAML of its own",
        ),
        (  # the README's example's overrides, pasted as they are
            ["workload=azure_conv", "workload.time_scale=0.25", "system=vllm,orca_pow2"],
            "error: workload.time_scale, system: set by the search: leave them out (--rates "
            "the rates; --systems names the systems)",
        ),
        (
            ["workload=azure_conv", "workload.time_scale=0.5"],
            "error: workload.time_scale: set by the search",
        ),
        (  # it told to add -m, which capacity refuses as an unknown argument
            ["hardware=a100-80gb,h100"],
            "error: hardware: several values: capacity searches one setting, run it once per "
            "value, or write [a,b]",
        ),
        (["--rates", "2,1"], "error: --rates: rates must ascend without repeats"),
        (["--rates", "1,x"], "error: --rates: not a comma-separated list of numbers"),
        (["system.block_size=0"], "error: system.block_size: not a positive power of two"),
        (["--systems", "vllm,vllm"], "error: --systems: name each system once"),
        (["--seeds", "0"], "error: --seeds: not a count >= 1"),
    ],
)
def test_bad_input_is_one_line_before_any_run(
    args: list[str], line: str, tmp_path: Path, capsys
) -> None:
    with pytest.raises(SystemExit) as ended:
        capacity.main([*args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1 and err.startswith(line), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("file", "name", "says"),
    [("l40s-x", "l40s", "error: hardware.name: "),  # a copy whose name was left
     ("l40s", "l40s", "error: hardware: "),  # an edited file Hydra reads the shipped one for
     ("l40s-y", "my-l40s", "error: hardware.name: ")],  # a name not its file's
)  # fmt: skip
def test_a_gpu_yaml_a_run_would_misread_is_refused_here_too(
    tmp_path: Path, capsys, file: str, name: str, says: str
) -> None:
    # simulate refused these; capacity and kv_capacity priced the shipped GPU's numbers, or
    # the file's under another GPU's name, without a word
    from experiments import kv_capacity

    shipped = (
        Path(capacity.__file__).parents[1] / "configs" / "hardware" / "l40s.yaml"
    ).read_text()
    own = tmp_path / "conf" / "hardware"
    own.mkdir(parents=True)
    edited = shipped.replace("memory_gb: 48", "memory_gb: 40").replace(
        "name: l40s", f"name: {name}"
    )
    (own / f"{file}.yaml").write_text(edited)
    args = [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"hardware={file}"]
    for main in (lambda: capacity.main([*args, "--out", str(tmp_path / "out")]),
                 lambda: kv_capacity.main(args)):  # fmt: skip
        with pytest.raises(SystemExit) as ended:
            main()
        err = capsys.readouterr().err
        assert ended.value.code == 2 and err.count("\n") == 1 and err.startswith(says), err
    assert not (tmp_path / "out").exists()


def test_a_plugins_own_system_yaml_is_searched(tmp_path: Path) -> None:
    # --systems was checked against the shipped system YAMLs alone, ignoring the overrides'
    # hydra.searchpath: a plugin's system YAML there was an unknown system
    own = tmp_path / "my_configs" / "system"
    own.mkdir(parents=True)
    (own / "vllm_spf.yaml").write_text(
        "defaults:\n  - vllm\n  - _self_\n\nname: vllm_spf\nplugin: tests.policy_plugin\n"
    )
    out = capacity.main([
        f"hydra.searchpath=[file://{tmp_path / 'my_configs'}]", "workload.duration_s=60",
        "--systems", "vllm,vllm_spf", "--seeds", "1", "--rates", "0.5,1", "--workers", "1",
        "--bisect-evals", "1", "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    cap = pd.read_csv(out / "capacity.csv")
    assert list(cap["system"]) == ["vllm", "vllm_spf"]
    assert (cap["max_rate"] > 0).all()


def _rows(system: str, passes: dict[float, bool]) -> list[dict]:
    return [{"setting": "search", "system": system, "rate": r, "seed": 0, "passes": ok,
             "output_throughput": 10 * r} for r, ok in passes.items()]  # fmt: skip


def test_a_ratio_to_an_open_or_zero_rate_is_a_bound() -> None:
    open_ref = _rows("vllm", {1.0: True, 2.0: True}) + _rows("orca_max", {1.0: True, 2.0: False})
    cap = capacity.capacity_frame(open_ref, ["vllm", "orca_max"]).set_index("system")
    assert cap.loc["vllm", "rate_open"] and cap.loc["orca_max", "over_vllm"] == 0.5
    assert set(cap["over_vllm_bound"]) == {"bound"}  # the reference's rate is only a floor
    exact = _rows("vllm", {1.0: True, 2.0: False}) + _rows("orca_max", {1.0: False})
    cap = capacity.capacity_frame(exact, ["vllm", "orca_max"]).set_index("system")
    assert cap.loc["vllm", "over_vllm_bound"] == "exact"
    assert (
        cap.loc["orca_max", "max_rate"] == 0 and cap.loc["orca_max", "over_vllm_bound"] == "bound"
    )
    assert math.isnan(cap.loc["orca_max", "output_throughput_at_rate"])  # no rate passed
    # the printed table marks an open rate's seed range as a floor too
    open_table = capacity.capacity_frame(open_ref, ["vllm", "orca_max"])
    line = next(x for x in capacity.print_table(open_table, 1.0).splitlines()
                if x.startswith("vllm"))  # fmt: skip
    assert ">=2" in line and ">=2–2" in line


def test_a_trace_file_is_searched_by_its_time_scale(tmp_path: Path, capsys) -> None:
    # a trace replays its own arrivals: rate r is the trace at time_scale trace_rate / r
    trace = tmp_path / "trace.csv"
    rows = [f"{i * 0.5},{100 + 7 * i},{20 + i % 5}" for i in range(200)]  # 2 req/s
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows))
    args = ["workload=trace", "workload.kind=vidur", f"workload.path={trace}",
            "workload.num_requests=120", "--systems", "vllm",
            "--rates", "1,4", "--bisect-evals", "1", "--seeds", "2", "--workers", "1"]  # fmt: skip
    out = capacity.main([*args, "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    # 120 requests span 59.5 s at time_scale 1
    assert f"runs at {120 / 59.5:.3g} req/s: rate r replays it at time_scale" in printed
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs["seed"]) == {0}  # one seed: a trace is the same on every seed
    at_4 = runs[runs["rate"] == 4.0].iloc[0]
    assert at_4["num_requests"] == 120  # the whole count, replayed faster
    assert at_4["trace_s"] == pytest.approx(59.5 * (120 / 59.5) / 4)  # its span, scaled
    span = pd.read_json(out / "runs" / at_4["label"] / "metrics.json", typ="series")
    assert span["num_requests"] == 120


def test_trace_rate_counts_the_window_that_cut_the_trace() -> None:
    from core.request import Request

    reqs = [Request(i, float(i), 10, 10) for i in range(10)]  # 1 req/s, last at 9 s
    assert capacity.trace_rate(reqs, None, counted=False) == pytest.approx(10 / 9)
    assert capacity.trace_rate(reqs, 20.0, counted=False) == pytest.approx(0.5)
    assert capacity.trace_rate(reqs, 20.0, counted=True) == pytest.approx(10 / 9)
    assert capacity.Plan("x", 2.0).rate_overrides()(4.0) == ["++workload.time_scale=0.5"]
    # a duration window is scaled with the trace: the same requests at every rate
    assert capacity.Plan("x", 2.0, 30.0).rate_overrides()(4.0) == [
        "++workload.time_scale=0.5",
        "workload.duration_s=15.0",
    ]
    # and so is its start
    assert capacity.Plan("x", 2.0, 30.0, start=100.0).rate_overrides()(4.0) == [
        "++workload.time_scale=0.5",
        "workload.duration_s=15.0",
        "workload.start_s=50.0",
    ]


def test_a_duration_window_replays_the_same_requests_at_every_rate(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    rows = [f"{i * 0.5},{100 + 7 * i},{20 + i % 5}" for i in range(200)]  # 2 req/s
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows))
    args = ["workload=trace", "workload.kind=vidur", f"workload.path={trace}",
            "workload.duration_s=30", "--systems", "vllm", "--rates", "1,4",
            "--bisect-evals", "1", "--workers", "1"]  # fmt: skip
    out = capacity.main([*args, "--out", str(tmp_path / "out")])
    runs = pd.read_csv(out / "runs.csv")
    assert len(set(runs["rate"])) >= 2
    assert set(runs["num_requests"]) == {60}  # the 60 arrivals of the first 30 s, each rate
    assert list(runs["trace_s"]) == pytest.approx(list(30 * 2 / runs["rate"]))  # 30 s, scaled
    # a window that starts later holds the same later requests at every rate
    late = capacity.main([*args, "workload.start_s=40", "--out", str(tmp_path / "late")])
    runs = pd.read_csv(late / "runs.csv")
    assert len(set(runs["rate"])) >= 2
    # arrivals from 40 s to the filtered trace's end (66 s: longer prompts are dropped)
    assert set(runs["num_requests"]) == {53}


def test_traces_without_a_request_at_any_rate_are_one_line_before_any_file(
    tmp_path: Path, capsys, caplog
) -> None:
    args = ["workload.duration_s=60", "--rates", "0.001,0.002", "--systems", "vllm",
            "--seeds", "1", "--workers", "1"]  # fmt: skip
    with pytest.raises(SystemExit) as ended:
        capacity.main([*args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert ended.value.code == 2
    assert err.startswith("error: --rates: vllm's traces held no request at any rate tried")
    assert not (tmp_path / "out" / "capacity.csv").exists()
    # the empty window is named by its keys, not by the workload's whole dict
    said = {r.getMessage() for r in caplog.records if "holds no request" in r.getMessage()}
    assert said == {"the workload holds no request (workload.rate=0.001, workload.duration_s=60)"}


def test_rejected_requests_are_named_in_the_log(tmp_path: Path, caplog) -> None:
    trace = tmp_path / "trace.csv"
    rows = [f"{i * 0.5},{100 + 7 * i},{20 + i % 5}" for i in range(40)]
    rows[3] = "1.5,5000,20"  # over OPT-13B's 2,048-token max_model_len
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows))
    args = ["workload=trace", "workload.kind=vidur", f"workload.path={trace}",
            "++workload.apply_filter=false", "--systems", "vllm", "--rates", "1,2",
            "--bisect-evals", "1",
            "--workers", "1"]  # fmt: skip
    with caplog.at_level(logging.INFO):
        capacity.main([*args, "--out", str(tmp_path / "out")])
    said = [r.getMessage() for r in caplog.records if "rejected at admission" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("vllm: up to 1 request(s)")
    # apply_filter is vLLM's 2023 ShareGPT filter, not a length cap: the advice says so
    assert "drops every longer prompt too" in said[0]
    # a rate failed by a rejection fails at any load: lower rates would not bracket it
    found = [r.getMessage() for r in caplog.records if r.getMessage().startswith("vllm: 0 req/s")]
    assert len(found) == 1 and "rejected requests fail every rate" in found[0]
    assert "lower --rates" not in found[0]


def test_capacity_csv_holds_the_kv_breakdown_at_the_rate(tmp_path: Path) -> None:
    out = capacity.main([*SMALL[:2], "vllm", *SMALL[3:], "--out", str(tmp_path / "a")])
    cap = pd.read_csv(out / "capacity.csv").iloc[0]
    runs = pd.read_csv(out / "runs.csv")
    at = runs[runs["rate"] == cap["max_rate"]]
    for key in ("kv_token_states_pct", "kv_reserved_pct", "kv_internal_frag_pct",
                "kv_external_frag_pct", "kv_free_at_limit_pct", "kv_free_pct"):  # fmt: skip
        assert cap[f"{key}_at_rate"] == pytest.approx(at[key].mean())


def test_a_second_search_into_the_same_out_keeps_only_its_own_runs(tmp_path: Path) -> None:
    runs = tmp_path / "out" / "runs"
    old = runs / "capacity_search_orca_max_rate1_seed0"
    old.mkdir(parents=True)
    (old / "metrics.json").write_text("{}")
    (old / "config.yaml").write_text("seed: 0")
    mine = runs / "capacity_notes"  # not a run: kept
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    trace = tmp_path / "trace.csv"
    rows = [f"{i * 0.5},{100 + 7 * i},{20 + i % 5}" for i in range(40)]
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows))
    args = ["workload=trace", "workload.kind=vidur", f"workload.path={trace}",
            "--systems", "vllm", "--rates", "1,2", "--bisect-evals", "1",
            "--workers", "1"]  # fmt: skip
    out = capacity.main([*args, "--out", str(tmp_path / "out")])
    assert not old.exists() and (mine / "notes.txt").is_file()
    labels = set(pd.read_csv(out / "runs.csv")["label"])
    assert {d.name for d in runs.iterdir()} == labels | {"capacity_notes"}


def test_a_new_search_removes_the_outputs_of_the_runs_it_removes(tmp_path: Path) -> None:
    # stopped midway, a second search left the first one's capacity.csv, runs.csv, curves.csv
    # and figure beside runs/ that no longer held the runs they were made from
    runs = tmp_path / "runs"
    (runs / "capacity_search_vllm_rate1_seed0").mkdir(parents=True)
    (runs / "capacity_search_vllm_rate1_seed0" / "metrics.json").write_text("{}")
    for name in [*capacity.OUTPUT_FILES, "notes.md"]:
        (tmp_path / name).write_text("earlier")
    assert capacity.clear_earlier_runs(runs) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.md", "runs"]


def test_overrides_may_stand_before_and_after_the_options(tmp_path: Path, capsys) -> None:
    """Both groups of overrides reach the config (here the second is checked and refused by
    name), not "unrecognized arguments"."""
    with pytest.raises(SystemExit) as exit_:
        capacity.main(["workload.duration_s=60", "--systems", "vllm", "workload.nonsense=1",
                       "--out", str(tmp_path / "out")])  # fmt: skip
    assert exit_.value.code == 2
    assert "workload.nonsense: no such key" in capsys.readouterr().err


def test_the_heading_names_each_systems_stack_where_they_differ() -> None:
    """cost=profiled gives vllm_v1 the vllm-v1 stack and vllm the paper-era vllm-2023 one:
    the heading (and the figure's title) named the first system's stack for both."""
    overrides = ["model=opt-125m", "cost=profiled", "workload.duration_s=10"]
    mixed = capacity.check_configs(overrides, ["vllm_v1", "vllm"], 1.0).setting
    assert "cost=profiled (stacks vllm-v1 for vllm_v1, vllm-2023 for vllm)" in mixed
    alike = capacity.check_configs(overrides, ["vllm", "orca_max"], 1.0).setting
    assert "cost=profiled (stack vllm-2023)" in alike


def test_the_heading_names_the_trace_file() -> None:
    """Both Azure traces are of kind azure: the heading (and the figure's title) named the
    kind alone, so a search of the code trace read as one of the conversation trace."""
    overrides = ["model=opt-125m", "workload=azure_code", "workload.duration_s=60"]
    setting = capacity.check_configs(overrides, ["vllm"], 1.0).setting
    assert "opt-125m on 1 x a100-40gb, azure AzureLLMInferenceTrace_code.csv, cost=" in setting
    synthetic = capacity.check_configs(["model=opt-125m"], ["vllm"], 1.0).setting
    assert "opt-125m on 1 x a100-40gb, sharegpt, cost=" in synthetic


def test_a_window_past_the_traces_end_is_searched_at_the_traces_own_rate(tmp_path: Path) -> None:
    # a duration_s window that runs past the trace's last arrival cuts nothing: the rate is
    # the one the same requests have without it, not their count over the empty tail
    trace = tmp_path / "trace.csv"
    rows = [f"{i * 0.5},{100 + i % 7},{20 + i % 5}" for i in range(200)]  # 2 req/s, to 99.5 s
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows))
    base = ["workload=trace", "workload.kind=vidur", f"workload.path={trace}"]
    whole = capacity.check_configs([*base, "workload.start_s=60"], ["vllm"], 1.0)
    past = capacity.check_configs(
        [*base, "workload.start_s=60", "workload.duration_s=1000"], ["vllm"], 1.0
    )
    assert whole.trace_rate == pytest.approx(80 / 39.5)  # 80 arrivals from 60 s to 99.5 s
    assert past.trace_rate == pytest.approx(whole.trace_rate)
    assert "all 80 requests" in past.setting
    # a window that ends inside the trace still counts its own length
    cut = capacity.check_configs(
        [*base, "workload.start_s=60", "workload.duration_s=20"], ["vllm"], 1.0
    )
    assert cut.trace_rate == pytest.approx(40 / 20)
    assert "its first 40 requests" in cut.setting
    # and the rate searched is the rate replayed: rate 4 replays the 80 requests at ~4 req/s
    over = dict(x.split("=", 1) for x in past.rate_overrides()(4.0))
    scale = float(over["++workload.time_scale"])
    assert 39.5 * scale == pytest.approx(80 / 4)


def test_a_long_search_says_how_many_runs_are_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a search silent for minutes looked hung: while a job runs, a line every HEARTBEAT_S
    # counts the runs written so far
    from concurrent.futures import TimeoutError as FuturesTimeout

    class SlowJob:
        waits = 0

        def result(self, timeout: float | None = None) -> list:
            assert timeout == capacity.HEARTBEAT_S
            self.waits += 1
            if self.waits < 3:
                (tmp_path / f"run{self.waits}").mkdir()
                (tmp_path / f"run{self.waits}" / "metrics.json").write_text("{}")
                raise FuturesTimeout
            return ["found"]

    with caplog.at_level("INFO", logger=capacity.log.name):
        assert capacity._result_with_heartbeat(SlowJob(), tmp_path, 0.0) == ["found"]
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" (")[0] for line in lines] == [
        "... 1 run(s) done so far",
        "... 2 run(s) done so far",
    ]


def test_each_run_of_a_search_runs_again_from_its_config_yaml(tmp_path: Path) -> None:
    """A run of the search keeps its resolved config beside its metrics: the trace's
    time_scale and window for the rate, the seed and the system, so that simulate gives
    the same metrics from it alone (and writes the tables a search does not keep)."""
    from omegaconf import OmegaConf

    from experiments.simulate import run

    trace = tmp_path / "trace.csv"
    rows = [f"{i * 0.5},{100 + 7 * i},{20 + i % 5}" for i in range(40)]
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows))
    out = capacity.main(["workload=trace", "workload.kind=vidur", f"workload.path={trace}",
                         "workload.duration_s=15", "--systems", "vllm", "--rates", "4,8",
                         "--bisect-evals", "1", "--workers", "1",
                         "--out", str(tmp_path / "out")])  # fmt: skip
    runs = pd.read_csv(out / "runs.csv")
    label = runs.loc[runs["rate"] == 4.0, "label"].item()
    folder = out / "runs" / label
    assert {p.name for p in folder.iterdir()} == {"config.yaml", "inputs.json", "metrics.json"}
    again = run(OmegaConf.load(folder / "config.yaml"), tmp_path / "again")
    kept = json.loads((folder / "metrics.json").read_text())
    machine = {"wall_s", "sim_steps_per_s", "label"}
    assert {k: v for k, v in again.items() if k not in machine} == {
        k: v for k, v in kept.items() if k not in machine
    }
    assert (tmp_path / "again" / "requests.csv").is_file()
