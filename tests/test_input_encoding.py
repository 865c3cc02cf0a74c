"""An input file that is not UTF-8 text is refused by a message naming the file, not by a
UnicodeDecodeError (a traceback from the command line, or a message that names no file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.mapping_file import read_mapping
from core.workload.trace_io import TraceFormatError
from core.workload.vllm_log import LoggedRequest, read_token_ids, read_vllm_log

ROW = {"request_id": "r0", "input_toks": 3, "output_toks": 2, "queued_ts": 1.0,
       "first_token_ts": 1.5, "last_token_ts": 2.0}  # fmt: skip


def test_a_vllm_log_that_is_not_utf8_names_the_file_and_line(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    log.write_bytes(json.dumps(ROW).encode() + b"\n\xff\n")
    with pytest.raises(TraceFormatError, match=r"requests\.jsonl, line 2: not UTF-8 text"):
        read_vllm_log(tmp_path)


def test_a_token_id_file_that_is_not_utf8_names_the_file_and_line(tmp_path: Path) -> None:
    ids = tmp_path / "workload.jsonl"
    ids.write_bytes(b'{"input_tok_ids": [1, 2, 3]}\n\xfe\n')
    logged = [LoggedRequest(0, 3, 2, 0.0, 0.0, 0.5, 1.0, 0)]
    with pytest.raises(TraceFormatError, match=r"workload\.jsonl, line 2: not UTF-8 text"):
        read_token_ids(ids, logged)


def test_a_mapping_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    meta = tmp_path / "meta.json"
    meta.write_bytes(b'{"model": "x"}\xff')
    with pytest.raises(ValueError, match=r"meta\.json: not JSON \(not UTF-8 text"):
        read_mapping(meta, json.loads, json.JSONDecodeError, "JSON", "a JSON object")
    meta.write_bytes(b'\xef\xbb\xbf{"model": "x"}')  # a byte-order mark, as the trace readers
    assert read_mapping(meta, json.loads, json.JSONDecodeError, "JSON", "a JSON object") == {
        "model": "x"
    }


@pytest.mark.parametrize("text", ["", "  \n\n"])
def test_an_empty_mapping_file_is_called_empty(tmp_path: Path, text: str) -> None:
    meta = tmp_path / "meta.json"
    meta.write_text(text)
    with pytest.raises(ValueError) as info:
        read_mapping(meta, json.loads, json.JSONDecodeError, "JSON", "a JSON object")
    assert str(info.value) == f"{meta}: empty (expected a JSON object)"


def test_a_bad_byte_after_a_byte_order_mark_names_its_line(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + json.dumps(ROW).encode() + b"\n" + b"{}\n" * 3 + b"\xff\n")
    with pytest.raises(TraceFormatError, match=r"requests\.jsonl, line 5: not UTF-8 text"):
        read_vllm_log(tmp_path)


def test_a_gzipped_trace_says_it_is_compressed(tmp_path: Path) -> None:
    """A trace left gzip-compressed is named as such, not as text that is not UTF-8."""
    import gzip

    from core.workload.trace_io import read_vidur_trace

    path = tmp_path / "trace.csv.gz"
    path.write_bytes(gzip.compress(b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,8,8\n"))
    with pytest.raises(TraceFormatError, match=r"trace\.csv\.gz, file: gzip-compressed"):
        read_vidur_trace(path)


def test_a_gzipped_bench_result_says_it_is_compressed(tmp_path: Path) -> None:
    """A ``vllm bench serve`` result left compressed is named so (it was 'not a readable
    JSON file' with a codec error)."""
    import gzip

    from core.workload.vllm_bench import read_bench_result

    path = tmp_path / "bench.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"input_lens": [4], "output_lens": [4]}).encode()))
    with pytest.raises(TraceFormatError, match=r"bench\.json\.gz, file: gzip-compressed"):
        read_bench_result(path)
