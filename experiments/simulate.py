"""``python -m experiments.simulate``: one simulated serving run (or a sweep with ``-m``).

Examples::

    python -m experiments.simulate system=orca_max workload.rate=1.5
    python -m experiments.simulate -m system=vllm,orca_oracle workload.rate=0.5,1,1.5,2

Each run writes ``config.yaml``, ``requests.csv``, ``steps.csv``, ``cost_model.json`` and
``metrics.json`` into its Hydra output directory, prints the results table and appends a
row to ``outputs/index.csv``; a sweep also writes ``summary.csv``. A bad config is one line
on stderr (``experiments.lib.checks``). A job whose directory already holds a complete run
of the same config is not run again (rerun a sweep with the same ``hydra.sweep.dir`` to
resume it). ``hydra/launcher=<name>`` runs a sweep's jobs on joblib, Ray or Slurm
(``experiments.lib.jobs``). ``run(cfg)`` is the plain function tests and notebooks call;
``simulate_requests(requests, overrides)`` simulates a list of one's own requests.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
from omegaconf import DictConfig

from core.metrics.summary import summarize_recorder
from core.request import Request
from core.workload.spec import arrivals_note
from experiments.lib.checks import CONFIG_DIR, ConfigError, check_config, plugin_failure
from experiments.lib.cli import (
    main_with_checks,
    run_app,
    settle_run_config,
    system_label,
    task_overrides,
)
from experiments.lib.jobs import exit_if_launcher_missing
from experiments.lib.results import (
    RowTable,
    finished_metrics,
    summary_line,
    swap_fallbacks,
    write_run,
)
from experiments.lib.setup import (
    as_dict,
    block_size,
    build_setup,
    is_contiguous,
    resolve_aliases,
)
from sim.driver import SimulationError, StepPriceError, no_cyclic_gc, simulate

log = logging.getLogger(__name__)

# what progress=null means: a bar when the command line's run writes to a terminal (main
# sets it); none for the runs of reproduce, capacity and other batch commands
_PROGRESS_WHEN_UNSET = False


def run(cfg: DictConfig | Mapping[str, Any], out_dir: Path | str | None = None) -> dict[str, Any]:
    """Simulate the configured run; write result files when ``out_dir`` (a path or a string)
    is given. Returns the metrics dict (plus ``wall_s`` and the KV capacity used). A config
    that cannot run raises ``ConfigError`` before any simulation."""
    c = resolve_aliases(as_dict(cfg))
    check_config(c, "simulate")
    with no_cyclic_gc():  # the run's objects live until its files are written
        return _run(c, None if out_dir is None else Path(out_dir))


@dataclass
class RequestsRun:
    """:func:`simulate_requests`' result: the run's metrics (as ``metrics.json``'s), its
    requests and steps tables (as ``requests.csv`` and ``steps.csv``)."""

    metrics: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame


def simulate_requests(requests: Sequence[Request], overrides: Sequence[str] = ()) -> RequestsRun:
    """Simulate a list of one's own ``requests`` on the model, GPU, system and clock the
    ``overrides`` name (``simulate``'s, less the workload group: the requests are the
    workload, and an override that names it raises ConfigError rather than do nothing).
    Prefix caching, where the system enables it, is on; a request without prompt token ids
    stands for a prompt of its own and finds only its own blocks again, as for a workload's
    requests (:func:`experiments.lib.setup.prefix_caching_for`). A config that cannot run
    raises ConfigError before any step."""
    from experiments.reproduce import compose_config

    if isinstance(overrides, str):  # its characters would be read as overrides, one by one
        raise TypeError(f"overrides must be a list of strings, got the string {overrides!r}")
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key.split(".", 1)[0] == "workload":
            raise ConfigError(
                key, "simulate_requests replays the requests given, so a workload override "
                "would change nothing", override, "the requests' own arrivals and lengths",
            )  # fmt: skip
    own = list(requests)  # read once: an iterator would reach the run empty
    if not own:
        raise ValueError("requests: none given (a run of no requests has no metrics)")
    wrong = next((i for i, r in enumerate(own) if not isinstance(r, Request)), None)
    if wrong is not None:
        raise TypeError(f"requests[{wrong}] is a {type(own[wrong]).__name__}, not a "
                        "core.request.Request")  # fmt: skip
    c = resolve_aliases(as_dict(compose_config(list(overrides))))
    check_config(c, "simulate")
    setup = build_setup(c, requests=own)
    result = _simulate(c, setup, own)
    rec = result.recorder
    frame = rec.requests_frame()
    metrics = summarize_recorder(rec, c.get("slo_ms"))
    metrics.update(
        **setting_metrics(c, setup),
        unfinished_at_last_arrival=unfinished_at_last_arrival(frame),
        num_swap_fallbacks=swap_fallbacks(result.swap_fallbacks, metrics["num_preemptions"]),
    )
    return RequestsRun(metrics, frame, rec.steps_frame())


def _run(c: dict[str, Any], out_dir: Path | None) -> dict[str, Any]:
    setup = build_setup(c)
    bs = block_size(c["system"])
    log.info("system: %s", setup.batch_limits.describe())
    log.info("%s", setup.capacity.describe(bs, contiguous=is_contiguous(c["system"])))
    if _cost_doc(setup.cost_model).get("stack") == "none":
        log.info(
            "cost: %s with cost.stack=none prices the GPU operators alone, a lower bound: no "
            "framework overhead, no per-block cost in paged attention (block size changes "
            "memory only), no per-copy latency; cost.stack=vllm-2023 (the paper-era eager "
            "stack) or vllm-v1 (CUDA graphs, async scheduling) adds them",
            c["cost"].get("kind", "the cost model"),
        )
    note = profile_transfer_note(setup.cost_model)
    if note is not None:
        log.info("%s", note)
    t0 = time.perf_counter()
    result = _simulate(c, setup, setup.requests)
    wall = time.perf_counter() - t0
    if out_dir is not None:  # the bar ends here; on a long run the tables take as long again
        log.info("simulated %d steps in %.0f s; summarizing them and writing the tables to %s",
                 result.num_steps, wall, out_dir)  # fmt: skip
    rec = result.recorder
    requests, steps = rec.requests_frame(), RowTable(*rec.step_table())
    metrics = summarize_recorder(rec, c.get("slo_ms"), setup.arrival_window_s)
    metrics.update(
        **setting_metrics(c, setup),
        wall_s=wall,
        sim_steps_per_s=result.num_steps / wall if wall > 0 else float("nan"),
        unfinished_at_last_arrival=unfinished_at_last_arrival(requests),
        num_swap_fallbacks=swap_fallbacks(result.swap_fallbacks, metrics["num_preemptions"]),
    )
    if out_dir is not None:
        doc = _cost_doc(setup.cost_model)
        write_run(out_dir, c, metrics, requests, steps, extra={"cost_model": doc})
    return metrics


def _simulate(c: dict[str, Any], setup: Any, requests: Sequence[Request]) -> Any:
    """``requests`` simulated on ``setup`` (:class:`~experiments.lib.setup.RunSetup`) with
    the config's ``num_replicas``, ``seed``, ``progress`` and ``check_integrity_every``; a
    step priced out of range, or a plugin's broken contract, is one ConfigError line."""
    try:
        return simulate(
            requests,
            setup.make_scheduler,
            setup.cost_model,
            num_replicas=int(c.get("num_replicas", 1)),
            seed=int(c.get("seed", 0)),
            progress=_PROGRESS_WHEN_UNSET if c.get("progress") is None else bool(c["progress"]),
            check_integrity_every=int(c.get("check_integrity_every") or 0),
            vocab_size=setup.model.vocab_size,
        )
    except StepPriceError as err:
        raise ConfigError("cost", str(err)) from None
    except SimulationError as err:
        line = plugin_failure(err, c)
        if line is None:
            raise
        raise line from None


def setting_metrics(c: Mapping[str, Any], setup: Any) -> dict[str, Any]:
    """The metrics that name the run's setting: system, model, hardware, tp, the batch
    limits, the KV slots and GiB, and ``cost_stack``: the serving stack the clock priced the
    run in (``cost=profiled``: the system's own unless ``cost.stack`` is given; ``none``:
    bare operators; None: a cost model with no stack of its own, e.g. a calibration's fit)
    (``setup``: the run's :class:`~experiments.lib.setup.RunSetup`)."""
    return {
        "system": c["system"]["name"],
        "model": setup.model.name,
        "hardware": setup.gpu.name,
        "tp": setup.tp,
        "max_num_seqs": setup.sched_config.max_num_seqs,
        "max_num_batched_tokens": setup.sched_config.max_num_batched_tokens,
        "kv_slots": setup.capacity.block_slots(block_size(c["system"])),
        "kv_cache_gib": setup.capacity.kv_bytes_total / 1024**3,
        "cost_stack": _stack_of(setup.cost_model),
    }


def unfinished_at_last_arrival(requests: Any) -> float:
    """The share of the trace's requests unfinished (waiting or running) when its last
    request arrives (NaN without requests): about mean latency / trace length when the
    system keeps up, and at least the excess share (rate - capacity) / rate when it does
    not. A rejected request is not waiting for anything and is not counted."""
    if not len(requests):
        return float("nan")
    last = float(requests["arrival_s"].max())
    done = requests["finish_s"].notna() & (requests["finish_s"] <= last)
    rejected = requests["status"] == "rejected"
    return float((~done & ~rejected).sum() / len(requests))


def _stack_of(cost_model: Any) -> str | None:
    """The name of the serving stack ``cost_model`` prices steps in; None where it has none
    of its own."""
    config = getattr(cost_model, "config", None)
    stack = config().get("stack") if callable(config) else None
    return None if stack is None else str(stack)


def profile_transfer_note(cost_model: Any) -> str | None:
    """The log's line for a ``cost=profiled`` run on a GPU its operator profile was not
    measured on (every shipped GPU but the profile's own): its step times are the profile's
    scaled by the two GPUs' datasheet numbers, not measurements of this GPU. None for any
    other cost model, or a profile of the run's own GPU."""
    prof = getattr(cost_model, "profile", None)
    gpu = getattr(getattr(cost_model, "gpu", None), "name", None)
    if prof is None or gpu is None or getattr(cost_model, "same", True) or prof.gpu == gpu:
        return None
    return (
        f"cost: profiled prices {gpu} with operators measured on {prof.gpu} "
        f"({prof.model or 'its profiled layer'}), scaled by the two GPUs' datasheet FLOP/s "
        "and bandwidth (docs/validation/profile-transfer.md): no operator of this GPU was "
        "measured; cost=roofline is the lower bound to hold it against"
    )


def _cost_doc(cost_model: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"describe": cost_model.describe()}
    config = getattr(cost_model, "config", None)
    if callable(config):
        doc.update(config())
    return doc


def simulate_job(cfg: DictConfig) -> Mapping[str, Any]:
    """One Hydra job: simulate into the job's output directory (``run_app``: one-line
    config errors, results table, index row), unless that directory already holds a
    complete run of this config (resume); returns the metrics."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    settle_run_config(cfg, task_overrides(hc))
    metrics = finished_metrics(out_dir, cfg)
    if metrics is not None:
        log.info("%s: finished before, not run again", out_dir)
        return metrics
    if (out_dir / "metrics.json").is_file():  # a resumed sweep whose jobs were renumbered
        log.info(
            "%s: holds a finished run of another config (or of inputs or code changed "
            "since): run again, its files replaced", out_dir,
        )  # fmt: skip
    # after the run (the workload file is known to be readable then): a vllm_bench file
    # without start_times has its arrivals redrawn, not read
    label = system_label(cfg)
    return run_app(
        "simulate", cfg, run, lambda m: summary_line(m, arrivals_note(cfg.workload), label)
    )


@hydra.main(config_path=str(CONFIG_DIR), config_name="simulate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    global _PROGRESS_WHEN_UNSET
    _PROGRESS_WHEN_UNSET = sys.stderr.isatty()
    try:
        simulate_job(cfg)
    finally:  # later runs in this process (a notebook's, reproduce's) keep the quiet default
        _PROGRESS_WHEN_UNSET = False


if __name__ == "__main__":
    exit_if_launcher_missing(sys.argv[1:])
    main_with_checks(main, config_name="simulate")
