"""Paged KV tensors on the device plus a CPU swap pool, sized from a byte budget.

All layers' caches are ONE device tensor ``caches`` of shape ``[2 * num_layers, num_blocks,
block_size, num_kv_heads, head_dim]``: K of layer ``l`` at index ``l``, V at ``num_layers +
l``. ``k_caches[l]`` and ``v_caches[l]`` are views of it, ``[num_blocks, block_size,
num_kv_heads, head_dim]`` and contiguous (the layout of ``engine.attention.metadata``).
Block ``b`` of every layer belongs to whoever the KV-cache manager gave block ``b``: the
manager's block ids ARE the tensor's block indices. The CPU pool ``cpu_caches`` (views
``k_cpu`` / ``v_cpu``) has the same layout with ``num_cpu_blocks`` blocks (pinned memory
when the device is CUDA, so swaps can overlap). Stacking makes a step's block moves a fixed
number of calls, whatever the number of layers: device copies are one kernel launch (CUDA)
or one ``index_select`` + one ``index_copy_`` (CPU); a swap is one gather, one host↔device
transfer and one scatter per chunk of at most ``core.defaults.SWAP_CHUNK_BYTES``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.defaults import GIB, swap_chunk_blocks
from core.kv.base import check_at_least
from core.model_spec import ModelSpec, kv_bytes_per_token
from kernels.block_ops import check_copy_pairs, gather_blocks, scatter_blocks
from kernels.block_ops import copy_blocks as triton_copy_blocks

BlockPairs = Sequence[tuple[int, int]]


class KVBudgetError(ValueError):
    """A KV-cache budget that cannot be resolved or holds no block."""


def bytes_per_block(config: ModelSpec, block_size: int, dtype: torch.dtype) -> int:
    """Device bytes of one block: K and V of ``block_size`` tokens in every layer."""
    return block_size * kv_bytes_per_token(config, torch.empty((), dtype=dtype).element_size())


def resolve_kv_budget(
    device: torch.device | str,
    budget_bytes: int | None = None,
    gib: float | None = None,
    fraction: float | None = None,
    reserved_bytes: int = 0,
) -> int:
    """The KV budget in bytes from exactly one of ``budget_bytes``, ``gib`` or ``fraction``
    (of the device's free memory now, ``torch.cuda.mem_get_info``, less ``reserved_bytes``
    that will be allocated before the cache, e.g. the weights; CUDA only)."""
    given = [x is not None for x in (budget_bytes, gib, fraction)]
    if sum(given) != 1:
        raise KVBudgetError(
            "give exactly one KV budget: budget_bytes, gib or fraction "
            f"(got budget_bytes={budget_bytes}, gib={gib}, fraction={fraction})"
        )
    if budget_bytes is not None:
        out = int(budget_bytes)
    elif gib is not None:
        out = int(float(gib) * GIB)
    else:
        assert fraction is not None
        if not 0 < fraction <= 1:
            raise KVBudgetError(f"KV budget fraction must be in (0, 1], got {fraction}")
        dev = torch.device(device)
        if dev.type != "cuda":
            raise KVBudgetError(
                f"a KV budget as a fraction of free device memory needs a CUDA device, "
                f"not {dev}; give the budget in bytes or GiB"
            )
        free, _total = torch.cuda.mem_get_info(dev)
        if free <= reserved_bytes:
            raise KVBudgetError(
                f"{free / GIB:.2f} GiB free on {dev} leave no room for a KV cache after the "
                f"{reserved_bytes / GIB:.2f} GiB still to be allocated (the weights)"
            )
        out = int((free - reserved_bytes) * fraction)
    if out <= 0:
        raise KVBudgetError(f"KV budget must be positive, got {out} bytes")
    return out


class PagedKVCache:
    """The engine's KV memory. ``num_blocks * bytes_per_block <= budget`` by construction
    when built with :meth:`num_blocks_for_budget`."""

    def __init__(
        self,
        config: ModelSpec,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        num_cpu_blocks: int = 0,
    ) -> None:
        check_at_least(1, KVBudgetError, num_blocks=num_blocks, block_size=block_size)
        check_at_least(0, KVBudgetError, num_cpu_blocks=num_cpu_blocks)
        self.config = config
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_cpu_blocks = num_cpu_blocks
        self.dtype = dtype
        self.device = torch.device(device)
        layers = config.num_layers
        block = (block_size, config.num_kv_heads, config.head_dim)
        # zeros, not empty: a kernel may load a whole block and mask; NaN * 0 is NaN.
        self.caches = torch.zeros((2 * layers, num_blocks, *block), dtype=dtype, device=device)
        self.k_caches = [self.caches[i] for i in range(layers)]
        self.v_caches = [self.caches[layers + i] for i in range(layers)]
        pin = self.device.type == "cuda"
        self.cpu_caches = torch.empty(
            (2 * layers, num_cpu_blocks, *block), dtype=dtype, pin_memory=pin
        )
        self.k_cpu = [self.cpu_caches[i] for i in range(layers)]
        self.v_cpu = [self.cpu_caches[layers + i] for i in range(layers)]
        # the Triton copy kernel on CUDA; torch index ops elsewhere (tests may flip it to
        # run the kernel under the Triton interpreter)
        self.use_copy_kernel = self.device.type == "cuda"

    @staticmethod
    def num_blocks_for_budget(
        config: ModelSpec, budget_bytes: int, block_size: int, dtype: torch.dtype
    ) -> int:
        """Most whole blocks whose K/V tensors fit in ``budget_bytes`` (raises if none)."""
        per_block = bytes_per_block(config, block_size, dtype)
        n = int(budget_bytes) // per_block
        if n < 1:
            raise KVBudgetError(
                f"KV budget of {budget_bytes} bytes holds no block: one block of {block_size} "
                f"tokens needs {per_block} bytes in {dtype}"
            )
        return n

    @property
    def kv_caches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One ``(k_cache, v_cache)`` per layer, as the models take them."""
        return list(zip(self.k_caches, self.v_caches, strict=True))

    @property
    def device_bytes(self) -> int:
        """Bytes held by the device K/V tensors."""
        return self.caches.numel() * self.caches.element_size()

    # -- block moves (the plan's swap_out, swap_in, copies, in that order) ------------
    def swap_out(self, pairs: BlockPairs) -> None:
        """Copy device blocks to CPU blocks: ``pairs`` of ``(device, cpu)``, every layer's K
        and V in one gather, one transfer and one scatter per chunk (see :meth:`_move`)."""
        if pairs:
            self._move(pairs, self.caches, self.cpu_caches)

    def swap_in(self, pairs: BlockPairs) -> None:
        """Copy CPU blocks back to device blocks: ``pairs`` of ``(cpu, device)``, as
        :meth:`swap_out` does."""
        if pairs:
            self._move(pairs, self.cpu_caches, self.caches)

    @staticmethod
    def _move(pairs: BlockPairs, source: torch.Tensor, dest: torch.Tensor) -> None:
        """``dest[:, d] = source[:, s]`` for ``(s, d)`` in ``pairs``, in chunks of
        :func:`swap_chunk_blocks` blocks: each chunk's blocks of all layers are gathered
        into one temporary on the source's device (at most ``SWAP_CHUNK_BYTES``, or one
        block), then transferred and scattered."""
        step = swap_chunk_blocks(source[:, :1].numel() * source.element_size())
        for i in range(0, len(pairs), step):
            chunk = pairs[i : i + step]
            src = torch.tensor([p[0] for p in chunk], dtype=torch.int64)
            dst = torch.tensor([p[1] for p in chunk], dtype=torch.int64)
            scatter_blocks(dest, dst, gather_blocks(source, src))

    def copy_blocks(self, pairs: BlockPairs) -> None:
        """``cache[dst] = cache[src]`` in every layer's K and V for ``pairs`` of ``(src,
        dst)`` (all copies read the pre-copy state; pairs checked by
        :func:`kernels.block_ops.check_copy_pairs`). One Triton kernel launch on CUDA, one
        ``index_select`` + one ``index_copy_`` over the stacked caches otherwise."""
        if not pairs:
            return
        ids = torch.tensor(list(pairs), dtype=torch.int64, device=self.device)
        if self.use_copy_kernel:
            triton_copy_blocks(self.caches, ids)
            return
        check_copy_pairs(ids, self.num_blocks)
        src, dst = ids[:, 0], ids[:, 1]
        self.caches.index_copy_(1, dst, self.caches.index_select(1, src))
