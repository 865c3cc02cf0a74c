"""The engine's KV tensors: all layers in one stacked tensor, so a step's block copies are
one kernel launch (or one gather + one scatter on CPU) and a swap one gather + one scatter,
with the same cache contents as a per-cache reference."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from core.model_spec import ModelSpec
from core.request import Request, SamplingParams
from engine import kv_cache as kv_cache_module
from engine.kv_cache import PagedKVCache
from kernels import block_ops
from kernels.reference import ref_copy_blocks, ref_gather_blocks, ref_scatter_blocks
from tests.engine_helpers import (
    make_engine,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    prompt_ids,
    reference_beam_search,
    tiny_config,
)
from tests.kernel_helpers import CountingLauncher

SHAPES = [  # layers, block_size, kv_heads, head_dim
    (1, 4, 1, 8),
    (3, 8, 2, 16),
    (2, 16, 3, 24),
]


def _filled(
    layers: int, block_size: int, kvh: int, dim: int, num_blocks: int = 9, cpu_blocks: int = 0
) -> PagedKVCache:
    config: ModelSpec = dataclasses.replace(
        tiny_config(),
        num_layers=layers,
        hidden_size=kvh * dim,
        num_heads=kvh,
        num_kv_heads=kvh,
        head_dim=dim,
    )
    kv = PagedKVCache(config, num_blocks, block_size, num_cpu_blocks=cpu_blocks)
    gen = torch.Generator().manual_seed(layers * 100 + block_size)
    for cache in (*kv.k_caches, *kv.v_caches):  # through the views, as the model writes
        cache.copy_(torch.randn(cache.shape, generator=gen))
    # the host pool is torch.empty: give it values, or blocks a test never writes hold
    # whatever was in memory (NaN bit patterns included, which torch.equal calls unequal)
    for cache in (*kv.k_cpu, *kv.v_cpu):
        cache.copy_(torch.randn(cache.shape, generator=gen))
    return kv


def _per_cache(kv: PagedKVCache) -> list[torch.Tensor]:
    return [c.clone() for c in (*kv.k_caches, *kv.v_caches)]


class _AtenCounter(TorchDispatchMode):
    """Counts the aten ops run while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_layer_caches_are_contiguous_views_of_one_tensor() -> None:
    kv = _filled(3, 8, 2, 16, cpu_blocks=4)
    assert kv.caches.shape == (6, 9, 8, 2, 16) and kv.cpu_caches.shape == (6, 4, 8, 2, 16)
    for i, (k, v) in enumerate(kv.kv_caches):
        assert k.is_contiguous() and v.is_contiguous()
        assert k.data_ptr() == kv.caches[i].data_ptr()
        assert v.data_ptr() == kv.caches[3 + i].data_ptr()
    assert kv.k_cpu[2].data_ptr() == kv.cpu_caches[2].data_ptr()
    assert kv.v_cpu[0].data_ptr() == kv.cpu_caches[3].data_ptr()
    assert kv.device_bytes == 6 * 9 * 8 * 2 * 16 * 4


@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "triton"])
@pytest.mark.parametrize(("layers", "block_size", "kvh", "dim"), SHAPES)
@pytest.mark.parametrize("pairs", [[(0, 4)], [(0, 4), (2, 7), (0, 5), (8, 1)]])
def test_copy_blocks_matches_the_per_cache_reference(
    kernel: bool, layers: int, block_size: int, kvh: int, dim: int, pairs: list
) -> None:
    kv = _filled(layers, block_size, kvh, dim)
    kv.use_copy_kernel = kernel
    refs = _per_cache(kv)
    kv.copy_blocks(pairs)
    for ref in refs:
        ref_copy_blocks(ref[None], torch.tensor(pairs))
    assert all(torch.equal(c, r) for c, r in zip((*kv.k_caches, *kv.v_caches), refs, strict=True))


@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "triton"])
@pytest.mark.parametrize(
    ("pairs", "error", "match"),
    [
        ([(0, 9)], IndexError, "out of range"),
        ([(-1, 2)], IndexError, "out of range"),
        ([(0, 1), (2, 1)], ValueError, "repeat"),
        ([(0, 1), (1, 2)], ValueError, "also a source"),
    ],
)
def test_copy_blocks_rejects_bad_pairs_with_one_error(
    kernel: bool, pairs: list, error: type, match: str
) -> None:
    kv = _filled(2, 4, 1, 8)
    kv.use_copy_kernel = kernel
    before = kv.caches.clone()
    with pytest.raises(error, match=match):
        kv.copy_blocks(pairs)
    assert torch.equal(kv.caches, before)


@pytest.mark.parametrize(("layers", "block_size", "kvh", "dim"), SHAPES)
def test_swap_out_then_in_matches_the_per_cache_reference(
    layers: int, block_size: int, kvh: int, dim: int
) -> None:
    kv = _filled(layers, block_size, kvh, dim, cpu_blocks=5)
    out_pairs, in_pairs = [(7, 3), (2, 0), (8, 4)], [(3, 1), (0, 5), (4, 6)]
    device_refs, cpu_refs = _per_cache(kv), [c.clone() for c in (*kv.k_cpu, *kv.v_cpu)]
    original = kv.caches.clone()
    kv.swap_out(out_pairs)
    kv.caches[:, [7, 2, 8]] = 0  # the device blocks are reused while swapped out
    kv.swap_in(in_pairs)
    for dev, cpu in zip(device_refs, cpu_refs, strict=True):
        src, dst = (torch.tensor(ids) for ids in zip(*out_pairs, strict=True))
        ref_scatter_blocks(cpu[None], dst, ref_gather_blocks(dev[None], src))
        dev[[7, 2, 8]] = 0
        src, dst = (torch.tensor(ids) for ids in zip(*in_pairs, strict=True))
        ref_scatter_blocks(dev[None], dst, ref_gather_blocks(cpu[None], src))
    got_dev, got_cpu = (*kv.k_caches, *kv.v_caches), (*kv.k_cpu, *kv.v_cpu)
    assert all(torch.equal(g, r) for g, r in zip(got_dev, device_refs, strict=True))
    assert all(torch.equal(g, r) for g, r in zip(got_cpu, cpu_refs, strict=True))
    assert torch.equal(kv.caches[:, [1, 5, 6]], original[:, [7, 2, 8]])  # out 7->3, in 3->1
    with pytest.raises(IndexError, match="out of range"):
        kv.swap_out([(0, 5)])


def test_a_step_of_moves_is_one_gather_and_one_scatter_each_on_cpu() -> None:
    kv = _filled(4, 4, 2, 8, cpu_blocks=4)  # 8 caches: the old loop ran 8 of each
    for move, pairs in (
        (kv.copy_blocks, [(0, 4), (1, 5), (2, 6)]),
        (kv.swap_out, [(4, 0), (5, 1)]),
        (kv.swap_in, [(0, 7), (1, 8)]),
    ):
        with _AtenCounter() as counter:
            move(pairs)
        assert (counter.ops["index_select"], counter.ops["index_copy_"]) == (1, 1), move


def test_a_swap_larger_than_a_chunk_moves_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A swap bigger than SWAP_CHUNK_BYTES is moved a chunk at a time (the gather's device
    temporary stays bounded) with the same result: 5 blocks at 2 per chunk are 3 gathers and
    3 scatters per direction."""
    from core.defaults import SWAP_CHUNK_BYTES, swap_chunk_blocks

    assert swap_chunk_blocks(SWAP_CHUNK_BYTES / 2.5) == 2 and swap_chunk_blocks(1e30) == 1
    assert swap_chunk_blocks(0) == 1
    kv = _filled(2, 4, 2, 8, num_blocks=12, cpu_blocks=6)
    monkeypatch.setattr(kv_cache_module, "swap_chunk_blocks", lambda block_bytes: 2)
    out_pairs, in_pairs = [(7, 3), (2, 0), (8, 4), (1, 5), (10, 1)], [(3, 9), (0, 6)]
    original, cpu_before = kv.caches.clone(), kv.cpu_caches.clone()
    with _AtenCounter() as counter:
        kv.swap_out(out_pairs)
    assert (counter.ops["index_select"], counter.ops["index_copy_"]) == (3, 3)
    expected_cpu = cpu_before.clone()
    for d, c in out_pairs:
        expected_cpu[:, c] = original[:, d]
    assert torch.equal(kv.cpu_caches, expected_cpu)
    kv.swap_in(in_pairs)
    assert torch.equal(kv.caches[:, [9, 6]], original[:, [7, 2]])


def test_a_steps_copies_are_one_kernel_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = CountingLauncher(block_ops._copy_blocks_kernel)
    monkeypatch.setattr(block_ops, "_copy_blocks_kernel", launcher)
    kv = _filled(3, 8, 2, 16)
    kv.use_copy_kernel = True
    kv.copy_blocks([(0, 4), (2, 7), (8, 1)])
    assert launcher.grids == [(3, 1, 6)]  # pairs x chunks x (K and V of 3 layers)


def test_beam_search_through_the_copy_kernel_launches_once_per_step_with_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launcher = CountingLauncher(block_ops._copy_blocks_kernel)
    monkeypatch.setattr(block_ops, "_copy_blocks_kernel", launcher)
    width, steps = 3, 5
    prompt = prompt_ids(9, seed=5)
    engine = make_engine(num_blocks=64, max_model_len=64)
    engine.kv_cache.use_copy_kernel = True
    engine.add_request(Request(0, 0.0, 9, steps, SamplingParams(beam_width=width), prompt))
    steps_with_copies = 0
    while engine.has_unfinished():
        engine.step()
        steps_with_copies += int(engine.recorder.steps_frame()["copy_blocks"].iloc[-1] > 0)
    assert steps_with_copies > 0 and len(launcher.grids) == steps_with_copies
    seqs = sorted(engine.groups[0].seqs, key=lambda s: -s.cum_logprob)
    reference = reference_beam_search(engine.model, prompt, width, steps)
    assert [s.output_token_ids for s in seqs] == [tokens for tokens, _ in reference]
