import logging
import os
from collections.abc import Iterator

import pytest

# Triton reads this at import time: run kernels under its CPU interpreter unless a run opts out.
os.environ.setdefault("TRITON_INTERPRET", "1")


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
