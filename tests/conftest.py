import logging
import os
from collections.abc import Iterator

import pytest

# Triton reads this at import time: run kernels under its CPU interpreter unless a run opts out.
os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run first, so that the workers of ``-n auto`` start on the
    long files together and share the short ones after (last, a long file would run alone
    at the end). The order within each part is kept."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _loggers_as_they_were() -> Iterator[None]:
    """A Hydra app run in this process configures logging with
    ``disable_existing_loggers`` and a root level of its own, which would silence every
    module's logger for the rest of the session (a later ``caplog`` test then reads
    nothing); each test ends with the loggers enabled and the root level restored."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)
    for logger in logging.Logger.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            logger.disabled = False
