"""KV capacity as vLLM computes it: max_model_len, num_gpu_blocks and the memory terms."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.lib.checks import ConfigError
from experiments.lib.setup import build_setup, served_max_model_len
from sim.capacity import activation_bytes, kv_capacity
from sim.catalog import GIB, get_model

LLAMA = "llama-3.1-8b"


def _cfg(**system: object) -> dict:
    return {
        "model": {"name": LLAMA, "tp": 1},
        "hardware": {"name": "rtx4090"},
        "system": {
            "name": "vllm",
            "max_num_batched_tokens": 2048,
            "chunked_prefill": True,
            **system,
        },
        "workload": {"kind": "synthetic", "rate": 1.0, "num_requests": 2},
    }


def test_max_model_len_is_honoured_by_the_capacity_check() -> None:
    with pytest.raises(ValueError, match=r"fewer than one max_model_len=131072"):
        kv_capacity(LLAMA, "rtx4090", max_num_batched_tokens=2048)
    cap = kv_capacity(LLAMA, "rtx4090", max_num_batched_tokens=2048, max_model_len=32768)
    assert cap.num_slots >= 32768
    setup = build_setup(_cfg(max_model_len=32768))
    assert setup.max_model_len == setup.sched_config.max_model_len == 32768


def test_max_model_len_above_the_model_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"system\.max_model_len: exceeds .*got 200000"):
        served_max_model_len({"max_model_len": 200000}, get_model(LLAMA))
    assert served_max_model_len({"max_model_len": None}, get_model(LLAMA)) == 131072


def test_num_gpu_blocks_overrides_the_estimate() -> None:
    cap = kv_capacity(LLAMA, "rtx4090", max_model_len=32768, num_gpu_blocks=2588, block_size=16)
    assert cap.num_slots == 41408
    assert cap.num_blocks(16) == 2588
    assert "num_gpu_blocks=2588" in cap.describe()
    setup = build_setup({**_cfg(max_model_len=32768), "num_gpu_blocks": 2588})
    assert setup.capacity.num_slots == 41408
    assert setup.make_scheduler().manager.num_device_blocks == 2588


def test_memory_terms_add_up_and_are_described() -> None:
    cap = kv_capacity(
        LLAMA, "rtx4090", max_num_batched_tokens=2048, max_model_len=32768,
        cuda_graph_max_size=512, non_torch_bytes=GIB // 4,
    )  # fmt: skip
    parts = cap.weight_bytes + cap.activation_bytes + cap.cuda_graph_bytes + cap.non_torch_bytes
    assert parts + cap.kv_bytes == cap.usable_bytes
    assert cap.cuda_graph_bytes == activation_bytes(get_model(LLAMA), 1, 512, 0)
    assert cap.non_torch_bytes == GIB // 4
    text = cap.describe()
    for term in ("weights", "activations", "cuda_graphs", "non_torch", "kv_cache"):
        assert term in text
    no_graphs = kv_capacity(LLAMA, "rtx4090", max_num_batched_tokens=2048, max_model_len=32768)
    assert no_graphs.cuda_graph_bytes == 0 and no_graphs.num_slots > cap.num_slots


def test_sampler_peak_dominates_small_token_budgets() -> None:
    model = get_model(LLAMA)
    small = activation_bytes(model, 1, 512, 256)
    assert small >= 256 * model.vocab_size * 20  # logits, sorted values, indices, softmax
    assert activation_bytes(model, 1, 512, 0) < small


def test_one_sequence_is_counted_in_whole_blocks() -> None:
    """2040 tokens need 128 blocks of 16; a cache of 2,045 slots (127 blocks and a part)
    cannot hold one such sequence (serve's check and vLLM count whole blocks too)."""
    from sim.capacity import kv_capacity
    from sim.catalog import get_gpu, get_model

    model, gpu = get_model("opt-125m"), get_gpu("a100-40gb")
    per_token = 2 * 12 * 768 * 2
    cache = 2045 * per_token  # 2,045 slots: 127 whole blocks
    with pytest.raises(ValueError, match=r"holds 2032 tokens \(127 block\(s\) of 16\)"):
        kv_capacity(model, gpu, kv_cache_bytes=cache, max_model_len=2040, block_size=16)
    assert kv_capacity(model, gpu, kv_cache_bytes=cache, max_model_len=2032).num_slots == 2045


def test_a_given_cache_is_not_held_to_the_derived_budget() -> None:
    """kv_cache_bytes sizes the cache itself (vLLM's kv_cache_memory_bytes): only it and the
    weights must fit, whatever gpu_memory_utilization leaves for a derived one."""
    from sim.capacity import kv_capacity
    from sim.catalog import get_gpu, get_model

    model, gpu = get_model("opt-13b"), get_gpu("a100-40gb")
    with pytest.raises(ValueError, match="does not fit"):
        kv_capacity(model, gpu, gpu_memory_utilization=0.5)
    cap = kv_capacity(model, gpu, gpu_memory_utilization=0.5, kv_cache_bytes=12 * 1024**3)
    assert cap.num_slots == 12 * 1024**3 // (2 * 40 * 5120 * 2)


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(["opt-13b", "llama-3.1-8b", "qwen3-8b", "opt-6.7b"]),
    gpu=st.sampled_from(["a100-40gb", "rtx4090", "l40s"]),
    utilization=st.floats(0.3, 0.95),
    max_model_len=st.sampled_from([None, 2048, 8192]),
    max_num_seqs=st.sampled_from([8, 256, 1024]),
)
def test_a_raised_utilization_the_error_names_is_enough(
    model: str, gpu: str, utilization: float, max_model_len: int | None, max_num_seqs: int
) -> None:
    """Where a derived cache is too small, the gpu_memory_utilization the error offers
    gives one that holds a max_model_len sequence; none is offered when even all of the
    GPU would not, and the sampler is named when its rows make the activations' peak."""
    args = {"max_num_batched_tokens": 2048 if max_model_len is None else max_model_len,
            "max_num_seqs": max_num_seqs, "max_model_len": max_model_len}  # fmt: skip
    try:
        kv_capacity(model, gpu, gpu_memory_utilization=utilization, **args)
        return
    except ValueError as exc:
        text = str(exc)
    offered = re.search(r"raise gpu_memory_utilization to (\d\.\d\d)", text)
    at_full = None
    try:
        kv_capacity(model, gpu, gpu_memory_utilization=1.0, **args)
    except ValueError as exc:
        at_full = exc
    assert (offered is None) == (at_full is not None), text
    if offered is not None:
        assert kv_capacity(model, gpu, gpu_memory_utilization=float(offered[1]), **args)
    if "(max_num_seqs)" in text:
        assert activation_bytes(get_model(model), 1, args["max_num_batched_tokens"], 0) < (
            activation_bytes(get_model(model), 1, args["max_num_batched_tokens"], max_num_seqs)
        )


def test_the_sampler_and_an_empty_cache_get_advice_that_helps() -> None:
    """OPT-13B on an A100-40GB at 60 %: the weights fit, the sampler's 256 rows make the
    activations' peak (lowering the token budget would not help) and 65 % of the GPU is
    enough; a given cache too small for one block is told to grow, not to shorten the
    context."""
    with pytest.raises(ConfigError) as info:
        build_setup(_opt13b(gpu_memory_utilization=0.6))
    assert info.value.key == "system.max_num_seqs"
    assert "sampler on 256 rows (max_num_seqs)" in str(info.value)
    assert str(info.value).endswith("set it lower; or raise gpu_memory_utilization to 0.65")
    assert build_setup(_opt13b(gpu_memory_utilization=0.65)).capacity.num_slots >= 2048
    with pytest.raises(ConfigError) as info:
        build_setup(_opt13b(kv_cache_gb=0.01))
    assert info.value.key == "kv_cache_gb" and str(info.value).endswith("give a larger cache")


def _opt13b(**top: object) -> dict:
    return {
        "model": {"name": "opt-13b", "tp": 1},
        "hardware": {"name": "a100-40gb"},
        "system": {"name": "vllm"},
        "workload": {"kind": "synthetic", "rate": 1.0, "num_requests": 2},
        **top,
    }


def test_weights_over_a_low_utilization_name_the_utilization() -> None:
    with pytest.raises(ConfigError) as info:
        build_setup(_opt13b(gpu_memory_utilization=0.5))
    assert info.value.key == "gpu_memory_utilization"
    assert str(info.value).endswith("(50% of the 40.00 GiB nominal memory); raise "
                                    "gpu_memory_utilization to 0.65")  # fmt: skip


@pytest.mark.parametrize(("system", "paged"), [("vllm", True), ("orca_pow2", False)])
def test_kv_capacity_says_blocks_only_for_a_paged_system(system: str, paged: bool, capsys) -> None:
    """``kv_capacity`` names the blocks of a paged system; a contiguous one holds the same
    whole-block slots (vLLM's sizing) but allocates them unpaged, and is not said in blocks."""
    from experiments import kv_capacity as command

    assert command.main([f"system={system}"]) == 0
    out = capsys.readouterr().out
    blocks = re.search(r"-> (\d+) blocks of 16: (\d+) slots in the run", out)
    assert (blocks is not None) == paged
    if not paged:
        assert re.search(r"-> \d+ slots in the run \(whole blocks of 16.*contiguously\)", out)
