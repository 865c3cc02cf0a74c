"""Readers for the ShareGPT and Alpaca JSON datasets (lengths only; no timestamps).

The datasets have no arrival times: every request arrives at 0 (``build_workload`` gives
them arrival times). Lengths come from a tokenizer; the default splits on whitespace, an
approximation that undercounts real tokens. Errors name the entry index (JSON has no line
per record). Otherwise the policy of :mod:`core.workload.trace_io` applies (filter, limit,
ids in order).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable

from core.request import Request, SamplingParams
from core.workload.filters import MAX_MODEL_LEN, MAX_PROMPT_LEN
from core.workload.trace_io import PathLike, TraceFormatError, _to_requests, read_text_lines

Tokenizer = Callable[[str], list[int]]


def whitespace_tokenize(text: str, vocab_size: int = 50272) -> list[int]:
    """APPROXIMATION of a tokenizer: one token per whitespace-separated word.

    Ids are ``crc32(word) % vocab_size`` (stable across runs). Real BPE tokenizers give
    more tokens than words (roughly 1.3 per English word), so lengths come out shorter than
    the paper's; pass a real tokenizer's ``encode`` for faithful lengths.
    """
    return [zlib.crc32(w.encode("utf-8")) % vocab_size for w in text.split()]


def _load_json_list(path: PathLike) -> list[object]:
    try:
        data = json.loads("\n".join(read_text_lines(path)))
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, exc.lineno, f"invalid JSON: {exc.msg}") from None
    if not isinstance(data, list):
        raise TraceFormatError(path, 1, "expected a JSON list of entries")
    return data


def _dataset_requests(
    path: PathLike,
    pairs: list[tuple[int, str, str]],
    tokenize: Tokenizer | None,
    max_model_len: int,
    max_prompt_len: int,
    limit: int | None,
    apply_filter: bool,
    with_token_ids: bool,
    sampling: SamplingParams | None,
) -> list[Request]:
    """(entry index, prompt text, completion text) → requests at t = 0, in file order."""
    tok = tokenize if tokenize is not None else whitespace_tokenize
    rows: list[tuple[int, float, int, int]] = []
    ids: list[tuple[int, ...] | None] = []
    for entry, prompt, completion in pairs:
        p_ids = list(tok(prompt))
        o_len = len(tok(completion))
        if not apply_filter and (not p_ids or o_len == 0):
            raise TraceFormatError(
                path, f"entry {entry}", "empty prompt or completion cannot make a request"
            )
        rows.append((entry, 0.0, len(p_ids), o_len))
        ids.append(tuple(int(t) for t in p_ids) if with_token_ids else None)
    return _to_requests(
        path,
        rows,
        1.0,
        max_model_len,
        max_prompt_len,
        limit,
        apply_filter,
        sampling,
        ids,
        dataset=True,
    )


def _text(path: PathLike, entry: int, obj: dict[str, object], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise TraceFormatError(path, f"entry {entry}", f"{key!r} must be a string")
    return value


def read_sharegpt_json(
    path: PathLike,
    tokenize: Tokenizer | None = None,
    max_model_len: int = MAX_MODEL_LEN,
    limit: int | None = None,
    apply_filter: bool = True,
    with_token_ids: bool = False,
    max_prompt_len: int = MAX_PROMPT_LEN,
    sampling: SamplingParams | None = None,
) -> list[Request]:
    """ShareGPT JSON: ``[{"conversations": [{"from": ..., "value": text}, ...]}, ...]``.

    As in vLLM's benchmark, the first turn is the prompt and the second the completion;
    entries with fewer than two turns are skipped. All arrivals are t = 0 (the dataset has
    no timestamps); ``tokenize`` defaults to :func:`whitespace_tokenize` (an approximation).
    """
    pairs: list[tuple[int, str, str]] = []
    for i, obj in enumerate(_load_json_list(path)):
        if not isinstance(obj, dict) or not isinstance(obj.get("conversations"), list):
            raise TraceFormatError(path, f"entry {i}", "expected an object with 'conversations'")
        turns = obj["conversations"]
        if len(turns) < 2:
            continue
        if not all(isinstance(t, dict) for t in turns[:2]):
            raise TraceFormatError(path, f"entry {i}", "conversation turns must be objects")
        pairs.append((i, _text(path, i, turns[0], "value"), _text(path, i, turns[1], "value")))
    return _dataset_requests(
        path,
        pairs,
        tokenize,
        max_model_len,
        max_prompt_len,
        limit,
        apply_filter,
        with_token_ids,
        sampling,
    )


def read_alpaca_json(
    path: PathLike,
    tokenize: Tokenizer | None = None,
    max_model_len: int = MAX_MODEL_LEN,
    limit: int | None = None,
    apply_filter: bool = True,
    with_token_ids: bool = False,
    max_prompt_len: int = MAX_PROMPT_LEN,
    sampling: SamplingParams | None = None,
) -> list[Request]:
    """Alpaca JSON: ``[{"instruction": ..., "input": ..., "output": ...}, ...]``.

    Prompt = instruction, plus a newline and the input when the input is non-empty (a
    choice; the paper does not give its template). Completion = output. Arrivals t = 0.
    """
    pairs: list[tuple[int, str, str]] = []
    for i, obj in enumerate(_load_json_list(path)):
        if not isinstance(obj, dict):
            raise TraceFormatError(path, f"entry {i}", "expected a JSON object")
        instruction = _text(path, i, obj, "instruction")
        extra = obj.get("input", "")
        if not isinstance(extra, str):
            raise TraceFormatError(path, f"entry {i}", "'input' must be a string")
        prompt = f"{instruction}\n{extra}" if extra else instruction
        pairs.append((i, prompt, _text(path, i, obj, "output")))
    return _dataset_requests(
        path,
        pairs,
        tokenize,
        max_model_len,
        max_prompt_len,
        limit,
        apply_filter,
        with_token_ids,
        sampling,
    )
