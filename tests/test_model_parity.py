"""kvlab's OPT and Llama models over a paged KV cache against HF ``transformers``.

Tolerance: fp32 logits within atol 1e-4 (rtol 1e-4) of HF's eager implementation; the only
differences are summation order (HF scales q before QK^T, kvlab scales the scores).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from core.model_spec import ModelSpec
from engine.attention.metadata import AttentionMetadata
from engine.config import spec_from_hf_dict
from engine.models import CausalLM, build_model
from engine.weights import CheckpointError, init_dummy_weights, load_checkpoint, load_weights

VOCAB = 128
ATOL = RTOL = 1e-4
BLOCK_SIZE = 4
NUM_BLOCKS = 64


def _hf_config(kind: str) -> transformers.PretrainedConfig:
    common = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2}
    common |= {"num_attention_heads": 4, "max_position_embeddings": 64}
    if kind == "llama":
        return transformers.LlamaConfig(
            **common, num_key_value_heads=2, intermediate_size=128, rope_theta=10000.0
        )
    if kind == "opt":
        return transformers.OPTConfig(**common, ffn_dim=128)
    if kind == "opt_post_ln_proj":  # OPT-350m's shape: post-LN and a narrower embedding
        return transformers.OPTConfig(
            **common, ffn_dim=128, do_layer_norm_before=False, word_embed_proj_dim=32
        )
    raise AssertionError(kind)


def _hf_model(kind: str) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = _hf_config(kind)
    config._attn_implementation = "eager"
    cls = transformers.LlamaForCausalLM if kind == "llama" else transformers.OPTForCausalLM
    return cls(config).eval()


def _kvlab_from_hf(hf: transformers.PreTrainedModel) -> CausalLM:
    model = build_model(spec_from_hf_dict(hf.config.to_dict()), "torch")
    load_weights(model, hf.state_dict().items())
    return model


def _hf_logits(hf: transformers.PreTrainedModel, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0]


class PagedCache:
    """Per-layer NaN-filled KV caches plus each sequence's random, non-contiguous blocks.
    NaN makes any read of a slot that was never written poison the output."""

    def __init__(self, config: ModelSpec, seed: int) -> None:
        shape = (NUM_BLOCKS, BLOCK_SIZE, config.num_kv_heads, config.head_dim)
        self.kv = [
            (torch.full(shape, float("nan")), torch.full(shape, float("nan")))
            for _ in range(config.num_layers)
        ]
        self.free = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(seed))
        self.free = self.free.tolist()
        self.blocks: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def step(self, model: CausalLM, chunks: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Run one forward over ``(seq_id, new tokens)`` chunks; return each chunk's logits."""
        ids, positions, slots, starts, ctx_lens, tables = [], [], [], [0], [], []
        for seq, tokens in chunks:
            blocks = self.blocks.setdefault(seq, [])
            start = self.lens.get(seq, 0)
            for pos in range(start, start + len(tokens)):
                if pos // BLOCK_SIZE == len(blocks):
                    blocks.append(self.free.pop())
                slots.append(blocks[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            self.lens[seq] = start + len(tokens)
            ids += tokens
            positions += range(start, start + len(tokens))
            starts.append(starts[-1] + len(tokens))
            ctx_lens.append(self.lens[seq])
            tables.append(list(blocks))
        width = max(len(t) for t in tables)
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            context_lens=torch.tensor(ctx_lens, dtype=torch.int32),
            block_tables=torch.tensor(
                [t + [0] * (width - len(t)) for t in tables], dtype=torch.int32
            ),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            max_query_len=max(len(c[1]) for c in chunks),
            max_context_len=max(ctx_lens),
        )
        with torch.no_grad():
            hidden = model(torch.tensor(ids), torch.tensor(positions), self.kv, meta)
            logits = model.compute_logits(hidden)
        return [logits[starts[i] : starts[i + 1]] for i in range(len(chunks))]


def _prompt(length: int, seed: int) -> list[int]:
    return torch.randint(
        3, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)
    ).tolist()


KINDS = ["opt", "llama", "opt_post_ln_proj"]


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_logits_match_hf(kind: str) -> None:
    hf = _hf_model(kind)
    model = _kvlab_from_hf(hf)
    prompt = _prompt(11, seed=1)
    (logits,) = PagedCache(model.config, seed=2).step(model, [(0, prompt)])
    torch.testing.assert_close(logits, _hf_logits(hf, prompt), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_decode_matches_hf(kind: str) -> None:
    hf = _hf_model(kind)
    model = _kvlab_from_hf(hf)
    tokens = _prompt(7, seed=3)
    cache = PagedCache(model.config, seed=4)
    (logits,) = cache.step(model, [(0, tokens)])
    expected = _hf_logits(hf, tokens)
    kvlab_new, hf_new = [], []
    for _ in range(8):
        kvlab_new.append(int(logits[-1].argmax()))
        hf_new.append(int(expected[-1].argmax()))
        tokens = [*tokens, kvlab_new[-1]]
        expected = _hf_logits(hf, tokens)  # no HF cache: the whole sequence every step
        (logits,) = cache.step(model, [(0, tokens[-1:])])
        torch.testing.assert_close(logits[-1], expected[-1], atol=ATOL, rtol=RTOL)
    assert kvlab_new == hf_new


@pytest.mark.parametrize("kind", ["opt", "llama"])
def test_mixed_ragged_batch_equals_per_sequence_runs(kind: str) -> None:
    hf = _hf_model(kind)
    model = _kvlab_from_hf(hf)
    a, b, c = _prompt(6, seed=5), _prompt(9, seed=6), _prompt(10, seed=7)
    next_a, rest_c = _prompt(1, seed=8), c[6:]

    alone = []
    for seq, chunks in ((0, [a, next_a]), (1, [b]), (2, [c[:6], rest_c])):
        cache = PagedCache(model.config, seed=9 + seq)
        alone.append([cache.step(model, [(seq, chunk)])[0] for chunk in chunks][-1])

    batched = PagedCache(model.config, seed=20)
    batched.step(model, [(0, a), (2, c[:6])])
    # One forward: a decode, a fresh prefill and a prefill over a cached prefix.
    out = batched.step(model, [(0, next_a), (1, b), (2, rest_c)])
    for got, want in zip(out, alone, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["opt", "llama"])
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_load_checkpoint_gives_hf_logits(kind: str, fmt: str, tmp_path: Path) -> None:
    hf = _hf_model(kind)
    if fmt == "safetensors":
        hf.save_pretrained(tmp_path)
        assert list(tmp_path.glob("*.safetensors"))
    else:
        hf.config.to_json_file(tmp_path / "config.json")
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    model = build_model(ModelSpec.from_json(tmp_path), "torch")
    load_checkpoint(model, tmp_path)
    prompt = _prompt(9, seed=11)
    (logits,) = PagedCache(model.config, seed=12).step(model, [(0, prompt)])
    torch.testing.assert_close(logits, _hf_logits(hf, prompt), atol=ATOL, rtol=RTOL)


def test_tied_lm_head_is_the_embedding() -> None:
    model = _kvlab_from_hf(_hf_model("opt"))
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    untied = _kvlab_from_hf(_hf_model("llama"))
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight


def test_load_weights_names_bad_keys() -> None:
    hf = _hf_model("llama")
    state = dict(hf.state_dict())
    model = build_model(spec_from_hf_dict(hf.config.to_dict()), "torch")
    missing = {k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ValueError, match=r"lacks parameters: model\.layers\.1\.mlp\.up_proj"):
        load_weights(model, missing.items())
    extra = state | {"model.layers.0.mlp.extra": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"model lacks: model\.layers\.0\.mlp\.extra"):
        load_weights(model, extra.items())
    wrong = state | {"model.norm.weight": torch.ones(65)}
    with pytest.raises(ValueError, match=r"shape mismatch for model\.norm\.weight"):
        load_weights(model, wrong.items())
    damaged = state["model.layers.0.mlp.up_proj.weight"].clone()
    damaged[0, 0] = float("nan")
    nan = state | {"model.layers.0.mlp.up_proj.weight": damaged}
    with pytest.raises(ValueError, match=r"up_proj\.weight holds non-finite values"):
        load_weights(model, nan.items())


def test_checkpoint_config_must_match_model(tmp_path: Path) -> None:
    hf = _hf_model("opt")
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text()) | {"ffn_dim": 256}
    model = build_model(spec_from_hf_dict(config), "torch")
    with pytest.raises(ValueError, match="ffn_hidden_size: checkpoint 128, model 256"):
        load_checkpoint(model, tmp_path)
    with pytest.raises(CheckpointError, match="no weights"):
        load_checkpoint(model, tmp_path / "..")


def test_every_catalog_model_has_an_engine_config() -> None:
    catalog = pytest.importorskip("sim.catalog")
    for name, spec in catalog.MODELS.items():
        config = spec_from_hf_dict(spec.to_hf_config())
        shape = (config.family, config.num_layers, config.hidden_size, config.num_kv_heads)
        assert shape == (spec.family, spec.num_layers, spec.hidden_size, spec.num_kv_heads), name
        assert (config.head_dim, config.ffn_hidden_size) == (spec.head_dim, spec.ffn_hidden_size)


def test_config_from_hf_dicts() -> None:
    llama = spec_from_hf_dict(_hf_config("llama").to_dict())
    assert (llama.family, llama.num_kv_heads, llama.head_dim, llama.activation) == (
        "llama",
        2,
        16,
        "silu",
    )
    assert not llama.tie_word_embeddings
    opt = spec_from_hf_dict(_hf_config("opt").to_dict())
    assert (opt.family, opt.num_kv_heads, opt.ffn_hidden_size, opt.activation) == (
        "opt",
        4,
        128,
        "relu",
    )
    assert opt.tie_word_embeddings and opt.word_embed_proj_dim is None
    legacy = _hf_config("llama").to_dict()
    del legacy["rope_parameters"]
    legacy["rope_theta"] = 500000.0
    assert spec_from_hf_dict(legacy).rope_theta == 500000.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "unsupported model_type 'gpt2'"),
        ({"num_key_value_heads": 3}, "multiple of num_kv_heads"),
        ({"hidden_act": "gelu"}, "activation 'silu'"),
        ({"attention_bias": True}, "attention_bias=True"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1.0}}, "rope_type 'llama3'"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be a whole number >= 1"),
        ({"model_type": "qwen3"}, "qk_norm=True"),
    ],
)
def test_bad_configs_are_rejected(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec_from_hf_dict(_hf_config("llama").to_dict() | change)


def test_opt_config_rejects_unsupported_features() -> None:
    with pytest.raises(ValueError, match="enable_bias=False"):
        spec_from_hf_dict(_hf_config("opt").to_dict() | {"enable_bias": False})
    with pytest.raises(ValueError, match="not a multiple of num_attention_heads"):
        spec_from_hf_dict(_hf_config("opt").to_dict() | {"hidden_size": 66})


@pytest.mark.parametrize("family", ["opt", "llama"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dummy_weights_seeded_and_finite_at_real_width(family: str, dtype: torch.dtype) -> None:
    hidden, heads = 1024, 16
    config = ModelSpec(
        name=f"wide-{family}",
        family=family,
        gated_mlp=family == "llama",
        vocab_size=512,
        hidden_size=hidden,
        num_layers=2,
        num_heads=heads,
        num_kv_heads=heads if family == "opt" else 4,
        head_dim=hidden // heads,
        ffn_hidden_size=4 * hidden,
        max_model_len=64,
        num_position_embeddings=66 if family == "opt" else 0,
        activation="relu" if family == "opt" else "silu",
        tie_word_embeddings=family == "opt",
    )
    first, second = build_model(config, "torch", dtype), build_model(config, "torch", dtype)
    init_dummy_weights(first, seed=7)
    init_dummy_weights(second, seed=7)
    for (name, p), q in zip(first.named_parameters(), second.parameters(), strict=True):
        assert p.dtype == dtype
        assert torch.equal(p, q), name
        if name.endswith("norm.weight"):
            assert torch.all(p == 1), name
    prompt = _prompt(16, seed=13)
    cache = PagedCache(config, seed=14)
    cache.kv = [(k.to(dtype), v.to(dtype)) for k, v in cache.kv]
    (logits,) = cache.step(first, [(0, prompt)])
    assert torch.isfinite(logits).all()
    assert logits.float().std() > 0.1
