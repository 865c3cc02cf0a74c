"""The paged manager hashes each block from ``_block_tokens``, which cuts the blocks'
tuples straight from the prompt ids, one shared stand-in tuple or the outputs: they must be
the tuples of ``_token_slice`` (the ids a block hash reads) cut into blocks, for prompts
with and without ids, any block size and any range of blocks, the block a prompt ends in
(its first outputs too) included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.kv.paged import PagedKVCacheManager
from tests.kv_helpers import make_group


@settings(max_examples=200, deadline=None)
@given(
    block_size=st.integers(1, 5),
    prompt_len=st.integers(1, 30),
    num_outputs=st.integers(0, 20),
    with_ids=st.booleans(),
    data=st.data(),
)
def test_block_tokens_are_the_token_slice_cut_into_blocks(
    block_size: int, prompt_len: int, num_outputs: int, with_ids: bool, data: st.DataObject
) -> None:
    prompt = tuple(range(100, 100 + prompt_len)) if with_ids else None
    group = make_group(prompt_len, output_len=num_outputs + 1, prompt=prompt)
    seq = group.seqs[0]
    seq.output_token_ids = [-1000 - i for i in range(num_outputs)]
    seq.num_generated = num_outputs
    m = PagedKVCacheManager(4, block_size, enable_prefix_caching=True)
    known = (prompt_len + num_outputs) // block_size
    first = data.draw(st.integers(0, known))
    upto = data.draw(st.integers(first, known))
    tokens = m._token_slice(seq, first * block_size, upto * block_size)
    expected = [tuple(tokens[j * block_size : (j + 1) * block_size]) for j in range(upto - first)]
    assert list(m._block_tokens(seq, first, upto)) == expected
