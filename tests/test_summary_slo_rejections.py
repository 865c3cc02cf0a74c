"""Goodput with an ITL SLO and the rejection counts, on hand-made request tables."""

from __future__ import annotations

import pandas as pd
import pytest

from core.metrics.recorder import REQUEST_COLUMNS, STEP_COLUMNS
from core.metrics.summary import rejection_counts, summarize


def _requests() -> pd.DataFrame:
    rows = [  # id, arrival, prompt, output, seqs, ..., cached, readmit, ttft, e2el, tpot, ...
        (0, 0.0, 10, 5, 1, 0.0, 0.1, 1.0, 1, 5, 0, 0, 0, 0.1, 1.0, 0.225, "finished", ""),
        (1, 0.0, 10, 5, 1, 0.0, 0.1, 2.0, 1, 9, 0, 0, 0, 0.1, 2.0, 0.475, "finished", ""),
        (2, 0.0, 3000, 5, 1, None, None, None, None, None, 0, None, 0, None, None, None, "rejected",
         "prompt_len + output_len = 3000 + 5 = 3005 exceeds max_model_len=2048"),
        (3, 0.0, 10, 5, 4, None, None, None, None, None, 0, None, 0, None, None, None, "rejected",
         "needs 4 sequences (parallel samples or beams), more than max_num_seqs=2"),
        (4, 0.0, 10, 900, 1, None, None, None, None, None, 0, None, 0, None, None, None, "rejected",
         "needs more KV-cache memory than the cache admits (8 of its 8 blocks of 16 slots"),
        (5, 0.0, 10, 900, 1, None, None, None, None, None, 0, None, 0, None, None, None, "rejected",
         "outgrew the KV cache: alone on the device it needs more than all 8 blocks"),
    ]  # fmt: skip
    return pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))


def test_itl_slo_holds_each_requests_longest_gap() -> None:
    steps = pd.DataFrame(columns=list(STEP_COLUMNS))
    max_itl = {0: 0.150, 1: 0.600}  # request 1 has one 600 ms gap
    m = summarize(_requests(), steps, None, {"itl": 200}, max_itl)
    assert m["slo_attainment"] == pytest.approx(1 / 6)  # of all six; rejected ones missed
    assert m["goodput"] == pytest.approx(1 / 2.0)  # one request over the 2 s run
    both = summarize(_requests(), steps, None, {"itl": 200, "e2el": 1500}, max_itl)
    assert both["slo_attainment"] == pytest.approx(1 / 6)
    none = summarize(_requests(), steps, None, {"itl": 100}, max_itl)
    assert none["slo_attainment"] == 0.0


def test_every_rejection_is_counted_under_its_reason() -> None:
    assert rejection_counts(_requests()) == {
        "rejected_max_model_len": 1,
        "rejected_max_num_seqs": 1,
        "rejected_kv_cache": 2,
        "rejected_other": 0,
    }
