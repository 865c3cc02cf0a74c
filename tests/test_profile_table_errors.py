"""A malformed profile table is one ProfileError naming the file and the row (or sidecar key):
non-finite or fractional sizes, sizes given twice, empty files, bad sidecar values, bad
Vidur shape columns; and through the CLI one line with exit status 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sim.cost.profile import FORMAT, VIDUR_LINEAR, VIDUR_OTHER, ProfileError, read_profile

REPO = Path(__file__).resolve().parents[1]
Row = tuple[str, str, str, str]


def kvlab_rows() -> list[Row]:
    """A complete, valid kvlab table (as text fields): every op at sizes 1, 8, 64, 512."""
    rows: list[Row] = []
    for op in ("linear", "other", "attn_prefill", "lm_head"):
        for n in (1, 8, 64, 512):
            ctx = n if op == "attn_prefill" else 0
            rows.append((op, str(n), str(ctx), str(0.1 + 1e-3 * n)))
    for s in (1, 8):
        for ctx in (s * 16, s * 256):
            rows.append(("attn_decode", str(s), str(ctx), str(0.01 + 1e-4 * ctx)))
    return rows


def write_kvlab(d: Path, rows: list[Row] | None = None, **meta: object) -> Path:
    """``d`` holding ``operator_profile.csv`` of ``rows`` (default :func:`kvlab_rows`) and a
    sidecar whose keys ``meta`` overrides (a value of ``...`` drops the key)."""
    d.mkdir(parents=True, exist_ok=True)
    lines = ["op,num_tokens,context_tokens,time_ms", *(",".join(r) for r in rows or kvlab_rows())]
    (d / "operator_profile.csv").write_text("\n".join(lines) + "\n")
    side = {"format": FORMAT, "model": "opt-13b", "gpu": "h200", "dtype": "float16", "tp": 1,
            "block_size": 16, "date": "2026-12-05", "attention": "triton", **meta}  # fmt: skip
    side = {k: v for k, v in side.items() if v is not ...}
    (d / "operator_profile.json").write_text(json.dumps(side))
    return d


def with_row(index: int, row: Row) -> list[Row]:
    """:func:`kvlab_rows` with row ``index`` (0-based; file line ``index + 2``) replaced."""
    rows = kvlab_rows()
    rows[index] = row
    return rows


def refused(path: Path, pattern: str, tp: int = 1) -> str:
    """The one-line message of the ProfileError reading ``path`` raises; it matches
    ``pattern``."""
    with pytest.raises(ProfileError, match=pattern) as e:
        read_profile(path, tp)
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("row", "pattern"),
    [
        (("linear", "nan", "0", "0.2"), r"row 3: num_tokens is 'nan' \(a whole number >= 1"),
        (("linear", "inf", "0", "0.2"), r"row 3: num_tokens is 'inf'"),
        (("linear", "-inf", "0", "0.2"), r"row 3: num_tokens is '-inf'"),
        (("linear", "2.5", "0", "0.2"), r"row 3: num_tokens is '2.5'"),
        (("linear", "x", "0", "0.2"), r"row 3: num_tokens is 'x'"),
        (("linear", "2", "nan", "0.2"), r"row 3: context_tokens is 'nan' \(a whole number >= 0"),
        (("linear", "2", "0.5", "0.2"), r"row 3: context_tokens is '0.5'"),
    ],
)
def test_kvlab_size_not_a_whole_finite_number_names_the_row(
    tmp_path: Path, row: Row, pattern: str
) -> None:
    """NaN slips past ``n < 1`` and an ordering test (both False for NaN) and would price
    steps at NaN; sizes are whole, finite numbers."""
    rows = with_row(1, row)
    refused(write_kvlab(tmp_path / "p", rows), r"operator_profile\.csv: " + pattern)


def test_kvlab_nan_context_in_a_decode_row_names_the_row(tmp_path: Path) -> None:
    rows = kvlab_rows()
    i = next(k for k, r in enumerate(rows) if r[0] == "attn_decode") + 1
    rows[i] = ("attn_decode", "1", "nan", "0.05")
    refused(write_kvlab(tmp_path / "p", rows), rf"row {i + 2}: context_tokens is 'nan'")


@pytest.mark.parametrize("time", ["nan", "inf", "-inf"])
def test_kvlab_non_finite_time_names_the_row(tmp_path: Path, time: str) -> None:
    refused(write_kvlab(tmp_path / "p", with_row(1, ("linear", "8", "0", time))),
            r"row 3: op linear has time .* ms \(a measured time is finite and > 0\)")  # fmt: skip


def test_kvlab_size_given_twice_is_refused_as_such(tmp_path: Path) -> None:
    """The rule: each (num_tokens, context_tokens) of an op once (no shipped kvlab table
    repeats one); a repeat is named, with the row it repeats."""
    rows = with_row(1, ("linear", "1", "0", "0.3"))
    refused(
        write_kvlab(tmp_path / "p", rows),
        r"row 3: op linear sizes not increasing: \(1.0, 0.0\) again \(row 2;",
    )


def test_row_numbers_are_file_lines_past_blank_lines(tmp_path: Path) -> None:
    d = write_kvlab(tmp_path / "p", with_row(1, ("linear", "nan", "0", "0.2")))
    csv = d / "operator_profile.csv"
    lines = csv.read_text().splitlines()
    csv.write_text("\n".join([lines[0], lines[1], "", lines[2], *lines[3:]]) + "\n")
    refused(d, r"row 4: num_tokens is 'nan'")


@pytest.mark.parametrize("text", ["", "op,num_tokens,context_tokens,time_ms\n"])
def test_empty_kvlab_table_is_refused(tmp_path: Path, text: str) -> None:
    d = write_kvlab(tmp_path / "p")
    (d / "operator_profile.csv").write_text(text)
    refused(d, r"operator_profile\.csv: no data rows")


def test_kvlab_table_not_text_is_refused(tmp_path: Path) -> None:
    d = write_kvlab(tmp_path / "p")
    (d / "operator_profile.csv").write_bytes(b"op,num_tokens\n\xff\xfe\x00\x81\n")
    refused(d, r"operator_profile\.csv: not a CSV text file")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tp", "x"), ("tp", 0), ("tp", -1), ("tp", 1.5), ("tp", True), ("tp", None),
        ("gpu", 5), ("gpu", ""), ("gpu", None), ("model", None), ("model", ["opt-13b"]),
        ("dtype", 16), ("attention", 3),
        ("block_size", 0), ("block_size", -16), ("block_size", 12), ("block_size", 16.0),
        ("block_size", "16"), ("block_size", True),
        ("ops", "linear"), ("ops", ["linear", "matmul"]),
    ],
)  # fmt: skip
def test_bad_sidecar_value_names_file_and_key(tmp_path: Path, key: str, value: object) -> None:
    """Each was taken before as some other value (``block_size`` 0 as the run's block size,
    ``tp`` 0 a division by zero later) or raised an error naming neither file nor key."""
    d = write_kvlab(tmp_path / "p", **{key: value})
    refused(d, rf"operator_profile\.json: key '{key}' is .*; expected ")


@pytest.mark.parametrize("key", ["model", "gpu", "tp"])
def test_sidecar_missing_a_required_key_names_it(tmp_path: Path, key: str) -> None:
    refused(
        write_kvlab(tmp_path / "p", **{key: ...}), rf"operator_profile\.json: missing key '{key}'"
    )


@pytest.mark.parametrize(("body", "pattern"), [
    (b"[1, 2]", "not a JSON object"),
    (b"\xff\xfe{", "cannot read the profile's sidecar"),
    (b'{"format": 1}', "format 1, expected"),
])  # fmt: skip
def test_sidecar_not_an_object_or_not_text_is_refused(
    tmp_path: Path, body: bytes, pattern: str
) -> None:
    d = write_kvlab(tmp_path / "p")
    (d / "operator_profile.json").write_bytes(body)
    refused(d, rf"operator_profile\.json: {pattern}")


@pytest.mark.parametrize("block_size", [None, ...])
def test_block_size_not_said_keeps_meaning_the_runs(tmp_path: Path, block_size: object) -> None:
    """A null or absent ``block_size`` is read as not known (None: the run's block size)."""
    assert read_profile(write_kvlab(tmp_path / "p", block_size=block_size)).block_size is None


def run_simulate(profile: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "experiments.simulate", "cost=profiled",
         f"cost.profile={profile}", "hardware=h200", "workload.num_requests=5", "index=null",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "meta", "pattern"),
    [
        (with_row(1, ("linear", "nan", "0", "0.2")), {},
         r"operator_profile\.csv: row 3: num_tokens is 'nan'"),
        (None, {"tp": "x"}, r"operator_profile\.json: key 'tp' is 'x'"),
        (None, {"block_size": 0}, r"operator_profile\.json: key 'block_size' is 0"),
    ],
)  # fmt: skip
def test_cli_reports_a_bad_table_in_one_line_and_exits_2(
    tmp_path: Path, rows: list[Row] | None, meta: dict[str, object], pattern: str
) -> None:
    """The defects of the audit, end to end: no run priced at NaN, no traceback."""
    done = run_simulate(write_kvlab(tmp_path / "p", rows, **meta), tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    assert re.search(pattern, lines[0]), lines[0]


VIDUR_SHAPE = {"n_head": "32", "n_kv_head": "32", "n_embd": "4096", "n_expanded_embd": "11008",
               "use_gated_mlp": "True"}  # fmt: skip


def vidur_rows(tokens: list[str]) -> list[dict[str, str]]:
    """Vidur rows at tp 1 for ``tokens`` (text), each operator 0.01 ms."""
    times = {f"time_stats.{o}.median": "0.01" for o in (*VIDUR_LINEAR, *VIDUR_OTHER)}
    return [
        {"num_tokens": n, "num_tensor_parallel_workers": "1", **times, **VIDUR_SHAPE}
        for n in tokens
    ]


def write_vidur(tmp_path: Path, rows: list[dict[str, str]]) -> Path:
    """``rows`` as ``a100/mlp_test.csv`` under ``tmp_path`` (Vidur's layout)."""
    p = tmp_path / "a100" / "mlp_test.csv"
    p.parent.mkdir(parents=True, exist_ok=True)
    header = list(vidur_rows(["1"])[0])
    lines = [",".join(header), *(",".join(r[k] for k in header) for r in rows)]
    p.write_text("\n".join(lines) + "\n")
    return p


def test_vidur_synthetic_table_loads(tmp_path: Path) -> None:
    prof = read_profile(write_vidur(tmp_path, vidur_rows(["1", "2", "4"])))
    assert prof.ops["linear"][0].tolist() == [1.0, 2.0, 4.0]


@pytest.mark.parametrize("value", ["nan", "inf", "2.5", "0", "x"])
def test_vidur_num_tokens_not_whole_names_the_row(tmp_path: Path, value: str) -> None:
    """NaN broke the sort (the table ended early), inf overflowed ``int``; both are
    refused at their row."""
    p = write_vidur(tmp_path, vidur_rows(["1", "2", value, "8", "16"]))
    refused(p, rf"mlp_test\.csv: row 4: num_tokens is '{value}'")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_vidur_non_finite_time_names_the_column(tmp_path: Path, value: str) -> None:
    rows = vidur_rows(["1", "2", "4"])
    rows[1]["time_stats.mlp_act.median"] = value
    refused(write_vidur(tmp_path, rows), r"row 3: time_stats\.mlp_act\.median is")


def test_vidur_repeated_token_count_is_averaged(tmp_path: Path) -> None:
    """Vidur's own tables repeat some token counts at one tp (8 in each shipped file), so
    there a repeat is kept as one point, the mean of its times."""
    rows = vidur_rows(["1", "2", "2", "4"])
    rows[2]["time_stats.add.median"] = "0.03"
    prof = read_profile(write_vidur(tmp_path, rows))
    n, _, t = prof.ops["other"]
    assert n.tolist() == [1.0, 2.0, 4.0]
    assert t[1] == pytest.approx((0.05 + 0.07) / 2 / 1e3)


@pytest.mark.parametrize(
    ("column", "value", "pattern"),
    [
        ("n_head", "0", r"n_head is '0'"),
        ("n_embd", "nan", r"n_embd is 'nan'"),
        ("n_embd", "4001", r"n_embd 4001 is not a multiple of n_head 32"),
        ("use_gated_mlp", "maybe", r"use_gated_mlp is 'maybe'"),
    ],
)
def test_vidur_bad_shape_column_names_the_row(
    tmp_path: Path, column: str, value: str, pattern: str
) -> None:
    rows = vidur_rows(["1", "2"])
    rows[0][column] = value
    refused(write_vidur(tmp_path, rows), rf"row 2: {pattern}")


@pytest.mark.parametrize("text", ["", "num_tokens,num_tensor_parallel_workers\n"])
def test_empty_vidur_table_is_refused(tmp_path: Path, text: str) -> None:
    p = tmp_path / "a100" / "mlp_test.csv"
    p.parent.mkdir()
    p.write_text(text)
    refused(p, r"mlp_test\.csv: no data rows")


@pytest.mark.parametrize("op", ["linear", "other", "attn_prefill", "lm_head"])
def test_kvlab_op_priced_along_tokens_at_one_count_is_refused(tmp_path: Path, op: str) -> None:
    """One token count gives no slope: every batch was priced as that count."""
    rows = [r for r in kvlab_rows() if r[0] != op or r[1] == "8"]
    line = next(i for i, r in enumerate(rows) if r[0] == op) + 2
    refused(write_kvlab(tmp_path, rows), rf"row {line}: op {op} has one token count \(8\)")


def test_kvlab_decode_attention_at_one_point_stays_accepted(tmp_path: Path) -> None:
    """Decode attention at one (sequences, context) point is priced in proportion to the
    context, as documented, so it is not refused."""
    rows = [r for r in kvlab_rows() if r[0] != "attn_decode"] + [("attn_decode", "1", "16", "0.02")]
    assert read_profile(write_kvlab(tmp_path, rows)).ops["attn_decode"][0].tolist() == [1.0]


def test_vidur_table_at_one_token_count_is_refused(tmp_path: Path) -> None:
    refused(write_vidur(tmp_path, vidur_rows(["4", "4"])), r"row 2: op linear has one token count")
