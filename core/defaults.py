"""Defaults shared by the policies, both bodies and the cost models, written once.

- ``DEFAULT_BLOCK_SIZE``: tokens per KV block (paged) or allocation granule (contiguous);
  16 is vLLM's default (Kwon et al., SOSP 2023, §7.2 and Fig. 18b: 16-128 best on ShareGPT,
  16-32 on Alpaca).
- ``DEFAULT_WATERMARK``: fraction of device blocks a paged manager keeps free when it admits
  a group. The paper is silent; 1 % is the block manager's watermark in vLLM's 2023 code.
- ``SWAP_CHUNK_BYTES``: kvlab's engine swaps a step's blocks in chunks of at most this many
  bytes (all layers' K and V of the chunk's blocks, at least one block), one gather, one
  transfer and one scatter each: the gather's temporary on the source device stays bounded.
  256 MiB is a choice (small beside a GPU's memory, large enough that a typical swap is one
  chunk); the simulator's ``measured`` stack prices the same chunks.
- ``GIB``: bytes in a GiB (2**30), the unit of every ``*_gb`` key and memory figure.
"""

from __future__ import annotations

DEFAULT_BLOCK_SIZE = 16
DEFAULT_WATERMARK = 0.01
SWAP_CHUNK_BYTES = 256 << 20
GIB = 1 << 30


def swap_chunk_blocks(block_bytes: float, chunk_bytes: float = SWAP_CHUNK_BYTES) -> int:
    """Blocks per swap chunk when one block (all layers' K and V) is ``block_bytes``: as
    many as fit in ``chunk_bytes``, at least one."""
    if block_bytes <= 0:
        return 1
    return max(1, int(chunk_bytes // block_bytes))
