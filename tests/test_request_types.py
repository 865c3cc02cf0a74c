"""A request's lengths and a sampling's counts are whole numbers: a float or a bool is
refused in one line naming the field, not a TypeError deep in a step."""

from __future__ import annotations

import numpy as np
import pytest

from core.request import Request, RequestError, SamplingParams


@pytest.mark.parametrize(
    ("prompt_len", "output_len", "field"),
    [
        (5.5, 3, "prompt_len"),
        (5.0, 3, "prompt_len"),
        (True, 3, "prompt_len"),
        (5, 3.7, "output_len"),
    ],
)
def test_a_length_that_is_not_a_whole_number_is_refused(
    prompt_len: object, output_len: object, field: str
) -> None:
    with pytest.raises(RequestError, match=rf"^request 7: {field} must be a whole number"):
        Request(7, 0.0, prompt_len, output_len)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"n": 2.5}, "n"), ({"beam_width": 2.0}, "beam_width")]
)
def test_a_count_that_is_not_a_whole_number_is_refused(kwargs: dict, field: str) -> None:
    with pytest.raises(RequestError, match=rf"^SamplingParams\.{field} must be a whole number"):
        SamplingParams(**kwargs)


def test_numpy_integers_are_whole_numbers() -> None:
    request = Request(0, 0.0, np.int64(5), np.int32(3), SamplingParams(n=np.int64(2)))
    assert request.total_len == 8 and request.sampling.num_seqs == 2
