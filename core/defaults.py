"""Defaults shared by the policies, both bodies and the cost models, written once.

- ``DEFAULT_BLOCK_SIZE``: tokens per KV block (paged) or allocation granule (contiguous);
  16 is vLLM's default (Kwon et al., SOSP 2023, §7.2 and Fig. 18b: 16-128 best on ShareGPT,
  16-32 on Alpaca).
- ``DEFAULT_WATERMARK``: fraction of device blocks a paged manager keeps free when it admits
  a group. The paper is silent; 1 % is the block manager's watermark in vLLM's 2023 code.
"""

from __future__ import annotations

DEFAULT_BLOCK_SIZE = 16
DEFAULT_WATERMARK = 0.01
