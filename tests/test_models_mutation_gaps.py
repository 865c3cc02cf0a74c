"""Gaps a mutation audit of ``engine.models`` and ``engine.weights`` found (2026-12-06).

The HF parity tests use HF's own init, whose norm weights are all 1 and biases 0, and HF's
default eps and RoPE theta: a model that read the wrong norm, or ignored the config's eps or
theta, still matched. Here every parameter (norms included) is random, the eps and theta are
far from their defaults, and the reference is the layer math written out in plain torch
(fp64) from the parameters' HF names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.model_spec import ModelSpec
from engine.attention.metadata import AttentionMetadata
from engine.attention.registry import get_backend
from engine.models import CausalLM, LlamaCausalLM, OPTCausalLM, build_model
from engine.weights import CheckpointError, init_dummy_weights, load_checkpoint, load_weights
from tests.engine_helpers import prefill_logits

VOCAB = 64
ATOL = RTOL = 1e-4


def _spec(family: str, **changes: object) -> ModelSpec:
    """A 2-layer, 32-wide model of ``family`` (Llama: 4 query heads over 2 KV heads)."""
    llama = family == "llama"
    fields: dict = {
        "name": f"gap-{family}",
        "family": family,
        "num_layers": 2,
        "hidden_size": 32,
        "num_heads": 4,
        "num_kv_heads": 2 if llama else 4,
        "head_dim": 8,
        "ffn_hidden_size": 48,
        "vocab_size": VOCAB,
        "max_model_len": 32,
        "gated_mlp": llama,
        "tie_word_embeddings": not llama,
        "num_position_embeddings": 0 if llama else 34,
    }
    return ModelSpec(**(fields | changes))


def _random_model(spec: ModelSpec, seed: int = 0) -> CausalLM:
    """Every parameter random: matrices N(0, 0.3²), biases N(0, 0.1²), norm weights
    1 + N(0, 0.3²), so no norm is the identity and no two norms agree."""
    model = build_model(spec, "torch")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * noise)
            else:
                p.copy_((0.1 if name.endswith("bias") else 0.3) * noise)
    return model


# -- plain-torch references (fp64) ------------------------------------------------------
def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d)) v under a causal mask; query head h reads KV head
    h // (heads / kv_heads). ``q`` [T, H, D], ``k``/``v`` [T, Hkv, D] -> [T, H * D]."""
    t, heads, d = q.shape
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    v = v.repeat_interleave(heads // v.shape[1], dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / d**0.5
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(-1)
    return torch.einsum("hts,shd->thd", probs, v).reshape(t, heads * d)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return weight * (x - mean) / torch.sqrt(var + eps) + bias


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE: the pair (i, i + D/2) of token t turns by t * theta^(-2i/D)."""
    t, _, d = x.shape
    half = d // 2
    freq = theta ** (-2 * torch.arange(half, dtype=torch.float64) / d)
    angle = torch.arange(t, dtype=torch.float64)[:, None, None] * freq
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()), -1)


def _reference_llama(model: CausalLM, tokens: list[int]) -> torch.Tensor:
    cfg = model.config
    w = {n: p.detach().double() for n, p in model.named_parameters(remove_duplicate=False)}
    t, eps = len(tokens), cfg.rms_norm_eps
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h = _rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(t, cfg.num_heads, -1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(t, cfg.num_kv_heads, -1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(t, cfg.num_kv_heads, -1)
        attn = _causal_attention(_rope(q, cfg.rope_theta), _rope(k, cfg.rope_theta), v)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
        x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return _rms_norm(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def _reference_opt(model: CausalLM, tokens: list[int]) -> torch.Tensor:
    cfg = model.config
    w = {n: p.detach().double() for n, p in model.named_parameters(remove_duplicate=False)}
    t, eps, pre = len(tokens), cfg.layer_norm_eps, cfg.do_layer_norm_before
    d = "model.decoder."

    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        return _layer_norm(x, w[name + ".weight"], w[name + ".bias"], eps)

    x = w[d + "embed_tokens.weight"][tokens]
    if d + "project_in.weight" in w:
        x = x @ w[d + "project_in.weight"].T
    x = x + w[d + "embed_positions.weight"][torch.arange(t) + 2]
    for i in range(cfg.num_layers):
        p = f"{d}layers.{i}."
        h = norm(x, p + "self_attn_layer_norm") if pre else x
        q, k, v = (linear(h, p + f"self_attn.{n}_proj").view(t, cfg.num_heads, -1) for n in "qkv")
        x = x + linear(_causal_attention(q, k, v), p + "self_attn.out_proj")
        if not pre:
            x = norm(x, p + "self_attn_layer_norm")
        h = norm(x, p + "final_layer_norm") if pre else x
        x = x + linear(torch.relu(linear(h, p + "fc1")), p + "fc2")
        if not pre:
            x = norm(x, p + "final_layer_norm")
    if pre:
        x = norm(x, d + "final_layer_norm")
    if d + "project_out.weight" in w:
        x = x @ w[d + "project_out.weight"].T
    return x @ w["lm_head.weight"].T


# -- engine.models.llama / opt ----------------------------------------------------------
@pytest.mark.parametrize("tied", [False, True])
def test_llama_logits_equal_the_layer_math_with_its_eps_and_theta(tied: bool) -> None:
    """Each RMSNorm uses its own weight (input, post-attention, final) and the config's
    rms_norm_eps; RoPE uses the config's rope_theta; GQA, SwiGLU and the (tied) head as
    written out in plain torch."""
    spec = _spec("llama", rms_norm_eps=0.5, rope_theta=3.0, tie_word_embeddings=tied)
    model = _random_model(spec, seed=1)
    tokens = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(2)).tolist()
    want = _reference_llama(model, tokens).float()
    torch.testing.assert_close(prefill_logits(model, tokens), want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(
    "changes",
    [{}, {"do_layer_norm_before": False, "word_embed_proj_dim": 16}],
    ids=["pre_ln", "post_ln_proj"],
)
def test_opt_logits_equal_the_layer_math_with_its_eps(changes: dict) -> None:
    """Each LayerNorm is applied where OPT applies it (before the sub-block, or after it in
    post-LN models, which have no final LayerNorm) with the config's layer_norm_eps."""
    model = _random_model(_spec("opt", layer_norm_eps=0.5, **changes), seed=3)
    tokens = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(4)).tolist()
    want = _reference_opt(model, tokens).float()
    torch.testing.assert_close(prefill_logits(model, tokens), want, atol=ATOL, rtol=RTOL)


# -- engine.models.common ---------------------------------------------------------------
def test_a_model_class_refuses_another_familys_config() -> None:
    backend = get_backend("torch")
    with pytest.raises(ValueError, match=r"OPTCausalLM needs a 'opt' config, got 'llama'"):
        OPTCausalLM(_spec("llama"), backend)
    with pytest.raises(ValueError, match=r"LlamaCausalLM needs a 'llama' config, got 'opt'"):
        LlamaCausalLM(_spec("opt"), backend)


@pytest.mark.parametrize("family", ["opt", "llama"])
def test_forward_refuses_misshapen_inputs_and_a_wrong_cache_count(family: str) -> None:
    """positions must match input_ids token for token (a [1] positions would broadcast
    silently), input_ids must be flat, and there must be one KV cache per layer."""
    model = _random_model(_spec(family))
    shape = (4, 1, model.config.num_kv_heads, model.config.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(2)]
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, 3], dtype=torch.int32),
        context_lens=torch.tensor([3], dtype=torch.int32),
        block_tables=torch.arange(3, dtype=torch.int32)[None],
        slot_mapping=torch.arange(3, dtype=torch.int64),
        max_query_len=3,
        max_context_len=3,
    )
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match=r"positions \(1,\) must both be \[T\]"):
        model(ids, torch.tensor([0]), caches, meta)
    with pytest.raises(ValueError, match=r"input_ids \(1, 3\)"):
        model(ids[None], torch.arange(3)[None], caches, meta)
    with pytest.raises(ValueError, match=r"got 1 KV caches for 2 layers"):
        model(ids, torch.arange(3), caches[:1], meta)


# -- engine.weights ---------------------------------------------------------------------
class _WithLooseParameter(torch.nn.Module):
    """A model holding a parameter outside any Linear, Embedding or norm module."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(2, 2)
        self.scale = torch.nn.Parameter(torch.empty(2))


def test_dummy_init_refuses_a_parameter_it_has_no_rule_for() -> None:
    """A parameter no rule covers is an error, not left holding torch.empty's garbage."""
    with pytest.raises(TypeError, match=r"no rule for \.scale \(_WithLooseParameter\)"):
        init_dummy_weights(_WithLooseParameter(), seed=0)


def test_a_missing_checkpoint_path_is_named_as_missing(tmp_path: Path) -> None:
    model = build_model(_spec("opt"), "torch")
    with pytest.raises(CheckpointError, match=r"nowhere\.bin does not exist"):
        load_checkpoint(model, tmp_path / "nowhere.bin")


def test_a_transposed_matrix_is_a_shape_mismatch() -> None:
    """Same element count, other shape (a [in, out] matrix saved for [out, in]): refused
    with both shapes, never reinterpreted."""
    model = _random_model(_spec("opt"))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["model.decoder.layers.0.fc1.weight"] = state["model.decoder.layers.0.fc1.weight"].T
    with pytest.raises(
        ValueError, match=r"shape mismatch for model\.decoder\.layers\.0\.fc1\.weight: "
        r"checkpoint \(32, 48\), model \(48, 32\)"
    ):  # fmt: skip
        load_weights(model, state.items())


def test_a_value_finite_in_fp32_but_not_in_the_model_dtype_is_refused() -> None:
    """The finiteness check is on the cast value: 1e5 fits fp32 but is inf in fp16."""
    model = build_model(_spec("llama"), "torch", torch.float16)
    state = {k: v.float() for k, v in _random_model(_spec("llama")).state_dict().items()}
    state["model.layers.1.mlp.up_proj.weight"][3, 4] = 1e5
    with pytest.raises(
        ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight holds non-finite values "
        r"\(NaN or inf\) once in torch\.float16"
    ):  # fmt: skip
        load_weights(model, state.items())


@pytest.mark.parametrize(("drop", "shown"), [(10, 10), (11, 10)])
def test_missing_keys_are_listed_sorted_and_capped_at_ten(drop: int, shown: int) -> None:
    """Up to 10 missing names are listed in sorted order; past 10 the message gives the
    first 10 and the count."""
    model = _random_model(_spec("llama"))
    state = model.state_dict()
    dropped = sorted(state)[::-1][:drop]  # fed in reverse order
    kept = {k: v for k, v in state.items() if k not in dropped}
    with pytest.raises(ValueError, match=r"checkpoint lacks parameters: ") as info:
        load_weights(model, kept.items())
    listed = str(info.value).split("lacks parameters: ")[1]
    names = sorted(dropped)[:shown]
    tail = "" if drop <= 10 else f", ... ({drop} in all)"
    assert listed == ", ".join(names) + tail


def _same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    pairs = zip(a.parameters(), b.parameters(), strict=True)
    return all(torch.equal(p, q) for p, q in pairs)


def test_every_safetensors_shard_is_read(tmp_path: Path) -> None:
    """A sharded checkpoint (model-0000i-of-0000n.safetensors) loads from all its shards."""
    from safetensors.torch import save_file

    source, target = _random_model(_spec("llama"), seed=5), _random_model(_spec("llama"), seed=6)
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    keys = sorted(state)
    for i, part in enumerate((keys[::2], keys[1::2]), start=1):
        save_file(
            {k: state[k] for k in part}, str(tmp_path / f"model-0000{i}-of-00002.safetensors")
        )
    load_checkpoint(target, tmp_path)
    assert _same_parameters(source, target)


def test_a_weights_file_that_is_not_a_name_to_tensor_dict_is_refused(tmp_path: Path) -> None:
    model = build_model(_spec("opt"), "torch")
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match=r"list\.pt is not a state dict of name -> tensor"):
        load_checkpoint(model, tmp_path / "list.pt")


def test_a_subdirectory_named_like_a_weights_file_is_not_read(tmp_path: Path) -> None:
    """In a directory, only files count as *.bin / *.pt weights."""
    source, target = _random_model(_spec("opt"), seed=7), _random_model(_spec("opt"), seed=8)
    torch.save(dict(source.state_dict()), tmp_path / "pytorch_model.bin")
    (tmp_path / "adapters.pt").mkdir()
    load_checkpoint(target, tmp_path)
    assert _same_parameters(source, target)


class _Pickled:
    """An arbitrary object: a weights file holding one needs code execution to unpickle."""


@pytest.mark.parametrize("content", ["garbage", "object"])
def test_an_unreadable_or_unsafe_torch_file_is_a_checkpoint_error(
    content: str, tmp_path: Path
) -> None:
    """Bytes that are no torch file, and a pickle of an arbitrary object (refused by
    torch.load's weights_only unpickler, never executed), are both CheckpointErrors."""
    model = build_model(_spec("opt"), "torch")
    file = tmp_path / "pytorch_model.bin"
    if content == "garbage":
        file.write_bytes(b"not a torch file")
    else:
        torch.save({"model.decoder.embed_tokens.weight": _Pickled()}, file)
    with pytest.raises(CheckpointError, match=r"cannot be read as a torch weights file"):
        load_checkpoint(model, tmp_path)
