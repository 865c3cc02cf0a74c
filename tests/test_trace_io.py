"""Trace files: native round trip, Azure/Mooncake/Vidur/ShareGPT/Alpaca readers, and errors
that name the file, the line and the problem."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.request import GREEDY_BELOW, Request, RequestError, SamplingParams
from core.workload.datasets_json import read_alpaca_json, read_sharegpt_json, whitespace_tokenize
from core.workload.spec import build_workload
from core.workload.trace_io import (
    NATIVE_COLUMNS,
    NATIVE_MAGIC,
    TraceFormatError,
    read_azure_trace,
    read_mooncake_trace,
    read_trace,
    read_vidur_trace,
    write_trace,
)

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


# ---------------------------------------------------------------- native format


@st.composite
def _sampling(draw: st.DrawFn) -> SamplingParams:
    width = draw(st.integers(1, 8))
    n = 1 if width > 1 else draw(st.integers(1, 8))
    seed = draw(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)))
    if width > 1:  # beam search takes no temperature, top-p or top-k
        return SamplingParams(beam_width=width, seed=seed)
    greedy_allowed = 0.0 if n == 1 else GREEDY_BELOW  # greedy n > 1 is refused
    return SamplingParams(
        n=n,
        temperature=draw(st.floats(greedy_allowed, 10.0)),
        top_p=draw(st.floats(1e-9, 1.0, exclude_min=False).filter(lambda x: x > 0)),
        top_k=draw(st.one_of(st.just(-1), st.integers(1, 1000))),
        seed=seed,
    )


@st.composite
def _request(draw: st.DrawFn, request_id: int) -> Request:
    prompt_len = draw(st.integers(1, 40))
    with_ids = draw(st.booleans())
    ids = (
        tuple(draw(st.lists(st.integers(0, 2**40), min_size=prompt_len, max_size=prompt_len)))
        if with_ids
        else None
    )
    return Request(
        request_id=request_id,
        arrival_time=draw(st.floats(0.0, 1e12, allow_nan=False, allow_infinity=False)),
        prompt_len=prompt_len,
        output_len=draw(st.integers(1, 10**6)),
        sampling=draw(_sampling()),
        prompt_token_ids=ids,
    )


@st.composite
def _requests(draw: st.DrawFn) -> list[Request]:
    ids = draw(st.lists(st.integers(0, 10**9), unique=True, max_size=12))
    return [draw(_request(i)) for i in ids]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(reqs=_requests())
def test_native_round_trip_is_exact(tmp_path: Path, reqs: list[Request]) -> None:
    path = tmp_path / "trace.csv"
    write_trace(path, reqs)
    back = read_trace(path)
    assert back == reqs
    for a, b in zip(reqs, back, strict=True):  # bit-exact floats, not just ==
        assert math.copysign(1, a.arrival_time) == math.copysign(1, b.arrival_time)
        assert a.arrival_time.hex() == b.arrival_time.hex()
        assert a.sampling.top_p.hex() == b.sampling.top_p.hex()


def test_native_file_layout(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_trace(path, [Request(3, 0.1, 2, 5, SamplingParams(seed=7), (4, 9))])
    lines = path.read_text().splitlines()
    assert lines[0] == "# kvlab-trace v1"
    assert lines[1].split(",") == list(NATIVE_COLUMNS)
    assert lines[2] == "3,0.1,2,5,1,1,0.0,1.0,-1,7,4 9"


def _native(tmp_path: Path, rows: list[str], header: str | None = None) -> Path:
    path = tmp_path / "bad.csv"
    head = header if header is not None else ",".join(NATIVE_COLUMNS)
    path.write_text("\n".join(["# kvlab-trace v1", head, *rows]) + "\n")
    return path


GOOD_ROW = "0,0.5,2,3,1,1,0.0,1.0,-1,,"


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("0,abc,2,3,1,1,0.0,1.0,-1,,", "arrival_time is not a number"),
        ("0,-1.0,2,3,1,1,0.0,1.0,-1,,", "arrival_time must be finite"),
        ("0,nan,2,3,1,1,0.0,1.0,-1,,", "arrival_time must be finite"),
        ("0,0.5,-2,3,1,1,0.0,1.0,-1,,", "prompt_len is negative"),
        ("0,0.5,2.5,3,1,1,0.0,1.0,-1,,", "prompt_len is not an integer"),
        ("0,0.5,0,3,1,1,0.0,1.0,-1,,", "prompt_len must be >= 1"),
        ("0,0.5,2,3,1,1,0.0,1.0,-1,,1 2 3", "3 prompt token ids"),
        ("0,0.5,2,3,2,2,0.0,1.0,-1,,", "not both"),
        # vLLM refuses them with beam search; kvlab ignored them
        ("0,0.5,2,3,1,4,0.8,1.0,-1,,", "beam search .*temperature must be 0"),
        ("0,0.5,2,3,1,4,0.0,0.9,-1,,", "top_p 1 and top_k -1, got 0.0, 0.9, -1"),
        ("0,0.5,2,3,1,4,0.0,1.0,5,,", "top_p 1 and top_k -1, got 0.0, 1.0, 5"),
        ("0,0.5,2,3,1,1,0.0,1.0,-1,x,", "seed is not an integer"),
        ("0,0.5,2,3,1,1", "expected 11 fields"),
    ],
)
def test_native_malformed_row_names_line_and_problem(
    tmp_path: Path, row: str, problem: str
) -> None:
    path = _native(tmp_path, [GOOD_ROW, row])
    with pytest.raises(TraceFormatError, match=problem) as info:
        read_trace(path)
    assert str(path) in str(info.value) and "line 4" in str(info.value)
    assert isinstance(info.value, RequestError)


def test_native_header_errors(tmp_path: Path) -> None:
    path = tmp_path / "nomagic.csv"
    path.write_text(",".join(NATIVE_COLUMNS) + "\n" + GOOD_ROW + "\n")
    with pytest.raises(TraceFormatError, match=r"line 1: first line must be"):
        read_trace(path)
    cols = ",".join(c for c in NATIVE_COLUMNS if c != "top_k")
    with pytest.raises(TraceFormatError, match=r"line 2: missing column\(s\) top_k"):
        read_trace(_native(tmp_path, [], header=cols))
    with pytest.raises(TraceFormatError, match="unknown column"):
        read_trace(_native(tmp_path, [], header=",".join([*NATIVE_COLUMNS, "color"])))
    with pytest.raises(TraceFormatError, match="no such file"):
        read_trace(tmp_path / "missing.csv")


# ---------------------------------------------------------------- Azure


def _azure(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "azure.csv"
    path.write_text(AZURE_HEADER + body)
    return path


def test_azure_small_file(tmp_path: Path) -> None:
    path = _azure(
        tmp_path,
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:47.0000000,2000,10\n"  # prompt too long; out of order
        "2023-11-16 18:15:51.0000000,10,2\n"  # output too short
        "\n"
        "2023-11-16 18:16:46.6805901,100,100\n",
    )
    reqs = read_azure_trace(path)
    assert [(r.request_id, r.prompt_len, r.output_len) for r in reqs] == [
        (0, 374, 44),
        (1, 396, 109),
        (2, 100, 100),
    ]
    assert reqs[0].arrival_time == 0.0
    assert reqs[1].arrival_time == pytest.approx(4.314579, abs=1e-9)
    assert reqs[2].arrival_time == pytest.approx(60.0000001, abs=1e-9)
    halved = read_azure_trace(path, time_scale=0.5, limit=2)
    assert [r.arrival_time for r in halved] == [0.0, reqs[1].arrival_time * 0.5]
    unfiltered = read_azure_trace(path, apply_filter=False)
    assert [r.prompt_len for r in unfiltered] == [374, 2000, 396, 10, 100]
    assert unfiltered[1].arrival_time == pytest.approx(0.31941, abs=1e-9)
    assert len(read_azure_trace(path, max_model_len=400)) == 1


def test_a_header_without_the_columns_is_quoted_in_the_error(tmp_path: Path) -> None:
    """A semicolon-separated file is one line that shows the header it found (it said only
    which columns were missing, as if they were absent)."""
    path = tmp_path / "vidur.csv"
    path.write_text("arrived_at;num_prefill_tokens;num_decode_tokens\n0;10;5\n")
    with pytest.raises(TraceFormatError) as info:
        read_vidur_trace(path)
    line = str(info.value)
    assert "line 1: missing column(s) arrived_at, num_prefill_tokens, num_decode_tokens" in line
    assert "'arrived_at;num_prefill_tokens;num_decode_tokens'" in line and "\n" not in line
    path.write_text("x" * 200 + "\n1\n")
    with pytest.raises(TraceFormatError, match=r"reads 'x{77}\.\.\.'"):
        read_vidur_trace(path)


def test_azure_counts_written_as_integral_floats_are_read(tmp_path: Path) -> None:
    """``12.0`` (pandas writes a column with a missing value so) is 12, as in the Vidur and
    Mooncake readers; the Azure reader had refused it."""
    path = _azure(tmp_path, "2023-11-16 18:15:46.1,374.0,44\n2023-11-16 18:15:47.1,12,7.0\n")
    reqs = read_azure_trace(path, apply_filter=False)
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(374, 44), (12, 7)]


@pytest.mark.parametrize(
    ("body", "line", "problem"),
    [
        ("2023-11-16 18:15:46.1,374,44\n2023-11-16 18:15:47.1,abc,44\n", 3, "ContextTokens is not"),
        ("2023-11-16 18:15:46.1,374,-4\n", 2, "GeneratedTokens is negative"),
        ("2023-11-16 18:15:46.1,374,44\nyesterday,1,1\n", 3, "unparsable TIMESTAMP"),
        ("2023-11-16 18:15:46.1x,374,44\n", 2, "unparsable TIMESTAMP"),
        ("2023-11-16 18:15:46.1,374\n", 2, "expected 3 fields"),
        ("2023-11-16 18:15:46.1,374.5,44\n", 2, "ContextTokens is not an integer"),
    ],
)
def test_azure_malformed(tmp_path: Path, body: str, line: int, problem: str) -> None:
    path = _azure(tmp_path, body)
    with pytest.raises(TraceFormatError, match=problem) as info:
        read_azure_trace(path)
    assert f"line {line}" in str(info.value) and str(path) in str(info.value)


def test_azure_missing_column_and_empty_request(tmp_path: Path) -> None:
    path = tmp_path / "cols.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.1,374\n")
    with pytest.raises(TraceFormatError, match=r"line 1: missing column\(s\) GeneratedTokens"):
        read_azure_trace(path)
    path = _azure(tmp_path, "2023-11-16 18:15:46.1,374,44\n2023-11-16 18:15:46.2,0,44\n")
    assert len(read_azure_trace(path)) == 1
    with pytest.raises(TraceFormatError, match="line 3"):
        read_azure_trace(path, apply_filter=False)
    with pytest.raises(RequestError, match="time_scale"):
        read_azure_trace(path, time_scale=0.0)


@pytest.mark.traces
@pytest.mark.parametrize("name", ["conv", "code"])
def test_azure_real_traces(name: str) -> None:
    path = TRACES / f"AzureLLMInferenceTrace_{name}.csv"
    if not path.exists():
        pytest.skip(f"Azure trace not found under {TRACES.name}/")
    rows = sum(1 for _ in path.open()) - 1
    raw = read_azure_trace(path, apply_filter=False)
    assert len(raw) == rows
    reqs = read_azure_trace(path)
    assert 0 < len(reqs) < rows
    times = [r.arrival_time for r in reqs]
    assert times == sorted(times)
    assert raw[0].arrival_time == 0.0
    assert all(4 <= r.prompt_len <= 1024 and r.total_len <= 2048 for r in reqs)
    assert [r.request_id for r in reqs] == list(range(len(reqs)))
    # The sample spans about an hour of 2023-11-16.
    assert 600 < raw[-1].arrival_time < 2 * 3600
    assert len(read_azure_trace(path, limit=100)) == 100


# ---------------------------------------------------------------- Mooncake and Vidur


def test_mooncake(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    rows = [
        {"timestamp": 1000, "input_length": 50, "output_length": 20, "hash_ids": [1]},
        {"timestamp": 0, "input_length": 30, "output_length": 10},
        {"timestamp": 2500, "input_length": 30, "output_length": 3000},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    reqs = read_mooncake_trace(path)
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in reqs] == [
        (0.0, 30, 10),
        (1.0, 50, 20),
    ]
    assert len(read_mooncake_trace(path, max_model_len=8192)) == 3


@pytest.mark.parametrize(
    ("line2", "problem"),
    [
        ('{"timestamp": 5, "input_length": 3}', r"missing key\(s\) output_length"),
        ('{"timestamp": "x", "input_length": 3, "output_length": 4}', "timestamp is not a number"),
        ('{"timestamp": 5, "input_length": -3, "output_length": 4}', "input_length is negative"),
        ('{"timestamp": 5, "input_length": 3.5, "output_length": 4}', "input_length is not an int"),
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_mooncake_malformed(tmp_path: Path, line2: str, problem: str) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 30, "output_length": 10}\n' + line2 + "\n")
    with pytest.raises(TraceFormatError, match=problem) as info:
        read_mooncake_trace(path)
    assert "line 2" in str(info.value)


def _mooncake_rows(path: Path) -> None:
    """Mooncake's own example shape: blocks of 512 tokens, block 0 shared by all three."""
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 10, "input_length": 1030, "output_length": 5, "hash_ids": [0, 1, 3]},
        {"timestamp": 20, "input_length": 600, "output_length": 5, "hash_ids": [0, 4]},
        {"timestamp": 30, "input_length": 40, "output_length": 5},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_mooncake_hash_ids_become_shared_prompt_ids(tmp_path: Path) -> None:
    """Equal hash ids give equal token blocks, different ones different ids, so the prefix
    cache sees the trace's shared prefixes; a row without hash_ids keeps no ids."""
    path = tmp_path / "m.jsonl"
    _mooncake_rows(path)
    a, b, c, d = read_mooncake_trace(path, apply_filter=False, vocab_size=1000)
    assert a.prompt_token_ids is not None and b.prompt_token_ids is not None
    assert c.prompt_token_ids is not None and d.prompt_token_ids is None
    assert len(a.prompt_token_ids) == 1100 and all(0 <= t < 1000 for t in a.prompt_token_ids)
    assert a.prompt_token_ids[:1024] == b.prompt_token_ids[:1024]
    assert a.prompt_token_ids[1024:1030] != b.prompt_token_ids[1024:1030]
    assert a.prompt_token_ids[:512] == c.prompt_token_ids[:512]
    assert a.prompt_token_ids[512:528] != c.prompt_token_ids[512:528]
    assert read_mooncake_trace(path, apply_filter=False)[0].prompt_token_ids is None


def test_mooncake_workload_carries_hash_ids_in_its_window(tmp_path: Path) -> None:
    """The workload group reads hash_ids (ids made after the window is cut, in the model's
    vocabulary), with another block size through hash_block_tokens."""
    path = tmp_path / "m.jsonl"
    _mooncake_rows(path)
    cfg = {"kind": "mooncake", "path": str(path), "apply_filter": False, "vocab_size": 500}
    got = build_workload({**cfg, "duration_s": 0.015}, max_model_len=8192)
    assert [r.request_id for r in got] == [0, 1]
    assert got[0].prompt_token_ids is not None and got[1].prompt_token_ids is not None
    assert got[0].prompt_token_ids[:1024] == got[1].prompt_token_ids[:1024]
    assert max(got[0].prompt_token_ids) < 500
    with pytest.raises(TraceFormatError, match=r"line 1: hash_ids holds 3 block.*of 256 tokens"):
        build_workload({**cfg, "hash_block_tokens": 256}, max_model_len=8192)


@pytest.mark.parametrize(
    ("hash_ids", "problem"),
    [("[0]", "holds 1 block"), ('[0, "a"]', "not a list of whole numbers"),
     ("[0, -1]", "not a list of whole numbers"), ("7", "not a list of whole numbers")],
)  # fmt: skip
def test_mooncake_bad_hash_ids(tmp_path: Path, hash_ids: str, problem: str) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 30, "output_length": 10}\n'
        f'{{"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": {hash_ids}}}\n'
    )
    with pytest.raises(TraceFormatError, match=f"line 2: hash_ids (is )?{problem}"):
        read_mooncake_trace(path, max_model_len=8192)


def test_vidur(tmp_path: Path) -> None:
    path = tmp_path / "v.csv"
    path.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens\n"
        "10.25,100.0,50,150\n"
        "10.0,20,30,50\n"
    )
    reqs = read_vidur_trace(path)
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in reqs] == [
        (0.0, 20, 30),
        (0.25, 100, 50),
    ]
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n1.0,20,30\n2.0,20.5,3\n")
    with pytest.raises(TraceFormatError, match="line 3: num_prefill_tokens is not an integer"):
        read_vidur_trace(path)
    path.write_text("arrived_at,num_prefill_tokens\n1.0,20\n")
    with pytest.raises(TraceFormatError, match="num_decode_tokens"):
        read_vidur_trace(path)


# ---------------------------------------------------------------- ShareGPT and Alpaca JSON


def _words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def test_sharegpt_json(tmp_path: Path) -> None:
    path = tmp_path / "sg.json"
    data = [
        {"id": "a", "conversations": [{"from": "human", "value": _words(10)},
                                      {"from": "gpt", "value": _words(20)},
                                      {"from": "human", "value": _words(99)}]},
        {"id": "b", "conversations": [{"from": "human", "value": _words(10)}]},
        {"id": "c", "conversations": [{"from": "human", "value": _words(2)},
                                      {"from": "gpt", "value": _words(20)}]},
        {"id": "d", "conversations": [{"from": "human", "value": _words(7)},
                                      {"from": "gpt", "value": _words(5)}]},
    ]  # fmt: skip
    path.write_text(json.dumps(data))
    reqs = read_sharegpt_json(path, with_token_ids=True)
    assert [(r.request_id, r.prompt_len, r.output_len) for r in reqs] == [(0, 10, 20), (1, 7, 5)]
    assert reqs[0].prompt_token_ids == tuple(whitespace_tokenize(_words(10)))
    assert all(r.arrival_time == 0.0 for r in reqs)
    chars = read_sharegpt_json(path, tokenize=lambda s: [ord(c) for c in s], limit=1)
    assert [(r.prompt_len, r.output_len) for r in chars] == [(29, 69)]
    assert chars[0].prompt_token_ids is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            json.dumps([{"conversations": []}, {"turns": []}]),
            "entry 1: expected an object with 'conversations'",
        ),
        (
            json.dumps([{"conversations": [{"value": "a b"}, {"value": 3}]}]),
            "entry 0: 'value' must be a string",
        ),
        ('[{"conversations": []},\n  oops]', "line 2: invalid JSON"),
        ('{"conversations": []}', "expected a JSON list"),
    ],
)
def test_sharegpt_json_malformed(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "sg.json"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=message):
        read_sharegpt_json(path)


def test_alpaca_json(tmp_path: Path) -> None:
    path = tmp_path / "alpaca.json"
    data = [
        {"instruction": _words(5), "input": "", "output": _words(8)},
        {"instruction": _words(5), "input": _words(3), "output": _words(4)},
        {"instruction": _words(5), "input": "", "output": "ok"},
    ]
    path.write_text(json.dumps(data))
    reqs = read_alpaca_json(path)
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(5, 8), (8, 4)]
    with pytest.raises(TraceFormatError, match="entry 2: empty prompt or completion"):
        read_alpaca_json(
            tmp_path / "alpaca.json",
            apply_filter=False,
            tokenize=lambda s: [] if s == "ok" else [1],
        )
    path.write_text(json.dumps([{"instruction": "x", "output": 5}]))
    with pytest.raises(TraceFormatError, match="entry 0: 'output' must be a string"):
        read_alpaca_json(path)


def test_whitespace_tokenize_is_stable_and_in_vocab() -> None:
    ids = whitespace_tokenize("the cat  sat\non the mat", vocab_size=100)
    assert len(ids) == 6 and ids[0] == ids[4]
    assert all(0 <= i < 100 for i in ids)


_TWO_ROWS = AZURE_HEADER + '2023-11-16 18:15:46.1,"374",44\n'


@pytest.mark.parametrize(
    ("reader", "text", "line"),
    [
        # the open quote's own line is named (the next one had been, as a field count)
        (read_azure_trace, AZURE_HEADER + '2023-11-16 18:15:46.1,"37\n4",44\n', 2),
        (read_azure_trace, _TWO_ROWS + '2023-11-16 18:15:47.1,12,"7\n"\n', 3),
        (read_azure_trace, '"TIME\nSTAMP",ContextTokens,GeneratedTokens\n', 1),  # the header
        (read_vidur_trace, 'arrived_at,num_prefill_tokens,num_decode_tokens,"a\nnote"\n', 1),
        (read_vidur_trace, 'arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,"3\n"\n', 2),
        (read_trace, f'{NATIVE_MAGIC}\n{",".join(NATIVE_COLUMNS[:-1])},"prompt\n_token_ids"\n', 2),
    ],
)
def test_a_quoted_line_break_is_refused_on_its_line(
    tmp_path: Path, reader: Any, text: str, line: int
) -> None:
    """The readers read a CSV line by line: a line break inside quotes is one line naming
    the file, the line where the quote opened and why, not a field count off by one."""
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(TraceFormatError) as info:
        reader(path)
    assert str(info.value) == (
        f"{path}, line {line}: a quoted field is not closed on this line: quoted line breaks "
        "are not read; put each row on one line"
    )


def test_a_quoted_field_on_one_line_is_read(tmp_path: Path) -> None:
    path = _azure(tmp_path, '"2023-11-16 18:15:46.1","374",44\n')
    assert [(r.prompt_len, r.output_len) for r in read_azure_trace(path)] == [(374, 44)]


def test_a_native_row_of_a_long_prompts_token_ids_reads_back(tmp_path: Path) -> None:
    """A prompt of 30,000 token ids writes a field longer than the csv module's default
    limit (131,072 characters): it reads back, whole, as write_trace wrote it (it raised
    the csv module's 'field larger than field limit', a traceback)."""
    ids = tuple(range(10_000, 40_000))
    reqs = [Request(0, 0.0, len(ids), 5, SamplingParams(), ids)]
    path = tmp_path / "long.csv"
    write_trace(path, reqs)
    assert path.stat().st_size > 131_072
    assert read_trace(path) == reqs
