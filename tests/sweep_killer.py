"""A Hydra callback for tests: SIGKILLs the job's own process when its ``seed`` is
``KVLAB_TEST_DIE_AT_SEED``, as the OOM killer would a sweep worker."""

from __future__ import annotations

import os
import signal
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class DieAtSeed(Callback):
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if str(config.get("seed")) == os.environ.get("KVLAB_TEST_DIE_AT_SEED"):
            os.kill(os.getpid(), signal.SIGKILL)
