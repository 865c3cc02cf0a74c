"""``write_csv`` writes exactly the bytes ``DataFrame.to_csv(index=False)`` writes, on its
row-by-row path (integer and float columns) and on pandas' own (anything else)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.lib.results import RowTable, write_csv

_FLOATS = st.floats(allow_nan=False, width=64)
_EDGE = [0.0, -0.0, 1e16, 1e-5, 123456789.0, 0.1, float("inf"), -float("inf"), 5e-324]


@settings(max_examples=60, deadline=None)
@given(
    ints=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=0, max_size=20),
    floats=st.lists(_FLOATS | st.sampled_from(_EDGE), min_size=20, max_size=20),
)
def test_numeric_frames_match_pandas_bytes(tmp_path_factory, ints, floats):
    n = len(ints)
    df = pd.DataFrame(
        {"step": np.array(ints, dtype=np.int64), "start_s": np.array(floats[:n], dtype=float)}
    )
    _check(tmp_path_factory.mktemp("csv"), df)


def test_other_frames_fall_back_to_pandas(tmp_path):
    frames = [
        pd.DataFrame({"a": [1.5, np.nan], "b": [1, 2]}),  # NaN
        pd.DataFrame({"a": ["x,y", 'q"'], "b": [None, "z"]}),  # text that needs quoting
        pd.DataFrame({"a": np.array([0.1, 2.5], dtype=np.float32)}),  # float32
        pd.DataFrame({"a b": [1, 2]}),  # a column name that is not an identifier
        pd.DataFrame({"a": [True, False]}),
        pd.DataFrame([[1, 2]], columns=["a", "a"]),  # duplicate names
        pd.DataFrame(),
    ]
    for i, df in enumerate(frames):
        _check(tmp_path / str(i), df)


def _check(root, df):
    root.mkdir(parents=True, exist_ok=True)
    write_csv(root / "fast.csv", df)
    df.to_csv(root / "pandas.csv", index=False)
    assert (root / "fast.csv").read_bytes() == (root / "pandas.csv").read_bytes()


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(-(2**62), 2**62), _FLOATS | st.sampled_from(_EDGE), st.integers()),
        max_size=15,
    )
)
def test_row_tables_match_the_frame_of_their_rows(tmp_path_factory, rows):
    """A RowTable (a recorder's rows) is written as the frame built from it would be."""
    rows = [(a, b, c % 2**40) for a, b, c in rows]
    root = tmp_path_factory.mktemp("rows")
    write_csv(root / "rows.csv", RowTable(("step", "start_s", "kv_free"), rows))
    df = pd.DataFrame(
        {
            "step": np.array([r[0] for r in rows], dtype=np.int64),
            "start_s": np.array([r[1] for r in rows], dtype=np.float64),
            "kv_free": np.array([r[2] for r in rows], dtype=np.int64),
        }
    )
    df.to_csv(root / "pandas.csv", index=False)
    assert (root / "rows.csv").read_bytes() == (root / "pandas.csv").read_bytes()
