"""Pin glibc malloc's thresholds for CPU timing runs.

By default glibc adapts its mmap threshold to the sizes freed so far, and returns the top of
the heap to the system past a trim threshold (mallopt(3), "M_MMAP_THRESHOLD"). A block above
the threshold is mapped fresh and page-faults on first touch, so the time of the same torch
work depends on the sizes the process allocated and freed before it. The CPU engine's torch
attention allocates each sequence's gathered K and V per layer (6 MiB at 1,024 tokens of
OPT-125M). For a decode step of 8 sequences averaging 1,024 tokens, the attention took 12%
longer with spread contexts than with equal ones, and one batch's attention time differed by
18–20% between fresh processes; with the thresholds pinned, by 3% and 3–6% (``python -m
experiments.bench.cpu_malloc``, 3 processes per mode,
``docs/validation/cpu-engine/malloc/cpu_malloc.csv``; this project's 2-core VM, 2026-12-02).
The operator profile times equal contexts and the engine serves mixed ones, and the heap's
history differs from run to run and sitting to sitting, so CPU timing runs pin the
thresholds first:

- ``M_MMAP_THRESHOLD`` at 32 MiB, the largest value the dynamic threshold may reach on
  64-bit (glibc's ``DEFAULT_MMAP_THRESHOLD_MAX``, 4 MiB × sizeof(long), mallopt(3)); setting
  it also turns the dynamic adjustment off;
- ``M_TRIM_THRESHOLD`` at 2 GiB − 1 (the largest int): freed memory stays in the heap.

Elsewhere than glibc (no ``mallopt``) nothing changes and :func:`malloc_state` says so.
``KVLAB_MALLOC=default`` in the environment leaves glibc's defaults (a control run, to see
what pinning changes); the runs record that too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
PINNED_MMAP_THRESHOLD = 32 << 20
PINNED_TRIM_THRESHOLD = 2**31 - 1
PINNED, DEFAULT, UNAVAILABLE = "pinned", "default", "no glibc mallopt"
LEFT = "default (KVLAB_MALLOC=default)"  # asked not to pin

_state = DEFAULT


def pin_malloc() -> str:
    """Pin this process's malloc thresholds (see the module doc); idempotent. Returns
    :func:`malloc_state`."""
    global _state
    if _state == DEFAULT and os.environ.get("KVLAB_MALLOC") == "default":
        _state = LEFT
    elif _state == DEFAULT:
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
        if mallopt is None:
            _state = UNAVAILABLE
        elif mallopt(M_MMAP_THRESHOLD, PINNED_MMAP_THRESHOLD) and mallopt(
            M_TRIM_THRESHOLD, PINNED_TRIM_THRESHOLD
        ):
            _state = PINNED
        else:
            _state = UNAVAILABLE
    return _state


def malloc_state() -> str:
    """``pinned`` once :func:`pin_malloc` has pinned the thresholds, ``default`` before,
    ``no glibc mallopt`` where it could not, :data:`LEFT` where ``KVLAB_MALLOC=default``
    asked it not to."""
    return _state
