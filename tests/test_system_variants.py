"""Settings of one shipped system compared side by side (README: Comparing settings of one
system): a system YAML of one's own that keeps the shipped system's ``name`` and changes its
keys is labelled by its file's name (the ``system=`` option) in a sweep's ``summary.csv`` and
in capacity's tables, and the registered name it runs is kept beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from experiments import simulate
from experiments.lib.callbacks import collect_summary
from tests.test_config_errors import SIM_SMALL, run_cli


def _variant(folder: Path, name: str = "vllm_v1") -> str:
    """``<folder>/system/vllm_v1_nopc.yaml``: vllm_v1 with prefix caching off, its
    ``name`` given; returns the ``hydra.searchpath`` override that finds it."""
    (folder / "system").mkdir(parents=True, exist_ok=True)
    (folder / "system" / "vllm_v1_nopc.yaml").write_text(
        f"defaults:\n  - vllm_v1\n  - _self_\n\nname: {name}\nenable_prefix_caching: false\n"
    )
    return f"hydra.searchpath=[file://{folder}]"


def _job(sweep: Path, num: int, overrides: list[str], metrics: dict | None) -> None:
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))
    if metrics is None:
        (job / "error.txt").write_text("error: system: something\n")
    else:
        (job / "metrics.json").write_text(json.dumps(metrics))


def test_a_groups_column_keeps_the_option_chosen_and_the_name_beside_it(tmp_path: Path) -> None:
    # the metric system (the YAML's name) replaced the override's column: two variants of
    # vllm_v1 were both "vllm_v1", and sweep_plot --hue system averaged them as one point
    _job(tmp_path, 0, ["system=vllm_v1", "workload.rate=1"], {"system": "vllm_v1", "x": 1.0})
    _job(tmp_path, 1, ["system=vllm_v1_nopc", "workload.rate=1"],
         {"system": "vllm_v1", "x": 2.0})  # fmt: skip
    _job(tmp_path, 2, ["system=vllm_v1_bs8", "workload.rate=1"], None)
    summary = collect_summary(tmp_path)
    assert list(summary["system"]) == ["vllm_v1", "vllm_v1_nopc", "vllm_v1_bs8"]
    assert list(summary["system_name"][:2]) == ["vllm_v1", "vllm_v1"]
    assert pd.isna(summary["system_name"][2])  # a failed job ran nothing
    assert list(summary.columns[:4]) == ["job", "system", "workload.rate", "system_name"]


def test_a_name_equal_to_its_option_adds_no_column(tmp_path: Path) -> None:
    _job(tmp_path, 0, ["system=vllm", "model=opt-125m"],
         {"system": "vllm", "model": "opt-125m", "x": 1.0})  # fmt: skip
    summary = collect_summary(tmp_path)
    assert not [c for c in summary if c.endswith("_name")]
    assert summary.loc[0, "system"] == "vllm" and summary.loc[0, "model"] == "opt-125m"


def test_a_swept_key_that_is_no_group_takes_the_metric_and_adds_no_column(
    tmp_path: Path,
) -> None:
    # only a group's option is kept beside its name: serve's threads=null (metric None) had
    # added a threads_name column, as "null" reads otherwise than None
    _job(tmp_path, 0, ["threads=null"], {"threads": None, "x": 1.0})
    _job(tmp_path, 1, ["threads=2"], {"threads": 2, "x": 1.0})
    summary = collect_summary(tmp_path)
    assert "threads_name" not in summary
    assert pd.isna(summary.loc[0, "threads"]) and summary.loc[1, "threads"] == 2


def test_a_sweep_of_two_settings_of_one_system_tells_them_apart(tmp_path: Path) -> None:
    search = _variant(tmp_path / "mine")
    sweep = tmp_path / "sweep"
    args = ["-m", *SIM_SMALL, search, "workload=shared_prefix", "workload.duration_s=null",
            "system=vllm_v1,vllm_v1_nopc", f"hydra.sweep.dir={sweep}"]  # fmt: skip
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    assert status == 0, err
    summary = pd.read_csv(sweep / "summary.csv").set_index("system")
    assert list(summary.index) == ["vllm_v1", "vllm_v1_nopc"]
    assert list(summary["system_name"]) == ["vllm_v1", "vllm_v1"]
    hits = summary["prefix_cache_hit_tokens"]
    assert hits["vllm_v1"] > 0 and hits["vllm_v1_nopc"] == 0  # the setting took effect


def test_a_single_runs_table_and_summary_name_a_system_yaml_by_its_file(tmp_path: Path) -> None:
    # the results table's heading named the policy (vllm_v1), the summary line the file
    status, out, err = run_cli(simulate, [*SIM_SMALL, _variant(tmp_path / "mine"),
                                          "system=vllm_v1_nopc"], tmp_path / "a")  # fmt: skip
    assert status == 0, err
    assert "simulate: vllm_v1_nopc opt-13b" in out
    assert json.loads((tmp_path / "a" / "run" / "metrics.json").read_text())["system"] == "vllm_v1"


def test_a_variant_named_after_its_file_is_told_to_keep_the_systems_name(tmp_path: Path) -> None:
    search = _variant(tmp_path / "mine", name="vllm_v1_nopc")
    args = [*SIM_SMALL, search, "system=vllm_v1_nopc"]
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: system: unknown system (got 'vllm_v1_nopc'")
    assert "a setting of a shipped system" in err and "Comparing settings of one system" in err


def test_a_sweeps_summary_names_the_stack_each_run_was_priced_on(tmp_path: Path) -> None:
    # cost=profiled prices vllm_v1 on the vllm-v1 stack and the paper's systems on
    # vllm-2023 unless cost.stack is given: summary.csv did not say which
    sweep = tmp_path / "sweep"
    args = ["-m", *SIM_SMALL, "model=opt-125m", "cost=profiled", "system=vllm_v1,vllm",
            f"hydra.sweep.dir={sweep}"]  # fmt: skip
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    assert status == 0, err
    summary = pd.read_csv(sweep / "summary.csv").set_index("system")
    assert summary["cost_stack"].to_dict() == {"vllm_v1": "vllm-v1", "vllm": "vllm-2023"}
    one = tmp_path / "one"
    status, _, err = run_cli(simulate, [*SIM_SMALL, "model=opt-125m"], one)
    assert status == 0, err
    assert json.loads((one / "run" / "metrics.json").read_text())["cost_stack"] == "none"


def test_a_run_folder_names_a_system_yaml_of_ones_own_by_its_file() -> None:
    from experiments.lib.cli import run_system_label

    assert run_system_label("vllm_v1", "vllm_v1_nopc") == "vllm_v1_nopc"  # a YAML of one's own
    assert run_system_label("vllm_spf", "vllm") == "vllm_spf"  # a plugin on a shipped YAML
    assert run_system_label("vllm", "vllm") == "vllm"
    assert run_system_label("vllm", None) == "vllm"  # outside a Hydra app
    for app in ("simulate", "serve"):
        cfg = OmegaConf.load(Path(__file__).resolve().parents[1] / "configs" / f"{app}.yaml")
        run_dir = OmegaConf.to_container(cfg.hydra.run, resolve=False)["dir"]  # type: ignore[index]
        assert "_${run_system:${system.name},${hydra:runtime.choices.system}}_" in run_dir


def test_a_run_again_from_its_folder_keeps_a_system_yamls_label(tmp_path: Path) -> None:
    # the run folder's config.yaml chooses no system=, so a run again from it was labelled
    # by the policy (vllm_v1): config.yaml now holds the file's name as system.label
    status, _, err = run_cli(simulate, [*SIM_SMALL, _variant(tmp_path / "mine"),
                                        "system=vllm_v1_nopc"], tmp_path / "a")  # fmt: skip
    assert status == 0, err
    first = tmp_path / "a" / "run"
    assert OmegaConf.load(first / "config.yaml").system.label == "vllm_v1_nopc"
    again = ["--config-dir", str(first), "--config-name", "config"]
    status, out, err = run_cli(simulate, again, tmp_path / "b")
    assert status == 0, err
    assert "simulate: vllm_v1_nopc opt-13b" in out
    assert "\nvllm_v1_nopc opt-13b " in f"\n{out}"  # the summary line
    second = tmp_path / "b" / "run"
    kept = [OmegaConf.load(run / "config.yaml") for run in (first, second)]
    assert kept[0].system == kept[1].system  # its label too, for a run again from this one
    assert (second / "steps.csv").read_bytes() == (first / "steps.csv").read_bytes()


def test_a_shipped_systems_config_holds_no_label(tmp_path: Path) -> None:
    status, _, err = run_cli(simulate, [*SIM_SMALL, "system=vllm_v1"], tmp_path / "a")
    assert status == 0, err
    assert "label" not in OmegaConf.load(tmp_path / "a" / "run" / "config.yaml").system


def test_a_recorded_search_run_runs_again_from_its_folder_to_the_same_metrics(
    tmp_path: Path,
) -> None:
    # capacity's runs/<label>/metrics.json held the search's label, which a run again from
    # the folder's config.yaml cannot know; and that run named the policy, not the file
    from experiments import reproduce

    runs = tmp_path / "runs"
    search = _variant(tmp_path / "mine")
    m = reproduce.run_recorded(runs, [], "capacity_x", [*SIM_SMALL, search, "system=vllm_v1_nopc"])
    assert m["label"] == "capacity_x"  # the search's rows keep it
    again = ["--config-dir", str(runs / "capacity_x"), "--config-name", "config"]
    status, out, err = run_cli(simulate, again, tmp_path / "b")
    assert status == 0, err
    assert "simulate: vllm_v1_nopc opt-13b" in out
    speed = ("wall_s", "sim_steps_per_s")  # the machine's, not the run's
    kept, rerun = (
        {k: v for k, v in json.loads(path.read_text()).items() if k not in speed}
        for path in (runs / "capacity_x" / "metrics.json", tmp_path / "b" / "run" / "metrics.json")
    )
    assert kept == rerun
