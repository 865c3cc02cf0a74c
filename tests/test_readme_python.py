"""The README's Python blocks run as written (so the API they show stays true)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


def test_the_readme_shows_python_blocks() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_python_block_runs(index: int) -> None:
    if "from engine" in BLOCKS[index]:
        pytest.importorskip("torch")
    namespace: dict[str, object] = {}
    exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), namespace)
    if "result" in namespace:  # the engine block: every request came back with its tokens
        outputs = namespace["result"].outputs  # type: ignore[attr-defined]
        assert len(outputs) == 4 and all(len(o.token_ids[0]) == 16 for o in outputs.values())
    if "metrics" in namespace:  # the simulator block: a finished run's summary
        assert namespace["metrics"]["completed"] > 0  # type: ignore[index]
