"""A user's own GPU or model YAML on Hydra's search path (README: GPUs and models are data),
through the real command-line entry: where the file must sit, the hint an unknown one
gets, and a ``name`` that must be its file's name (results and calibration checks know a
GPU or model by that name alone)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml

from experiments import simulate
from tests.test_config_errors import SIM_SMALL, run_cli

REPO = Path(__file__).resolve().parents[1]
HOW_TO_ADD = "(README: GPUs and models are data)"


def _gpu(path: Path, name: str = "my-gpu") -> Path:
    """A GPU YAML at ``path``: h200's numbers with 48 GB, named ``name``."""
    hw = yaml.safe_load((REPO / "configs" / "hardware" / "h200.yaml").read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**hw, "name": name, "memory_gb": 48,
                                    "reported_memory_gib": None}))  # fmt: skip
    return path


def _model(path: Path, name: str) -> Path:
    """A model YAML at ``path`` with qwen3-8b's shape of its own, named ``name``."""
    doc = yaml.safe_load((REPO / "configs" / "model" / "qwen3-8b.yaml").read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**doc, "name": name, "hf_id": None}))
    return path


def _search(folder: Path) -> str:
    return f"hydra.searchpath=[file://{folder}]"


def _refused(status: int, err: str, start: str) -> None:
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(start), err


def test_a_flat_gpu_file_is_named_with_where_it_belongs(tmp_path: Path) -> None:
    flat = _gpu(tmp_path / "mine" / "my-gpu.yaml")
    args = [*SIM_SMALL, _search(tmp_path / "mine"), "hardware=my-gpu"]
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    _refused(status, err, "error: hardware: unknown hardware (got 'my-gpu'; expected one of ")
    assert f"found {flat}: move it to {tmp_path / 'mine' / 'hardware' / 'my-gpu.yaml'}" in err
    assert not (tmp_path / "a" / "run" / "metrics.json").exists()


def test_the_group_folder_itself_on_the_path_is_named(tmp_path: Path) -> None:
    _gpu(tmp_path / "mine" / "hardware" / "my-gpu.yaml")
    args = [*SIM_SMALL, _search(tmp_path / "mine" / "hardware"), "hardware=my-gpu"]
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    _refused(status, err, "error: hardware: unknown hardware")
    assert f"put its parent folder on hydra.searchpath (file://{tmp_path / 'mine'})" in err


def test_an_unknown_gpu_says_how_to_add_one(tmp_path: Path) -> None:
    status, _, err = run_cli(simulate, [*SIM_SMALL, "hardware=my-gpu"], tmp_path / "a")
    _refused(status, err, "error: hardware: unknown hardware (got 'my-gpu'; expected one of ")
    assert "h200" in err and "or add <dir>/hardware/my-gpu.yaml" in err
    assert "hydra.searchpath=[file://<dir>] hardware=my-gpu" in err and HOW_TO_ADD in err
    _gpu(tmp_path / "mine" / "hardware" / "my-gpu.yaml")  # a folder without the file
    args = [*SIM_SMALL, _search(tmp_path / "mine"), "hardware=other"]
    status, _, err = run_cli(simulate, args, tmp_path / "b")
    _refused(status, err, "error: hardware: unknown hardware (got 'other'")
    assert "my-gpu" in err and "or add <dir>/hardware/other.yaml" in err


def test_a_gpu_in_the_hardware_subfolder_runs_under_its_name(tmp_path: Path) -> None:
    _gpu(tmp_path / "mine" / "hardware" / "my-gpu.yaml")
    args = [*SIM_SMALL, _search(tmp_path / "mine"), "hardware=my-gpu"]
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 0, err
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["hardware"] == "my-gpu"


def test_a_gpu_yaml_named_otherwise_inside_is_refused(tmp_path: Path) -> None:
    # a copy of my-gpu.yaml whose name was left: its results, and a calibration fitted on
    # my-gpu (check_calibration_fits compares GPU names), would pass for my-gpu's
    path = _gpu(tmp_path / "mine" / "hardware" / "my-gpu2.yaml", name="my-gpu")
    args = [*SIM_SMALL, _search(tmp_path / "mine"), "hardware=my-gpu2"]
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    _refused(status, err, "error: hardware.name: ")
    assert f"{path} calls itself 'my-gpu', but hardware=my-gpu2 chose it" in err
    assert "write name: my-gpu2" in err
    assert not (tmp_path / "a" / "run" / "metrics.json").exists()
    # a sweep's every choice is checked
    _gpu(tmp_path / "mine" / "hardware" / "my-gpu.yaml")
    args = ["-m", *SIM_SMALL, _search(tmp_path / "mine"), "hardware=my-gpu,my-gpu2"]
    status, _, err = run_cli(simulate, args, tmp_path / "b")
    _refused(status, err, "error: hardware.name: ")


def test_a_copy_naming_a_shipped_gpu_keeps_its_own_line(tmp_path: Path) -> None:
    _gpu(tmp_path / "mine" / "hardware" / "fast.yaml", name="h200")
    args = [*SIM_SMALL, _search(tmp_path / "mine"), "hardware=fast"]
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    _refused(status, err, "error: hardware.name: ")
    assert "names a shipped GPU" in err


def test_an_unknown_model_says_how_to_add_one(tmp_path: Path) -> None:
    flat = _model(tmp_path / "mine" / "my-model.yaml", "my-model")
    args = [*SIM_SMALL, _search(tmp_path / "mine"), "model=my-model"]
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    _refused(status, err, "error: model: unknown model (got 'my-model'; expected one of ")
    assert f"found {flat}: move it to {tmp_path / 'mine' / 'model' / 'my-model.yaml'}" in err
    # model.name= is checked once Hydra composed the config: the same hint
    status, _, err = run_cli(simulate, [*SIM_SMALL, "model.name=my-model"], tmp_path / "b")
    _refused(status, err, "error: model: unknown model (got 'my-model'")
    assert "an HF id in the catalog" in err and "or add <dir>/model/my-model.yaml" in err
    assert HOW_TO_ADD in err


def test_a_model_of_its_own_shape_must_carry_its_files_name(tmp_path: Path) -> None:
    path = _model(tmp_path / "mine" / "model" / "my-model.yaml", "qwen3-8b")
    args = [*SIM_SMALL, _search(tmp_path / "mine"), "model=my-model"]
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    _refused(status, err, "error: model.name: ")
    assert f"{path} calls itself 'qwen3-8b', but model=my-model chose it" in err
    _model(path, "my-model")
    status, _, err = run_cli(simulate, args, tmp_path / "b")
    assert status == 0, err
    assert json.loads((tmp_path / "b" / "run" / "metrics.json").read_text())["model"] == "my-model"


def test_a_model_yaml_that_only_names_a_catalog_model_may_be_named_otherwise(
    tmp_path: Path,
) -> None:
    # no shape of its own: it is the catalog model it names, whatever its file's name
    (tmp_path / "mine" / "model").mkdir(parents=True)
    (tmp_path / "mine" / "model" / "small.yaml").write_text("name: opt-125m\ntp: 1\n")
    args = [*SIM_SMALL, _search(tmp_path / "mine"), "model=small"]
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 0, err
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["model"] == "opt-125m"


def test_a_model_yaml_key_no_part_reads_is_refused(tmp_path: Path) -> None:
    # a misspelt top-level key (tp written otherwise) would run the model at tp 1, and a
    # misspelt shape would fall back to the catalog: each is one line naming the key
    path = _model(tmp_path / "mine" / "model" / "my-model.yaml", "my-model")
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**doc, "tensor_parallel": 2}))
    args = [*SIM_SMALL, _search(tmp_path / "mine"), "model=my-model"]
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    _refused(status, err, "error: model.tensor_parallel: not a key of the model group")
    assert "name, hf_id, tp, hf_config, shape, path" in err
    assert not (tmp_path / "a" / "run" / "metrics.json").exists()
    path.write_text(yaml.safe_dump({"name": "my-model", "tp": 1, "shapes": doc["shape"]}))
    status, _, err = run_cli(simulate, args, tmp_path / "b")
    _refused(status, err, "error: model.shapes: not a key of the model group")


def _plugin_yaml(path: Path) -> Path:
    """The README's system YAML of the example policy plugin, at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("defaults:\n  - vllm\n  - _self_\n\nname: vllm_spf\n"
                    "plugin: tests.policy_plugin\n")  # fmt: skip
    return path


def test_a_flat_system_file_is_named_with_where_it_belongs(tmp_path: Path) -> None:
    # a plugin's system YAML outside system/ would otherwise get the generic hint
    flat = _plugin_yaml(tmp_path / "mine" / "vllm_spf.yaml")
    args = ["-m", *SIM_SMALL, _search(tmp_path / "mine"), "system=vllm,vllm_spf"]
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    _refused(status, err, "error: system: unknown system (got 'vllm_spf'; expected one of ")
    assert f"found {flat}: move it to {tmp_path / 'mine' / 'system' / 'vllm_spf.yaml'}" in err


def test_an_unknown_system_in_a_sweep_names_the_system_yaml(tmp_path: Path) -> None:
    # system.plugin with system.name runs a plugin alone; beside other systems in a sweep
    # it needs a system YAML, and the line says where
    args = ["-m", *SIM_SMALL, "system.plugin=tests.policy_plugin", "system=vllm,vllm_spf"]
    status, _, err = run_cli(simulate, args, tmp_path / "a")
    _refused(status, err, "error: system: unknown system (got 'vllm_spf'; expected one of ")
    assert "to sweep it beside other systems, <dir>/system/vllm_spf.yaml naming it" in err
    _plugin_yaml(tmp_path / "mine" / "system" / "vllm_spf.yaml")
    sweep = tmp_path / "sweep"
    args = ["-m", *SIM_SMALL, _search(tmp_path / "mine"), "system=vllm,vllm_spf",
            f"hydra.sweep.dir={sweep}"]  # fmt: skip
    status, _, err = run_cli(simulate, args, tmp_path / "b")
    assert status == 0, err
    assert "vllm_spf" in (sweep / "summary.csv").read_text()


@pytest.mark.parametrize("flag", [["--config-dir", "{dir}"], ["-cd={dir}"], ["-cd", "{dir}"]])
def test_an_option_in_a_config_dir_folder_runs(tmp_path: Path, flag: list[str]) -> None:
    """Hydra's ``--config-dir``/``-cd`` puts its folder on the search path, as
    ``hydra.searchpath`` does: a GPU of one's own there runs (it was refused as unknown before
    Hydra read the flag)."""
    _gpu(tmp_path / "mine" / "hardware" / "my-gpu.yaml")
    given = [f.format(dir=tmp_path / "mine") for f in flag]
    status, _, err = run_cli(simulate, [*given, *SIM_SMALL, "hardware=my-gpu"], tmp_path)
    assert status == 0, err
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["hardware"] == "my-gpu"


def _package(root: Path, name: str) -> None:
    """A package ``name`` under ``root`` holding ``system/nopc.yaml`` (vllm_v1 without prefix
    caching): configs shipped in a Python package, for ``hydra.searchpath=[pkg://...]``."""
    folder = root.joinpath(*name.split("."))
    (folder / "system").mkdir(parents=True)
    for level in range(len(name.split("."))):
        (root.joinpath(*name.split(".")[: level + 1]) / "__init__.py").write_text("")
    (folder / "system" / "nopc.yaml").write_text(
        "defaults:\n  - vllm_v1\n  - _self_\n\nname: vllm_v1\nenable_prefix_caching: false\n"
    )


def test_a_package_on_the_search_path_is_listed_and_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a pkg:// entry was left to Hydra: an unknown system was its multi-line error, status 1
    _package(tmp_path / "src", "my_kvlab_conf.configs")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    search = "hydra.searchpath=[pkg://my_kvlab_conf/configs]"
    status, _, err = run_cli(simulate, [*SIM_SMALL, search, "system=other"], tmp_path / "a")
    _refused(status, err, "error: system: unknown system (got 'other'; expected one of ")
    assert "nopc" in err
    status, _, err = run_cli(simulate, [*SIM_SMALL, search, "system=nopc"], tmp_path / "b")
    assert status == 0, err
    metrics = json.loads((tmp_path / "b" / "run" / "metrics.json").read_text())
    assert metrics["system"] == "vllm_v1"


def test_a_package_that_is_not_there_is_searched_without(tmp_path: Path) -> None:
    search = "hydra.searchpath=[pkg://no_such_kvlab_package.conf]"  # Hydra warns and goes on
    status, _, err = run_cli(simulate, [*SIM_SMALL, search, "system=other"], tmp_path / "a")
    _refused(status, err, "error: system: unknown system (got 'other'")


def test_the_search_dirs_of_package_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``pkg://`` entry is its package's folder (a trailing ``/`` as Hydra reads it), none
    for a package that is not there (a top-level name too: Hydra searches on without it);
    None (the options left to Hydra) for an entry of another form and a package in a zip."""
    from experiments.lib.compose import search_dirs

    _package(tmp_path / "src", "my_kvlab_dirs.configs")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    folder = tmp_path / "src" / "my_kvlab_dirs" / "configs"
    assert search_dirs(["hydra.searchpath=[pkg://my_kvlab_dirs/configs/]"]) == [folder]
    assert search_dirs(["hydra.searchpath=[pkg://no_such_kvlab_top_package]"]) == []
    assert search_dirs([f"hydra.searchpath=[{tmp_path}]"]) is None  # no scheme
    with zipfile.ZipFile(tmp_path / "conf.zip", "w") as z:
        z.writestr("my_kvlab_zipped/__init__.py", "")
        z.writestr("my_kvlab_zipped/system/nopc.yaml", "name: vllm_v1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "conf.zip"))
    assert search_dirs(["hydra.searchpath=[pkg://my_kvlab_zipped]"]) is None


def test_an_entry_of_no_scheme_imports_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it was looked up as a package too: a/b imported a (its answer, None, the same)
    import sys

    from experiments.lib.compose import search_dirs

    _package(tmp_path / "src", "my_kvlab_noscheme.configs")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    assert search_dirs(["hydra.searchpath=[my_kvlab_noscheme/configs]"]) is None
    assert "my_kvlab_noscheme" not in sys.modules
