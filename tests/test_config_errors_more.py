"""More bad input that must be one line ``error: <key>: ...`` and exit status 2: hardware
numbers that are not finite, system keys vLLM V1 adds, keys added under a group, sweeps
(each job's keys checked, Hydra's sweep syntax for groups), arrivals a float clock cannot
resolve, a user's hardware YAML named by its file, the cost group's keys, and a runs index
that cannot be written. Valid input keeps working beside each."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from core.kv.block_pool import MAX_BLOCKS, BlockPool
from core.plan import BatchShape
from experiments import serve, simulate
from experiments.lib.checks import ConfigError
from experiments.lib.cli import sweep_failure_status
from experiments.lib.compose import (
    check_added_keys,
    check_group_overrides,
    parse_overrides,
    sweep_jobs,
)
from experiments.lib.setup import MAX_ARRIVAL_S, make_cost_model
from sim.catalog import GPUSpec, HardwareError, get_gpu, get_model, gpu_from_config
from tests.test_config_errors import SERVE_SMALL, SIM_SMALL, run_cli

REPO = Path(__file__).resolve().parents[1]
CALIBRATION = REPO / "docs" / "validation" / "vllm-rtx4090" / "calibration.json"
CALIBRATED = [
    "model=llama-3.1-8b", "hardware=rtx4090", "system=vllm_v1", "system.max_model_len=4096",
    "cost=calibrated", f"cost.path={CALIBRATION}",
]  # fmt: skip
LLAMA = ["model=llama-3.1-8b", "system=vllm_v1", "system.max_model_len=4096"]


def _azure(tmp: Path) -> str:
    """A four-row trace in the Azure format."""
    path = tmp / "azure.csv"
    rows = [(0.0, 100, 20), (0.5, 50, 20), (1.0, 300, 40), (1.5, 50, 10)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{t:09.6f},{p},{o}\n" for t, p, o in rows))  # fmt: skip
    return str(path)


def _user_hardware(tmp: Path) -> str:
    """A search-path folder with user hardware YAMLs: a copy of h200 without memory_gb,
    one without a name, an empty one, one that still calls itself h200; returns the
    ``hydra.searchpath`` argument."""
    hw = yaml.safe_load((REPO / "configs" / "hardware" / "h200.yaml").read_text())
    folder = tmp / "conf" / "hardware"
    folder.mkdir(parents=True)
    nomem = {k: v for k, v in hw.items() if k != "memory_gb"} | {"name": "nomem"}
    (folder / "nomem.yaml").write_text(yaml.safe_dump(nomem))
    (folder / "noname.yaml").write_text(yaml.safe_dump({k: v for k, v in hw.items()
                                                        if k != "name"}))  # fmt: skip
    (folder / "empty.yaml").write_text("")
    (folder / "copied.yaml").write_text(yaml.safe_dump({**hw, "mem_bandwidth_gbs": 900}))
    return f"hydra.searchpath=[file://{tmp / 'conf'}]"


def _tokens_run(tmp: Path) -> str:
    """A vLLM run directory (for workload=vllm_log) beside a malformed tokens file."""
    from tests.test_calibrate_vllm import _fake_run

    (tmp / "bad.jsonl").write_text("{not json\n")
    return str(_fake_run(tmp, n=6))


# (id, overrides ({tmp}: the test's folder), the key the line must name, a phrase)
CASES = [
    ("memory_inf", ["hardware.memory_gb=inf"], "hardware.memory_gb", "finite number > 0"),
    ("memory_overflows", ["hardware.memory_gb=1e300"], "hardware.memory_gb",
     "finite number > 0"),
    ("bandwidth_inf", ["hardware.mem_bandwidth_gbs=inf"], "hardware.mem_bandwidth_gbs",
     "finite number > 0"),
    ("flops_negative", ["hardware.peak_tflops=-1"], "hardware.peak_tflops", "finite number > 0"),
    ("memory_under_a_byte", ["hardware.memory_gb=1e-12"], "hardware.memory_gb",
     "memory_gb is under one byte, got 1e-12"),
    ("memory_under_a_byte_beside_a_reported_total", ["hardware=h200",
     "hardware.memory_gb=1e-12"], "hardware.memory_gb", "memory_gb is under one byte"),
    ("reported_memory_under_a_byte", ["hardware.reported_memory_gib=1e-12"],
     "hardware.reported_memory_gib", "reported_memory_gib is under one byte, got 1e-12"),
    ("peer_link_unknown", ["hardware.peer_link=infiniband"], "hardware.peer_link",
     "peer_link must be one of ('nvlink', 'pcie')"),
    # Hydra passes `=no` as text ('no'), `=false` as a boolean
    ("shape_flag_as_text", [*LLAMA, "model.shape.tie_word_embeddings=no"], "model.shape",
     "llama config: tie_word_embeddings must be true or false, got 'no'"),
    ("shape_rope_scaling_not_a_mapping", [*LLAMA, "model.shape.rope_scaling=yes"], "model.shape",
     "llama config: rope_scaling must be a mapping, got 'yes'"),
    ("shape_no_kv_heads", [*LLAMA, "model.shape.num_key_value_heads=0"], "model.shape",
     "llama config: num_key_value_heads must be a whole number >= 1, got 0"),
    ("shape_head_dim_fraction", [*LLAMA, "model.shape.head_dim=127.5"], "model.shape",
     "llama config: head_dim must be a whole number >= 1, got 127.5"),
    ("shape_eps_as_text", [*LLAMA, "model.shape.rms_norm_eps=abc"], "model.shape",
     "llama config: rms_norm_eps must be a finite number > 0, got 'abc'"),
    ("memory_beyond_a_pool", ["hardware.memory_gb=1e250"], "hardware.memory_gb",
     "blocks (2**26) a KV block pool holds"),
    ("swap_beyond_a_pool", ["swap_space_gb=1e12"], "swap_space_gb",
     "blocks (2**26) a KV block pool holds"),
    ("swap_without_a_pool", ["system.preemption_mode=swap", "swap_space_gb=0"],
     "swap_space_gb", "no whole KV block: every preemption would recompute"),
    # 0.01 GiB holds 13 of OPT-13B's 819,200-byte tokens: no block of 16
    ("swap_pool_under_a_block", ["system.preemption_mode=swap", "swap_space_gb=0.01"],
     "swap_space_gb", "no whole KV block: every preemption would recompute"),
    ("non_torch_text", ["system=vllm_v1", "system.non_torch_gb=abc"], "system.non_torch_gb",
     "not a size"),
    ("non_torch_nan", ["system=vllm_v1", "system.non_torch_gb=nan"], "system.non_torch_gb",
     "not a size"),
    ("non_torch_inf", ["system=vllm_v1", "system.non_torch_gb=inf"], "system.non_torch_gb",
     "not a size"),
    ("non_torch_negative", ["system=vllm_v1", "system.non_torch_gb=-100"],
     "system.non_torch_gb", "not a size"),
    ("non_torch_beyond_the_gpu", ["system=vllm_v1", "system.non_torch_gb=1000"],
     "system.non_torch_gb", "does not fit"),
    ("graph_size_text", ["system=vllm_v1", "system.cuda_graph_max_size=abc"],
     "system.cuda_graph_max_size", "not a capture size"),
    ("graph_size_negative", ["system=vllm_v1", "system.cuda_graph_max_size=-100000"],
     "system.cuda_graph_max_size", "not a capture size"),
    ("graph_size_fraction", ["system=vllm_v1", "system.cuda_graph_max_size=1.5"],
     "system.cuda_graph_max_size", "not a capture size"),
    ("graph_pool_beyond_the_gpu", ["system=vllm_v1", "system.cuda_graph_max_size=1000000"],
     "system.cuda_graph_max_size", "does not fit"),
    ("added_system_typo", ["+system.max_num_seq=4"], "system.max_num_seq",
     "the system group has no such key"),
    ("added_model_key", ["+model.foo=4"], "model.foo", "the model group has no such key"),
    ("added_hardware_key", ["+hardware.foo=1"], "hardware.foo",
     "the hardware group has no such key"),
    ("sweep_of_an_unknown_key", ["-m", "workload.foo=1,2"], "workload.foo", "no such key"),
    ("sweep_beside_an_added_key", ["-m", "+foo=1", "seed=0,1"], "foo",
     "no part of this app reads it"),
    ("sweep_of_a_system_key_one_system_lacks", ["-m", "system=vllm_v1,vllm",
     "system.non_torch_gb=1"], "system.non_torch_gb",
     "no such key in this config under system=vllm (a job of the sweep; other swept values "
     "have it): sweep such values separately"),
    ("sweep_of_a_key_no_system_has", ["-m", "system=vllm_v1,vllm", "system.non_torch_g=1"],
     "system.non_torch_g", "no such key in this config (expected"),
    ("glob_matching_nothing", ["-m", "system=glob(zz*)"], "system", "the glob matches no"),
    ("choice_with_an_unknown_system", ["-m", "system=choice(vllm,orca)"], "system",
     "unknown system"),
    ("rate_too_low_for_the_clock", ["workload.rate=1e-300"], "workload.rate",
     "past 4.5e+09 s (2**52 us)"),
    ("time_scale_too_high_for_the_clock", ["workload=azure_conv", "workload.path={azure}",
     "workload.time_scale=1e300"], "workload.time_scale", "past 4.5e+09 s (2**52 us)"),
    ("user_hardware_without_memory", ["{search}", "hardware=nomem"], "hardware.memory_gb",
     "conf/hardware/nomem.yaml or hardware.* overrides: GPU 'nomem' lacks memory_gb"),
    ("user_hardware_without_a_name", ["{search}", "hardware=noname"], "hardware.name",
     "conf/hardware/noname.yaml or hardware.* overrides: the GPU has no name"),
    # a copied YAML whose name was left: its run was labelled h200 with other numbers
    ("user_hardware_named_as_a_shipped_gpu", ["{search}", "hardware=copied"], "hardware.name",
     "conf/hardware/copied.yaml names a shipped GPU, so hardware=copied"),
    ("user_hardware_empty", ["{search}", "hardware=empty"], "hardware",
     "conf/hardware/empty.yaml or hardware.* overrides: empty"),
    ("seed_negative", ["seed=-1"], "seed", "not a seed"),
    ("tokens_file_malformed", ["model=llama-3.1-8b", "hardware=rtx4090", "system=vllm_v1",
     "system.max_model_len=4096", "workload=vllm_log", "workload.path={vllm_run}",
     "workload.tokens_path={tmp}/bad.jsonl"], "workload.tokens_path", "bad.jsonl, line 1"),
    ("roofline_unknown_key", ["+cost.foo=1"], "cost.foo",
     "cost=roofline takes no such key (known: compute_efficiency,"),
    ("calibrated_stack", [*CALIBRATED, "+cost.stack=vllm-v1"], "cost.stack",
     "cost=calibrated takes no such key (known: path)"),
    ("calibrated_efficiency", [*CALIBRATED, "+cost.compute_efficiency=0.5"],
     "cost.compute_efficiency", "cost=calibrated takes no such key"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "key", "phrase"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_input_is_one_line_naming_the_key(
    overrides: list[str], key: str, phrase: str, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    joined = " ".join(overrides)
    files = {
        "tmp": str(tmp_path),
        "azure": _azure(tmp_path) if "{azure}" in joined else "",
        "search": _user_hardware(tmp_path) if "{search}" in joined else "",
        "vllm_run": _tokens_run(tmp_path) if "{vllm_run}" in joined else "",
    }
    flags = [o for o in overrides if o.startswith("-")]
    rest = [o.format(**files) for o in overrides if not o.startswith("-")]
    sweep = [f"hydra.sweep.dir={tmp_path / 'sweep'}"] if flags else []
    status, out, err = run_cli(simulate, [*flags, *SIM_SMALL, *rest, *sweep], tmp_path)
    lines = err.strip().splitlines()
    assert status == 2, (out, err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {key}: "), lines[0]
    assert phrase in lines[0], lines[0]
    assert "Traceback" not in out + err
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_hardware_numbers_must_be_finite_and_positive() -> None:
    doc = yaml.safe_load((REPO / "configs" / "hardware" / "h200.yaml").read_text())
    for key, bad in (("memory_gb", float("inf")), ("mem_bandwidth_gbs", float("nan")),
                     ("host_link_gbs", 0), ("peak_tflops", 1e300 * 1e10)):  # fmt: skip
        with pytest.raises(HardwareError, match=f"my.yaml: {key} must be a finite") as err:
            gpu_from_config({**doc, key: bad}, "my.yaml")
        assert err.value.key == key
    assert gpu_from_config(doc, "my.yaml") == get_gpu("h200")
    with pytest.raises(ValueError, match="mem_bandwidth must be finite and positive"):
        GPUSpec("x", 1 << 30, float("inf"), 1e12, 1e9, 1e9)


def test_a_gpu_value_out_of_range_names_its_yaml_key() -> None:
    """GPUSpec's own checks name the hardware YAML key a field is read from (gpu_from_config
    passed that key on, where it had named peer_link for every one)."""
    for args, kwargs, key in (((0, 1e12, 1e12, 1e9, 1e9), {}, "memory_gb"),
                              ((1, 1e12, 1e12, 1e9, float("nan")), {}, "host_link_gbs"),
                              ((1, 1e12, 1e12, 1e9, 1e9), {"reported_memory_bytes": 0},
                               "reported_memory_gib")):  # fmt: skip
        with pytest.raises(HardwareError) as err:
            GPUSpec("x", *args, **kwargs)
        assert err.value.key == key
    doc = yaml.safe_load((REPO / "configs" / "hardware" / "h200.yaml").read_text())
    with pytest.raises(HardwareError, match=r"my\.yaml: GPU 'h200': peer_link must be") as err:
        gpu_from_config({**doc, "peer_link": "infiniband"}, "my.yaml")
    assert err.value.key == "peer_link"


def test_a_block_pool_beyond_its_bound_is_refused_before_any_allocation() -> None:
    with pytest.raises(ValueError, match=r"num_blocks must be in \[0, 67108864\]"):
        BlockPool(MAX_BLOCKS + 1, 16)
    assert BlockPool(4, 16).num_free() == 4


def test_keys_a_group_holds_may_be_added(tmp_path: Path) -> None:
    """Keys of any option of the group (vllm_v1's on vllm), deeper keys of the model's
    shape, and the keys of a user's own hardware YAML on the search path."""
    keys = ["system.cuda_graph_max_size", "system.non_torch_gb", "model.hf_id",
            "model.shape.rope_theta", "hardware.source"]  # fmt: skip
    check_added_keys("simulate", keys)
    check_added_keys("serve", ["model.path"])
    hw = yaml.safe_load((REPO / "configs" / "hardware" / "h200.yaml").read_text())
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "mine.yaml").write_text(yaml.safe_dump({**hw, "notes": "lab"}))
    search = f"hydra.searchpath=[file://{tmp_path}]"
    check_added_keys("simulate", ["hardware.notes"], [search, "hardware=mine"])
    with pytest.raises(ConfigError, match=r"hardware\.notes") as err:
        check_added_keys("simulate", ["hardware.notes"])  # not without that folder
    assert "memory_gb" in err.value.line()  # the group's keys listed


def test_a_sweep_is_checked_as_its_jobs() -> None:
    """Each sweep at its first value; each further value of a swept group in a job of
    its own; hydra.mode left out."""
    argv = ["-m", "hydra.mode=MULTIRUN", "system=glob(orca_*)", "seed=range(0,3)",
            "+slo_ms.ttft=100"]  # fmt: skip
    jobs = sweep_jobs(parse_overrides(argv), [])
    assert jobs == [
        ["system=orca_max", "seed=0", "+slo_ms.ttft=100"],
        ["system=orca_oracle", "seed=0", "+slo_ms.ttft=100"],
        ["system=orca_pow2", "seed=0", "+slo_ms.ttft=100"],
    ]
    assert sweep_jobs(parse_overrides(["seed=1"]), []) == [["seed=1"]]


def test_hydras_sweep_syntax_for_groups_is_accepted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    check_group_overrides(["-m", "system=glob(orca_*)", "model=glob(opt-1*,exclude=opt-13b)"])
    check_group_overrides(["-m", "system=choice(vllm,orca_max)", "hardware=h100,h200"])
    args = ["-m", *SIM_SMALL, "system=choice(vllm,orca_max)",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]  # fmt: skip
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 0, err
    summary = (tmp_path / "sweep" / "summary.csv").read_text()
    assert "orca_max" in summary and "vllm" in summary


def test_a_sweep_failing_only_on_config_exits_2_else_1(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    args = ["-m", *SIM_SMALL, "workload.rate=-1,2", f"hydra.sweep.dir={tmp_path / 'a'}"]
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 2, err
    assert "1 sweep job(s) failed on bad config" in err

    def broken(*args, **kwargs):
        raise RuntimeError("the cost model blew up")

    monkeypatch.setattr(simulate, "simulate", broken)
    args = ["-m", *SIM_SMALL, "workload.rate=-1,2", f"hydra.sweep.dir={tmp_path / 'b'}"]
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 1, err
    assert "2 sweep job(s) failed (" in err


def test_sweep_failure_status_reads_the_summary(tmp_path: Path) -> None:
    (tmp_path / "summary.csv").write_text("job,status,error\n0,ok,\n1,config error,e\n")
    assert sweep_failure_status(tmp_path) == 2
    (tmp_path / "summary.csv").write_text("job,status,error\n0,failed,x\n1,config error,e\n")
    assert sweep_failure_status(tmp_path) == 1
    assert sweep_failure_status(tmp_path / "nope") == 1
    assert sweep_failure_status(None) == 1


def test_a_calibrated_model_prices_transfers_at_the_runs_block_size() -> None:
    """Swaps and copies are not fitted: the roofline prices them per byte, so at the run's
    block size (the shipped file was fitted at 16)."""
    model, gpu = get_model("llama-3.1-8b"), get_gpu("rtx4090")
    cost = {"kind": "calibrated", "path": str(CALIBRATION)}
    assert json.loads(CALIBRATION.read_text())["block_size"] == 16
    swap = BatchShape(swap_out_blocks=4, copy_blocks=2)
    times = {}
    for bs in (8, 16, 32):
        config = {"system": {"name": "vllm_v1", "block_size": bs}, "cost": cost}
        times[bs] = make_cost_model(config, model, gpu).step_time(swap)
    assert times[8] == pytest.approx(times[16] / 2) and times[32] == pytest.approx(2 * times[16])


@pytest.mark.parametrize(("change", "problem"), [
    ({"profile": 5}, "profile: expected a path or null, got 5"),
    ({"fit_stats": {"mape": "abc"}}, "fit_stats.mape: expected a number or null, got 'abc'"),
    ({"fit_stats": {"weighting": 1}}, "fit_stats.weighting: expected a word or null, got 1"),
    ({"dtype_bytes": 3}, "dtype_bytes: expected one of [2, 4]"),
    ({"dtype_bytes": 1000}, "dtype_bytes: expected one of [2, 4]"),
])  # fmt: skip
def test_a_malformed_calibration_file_names_its_field(
    change: dict[str, object], problem: str, tmp_path: Path
) -> None:
    """A profile that is not a path was a TypeError traceback, a MAPE that is not a number
    one of formatting; a width no dtype has (1000) priced a token at seconds."""
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({**json.loads(CALIBRATION.read_text()), **change}))
    config = {"system": {"name": "vllm_v1"}, "cost": {"kind": "calibrated", "path": str(path)}}
    with pytest.raises(ConfigError) as err:
        make_cost_model(config, get_model("llama-3.1-8b"), get_gpu("rtx4090"))
    assert err.value.key == "cost.path" and str(path) in err.value.line()
    assert f"malformed calibration file: {problem}" in err.value.line()


def test_arrivals_within_the_clock_still_run(tmp_path: Path) -> None:
    status, out, err = run_cli(simulate, [*SIM_SMALL, "workload.rate=1e-5"], tmp_path)
    assert status == 0, err
    assert "5/5 done" in out
    assert MAX_ARRIVAL_S == 2**52 / 1e6


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_index_where_no_file_can_be_made_is_refused() -> None:
    """/proc takes no new file, though os.access says it may to root."""
    from experiments.lib.cli import check_index_writable

    with pytest.raises(ConfigError, match="cannot write the runs index there") as err:
        check_index_writable(Path("/proc/kvlab-index.csv"))
    assert err.value.key == "index"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_run_dir_that_cannot_be_made_is_refused_by_key(tmp_path: Path) -> None:
    """/proc takes no new folder, though os.access says it may to root; a good run dir is
    left for Hydra to make (a run refused before Hydra starts leaves no folder)."""
    from experiments.lib.cli import check_output_dirs

    with pytest.raises(ConfigError) as err:
        check_output_dirs(["hydra.run.dir=/proc/kvlab-run"])
    assert err.value.key == "hydra.run.dir"
    check_output_dirs([f"hydra.run.dir={tmp_path / 'a' / 'b'}"])
    assert not (tmp_path / "a").exists()


def test_a_failed_rerun_leaves_none_of_the_earlier_runs_tables(tmp_path: Path) -> None:
    """Rerun into a finished run's folder with a config that is refused: the folder holds
    this run's error, not the earlier run's requests, steps and config beside it."""
    status, _, err = run_cli(simulate, SIM_SMALL, tmp_path)
    assert status == 0, err
    run = tmp_path / "run"
    assert {"metrics.json", "requests.csv", "steps.csv", "config.yaml"} <= {
        p.name for p in run.iterdir()
    }
    status, _, err = run_cli(simulate, [*SIM_SMALL, "system.block_size=3"], tmp_path)
    assert status == 2, err
    left = {p.name for p in run.iterdir() if p.is_file()}
    assert "error.txt" in left and not left & {"metrics.json", "requests.csv", "steps.csv",
                                               "config.yaml", "cost_model.json",
                                               "provenance.json"}  # fmt: skip


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_result_file_the_system_will_not_write_is_refused_first(tmp_path: Path) -> None:
    from experiments.lib.cli import check_out_file

    with pytest.raises(ConfigError, match="cannot write there") as err:
        check_out_file(Path("/proc/kvlab-calibration.json"))
    assert err.value.key == "--out"
    with pytest.raises(ConfigError, match="is a folder; give the file to write"):
        check_out_file(tmp_path)
    check_out_file(tmp_path / "new" / "c.json")  # a folder it can make: made, then removed
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == []


def test_a_hydra_flag_after_the_overrides_is_taken() -> None:
    # kvlab adds overrides of its own to the command line: appended after a flag they made a
    # second run of overrides, which Hydra's parser refused ("unrecognized arguments")
    import subprocess
    import sys

    from experiments.lib.cli import with_overrides

    extra = ["+a=1"]
    assert with_overrides(["p", "x=1", "--cfg", "job"], extra) == ["p", "x=1", "+a=1", "--cfg",
                                                                     "job"]  # fmt: skip
    assert with_overrides(["p", "--cfg", "job"], extra) == ["p", "--cfg", "job", "+a=1"]
    assert with_overrides(["p", "-m", "x=1,2"], extra) == ["p", "-m", "x=1,2", "+a=1"]
    assert with_overrides(["p", "~seed", "--cfg", "job"], extra) == ["p", "~seed", "+a=1",
                                                                     "--cfg", "job"]  # fmt: skip
    assert with_overrides(["p", "x=1", "-m", "y=1,2"], extra)[:2] == ["p", "-m"]
    done = subprocess.run(
        [sys.executable, "-m", "experiments.simulate", "workload.rate=3", "--cfg", "job"],
        capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "rate: 3" in done.stdout


def test_m_after_an_override_sweeps_and_a_sweep_without_m_is_one_line(tmp_path: Path) -> None:
    from tests.test_config_errors import run_cli

    sweep = [f"hydra.sweep.dir={tmp_path / 'sweep'}", "workload.num_requests=2"]
    status, _, err = run_cli(simulate, [*sweep, "-m", "system=vllm,orca_max"], tmp_path)
    assert status == 0, err
    assert len(pd.read_csv(tmp_path / "sweep" / "summary.csv")) == 2
    status, _, err = run_cli(simulate, ["system=vllm,orca_max"], tmp_path)
    assert status == 2
    assert err.strip() == (
        "error: system: several values without -m: add -m to run one job per value, or "
        "write [a,b] for a list, 'a,b' for a string (got 'vllm,orca_max')"
    )


def test_a_relative_input_path_is_found_from_any_working_directory(
    tmp_path: Path, monkeypatch
) -> None:
    # the working directory's first, else the repository's (shipped files): cost.profile
    # already was; cost.stack_path was read from the working directory only
    from experiments.reproduce import compose_config

    monkeypatch.chdir(tmp_path)
    shipped = "sim/cost/stacks/kvlab-cpu-tiny-opt.json"
    over = ["workload.num_requests=2", "cost.stack=measured", f"cost.stack_path={shipped}"]
    assert simulate.run(compose_config(over))["completed"] == 2
    mine = tmp_path / "sim/cost/stacks"
    mine.mkdir(parents=True)
    (mine / "kvlab-cpu-tiny-opt.json").write_text("{}")  # the working directory's wins
    with pytest.raises(ConfigError) as exc:
        simulate.run(compose_config(over))
    assert exc.value.key == "cost.stack_path"


@pytest.mark.parametrize("flag", [["--cfg", "job"], ["--help"]])
def test_showing_the_config_with_a_bad_key_is_one_line_and_no_index_row(
    tmp_path: Path, flag: list[str]
) -> None:
    # it had been Hydra's traceback (--help) or its multi-line error (--cfg), and each added
    # a "config error" row to the runs index for a command that runs nothing
    from tests.test_config_errors import run_cli

    status, _, err = run_cli(simulate, [*flag, "foo=1"], tmp_path)
    assert status == 2
    assert err.strip().startswith("error: foo: no such key") and "\n" not in err.strip()
    assert not (tmp_path / "index.csv").exists()


def test_prefix_caching_without_ids_says_how_many_requests_lack_them(monkeypatch) -> None:
    from core.request import Request
    from experiments.lib import setup

    said: list[str] = []

    class Log:
        def info(self, message: str, *args: object) -> None:
            said.append(message % args)

    monkeypatch.setattr(setup, "log", Log())
    reqs = [Request(0, 0.0, 3, 2, prompt_token_ids=[1, 2, 3]), Request(1, 0.0, 3, 2)]
    # on: each request without ids stands for a prompt of its own (it had turned caching off)
    assert setup.prefix_caching_for({"enable_prefix_caching": True}, reqs) is True
    assert "has 1 of 2 without prompt token ids" in said[0] and "no prefix is shared" in said[0]
    assert setup.prefix_caching_for({"enable_prefix_caching": False}, reqs) is False
    assert len(said) == 1  # caching off: nothing to say


def test_the_config_shown_nulls_the_partner_key_as_the_run_does(tmp_path: Path) -> None:
    # --cfg job showed duration_s: 600 beside num_requests: 50, a window the run never uses
    from tests.test_config_errors import run_cli

    status, out, err = run_cli(simulate, ["--cfg", "job", "workload.num_requests=50"], tmp_path)
    assert status == 0, err
    assert "duration_s: null" in out and "num_requests: 50" in out
    status, out, err = run_cli(simulate, ["--cfg", "job", "workload.duration_s=30"], tmp_path)
    assert status == 0, err
    assert "duration_s: 30" in out and "num_requests: null" in out
    assert not (tmp_path / "index.csv").exists()  # showing the config writes no index


def test_showing_the_config_of_a_sweep_is_one_line(tmp_path: Path) -> None:
    # Hydra refused -m with --cfg by a traceback
    from tests.test_config_errors import run_cli

    status, _, err = run_cli(simulate, ["-m", "system=vllm,orca_max", "--cfg", "job"], tmp_path)
    assert status == 2
    assert err.strip().startswith("error: --cfg: shows one job's config and does not go with -m")
    assert not (tmp_path / "index.csv").exists()


@pytest.mark.parametrize("app", [simulate, serve])
def test_help_offers_only_runnable_systems(tmp_path: Path, app) -> None:
    # it listed `_base`, the shared defaults, as a system that then failed as unknown
    from core.systems import BUILT_IN
    from tests.test_config_errors import run_cli

    status, out, _ = run_cli(app, ["--help"], tmp_path)
    assert status == 0
    (line,) = [s for s in out.splitlines() if s.startswith("system: ")]
    assert set(line.removeprefix("system: ").split(", ")) == set(BUILT_IN)


def test_a_users_yaml_named_as_a_shipped_option_is_refused_unless_identical(
    tmp_path: Path,
) -> None:
    # Hydra reads configs/ first: the user's edited h200.yaml was ignored without a word
    from tests.test_config_errors import SIM_SMALL, run_cli

    shipped = REPO / "configs" / "hardware" / "h200.yaml"
    (tmp_path / "conf" / "hardware").mkdir(parents=True)
    mine = tmp_path / "conf" / "hardware" / "h200.yaml"
    mine.write_text(shipped.read_text().replace("mem_bandwidth_gbs: 4800", "mem_bandwidth_gbs: 1"))
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    status, _, err = run_cli(simulate, [*SIM_SMALL, search, "hardware=h200"], tmp_path / "a")
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: hardware: ") and "which Hydra reads instead" in err
    mine.write_bytes(shipped.read_bytes())  # a copy of the shipped file changes nothing
    status, _, err = run_cli(simulate, [*SIM_SMALL, search, "hardware=h200"], tmp_path / "b")
    assert status == 0, err


def test_a_rate_for_a_recorded_trace_points_at_time_scale(tmp_path: Path) -> None:
    # the line said only "no such key", which a user trying the Azure traces met first
    status, _, err = run_cli(simulate, ["workload=azure_conv", "workload.rate=2"], tmp_path)
    assert status == 2
    assert err.startswith("error: workload.rate: no such key in this config (expected none:")
    assert "workload.time_scale sets its rate" in err and len(err.strip().splitlines()) == 1


def test_a_duration_for_a_workload_without_one_points_at_its_size(tmp_path: Path) -> None:
    # the line said only "no such key" (a user study sized a chatbot run by duration_s)
    status, _, err = run_cli(simulate, ["workload=multi_turn", "workload.duration_s=60"], tmp_path)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: workload.duration_s: no such key in this config (expected none:")
    assert "workload.num_conversations" in err and "workload.num_requests" in err


def test_a_missing_vllm_run_directory_is_named_as_one(tmp_path: Path) -> None:
    # it said "expected an existing trace file" of a kind that reads a run directory
    args = ["workload=vllm_log", f"workload.path={tmp_path / 'no-run'}"]
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 2
    assert "error: workload.path: no such directory" in err
    assert "a vLLM run directory (requests.jsonl, meta.json)" in err


def test_greedy_parallel_samples_are_refused_before_the_engine_is_built(
    tmp_path: Path, monkeypatch
) -> None:
    # serve built the engine (and logged it) before the workload's sampling refused
    built = []
    monkeypatch.setattr(serve, "build_engine", lambda c: built.append(c) or 1 / 0)
    args = [*SERVE_SMALL, "workload.n=4", "workload.temperature=0"]
    status, _, err = run_cli(serve, args, tmp_path)
    assert status == 2 and not built
    assert err.strip().startswith("error: workload.temperature: n=4 parallel samples")
    assert len(err.strip().splitlines()) == 1


def test_a_serve_runs_config_given_to_simulate_says_so(tmp_path: Path) -> None:
    # simulate --config-dir <a serve run> crashed with KeyError: 'cost' (a traceback)
    from omegaconf import OmegaConf

    from experiments.lib.compose import compose_config

    folder = tmp_path / "serve_run"
    folder.mkdir()
    OmegaConf.save(compose_config("serve", SERVE_SMALL), folder / "config.yaml")
    args = ["--config-dir", str(folder), "--config-name", "config"]
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith("error: cost: the simulator's cost model is missing")
    assert "run it again with python -m experiments.serve" in err
