"""GPUs and models as data: hardware YAMLs, model shape YAMLs, HF config files and ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from core.model_spec import ModelSpec, kv_bytes_per_token
from core.plan import BatchShape
from experiments.lib.setup import build_setup
from sim.catalog import (
    CONFIGS,
    HARDWARE_KEYS,
    get_gpu,
    get_model,
    gpu_from_config,
    model_from_config,
    models,
    resolve_gpu,
)
from sim.cost import RooflineCostModel

# Parameter counts of the released checkpoints (model cards / safetensors index sizes).
RELEASED_PARAMS = {
    "llama-3.1-8b": 8.03e9,
    "llama-3.1-70b": 70.6e9,
    "qwen3-8b": 8.19e9,
    "qwen3-32b": 32.8e9,
    "mistral-7b": 7.25e9,
}


@pytest.mark.parametrize("path", sorted((CONFIGS / "hardware").glob("*.yaml")), ids=str)
def test_every_hardware_yaml_has_every_number_and_its_source(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    for key in HARDWARE_KEYS:
        assert isinstance(doc[key], int | float) and doc[key] > 0, key
        assert "datasheet" in doc["source"][key] or "whitepaper" in doc["source"][key], key
    assert doc["peer_link"] in ("nvlink", "pcie")
    assert get_gpu(path.stem).name == path.stem


def test_a_number_in_another_unit_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    # peak_tflops typed in FLOP/s, bandwidth in TB/s: both run, each with one warning naming
    # the key and the file; no shipped GPU warns
    doc = yaml.safe_load((CONFIGS / "hardware" / "l40s.yaml").read_text())
    typo = {**doc, "peak_tflops": 362.05e12, "mem_bandwidth_gbs": 0.864}
    with caplog.at_level("WARNING", logger="sim.catalog"):
        for path in sorted((CONFIGS / "hardware").glob("*.yaml")):
            gpu_from_config(yaml.safe_load(path.read_text()), str(path))
        assert not caplog.records
        for _ in range(2):
            assert gpu_from_config(typo, "typo.yaml").peak_flops == pytest.approx(362.05e24)
    assert [r.getMessage().split(" is ")[0] for r in caplog.records] == [
        "typo.yaml: mem_bandwidth_gbs=0.864",
        "typo.yaml: peak_tflops=3.6205e+14",
    ]


def test_rtx4090_numbers() -> None:
    g = get_gpu("rtx4090")
    assert (g.mem_bandwidth, g.peak_flops, g.peer_link) == (1008e9, 165.2e12, "pcie")
    assert g.memory_bytes == 24 << 30


def test_missing_hardware_number_is_named() -> None:
    doc = yaml.safe_load((CONFIGS / "hardware" / "l40s.yaml").read_text())
    del doc["mem_bandwidth_gbs"]
    with pytest.raises(ValueError, match=r"my.yaml: GPU 'l40s' lacks mem_bandwidth_gbs"):
        gpu_from_config(doc, "my.yaml")
    with pytest.raises(ValueError, match=r"peak_tflops must be a number, got 'fast'"):
        gpu_from_config({**doc, "mem_bandwidth_gbs": 1, "peak_tflops": "fast"}, "my.yaml")


def test_a_misspelt_hardware_key_is_named_not_ignored() -> None:
    """``reported_memory_gb`` for ``reported_memory_gib`` would silently size the KV cache
    from the nominal memory; any key a hardware YAML does not hold is refused by name."""
    doc = yaml.safe_load((CONFIGS / "hardware" / "rtx4090.yaml").read_text())
    doc["reported_memory_gb"] = doc.pop("reported_memory_gib")
    with pytest.raises(ValueError, match=r"my.yaml: unknown key 'reported_memory_gb'") as err:
        gpu_from_config(doc, "my.yaml")
    assert err.value.key == "reported_memory_gb"
    with pytest.raises(ValueError, match=r"unknown key 'memroy_gb'"):
        resolve_gpu({"name": "rtx4090", "memroy_gb": 80})


def test_hardware_group_numbers_override_the_catalog() -> None:
    doc = yaml.safe_load((CONFIGS / "hardware" / "rtx4090.yaml").read_text())
    assert resolve_gpu({"name": "rtx4090"}) == get_gpu("rtx4090")
    faster = resolve_gpu({**doc, "mem_bandwidth_gbs": 2000})
    assert faster.mem_bandwidth == 2000e9
    # the overridden number is not credited to the datasheet; the others keep their source
    assert faster.source["mem_bandwidth_gbs"].startswith("overridden to 2000 in ")
    assert "the catalog's rtx4090: 1008" in faster.source["mem_bandwidth_gbs"]
    assert faster.source["peak_tflops"] == doc["source"]["peak_tflops"]
    # a user's file of the same name with its own source for the number keeps that source
    mine = {**doc["source"], "mem_bandwidth_gbs": "my measurement"}
    own = resolve_gpu({**doc, "mem_bandwidth_gbs": 2000, "source": mine})
    assert own.source["mem_bandwidth_gbs"] == "my measurement"
    with pytest.raises(KeyError, match=r"unknown GPU 'v100'.*rtx4090"):
        resolve_gpu({"name": "v100"})


@pytest.mark.parametrize("name", sorted(RELEASED_PARAMS))
def test_shipped_model_yamls_match_released_sizes(name: str) -> None:
    assert get_model(name).num_params() == pytest.approx(RELEASED_PARAMS[name], rel=0.01)


def test_hf_ids_are_names() -> None:
    assert get_model("meta-llama/Llama-3.1-8B") is models()["llama-3.1-8b"]
    assert get_model("facebook/opt-13b").name == "opt-13b"
    with pytest.raises(KeyError, match=r"unknown model 'gpt-5'.*llama-3.1-8b.*qwen3-32b"):
        get_model("gpt-5")


def test_head_dim_other_than_hidden_over_heads() -> None:
    qwen = get_model("qwen3-32b")
    assert qwen.head_dim == 128 and qwen.hidden_size // qwen.num_heads == 80
    assert qwen.qk_norm
    assert kv_bytes_per_token(qwen) == 2 * 64 * 8 * 128 * 2
    assert kv_bytes_per_token(qwen, tp=2) == 2 * 64 * 4 * 128 * 2
    assert kv_bytes_per_token(qwen, tp=16) == 2 * 64 * 1 * 128 * 2  # replicated KV heads
    cost = RooflineCostModel(qwen, "h100")
    # attention FLOPs per (query, key) pair use head_dim × heads = 8192, not hidden = 5120
    assert cost.flops_per_pair == 4 * 128 * 64 * 64


def test_hf_config_path_and_shape_groups(tmp_path: Path) -> None:
    spec = get_model("llama-3.1-8b")
    (tmp_path / "config.json").write_text(json.dumps(spec.to_hf_config()))
    from_file = model_from_config({"hf_config": str(tmp_path)})
    assert from_file == spec
    named = model_from_config({"name": "mine", "hf_id": "me/mine", "hf_config": str(tmp_path)})
    assert (named.name, named.hf_id) == ("mine", "me/mine")
    from_shape = model_from_config({"name": "mine", "shape": spec.to_hf_config()})
    assert from_shape.num_params() == spec.num_params()
    with pytest.raises(ValueError, match=r"lacks required key 'num_attention_heads'"):
        model_from_config({"name": "bad", "shape": {"model_type": "llama", "hidden_size": 8}})
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json: not JSON"):
        model_from_config({"hf_config": str(tmp_path)})
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"config.json: expected a JSON object"):
        model_from_config({"hf_config": str(tmp_path)})


# (key, bad value, the error's phrase): a config.json's malformed optional keys
BAD_HF_VALUES = [
    ("tie_word_embeddings", "false", "tie_word_embeddings must be true or false, got 'false'"),
    ("attention_bias", 0, "attention_bias must be true or false, got 0"),
    ("use_sliding_window", "no", "use_sliding_window must be true or false, got 'no'"),
    ("num_key_value_heads", 0, "num_key_value_heads must be a whole number >= 1, got 0"),
    ("num_key_value_heads", "abc", "num_key_value_heads must be a whole number >= 1, got 'abc'"),
    ("head_dim", "abc", "head_dim must be a whole number >= 1, got 'abc'"),
    ("head_dim", 127.5, "head_dim must be a whole number >= 1, got 127.5"),
    ("sliding_window", "abc", "sliding_window must be a whole number >= 1, got 'abc'"),
    ("rms_norm_eps", "abc", "rms_norm_eps must be a finite number > 0, got 'abc'"),
    ("rope_theta", "abc", "rope_theta must be a finite number > 0, got 'abc'"),
    ("rope_theta", True, "rope_theta must be a finite number > 0, got True"),
    ("rope_parameters", {"rope_theta": "abc"},
     "rope_parameters.rope_theta must be a finite number > 0, got 'abc'"),
    ("rope_scaling", "yes", "rope_scaling must be a mapping, got 'yes'"),
    ("rope_scaling", ["llama3"], "rope_scaling must be a mapping, got ['llama3']"),
]  # fmt: skip


@pytest.mark.parametrize(("key", "bad", "phrase"), BAD_HF_VALUES,
                         ids=[f"{k}={v!r}" for k, v, _ in BAD_HF_VALUES])  # fmt: skip
def test_a_malformed_optional_key_of_a_config_json_is_named(
    key: str, bad: object, phrase: str, tmp_path: Path
) -> None:
    """Text is no boolean, 0 no head count, a fraction no width: each is refused naming the
    file and the key, never read as a default (``bool("false")`` was true)."""
    config = {**get_model("llama-3.1-8b").to_hf_config(), key: bad}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        model_from_config({"hf_config": str(tmp_path)})
    assert str(err.value) == f"{tmp_path / 'config.json'}: llama config: {phrase}"


def test_optional_keys_take_their_defaults_only_when_absent_or_null() -> None:
    llama = get_model("llama-3.1-8b").to_hf_config()
    assert ModelSpec.from_hf_config({**llama, "num_key_value_heads": None}).num_kv_heads == 32
    assert ModelSpec.from_hf_config({**llama, "head_dim": None}).head_dim == 128
    untied = ModelSpec.from_hf_config(llama)
    tied = ModelSpec.from_hf_config({**llama, "tie_word_embeddings": True})
    assert untied.num_params() - tied.num_params() == 4096 * 128256
    window = {**llama, "sliding_window": 4096}
    assert ModelSpec.from_hf_config(window).sliding_window == 4096
    assert ModelSpec.from_hf_config({**window, "use_sliding_window": False}).sliding_window is None
    opt = get_model("opt-350m").to_hf_config()
    assert not ModelSpec.from_hf_config(opt).do_layer_norm_before
    with pytest.raises(ValueError, match=r"do_layer_norm_before must be true or false, got 'no'"):
        ModelSpec.from_hf_config({**opt, "do_layer_norm_before": "no"})
    with pytest.raises(ValueError, match=r"word_embed_proj_dim must be a whole number >= 1"):
        ModelSpec.from_hf_config({**opt, "word_embed_proj_dim": 0})


def test_tensor_parallel_over_pcie_is_priced_by_the_peer_link() -> None:
    shape = BatchShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=64, decode_ctx_tokens=64)
    model = get_model("llama-3.1-8b")
    pcie = get_gpu("rtx-pro-6000-workstation")
    nvlink = gpu_from_config(
        {**yaml.safe_load((CONFIGS / "hardware" / "rtx-pro-6000-workstation.yaml").read_text()),
         "peer_link": "nvlink", "peer_link_gbs": 900}
    )  # fmt: skip
    t_pcie = RooflineCostModel(model, pcie, tp=2).step_time(shape)
    t_nvlink = RooflineCostModel(model, nvlink, tp=2).step_time(shape)
    allreduce_bytes = 2 * model.num_layers * 64 * model.hidden_size * 2 * (2 * 1 / 2)
    expected = allreduce_bytes / pcie.peer_link_bandwidth - allreduce_bytes / 900e9
    assert t_pcie - t_nvlink == pytest.approx(expected, rel=1e-9)


def test_simulate_config_takes_a_user_gpu_and_a_model_shape() -> None:
    hw = yaml.safe_load((CONFIGS / "hardware" / "rtx4090.yaml").read_text())
    cfg = {
        "model": {"name": "meta-llama/Llama-3.1-8B", "tp": 1, "hf_config": None},
        "hardware": {**hw, "name": "my-gpu", "memory_gb": 48},
        "system": {"name": "vllm", "max_model_len": 4096, "max_num_batched_tokens": 4096},
        "workload": {"kind": "synthetic", "rate": 1.0, "num_requests": 4},
    }
    setup = build_setup(cfg)
    assert setup.gpu.name == "my-gpu" and setup.gpu.memory_bytes == 48 << 30
    assert setup.model.name == "llama-3.1-8b"


def test_model_spec_round_trips_every_shipped_model() -> None:
    for name, spec in models().items():
        assert ModelSpec.from_hf_config(spec.to_hf_config()) == spec, name


def test_a_run_directory_names_the_model_an_hf_config_describes(tmp_path: Path) -> None:
    """``model.hf_config=...`` on the default group (``name: opt-13b``): the run is the
    config's model, and so is its directory's name."""
    from omegaconf import OmegaConf

    from experiments.lib.cli import run_model_label

    config = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
              "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 4,
              "vocab_size": 32000, "max_position_embeddings": 4096,
              "_name_or_path": "acme/tiny"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert run_model_label("opt-13b", str(tmp_path)) == "acme--tiny"
    assert run_model_label("meta-llama/Llama-3.1-8B") == "meta-llama--Llama-3.1-8B"
    assert run_model_label("opt-13b", str(tmp_path / "missing")) == "opt-13b"
    label = "${run_model:${model.name},${oc.select:model.hf_config,null}}"
    for app in ("simulate", "serve"):
        assert label in yaml.safe_load((CONFIGS / f"{app}.yaml").read_text())["hydra"]["run"]["dir"]
    model = {"name": "opt-13b", "hf_config": str(tmp_path)}
    assert OmegaConf.create({"model": model, "d": label}).d == "acme--tiny"
    assert OmegaConf.create({"model": {"name": "opt-13b"}, "d": label}).d == "opt-13b"


def test_a_run_saves_the_name_it_gives_an_hf_config_model(tmp_path: Path) -> None:
    """config.yaml said ``name: opt-13b`` (the default group's) for a run of another model;
    it names the model the run is, and the run is still recognised as finished."""
    from experiments import simulate
    from tests.test_config_errors import run_cli

    config = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
              "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 4,
              "vocab_size": 32000, "max_position_embeddings": 4096,
              "_name_or_path": "acme/tiny"}  # fmt: skip
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "config.json").write_text(json.dumps(config))
    args = [f"model.hf_config={tmp_path / 'acme'}", "workload.num_requests=2"]
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 0, err
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["model"]["name"] == metrics["model"] == "acme/tiny"
    (tmp_path / "run" / "requests.csv").write_text("not run again")
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 0, err
    assert (tmp_path / "run" / "requests.csv").read_text() == "not run again"


def test_a_sliding_window_is_named_in_a_warning(tmp_path: Path, monkeypatch) -> None:
    """The simulator prices a sliding-window model as full attention; it says so."""
    from experiments.lib import setup
    from experiments.reproduce import compose_config

    config = {"model_type": "mistral", "hidden_size": 512, "intermediate_size": 1024,
              "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 4,
              "vocab_size": 32000, "max_position_embeddings": 2048,
              "sliding_window": 512}  # fmt: skip
    small = ["workload.duration_s=null", "workload.num_requests=2", "hardware=h100"]
    warned: list[str] = []

    class Log:  # the module's logger, whatever level or handlers earlier tests left it
        def warning(self, message: str, *args: object) -> None:
            warned.append(message % args)

        def info(self, message: str, *args: object) -> None:
            pass

    monkeypatch.setattr(setup, "log", Log())

    def warnings_of(window: int | None) -> list[str]:
        warned.clear()
        (tmp_path / "config.json").write_text(json.dumps({**config, "sliding_window": window}))
        build_setup(compose_config([*small, f"model.hf_config={tmp_path}"]))
        return list(warned)

    (line,) = warnings_of(512)
    assert line.startswith("model.sliding_window:") and "last 512 tokens" in line
    assert warnings_of(None) == []


def test_a_folder_holding_another_configs_run_says_it_runs_again(
    tmp_path: Path, monkeypatch
) -> None:
    # a resumed sweep whose jobs were renumbered ran them again without a word
    from experiments import simulate
    from tests.test_config_errors import run_cli

    assert run_cli(simulate, ["workload.num_requests=2"], tmp_path)[0] == 0
    said: list[str] = []
    monkeypatch.setattr(simulate.log, "info", lambda msg, *a: said.append(msg % a))
    assert run_cli(simulate, ["workload.num_requests=3"], tmp_path)[0] == 0
    again = [m for m in said if "holds a finished run" in m]
    assert len(again) == 1 and "of another config" in again[0]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["num_requests"] == 3
