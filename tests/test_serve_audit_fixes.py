"""Serve's memory checks, after an audit (2026-12-05): a swap space larger than the host's
memory and a num_gpu_blocks larger than the device's were tracebacks from the allocator
(exit 1, the index row 'failed'); each is now one line naming its key, before any tensor."""

from __future__ import annotations

import pytest

from experiments.lib.checks import (
    ConfigError,
    Facts,
    check_swap_fits_host,
    check_weights_fit_device,
)

GIB = 1024**3
TINY = {"model": {"name": "tiny-opt"}, "dtype": "float32", "system": {"block_size": 16}}


def test_a_swap_space_past_the_hosts_memory_names_its_key() -> None:
    facts = Facts(device_memory_bytes=8 * GIB, host_memory_bytes=8 * GIB)
    check_swap_fits_host({**TINY, "swap_space_gb": 4}, "serve", facts)
    with pytest.raises(ConfigError, match="swap_space_gb") as err:
        check_swap_fits_host({**TINY, "swap_space_gb": 1000}, "serve", facts)
    assert "8.0 GiB of host memory" in err.value.line()
    check_swap_fits_host({**TINY, "swap_space_gb": 1000}, "simulate", facts)  # not the host's


def test_a_block_count_past_the_devices_memory_names_its_key() -> None:
    facts = Facts(device_memory_bytes=1 * GIB, host_memory_bytes=8 * GIB)
    check_weights_fit_device({**TINY, "num_gpu_blocks": 64}, "serve", facts)
    with pytest.raises(ConfigError, match="num_gpu_blocks") as err:
        check_weights_fit_device({**TINY, "num_gpu_blocks": 100_000_000}, "serve", facts)
    line = err.value.line()
    assert "blocks of 16 tokens" in line and "at most" in line
