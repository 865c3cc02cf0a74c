"""The report's tables as text: a table the report prints is built once, as a frame of
text cells (``fig12_rates.panel_table``, ``fig14_sampling.ratio_table``,
``fig16_prefix.ratio_table``), which the report renders here and a notebook shows as is,
so the two say the same."""

from __future__ import annotations

import pandas as pd


def markdown_rows(table: pd.DataFrame) -> list[str]:
    """``table`` as the lines of a markdown table: its index first (the index's name heads
    it), then its columns, every cell as ``str`` gives it."""
    head = [str(table.index.name), *map(str, table.columns)]
    body = [[str(i), *map(str, row)] for i, row in zip(table.index, table.values, strict=True)]
    line = [f"| {' | '.join(cells)} |" for cells in (head, *body)]
    return [line[0], "|" + "---|" * len(head), *line[1:]]
