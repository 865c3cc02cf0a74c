"""Catalog shapes, parameter counts, HF config round trips and KV capacity (Table 1)."""

from __future__ import annotations

import dataclasses

import pytest

from sim.capacity import (
    format_table1,
    kv_capacity,
    kv_heads_per_gpu,
    table1,
    table1_gap_lines,
)
from sim.catalog import GIB, MODELS, GPUSpec, ModelSpec, get_gpu, get_model, gpu_from_config, gpus

# Published sizes: OPT paper (Zhang et al. 2022) and LLaMA paper (Touvron et al. 2023) model
# names, with the exact counts of the released checkpoints.
PUBLISHED_PARAMS = {
    "opt-13b": 12.85e9,
    "opt-66b": 65.7e9,
    "opt-175b": 174.6e9,
    "llama-7b": 6.74e9,
    "llama-13b": 13.0e9,
    "llama-3-8b": 8.03e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_param_counts_match_published_sizes(name: str) -> None:
    assert get_model(name).num_params() == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)


def test_kv_bytes_per_token_follows_the_paper() -> None:
    # Kwon et al., SOSP 2023, §6.1: OPT-13B 2 × 40 × 5120 × 2 B = 800 KiB per token.
    assert get_model("opt-13b").kv_bytes_per_token() == 800 * 1024
    assert get_model("opt-13b").kv_bytes_per_token(dtype_bytes=4) == 1600 * 1024
    # GQA stores only the KV heads: Llama-3-8B 2 × 32 × 8 × 128 × 2 B.
    assert get_model("llama-3-8b").kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2


def test_lookup_is_case_insensitive_and_passes_specs_through() -> None:
    assert get_model("OPT-13B") is MODELS["opt-13b"]
    spec = MODELS["tiny-llama"]
    assert get_model(spec) is spec
    assert get_gpu("A100-40GB").memory_bytes == 40 * GIB


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(KeyError, match=r"unknown model 'gpt-5'.*opt-13b"):
        get_model("gpt-5")
    with pytest.raises(KeyError, match=r"unknown GPU 'v100'.*a100-40gb.*h200"):
        get_gpu("v100")


def test_a_gpu_is_found_by_the_name_the_device_reports() -> None:
    assert get_gpu("NVIDIA H200") is get_gpu("h200")  # as torch.cuda.get_device_name says
    assert get_gpu("nvidia geforce rtx 4090") is get_gpu("rtx4090")
    with pytest.raises(KeyError, match=r"unknown GPU 'NVIDIA B300'.*device_names"):
        get_gpu("NVIDIA B300")
    base = {"memory_gb": 1, "mem_bandwidth_gbs": 1, "peak_tflops": 1, "host_link_gbs": 1,
            "peer_link_gbs": 1, "peer_link": "pcie"}  # fmt: skip
    assert gpu_from_config({**base, "device_names": ["X 1"]}, "x.yaml").device_names == ("X 1",)
    for bad in ("X 1", 5, {"X 1": 1}, ["X 1", 2]):
        with pytest.raises(ValueError, match=r"x.yaml: device_names must be a list of strings"):
            gpu_from_config({**base, "device_names": bad}, "x.yaml")


def test_gpu_catalog_uses_datasheet_numbers() -> None:
    assert {"a100-40gb", "a100-80gb", "h100", "h200", "l40s", "rtx4090"} <= set(gpus())
    assert {"rtx-pro-6000-server", "rtx-pro-6000-workstation"} <= set(gpus())
    assert get_gpu("a100-40gb").mem_bandwidth == 1555e9
    assert get_gpu("a100-80gb").mem_bandwidth == 2039e9
    assert get_gpu("h100").peak_flops == get_gpu("h200").peak_flops == 989e12
    assert get_gpu("h200").mem_bandwidth == 4800e9


def test_a_lent_h100_is_named_by_its_form_factor() -> None:
    """The two H100s torch can report are different GPUs: the SXM module and the PCIe card
    (HBM2e at 2 TB/s, 756 dense TFLOPS, peers over PCIe) each resolve to their own YAML."""
    assert get_gpu("NVIDIA H100 80GB HBM3").name == "h100"
    card = get_gpu("NVIDIA H100 PCIe")
    assert card.name == "h100-pcie" and card.peer_link == "pcie"
    assert (card.mem_bandwidth, card.peak_flops) == (2000e9, 756e12)


def test_invalid_shapes_are_rejected() -> None:
    base = MODELS["tiny-llama"]
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        dataclasses.replace(base, num_kv_heads=3)
    with pytest.raises(ValueError, match="hidden_size must be positive"):
        dataclasses.replace(base, hidden_size=0)
    with pytest.raises(ValueError, match="family"):
        dataclasses.replace(base, family="gpt2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="peak_flops"):
        GPUSpec("bad", 1, 1.0, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="peer_link"):
        GPUSpec("bad", 1, 1.0, 1.0, 1.0, 1.0, peer_link="infiniband")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_config_round_trip(name: str) -> None:
    spec = MODELS[name]
    assert ModelSpec.from_hf_config(spec.to_hf_config()) == spec


def test_from_hf_config_reads_opt_and_llama_dicts() -> None:
    opt = ModelSpec.from_hf_config(
        {
            "model_type": "opt",
            "hidden_size": 5120,
            "num_hidden_layers": 40,
            "num_attention_heads": 40,
            "ffn_dim": 20480,
            "vocab_size": 50272,
            "max_position_embeddings": 2048,
        },
        name="opt-13b",
    )
    assert opt == MODELS["opt-13b"]
    llama = ModelSpec.from_hf_config(
        {
            "model_type": "llama",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "vocab_size": 128256,
            "max_position_embeddings": 8192,
            "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5,
        },
        name="llama-3-8b",
    )
    assert llama == MODELS["llama-3-8b"]
    assert llama.rope_theta == 500000.0


@pytest.mark.parametrize("key", ["num_local_experts", "num_experts", "n_routed_experts"])
def test_a_mixture_of_experts_labelled_dense_is_refused(key: str) -> None:
    """A Mixtral-shaped config that says model_type mistral would be priced as a dense
    model of all its experts' weights at every token."""
    with pytest.raises(ValueError, match=f"mistral config: {key} is 8: a mixture of experts"):
        ModelSpec.from_hf_config({"model_type": "mistral", key: 8})
    one_expert = {**MODELS["llama-3-8b"].to_hf_config(), key: 1}
    assert ModelSpec.from_hf_config(one_expert).num_layers == MODELS["llama-3-8b"].num_layers


@pytest.mark.parametrize("count", [8.0, "8"])
def test_an_expert_count_written_as_a_float_or_text_is_refused_too(count: object) -> None:
    # only ints were counted: num_local_experts 8.0 ran as a dense model of all the experts
    with pytest.raises(ValueError, match="a mixture of experts"):
        ModelSpec.from_hf_config({"model_type": "mistral", "num_local_experts": count})


@pytest.mark.parametrize("key", ["quantization_config", "compression_config"])
def test_a_quantized_checkpoint_is_refused_not_priced_at_16_bits(key: str) -> None:
    # quantization_config was ignored: an AWQ 4-bit Qwen2.5-32B was priced at 61 GiB of
    # weights, its KV cache a fifth of the real one
    config = {**MODELS["llama-3-8b"].to_hf_config(), key: {"quant_method": "awq", "bits": 4}}
    with pytest.raises(ValueError, match=f"llama config: {key} is set \\(awq\\): quantized"):
        ModelSpec.from_hf_config(config)
    assert ModelSpec.from_hf_config({**config, key: None}) == MODELS["llama-3-8b"]


def test_a_qwen3_config_without_head_dim_takes_transformers_default() -> None:
    # it took hidden_size / heads (64 for Qwen3-0.6B's shape), halving the KV per token
    shape = {"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
             "num_key_value_heads": 8, "num_hidden_layers": 28, "intermediate_size": 3072,
             "vocab_size": 151936, "max_position_embeddings": 40960}  # fmt: skip
    assert ModelSpec.from_hf_config(shape).head_dim == 128
    assert ModelSpec.from_hf_config({**shape, "head_dim": 64}).head_dim == 64


@pytest.mark.parametrize(("full_layers", "window"), [(28, None), (None, None), (20, 4096)])
def test_a_qwen_window_slides_only_past_its_full_attention_layers(
    full_layers: int | None, window: int | None
) -> None:
    # transformers' Qwen2 attends in full in its first max_window_layers layers (default
    # 28): with all 28 of them, no layer slides, and the window was reported anyway
    shape = {"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
             "num_key_value_heads": 4, "num_hidden_layers": 28, "intermediate_size": 18944,
             "vocab_size": 152064, "max_position_embeddings": 32768,
             "use_sliding_window": True, "sliding_window": 4096}  # fmt: skip
    if full_layers is not None:
        shape["max_window_layers"] = full_layers
    assert ModelSpec.from_hf_config(shape).sliding_window == window


def test_an_unknown_rope_type_is_refused_not_scaled_by_its_factor() -> None:
    # {"type": "foobar", "factor": 2} doubled the context as if it were linear scaling
    config = {**MODELS["llama-3-8b"].to_hf_config(), "rope_scaling": {"type": "foobar",
                                                                      "factor": 2.0}}  # fmt: skip
    with pytest.raises(ValueError, match="rope_scaling has rope type 'foobar'; known: default"):
        ModelSpec.from_hf_config(config)
    config["rope_scaling"]["type"] = "linear"
    assert ModelSpec.from_hf_config(config).max_model_len == 2 * 8192


def test_from_hf_config_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        ModelSpec.from_hf_config({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="lacks required key 'ffn_dim'"):
        ModelSpec.from_hf_config(
            {
                "model_type": "opt",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 512,
                "max_position_embeddings": 256,
            }
        )


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama"])
def test_param_formula_matches_transformers(name: str) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    spec = MODELS[name]
    config = transformers.AutoConfig.for_model(**spec.to_hf_config())
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert spec.num_params() == sum(p.numel() for p in model.parameters())


def test_table1_slots_within_ten_percent_of_the_paper() -> None:
    rows = table1()
    print("\n" + format_table1(rows))
    assert [r.model for r in rows] == ["opt-13b", "opt-66b", "opt-175b"]
    for r in rows:
        assert abs(r.slots_rel_diff) < 0.10, r
        assert abs(r.kv_rel_diff) < 0.10, r
        assert abs(r.params_rel_diff) < 0.02, r


def test_table1_gap_lines_compute_each_rows_difference() -> None:
    """Each Table 1 row's gap is a computed line: the paper's KV figure over that model's
    own KV bytes a token (not OPT-13B's 800 KiB for every row), and kvlab's KV less the
    paper's split into the weights' part and the rest of memory, the two adding up."""
    import re

    from experiments.report.markdown import TABLE1_UNITS

    rows = table1()
    lines = table1_gap_lines(rows)
    assert len(lines) == 3
    assert "at 800 KiB a token is 15,729 slots" in lines[0]
    assert "at 2,304 KiB a token is 9,557 slots (it prints 9,700)" in lines[1]
    assert "at 4,608 KiB a token is 60,075 slots (it prints 60,100)" in lines[2]
    for line, r in zip(lines, rows, strict=True):
        kv, weights, rest = (float(x) for x in re.findall(r"([+-]\d+\.\d) GiB", line)[:3])
        assert kv == pytest.approx(r.kv_gib - r.paper_kv_gib, abs=0.05)
        assert weights + rest == pytest.approx(kv, abs=0.11)
    assert "-12.6 GiB from the memory" in lines[2]
    assert "follow from 800 KiB a token" not in TABLE1_UNITS


def test_paper_kv_override_gives_15_7k_slots() -> None:
    cap = kv_capacity("opt-13b", "a100-40gb", kv_cache_bytes=12 * GIB)
    assert cap.num_slots == 12 * GIB // (800 * 1024) == 15728
    assert cap.num_blocks(16) == 15728 // 16


def test_capacity_budget_adds_up_per_gpu() -> None:
    gpu = get_gpu("a100-40gb")
    cap = kv_capacity("opt-66b", gpu, tp=4)
    assert cap.weight_bytes + cap.activation_bytes + cap.kv_bytes == int(0.9 * gpu.memory_bytes)
    assert cap.weight_bytes == pytest.approx(get_model("opt-66b").num_params() * 2 / 4, abs=1)
    assert cap.bytes_per_token_per_gpu * 4 == get_model("opt-66b").kv_bytes_per_token()
    assert cap.num_slots == cap.kv_bytes // cap.bytes_per_token_per_gpu
    assert cap.kv_bytes_total == 4 * cap.kv_bytes


def test_capacity_grows_with_utilization_and_shrinks_with_batch_budget() -> None:
    low = kv_capacity("opt-13b", "a100-40gb", gpu_memory_utilization=0.85)
    high = kv_capacity("opt-13b", "a100-40gb", gpu_memory_utilization=0.95)
    assert low.num_slots < high.num_slots
    big_batch = kv_capacity("opt-13b", "a100-40gb", max_num_batched_tokens=8192)
    assert big_batch.activation_bytes > high.activation_bytes
    assert big_batch.num_slots < kv_capacity("opt-13b", "a100-40gb").num_slots


def test_gqa_heads_are_split_then_replicated() -> None:
    m = get_model("llama-3-8b")
    assert kv_heads_per_gpu(m, 1) == 8
    assert kv_heads_per_gpu(m, 8) == 1
    assert kv_heads_per_gpu(m, 16) == 1
    with pytest.raises(ValueError, match="40 attention heads cannot be split over tp=3"):
        kv_heads_per_gpu(get_model("opt-13b"), 3)
    with pytest.raises(ValueError, match="tensor-parallel size must be >= 1"):
        kv_heads_per_gpu(m, 0)


def test_capacity_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"opt-175b does not fit on 1 × a100-40gb"):
        kv_capacity("opt-175b", "a100-40gb")
    with pytest.raises(ValueError, match="fewer than one max_model_len=2048 sequence"):
        kv_capacity("opt-13b", "a100-40gb", kv_cache_bytes=1 * GIB)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_capacity("opt-13b", "a100-40gb", gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="block_size"):
        kv_capacity("tiny-opt", "a100-40gb").num_blocks(0)


def test_kv_bytes_per_token_refuses_a_tp_that_neither_splits_nor_replicates_kv_heads() -> None:
    from core.model_spec import kv_bytes_per_token

    llama = get_model("llama-3.1-8b")  # 8 KV heads
    assert kv_bytes_per_token(llama, 2, tp=4) == 2 * 32 * 2 * 128 * 2
    assert kv_bytes_per_token(llama, 2, tp=16) == 2 * 32 * 1 * 128 * 2  # replicated
    with pytest.raises(ValueError, match="cannot be split or replicated over tp=3"):
        kv_bytes_per_token(llama, 2, tp=3)


def test_a_config_json_labelled_as_a_catalog_model_of_another_shape_is_refused(
    tmp_path,
) -> None:
    """A config.json labels itself (its ``_name_or_path``, else its folder's name). A label
    that is a catalog model's name on another shape would pass for that model: results,
    the runs index and the calibration check (by name) would take a 2.7B model for
    Llama-3.1-8B. It is refused, naming the file; the catalog model's own config.json and a
    label of its own still load."""
    import json

    from sim.catalog import model_from_config

    other = {**get_model("llama-3.1-8b").to_hf_config(), "num_hidden_layers": 24,
             "hidden_size": 3072, "num_attention_heads": 24}  # fmt: skip
    for label, folder in (("llama-3.1-8b", "a"), ("meta-llama/Llama-3.1-8B", "b"),
                          (None, "Qwen3-8B")):  # fmt: skip
        d = tmp_path / folder
        d.mkdir()
        cfg = dict(other)
        cfg.pop("_name_or_path")
        if label is not None:
            cfg["_name_or_path"] = label
        (d / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ValueError, match=r"config\.json: .*catalog.*name of its own"):
            model_from_config({"hf_config": str(d)})
    own = tmp_path / "own"
    own.mkdir()
    (own / "config.json").write_text(json.dumps({**other, "_name_or_path": "my-model"}))
    assert model_from_config({"hf_config": str(own)}).name == "my-model"
    same = tmp_path / "same"
    same.mkdir()
    (same / "config.json").write_text(json.dumps(get_model("llama-3.1-8b").to_hf_config()))
    assert model_from_config({"hf_config": str(same)}) == get_model("llama-3.1-8b")
    # calibrate_vllm's --model reads a config.json alike
    from experiments.lib.vllm_run import resolve_model

    with pytest.raises(ValueError, match="name of its own"):
        resolve_model(str(tmp_path / "a" / "config.json"), None)
