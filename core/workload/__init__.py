"""Workloads: synthetic generators fitted to published statistics, and trace readers/writers.

Everything here yields ``list[Request]`` (numpy/pandas only). :func:`build_workload` and
the generators return them sorted by arrival time; ``read_trace`` keeps a native file's row
order (an exact round trip with ``write_trace``), and ``build_workload`` sorts it.
"""

from core.workload.arrivals import all_at_once, gamma, make_arrivals, poisson
from core.workload.datasets_json import read_alpaca_json, read_sharegpt_json, whitespace_tokenize
from core.workload.filters import FilterResult, filter_requests, keep_mask
from core.workload.lengths import PUBLISHED, LengthModel, describe, fit
from core.workload.spec import build_workload
from core.workload.synthetic import multi_turn, shared_prefix, synthesize
from core.workload.trace_io import (
    TraceFormatError,
    read_azure_trace,
    read_mooncake_trace,
    read_trace,
    read_vidur_trace,
    write_trace,
)

__all__ = [
    "PUBLISHED",
    "FilterResult",
    "LengthModel",
    "TraceFormatError",
    "all_at_once",
    "build_workload",
    "describe",
    "filter_requests",
    "fit",
    "gamma",
    "keep_mask",
    "make_arrivals",
    "multi_turn",
    "poisson",
    "read_alpaca_json",
    "read_azure_trace",
    "read_mooncake_trace",
    "read_sharegpt_json",
    "read_trace",
    "read_vidur_trace",
    "shared_prefix",
    "synthesize",
    "whitespace_tokenize",
    "write_trace",
]
