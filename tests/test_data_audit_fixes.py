"""Data-audit fixes: the device total KV capacity starts from, RoPE-scaled context lengths,
the ``model`` group's name and hf_id with ``hf_config``, OPT-350M's shape, Llama-3.1-70B's
tensor-parallel size and the key a bad KV block count names."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.model_spec import ModelSpec
from experiments import simulate
from experiments.lib.setup import served_max_model_len
from sim.capacity import kv_capacity, table1
from sim.catalog import (
    CONFIGS,
    GIB,
    HardwareError,
    get_gpu,
    get_model,
    gpu_from_config,
    model_from_config,
    resolve_gpu,
)
from tests.test_config_errors import run_cli

REPO = Path(__file__).resolve().parents[1]
# hardware.device_total_memory_bytes of ../shared/measurements/vllm/rtx4090-llama-3.1-8b/
# meta.json (what torch reported on the RTX 4090 of the vLLM run)
RTX4090_REPORTED_BYTES = 25_250_627_584
# Qwen3-8B's model card ("Processing Long Texts"): the YaRN block that extends its 32768
# native context four times.
QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
# huggingface.co/facebook/opt-350m config.json (the keys kvlab reads) and the parameter count
# of the released checkpoint.
OPT_350M_CONFIG = {
    "_name_or_path": "facebook/opt-350m", "model_type": "opt", "activation_function": "relu",
    "do_layer_norm_before": False, "ffn_dim": 4096, "hidden_size": 1024,
    "max_position_embeddings": 2048, "num_attention_heads": 16, "num_hidden_layers": 24,
    "vocab_size": 50272, "word_embed_proj_dim": 512,
}  # fmt: skip
OPT_350M_PARAMS = 331_196_416


def _hw(name: str) -> dict[str, Any]:
    return yaml.safe_load((CONFIGS / "hardware" / f"{name}.yaml").read_text())


# -- 1. the device total a KV budget starts from -----------------------------------------
def test_rtx4090_capacity_starts_from_the_total_the_driver_reports() -> None:
    gpu = get_gpu("rtx4090")
    assert gpu.memory_bytes == 24 * GIB  # memory_gb keeps its nominal meaning
    assert gpu.total_memory_bytes == RTX4090_REPORTED_BYTES
    cap = kv_capacity("llama-3.1-8b", gpu, max_num_batched_tokens=2048, max_model_len=32768)
    assert cap.usable_bytes == int(0.9 * RTX4090_REPORTED_BYTES)
    assert cap.total_bytes == RTX4090_REPORTED_BYTES
    usable_line = cap.describe().splitlines()[1]
    assert "reported total 23.516 GiB" in usable_line
    assert "reported_memory_gib" in usable_line and "meta.json" in usable_line


def test_h200_reported_total_is_what_every_h200_run_recorded() -> None:
    runs = sorted((REPO / "docs" / "validation" / "h200").glob("*-run/env.json"))
    assert runs
    for env in runs:
        memory_gib = json.loads(env.read_text())["gpu"]["memory_gib"]
        assert _hw("h200")["reported_memory_gib"] == memory_gib, env
    gpu = get_gpu("h200")
    assert gpu.total_memory_bytes == int(_hw("h200")["reported_memory_gib"] * GIB)
    assert gpu.total_memory_bytes < gpu.memory_bytes == 141 * GIB
    assert "env.json" in gpu.source["reported_memory_gib"]


def test_unmeasured_gpus_and_table1_stay_nominal() -> None:
    cap = kv_capacity("opt-13b", "a100-40gb")
    assert cap.usable_bytes == int(0.9 * 40 * GIB)
    assert "nominal memory 40.000 GiB (memory_gb:" in cap.describe()
    assert "hardware.reported_memory_gib sets the measured total" in cap.describe()
    assert table1()[0].max_slots == 15459  # the opt-13b row before reported totals existed
    for path in (CONFIGS / "hardware").glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        if path.stem not in ("rtx4090", "h200"):
            assert doc["reported_memory_gib"] is None, path.name  # no measurement: none made up
            assert get_gpu(path.stem).total_memory_bytes == get_gpu(path.stem).memory_bytes


@pytest.mark.parametrize(
    ("bad", "phrase"),
    [(30, "exceeds memory_gb"), (float("inf"), "finite number > 0"), (0, "finite number > 0"),
     ("lots", "must be a number"), (True, "finite number > 0")],
)  # fmt: skip
def test_reported_memory_is_validated_naming_its_key(bad: object, phrase: str) -> None:
    with pytest.raises(HardwareError, match=f"my.yaml: reported_memory_gib.*{phrase}") as err:
        gpu_from_config({**_hw("rtx4090"), "reported_memory_gib": bad}, "my.yaml")
    assert err.value.key == "reported_memory_gib"


def test_reported_memory_comes_from_the_hardware_group() -> None:
    nominal = resolve_gpu({**_hw("rtx4090"), "reported_memory_gib": None})
    assert nominal.total_memory_bytes == nominal.memory_bytes == 24 * GIB
    assert resolve_gpu({"name": "rtx4090", "reported_memory_gib": None}).total_memory_bytes == (
        24 * GIB
    )
    a100 = resolve_gpu({"name": "a100-40gb", "reported_memory_gib": 39.5})
    assert a100.total_memory_bytes == int(39.5 * GIB)
    with pytest.raises(HardwareError, match="exceeds memory_gb"):
        resolve_gpu({"name": "a100-40gb", "reported_memory_gib": 41})
    # a memory_bytes lowered below the reported total after reading (a run's own total) wins
    lower = dataclasses.replace(get_gpu("h200"), memory_bytes=100 * GIB)
    assert lower.total_memory_bytes == 100 * GIB and lower.total_memory_key == "memory_gb"


def test_reported_memory_override_on_the_command_line(tmp_path: Path) -> None:
    args = ["hardware=rtx4090", "hardware.reported_memory_gib=30", "workload.num_requests=2"]
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 2
    assert err.startswith("error: hardware.reported_memory_gib: ") and "exceeds memory_gb" in err


# -- 2. RoPE scaling and the longest context ---------------------------------------------
def _qwen3_8b(**extra: Any) -> dict[str, Any]:
    shape = yaml.safe_load((CONFIGS / "model" / "qwen3-8b.yaml").read_text())["shape"]
    return {**shape, **extra}


def test_yarn_scales_the_original_context_as_vllm_does() -> None:
    spec = ModelSpec.from_hf_config(_qwen3_8b(rope_scaling=QWEN3_YARN), "qwen3-8b-yarn")
    assert spec.rope_type == "yarn" and spec.max_model_len == 131072
    assert served_max_model_len({"max_model_len": 131072}, spec) == 131072
    v5 = ModelSpec.from_hf_config(
        _qwen3_8b(rope_parameters={**QWEN3_YARN, "rope_theta": 1e6}), "v5"
    )
    assert v5.max_model_len == 131072
    no_original = {"rope_type": "yarn", "factor": 2.0}
    assert ModelSpec.from_hf_config(_qwen3_8b(rope_scaling=no_original)).max_model_len == 81920
    linear = {"type": "linear", "factor": 2.0}
    assert ModelSpec.from_hf_config(_qwen3_8b(rope_scaling=linear)).max_model_len == 81920
    assert get_model("qwen3-8b").max_model_len == 40960  # no scaling block: unchanged
    assert get_model("llama-3.1-8b").max_model_len == 131072  # llama3: already extended


@pytest.mark.parametrize("factor", [0, -1.0, float("nan"), "4", True])
def test_a_bad_rope_factor_is_named(factor: object) -> None:
    with pytest.raises(ValueError, match=r"rope_scaling\.factor must be a finite number > 0"):
        ModelSpec.from_hf_config(_qwen3_8b(rope_scaling={**QWEN3_YARN, "factor": factor}))


# -- 3. the model group's name and hf_id with hf_config; hf_id only from an HF id ---------
def test_hf_config_takes_the_groups_name_and_hf_id(tmp_path: Path) -> None:
    snapshot = tmp_path / "0123abcd"  # an HF cache snapshot folder
    snapshot.mkdir()
    config = {k: v for k, v in get_model("qwen3-8b").to_hf_config().items() if k[0] != "_"}
    (snapshot / "config.json").write_text(json.dumps(config))
    spec = model_from_config({"name": "mine", "hf_id": "org/mine", "hf_config": str(snapshot)})
    assert (spec.name, spec.hf_id) == ("mine", "org/mine")
    unnamed = model_from_config({"hf_config": str(snapshot)})
    assert (unnamed.name, unnamed.hf_id) == ("0123abcd", "")
    # the catalog's own group over a snapshot of that model: its name and hf_id
    same = {"name": "qwen3-8b", "hf_id": "Qwen/Qwen3-8B", "hf_config": str(snapshot)}
    assert (model_from_config(same).name, model_from_config(same).hf_id) == (
        "qwen3-8b", "Qwen/Qwen3-8B",
    )  # fmt: skip
    # another catalog model's group (model.hf_config=... on the default group): the config's
    other = model_from_config({"name": "opt-13b", "hf_id": "x/y", "hf_config": str(snapshot)})
    assert (other.name, other.hf_id) == ("0123abcd", "")


def test_only_an_hf_id_becomes_hf_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = get_model("qwen3-8b").to_hf_config()

    def hf_id(path_or_id: str) -> str:
        return ModelSpec.from_hf_config({**base, "_name_or_path": path_or_id}).hf_id

    assert hf_id("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    for local in (str(tmp_path / "models" / "qwen"), "./models/qwen", "../qwen/x", "a/b/c"):
        assert hf_id(local) == "", local
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert hf_id("org/model") == ""  # an existing relative folder is a path


# -- 4. OPT-350M -----------------------------------------------------------------------
def test_opt_350m_matches_its_released_checkpoint() -> None:
    spec = get_model("opt-350m")
    assert spec.word_embed_proj_dim == 512 and not spec.do_layer_norm_before
    assert spec.num_params() == OPT_350M_PARAMS
    assert ModelSpec.from_hf_config(OPT_350M_CONFIG, "opt-350m") == spec
    assert spec.lm_head_params() == 512 * 50272


def test_projected_post_ln_opt_count_matches_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    spec = ModelSpec(
        "tiny-opt-proj", "opt", 2, 64, 4, 4, 16, 256, 512, 256, gated_mlp=False,
        tie_word_embeddings=True, num_position_embeddings=258, word_embed_proj_dim=32,
        do_layer_norm_before=False,
    )  # fmt: skip
    config = transformers.AutoConfig.for_model(**spec.to_hf_config())
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert spec.num_params() == sum(p.numel() for p in model.parameters())


# -- 5. Llama-3.1-70B's tensor-parallel size ---------------------------------------------
def test_llama_3_1_70b_ships_with_a_tp_that_fits(tmp_path: Path) -> None:
    tp = yaml.safe_load((CONFIGS / "model" / "llama-3.1-70b.yaml").read_text())["tp"]
    for gpu in ("a100-80gb", "h100", "h200"):
        assert kv_capacity("llama-3.1-70b", gpu, tp=tp).num_slots >= 131072, gpu
    args = ["model=llama-3.1-70b", "hardware=h100", "system=vllm_v1", "workload.num_requests=3"]
    status, out, err = run_cli(simulate, args, tmp_path)
    assert status == 0, err
    assert "3/3 done" in out


# -- 6. the key a bad block count names ------------------------------------------------
def test_a_bad_block_count_names_its_key() -> None:
    kw: dict[str, Any] = {"max_model_len": 32768}
    with pytest.raises(ValueError, match=r"^block_size must be >= 1, got 0$"):
        kv_capacity("llama-3.1-8b", "rtx4090", num_gpu_blocks=2588, block_size=0, **kw)
    with pytest.raises(ValueError, match=r"^num_gpu_blocks must be >= 1, got 0$"):
        kv_capacity("llama-3.1-8b", "rtx4090", num_gpu_blocks=0, block_size=16, **kw)


def test_replicated_kv_heads_count_on_every_gpu() -> None:
    """Llama-3.1-70B has 8 KV heads: at tp 16 each GPU holds (and computes) a whole K and V
    head, twice its even share, in its weights, its profile-run activations and its work
    (a researcher-scenario audit, 2026-12-05: the weights were num_params / tp)."""
    from sim.capacity import kv_capacity, replicated_kv_params
    from sim.catalog import get_model
    from sim.cost.work import WorkCoefficients

    m = get_model("llama-3.1-70b")
    extra = m.num_layers * 2 * m.hidden_size * (m.head_dim - m.kv_size // 16)  # no biases
    assert replicated_kv_params(m, 16) == extra and replicated_kv_params(m, 8) == 0
    cap16 = kv_capacity(m, "h200", tp=16, max_model_len=8192)
    assert cap16.weight_bytes == -(-m.num_params() * 2 // 16) + 2 * extra
    assert "replicated" in cap16.source["weights"]
    k16, k8 = WorkCoefficients.of(m, 16), WorkCoefficients.of(m, 8)
    assert k16.flops_per_token == pytest.approx(k8.flops_per_token / 2 + 2 * extra)
    assert k16.kv_bytes_per_token == k8.kv_bytes_per_token  # one head's K/V per GPU both ways
