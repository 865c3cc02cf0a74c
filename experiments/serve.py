"""``python -m experiments.serve``: one engine serving run (or a sweep with ``-m``).

Examples::

    python -m experiments.serve system=orca_oracle workload.num_requests=16
    python -m experiments.serve model=opt-13b device=cuda dtype=float16 backend=triton \
        kv_budget_fraction=0.8 workload.rate=2

The model's shape comes from the simulator's catalog (``model=opt-13b`` means the same in
both bodies); weights are seeded dummies unless ``model.path`` names a local checkpoint.
Writes the simulator's files (``config.yaml``, ``requests.csv``, ``steps.csv`` with
measured ``duration_s``, ``metrics.json``) plus ``engine.json``; both JSON files record
the device the engine ran on (CPU model or GPU name), torch's thread count and version;
a run with beam search also writes ``beams.csv``, the engine's beam choices, which
``experiments.validate --recorded`` replays (:mod:`core.beam_log`). With ``time_phases``
(null: on CPU only; true on CUDA synchronizes at each phase boundary) ``steps.csv`` also
holds each step's phase seconds, :data:`engine.phases.PHASE_COLUMNS`.
``run(cfg, out_dir)`` is the plain function tests and notebooks call (``start``, the engine's
steps, then ``finish``: a caller may serve several runs a step each in turn). ``backend=triton``
on ``device=cpu`` needs ``TRITON_INTERPRET=1`` (Triton's CPU interpreter; slow).

KV budget (:func:`kv_budget_bytes`): ``kv_cache_gb`` when given; else
``kv_budget_fraction`` of the CUDA memory free once the weights are loaded (free memory now
less the weights); else derived: on CUDA :data:`GPU_DEFAULT_FRACTION` of that, on CPU room
for ``system.max_num_seqs`` sequences of ``max_model_len`` tokens, at most
:data:`CPU_DEFAULT_CAP_BYTES` (but never less than one ``max_model_len`` sequence).
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
import torch
from omegaconf import DictConfig

from core.beam_log import COLUMNS
from core.metrics.summary import summarize_recorder
from core.model_spec import ModelSpec
from core.request import Request
from core.sched.batch_defaults import DeviceFacts
from core.systems import SystemConfigError
from engine.config import check_engine_support
from engine.engine import EngineError, EngineResult, LLMEngine, run_to_end
from engine.kv_cache import GIB, KVBudgetError, bytes_per_block, resolve_kv_budget
from engine.weights import CheckpointError
from experiments.lib.checks import (
    CONFIG_DIR,
    ConfigError,
    Facts,
    check_config,
    check_swap_pool,
    plugin_failure,
)
from experiments.lib.cli import main_with_checks, run_app, system_label
from experiments.lib.malloc import malloc_state, pin_malloc
from experiments.lib.results import summary_line, swap_fallbacks, write_csv, write_run
from experiments.lib.setup import (
    as_dict,
    batch_limits_for,
    build_run_workload,
    manager_options,
    resolve_aliases,
    scheduler_config,
    served_max_model_len,
    warn_plugin_spec,
)
from sim.catalog import model_from_config

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# A CPU run's derived KV pool stays at most this large: a share of a small machine's
# memory (kvlab's CPU runs use KV budgets of a few MiB to a few hundred MiB).
CPU_DEFAULT_CAP_BYTES = 1 * GIB
# A CUDA run's derived KV pool: this fraction of the free memory at startup, leaving the
# rest for the weights (loaded after) and activations.
GPU_DEFAULT_FRACTION = 0.5


def device_facts(device: str) -> Facts:
    """Memory of the device the KV cache would live on, and CUDA's availability."""
    cuda = torch.cuda.is_available()
    if device == "cuda" and cuda:
        memory = torch.cuda.get_device_properties(0).total_memory
    elif device == "cpu":
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        memory = None
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Facts(device_memory_bytes=memory, cuda_available=cuda, host_memory_bytes=host)


def gpu_of(device: str) -> DeviceFacts | None:
    """The CUDA device as vLLM's batch-limit rule reads it (name, total memory); None on a
    CPU (:mod:`core.sched.batch_defaults`)."""
    if device != "cuda" or not torch.cuda.is_available():
        return None
    return DeviceFacts(
        torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory / GIB
    )


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model (``/proc/cpuinfo``; else the platform's)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def kv_budget_bytes(
    c: Mapping[str, Any], model_config: ModelSpec, dtype: torch.dtype, mml: int
) -> int:
    """The engine's KV budget in bytes (see the module doc)."""
    device = str(c.get("device", "cpu"))
    if c.get("kv_cache_gb") is not None:
        return int(float(c["kv_cache_gb"]) * GIB)
    weights = model_config.num_params() * torch.finfo(dtype).bits // 8  # loaded before the cache
    if c.get("kv_budget_fraction") is not None:
        fraction = float(c["kv_budget_fraction"])
        return resolve_kv_budget(device, fraction=fraction, reserved_bytes=weights)
    if device == "cuda":
        return resolve_kv_budget(device, fraction=GPU_DEFAULT_FRACTION, reserved_bytes=weights)
    # a sequence takes whole blocks: fewer bytes, floored to blocks, would not hold one
    # max_model_len sequence (which check_holds_one_sequence refuses)
    block = int(manager_options(c["system"])["block_size"])
    per_seq = -(-mml // block) * bytes_per_block(model_config, block, dtype)
    seqs = batch_limits_for(c["system"], mml, gpu_of(device)).max_num_seqs
    return min(seqs * per_seq, max(CPU_DEFAULT_CAP_BYTES, per_seq))


def budget_key(c: Mapping[str, Any]) -> str:
    """The key that sized the KV budget (:func:`kv_budget_bytes`), for its errors."""
    if c.get("num_gpu_blocks") is not None:
        return "num_gpu_blocks"
    if c.get("kv_cache_gb") is not None:
        return "kv_cache_gb"
    return "kv_budget_fraction"


def check_holds_one_sequence(
    c: Mapping[str, Any], budget: int | None, per_block: int, block_size: int, mml: int
) -> None:
    """A KV cache (``num_gpu_blocks``, else ``budget`` bytes) that holds fewer tokens than
    one ``mml``-token sequence is a ConfigError naming the key that sized it, as
    ``experiments.simulate`` refuses it: every request could be rejected. A budget below
    one block is left to the engine's own error."""
    blocks = c.get("num_gpu_blocks")
    num = int(blocks) if blocks is not None else int(budget or 0) // per_block
    if num < 1 or num * block_size >= mml:
        return
    key = next((k for k in ("num_gpu_blocks", "kv_cache_gb", "kv_budget_fraction")
                if c.get(k) is not None), "system.max_model_len")  # fmt: skip
    raise ConfigError(
        key, f"the KV cache holds {num * block_size} tokens ({num} block(s) of {block_size}), "
        f"fewer than one max_model_len={mml} sequence; lower system.max_model_len",
        c.get(key) if key != "system.max_model_len" else mml,
    )  # fmt: skip


def build_engine(c: Mapping[str, Any]) -> tuple[LLMEngine, int]:
    """The configured engine and its max_model_len; the run's log says what was built
    (:func:`log_engine`)."""
    spec = model_from_config(c["model"])
    system = c["system"]
    mml = served_max_model_len(system, spec)
    try:
        model_config = check_engine_support(spec)
    except ValueError as exc:
        raise ConfigError("model", str(exc), spec.name) from None
    dtype, device = DTYPES[str(c.get("dtype", "float32"))], str(c.get("device", "cpu"))
    options = manager_options(system)
    warn_plugin_spec(system)
    blocks = c.get("num_gpu_blocks")
    try:
        budget = None if blocks is not None else kv_budget_bytes(c, model_config, dtype, mml)
        per_block = bytes_per_block(model_config, options["block_size"], dtype)
        check_holds_one_sequence(c, budget, per_block, int(options["block_size"]), mml)
        cpu_blocks = int(float(c.get("swap_space_gb", 0)) * GIB) // per_block
        check_swap_pool(system, cpu_blocks, c.get("swap_space_gb"))
        engine = LLMEngine(
            model_config,
            system=system["name"],
            kv_budget_bytes=budget,
            num_blocks=None if blocks is None else int(blocks),
            backend=str(c.get("backend", "torch")),
            dtype=dtype,
            device=device,
            sched_config=scheduler_config(system, mml, gpu_of(device)),
            num_cpu_blocks=cpu_blocks,
            seed=int(c.get("seed", 0)),
            weights_path=c["model"].get("path"),
            time_phases=c.get("time_phases"),
            step_timer_name=str(c.get("step_timer") or "wall"),
            check_integrity_every=int(c.get("check_integrity_every") or 0),
            **options,
        )
    except KVBudgetError as exc:
        raise ConfigError(budget_key(c), str(exc)) from None
    except CheckpointError as exc:
        raise ConfigError("model.path", str(exc)) from None
    except SystemConfigError as exc:  # a plugin's manager that cannot be built, as simulate says
        raise ConfigError("system", str(exc)) from None
    except EngineError as exc:
        if "max_model_len" not in str(exc):
            raise
        raise ConfigError("system.max_model_len", str(exc), mml) from None
    log_engine(c, engine)
    return engine, mml


@dataclass
class Serving:
    """One configured run, built and not yet served (:func:`start`)."""

    config: dict[str, Any]  # resolved
    engine: LLMEngine
    requests: list[Request]
    max_model_len: int
    arrival_window_s: float | None = None  # the workload's (Workload.window_s)

    def steps(self) -> Generator[None, None, EngineResult]:
        """The engine serving the run a step per iteration (:meth:`LLMEngine.serving`)."""
        c = self.config
        return self.engine.serving(
            self.requests,
            mode=str(c.get("mode", "online")),
            clock=str(c.get("clock", "virtual")),
            progress=_PROGRESS_WHEN_UNSET if c.get("progress") is None else bool(c["progress"]),
        )


def start(cfg: DictConfig | Mapping[str, Any]) -> Serving:
    """Check ``cfg`` (``ConfigError`` before the model is built), set torch's thread count,
    on CPU pin malloc's thresholds (:mod:`experiments.lib.malloc`), build the engine, warm it
    up (``warmup``; null: on CUDA only, :meth:`LLMEngine.warm_up`) and build the workload."""
    c = resolve_aliases(as_dict(cfg))
    check_config(c, "serve", device_facts(str(c.get("device", "cpu"))))
    if str(c.get("device", "cpu")) == "cpu":
        pin_malloc()  # a CPU step's time must not hang on the heap's history
    if c.get("threads") is not None:
        torch.set_num_threads(int(c["threads"]))
    engine, mml = build_engine(c)
    warmup = c.get("warmup")
    if warmup if warmup is not None else engine.device.type == "cuda":
        engine.warm_up()
    loaded = build_run_workload(c, mml, vocab_size=engine.model_config.vocab_size)
    return Serving(c, engine, loaded.requests, mml, loaded.window_s)


def log_engine(c: Mapping[str, Any], engine: LLMEngine) -> None:
    """The run's log (``serve.log``): where the engine runs and what sized its KV cache."""
    kv = engine.kv_cache
    sized = {
        "num_gpu_blocks": "num_gpu_blocks",
        "kv_cache_gb": f"kv_cache_gb={c.get('kv_cache_gb')}",
    }.get(budget_key(c))
    if sized is None:
        if c.get("kv_budget_fraction") is not None:
            sized = f"kv_budget_fraction={c['kv_budget_fraction']} of the free memory"
        elif engine.device.type == "cuda":
            sized = "derived: half the device memory free after the weights"
        else:
            sized = "derived: room for max_num_seqs sequences of max_model_len, at most 1 GiB"
    log.info(
        "engine: %s on %s (%s, %d torch thread(s)), backend %s, step timer %s",
        c["model"]["name"], engine.device, device_name(engine.device), torch.get_num_threads(),
        c.get("backend", "torch"), engine.step_timer_name,
    )  # fmt: skip
    sched = engine.scheduler
    from core.kv.paged import PagedKVCacheManager

    swaps = isinstance(sched.manager, PagedKVCacheManager) and (
        sched.config.preemption_mode == "swap" or sched.swap_groups
    )
    log.info(
        "KV cache: %d blocks of %d tokens, %.4g GiB (%s); CPU swap pool %d blocks%s",
        kv.num_blocks, kv.block_size, kv.device_bytes / GIB, sized, kv.num_cpu_blocks,
        "" if swaps else f" (unused: {sched.name} never swaps)",
    )  # fmt: skip
    log.info("system: %s", engine.scheduler.config)


def run(cfg: DictConfig | Mapping[str, Any], out_dir: Path | None = None) -> dict[str, Any]:
    """Serve the configured workload; write result files when ``out_dir`` is given.
    Returns the metrics dict (plus the engine's KV size and ``wall_s``). A config that
    cannot run raises ``ConfigError`` before the model is built."""
    serving = start(cfg)
    t0 = time.perf_counter()
    try:
        result = run_to_end(serving.steps())
    except EngineError as err:
        line = plugin_failure(err, serving.config)
        if line is None:
            raise
        raise line from None
    return finish(serving, result, time.perf_counter() - t0, out_dir)


def finish(
    serving: Serving, result: EngineResult, wall_s: float, out_dir: Path | None = None
) -> dict[str, Any]:
    """The served run's metrics (``wall_s``: the time spent serving it), its files written
    into ``out_dir`` when given."""
    c, engine = serving.config, serving.engine
    rec = result.recorder
    req_frame, steps = rec.requests_frame(), rec.steps_frame()
    if result.phases is not None:
        steps = with_phases(steps, result.phases)
    # offline, every request arrives at t = 0 whatever window drew them: no rate offered
    online = str(c.get("mode", "online")) == "online"
    window = serving.arrival_window_s if online else None
    metrics = summarize_recorder(rec, c.get("slo_ms"), window)
    kv = engine.kv_cache
    where = {
        "device": str(engine.device),
        "hardware": device_name(engine.device),
        "threads": torch.get_num_threads(),
        "step_timer": engine.step_timer_name,
        "malloc": malloc_state(),
        "torch_version": torch.__version__,
    }
    metrics.update(
        system=c["system"]["name"],
        model=c["model"]["name"],
        max_num_seqs=engine.scheduler.config.max_num_seqs,
        max_num_batched_tokens=engine.scheduler.config.max_num_batched_tokens,
        kv_slots=kv.num_blocks * kv.block_size,
        num_swap_fallbacks=swap_fallbacks(
            engine.scheduler.swap_fallbacks, metrics["num_preemptions"]
        ),
        kv_cache_gib=kv.device_bytes / GIB,
        wall_s=wall_s,
        **where,
    )
    if out_dir is not None:
        doc = {
            "num_blocks": kv.num_blocks,
            "block_size": kv.block_size,
            "num_cpu_blocks": kv.num_cpu_blocks,
            "max_num_seqs": engine.scheduler.config.max_num_seqs,
            "max_num_batched_tokens": engine.scheduler.config.max_num_batched_tokens,
            "kv_bytes": kv.device_bytes,
            "dtype": str(kv.dtype),
            "num_steps": result.num_steps,
            "phase_columns": None if result.phases is None else list(result.phases.columns),
            "cost_basis_hardware": (c.get("hardware") or {}).get("name"),
            **where,
            "device": where["hardware"],
        }
        if engine.beam_log.rows:  # for a step-for-step replay (experiments.validate)
            out_dir.mkdir(parents=True, exist_ok=True)
            write_csv(out_dir / "beams.csv", pd.DataFrame(engine.beam_log.rows, columns=COLUMNS))
        else:  # an earlier beam run's choices in this folder are not this run's
            (out_dir / "beams.csv").unlink(missing_ok=True)
        write_run(out_dir, c, metrics, req_frame, steps, extra={"engine": doc})
    return metrics


def with_phases(steps: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with the engine's per-step phase columns appended (one row each)."""
    if len(phases) != len(steps):
        raise RuntimeError(f"{len(phases)} phase rows for {len(steps)} steps")
    return pd.concat([steps, phases.set_axis(steps.index)], axis=1)


# what progress=null means: a bar when the command line's run writes to a terminal (main
# sets it; a log redirected to a file gets no bar's carriage returns), none for other callers
_PROGRESS_WHEN_UNSET = False


@hydra.main(config_path=str(CONFIG_DIR), config_name="serve", version_base="1.3")
def main(cfg: DictConfig) -> None:
    global _PROGRESS_WHEN_UNSET
    _PROGRESS_WHEN_UNSET = sys.stderr.isatty()
    try:
        _serve_job(cfg)
    finally:  # later runs in this process keep the quiet default
        _PROGRESS_WHEN_UNSET = False


def _serve_job(cfg: DictConfig) -> None:
    label = system_label(cfg)
    run_app(
        "serve",
        cfg,
        run,
        lambda m: summary_line(
            m,
            f"on {m['hardware']} ({m['device']}, {m['threads']} "
            f"thread{'' if m['threads'] == 1 else 's'})",
            label,
        ),
    )


if __name__ == "__main__":
    main_with_checks(main, config_name="serve")
