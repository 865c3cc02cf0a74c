"""The one place a resolved config becomes run objects: scheduler (with its KV-cache
manager), cost model, KV capacity and requests. ``simulate``, ``serve``, ``calibrate``,
``validate``, the report and the benchmarks call these functions instead of reading the
``system`` / ``cost`` / ``workload`` groups themselves.

Errors a config causes while objects are built (a malformed trace, a model that does not
fit its GPU, an impossible system) are re-raised as :class:`~experiments.lib.checks.ConfigError`
by :func:`config_errors`, so the entry points report them as one line.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from core.defaults import DEFAULT_BLOCK_SIZE, DEFAULT_WATERMARK, GIB
from core.kv.block_pool import MAX_BLOCKS
from core.request import Request, RequestError
from core.sched.base import BaseScheduler, SchedulerConfig, SchedulerConfigError
from core.sched.batch_defaults import BatchLimits, DeviceFacts
from core.systems import SystemConfigError, build_scheduler, get_system, plugin_of
from core.workload.spec import FILE_KINDS, Workload, load_workload
from core.workload.trace_io import TraceFormatError
from experiments.lib.checks import (
    COST_KEYS,
    DTYPE_BYTES,
    ConfigError,
    batch_limits_for,
    check_cost_keys,
    check_swap_pool,
    gpu_facts,
    lookup,
    run_gpu,
)
from experiments.lib.input_stamps import located_input
from sim.capacity import DoesNotFit, KVCapacity, kv_capacity
from sim.catalog import GPUSpec, ModelSpec, model_from_config, model_key
from sim.cost import CostModel, Efficiency, build_cost_model
from sim.cost.calibrated import check_calibration_doc
from sim.cost.overhead import Stack, contiguous_kernel, get_stack
from sim.cost.profile import ProfileError
from sim.cost.stack_file import MEASURED, load_stack_file

REPO_ROOT = Path(__file__).resolve().parents[2]  # relative profile paths start here
log = logging.getLogger(__name__)

# Old key -> the key that replaced it; reading the old one warns.
KEY_ALIASES = {"kv_budget_gb": "kv_cache_gb"}


def as_dict(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """A plain dict of ``cfg``, resolved; a mandatory value left unset (``???``) and an
    interpolation that cannot resolve are config errors."""
    if isinstance(cfg, DictConfig):
        from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

        try:
            return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
        except MissingMandatoryValue as exc:
            key = getattr(exc, "full_key", None) or "config"
            raise ConfigError(str(key), "missing value", "???", "a value") from None
        except InterpolationResolutionError as exc:
            key = getattr(exc, "full_key", None) or "config"
            why = exc.msg.strip().splitlines()[0]  # OmegaConf adds full_key lines
            raise ConfigError(str(key), f"cannot resolve ({why})") from None
    return dict(cfg)


def resolve_aliases(c: dict[str, Any]) -> dict[str, Any]:
    """Move values given under an old key (:data:`KEY_ALIASES`) to the new key, with a
    warning; both given is a config error."""
    for old, new in KEY_ALIASES.items():
        if c.get(old) is None:
            continue
        if c.get(new) is not None:
            raise ConfigError(old, f"an old name of {new}; give only {new}", c[old], "null")
        warnings.warn(f"{old} is an old name of {new}; use {new}", DeprecationWarning, stacklevel=2)
        log.warning("%s is an old name of %s; use %s=%s", old, new, new, c[old])
        c[new] = c[old]
        c[old] = None
    return c


@contextmanager
def config_errors(workload: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Turn errors that a config causes while run objects are built into ConfigError. A
    malformed file is named by its key: ``workload.tokens_path`` when it is the
    ``workload``'s tokens file, else ``workload.path``."""
    try:
        yield
    except ConfigError:
        raise
    except TraceFormatError as exc:
        tokens = (workload or {}).get("tokens_path")
        key = "workload.tokens_path" if tokens is not None and exc.path == str(tokens) else None
        raise ConfigError(key or "workload.path", str(exc)) from None
    except RequestError as exc:
        raise ConfigError(f"workload.{exc.key}" if exc.key else "workload", str(exc)) from None
    except SystemConfigError as exc:
        raise ConfigError("system", str(exc)) from None


# ---------------------------------------------------------------- system group


def served_max_model_len(system: Mapping[str, Any], model: ModelSpec) -> int:
    """``system.max_model_len`` (vLLM's engine argument), else the model's maximum
    context; a value above the model's maximum is a config error."""
    value = system.get("max_model_len")
    if value is None:
        return model.max_model_len
    if int(value) > model.max_model_len:
        raise ConfigError(
            "system.max_model_len",
            f"exceeds {model.name}'s maximum context",
            int(value),
            f"at most {model.max_model_len}",
        )
    return int(value)


def prefix_caching_for(system: Mapping[str, Any], requests: list[Request]) -> bool:
    """``system.enable_prefix_caching``. A workload without prompt token ids keeps it: each
    such request's prompt stands for ids of its own (:func:`core.kv.paged.stand_in_prompt_id`),
    so a request finds only its own blocks again (after a recompute preemption), as the
    engine's randomly drawn prompts do, and no prefix is shared; a log line says so (e.g.
    ``system=vllm_v1`` on a synthetic workload without ``with_token_ids``)."""
    wanted = bool(system.get("enable_prefix_caching", False))
    missing = sum(r.prompt_token_ids is None for r in requests)
    if wanted and missing:
        which = "no" if missing == len(requests) else f"{missing} of {len(requests)} without"
        log.info(
            "prefix caching: the workload has %s prompt token ids, so each such request's "
            "prompt stands for tokens of its own: it finds only its own blocks again (after a "
            "recompute preemption), no prefix is shared (workload.with_token_ids=true draws "
            "ids on a synthetic workload)", which,
        )  # fmt: skip
    return wanted


def block_size(system: Mapping[str, Any]) -> int:
    return int(system.get("block_size") or DEFAULT_BLOCK_SIZE)


def is_contiguous(system: Mapping[str, Any]) -> bool:
    """Whether the system group's system keeps contiguous (not paged) KV."""
    name = system.get("name")
    return name is not None and get_system(str(name)).kv == "contiguous"


def scheduler_config(
    system: Mapping[str, Any], max_model_len: int, device: DeviceFacts | None = None
) -> SchedulerConfig:
    """The scheduler limits of the system group, ``max_num_seqs`` and
    ``max_num_batched_tokens`` left null taken by vLLM's rule for the system's vLLM version
    and the GPU (:func:`batch_limits_for`); an impossible combination is a ConfigError
    naming the system key (e.g. a token budget below ``max_model_len``)."""
    limits = batch_limits_for(system, max_model_len, device)
    try:
        return SchedulerConfig(
            max_num_seqs=limits.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            max_model_len=max_model_len,
            preemption_mode=str(system.get("preemption_mode", "recompute")),
            chunked_prefill=bool(system.get("chunked_prefill", False)),
        )
    except SchedulerConfigError as exc:
        key = re.match(r"\w+", str(exc))
        problem = str(exc)
        if "max_model_len=" in problem:
            problem += " (or set system.max_model_len lower)"
        raise ConfigError(f"system.{key.group(0) if key else 'name'}", problem) from None


def manager_options(system: Mapping[str, Any]) -> dict[str, Any]:
    """The KV-cache manager's keyword arguments from the system group (the engine takes
    the same ones)."""
    watermark = system.get("watermark")
    return {
        "block_size": block_size(system),
        "watermark": DEFAULT_WATERMARK if watermark is None else float(watermark),
        "enable_prefix_caching": bool(system.get("enable_prefix_caching", False)),
    }


# what a SystemSpec carries for callers that give none, and a run takes from system.* instead
SPEC_KEYS = ("chunked_prefill", "watermark", "enable_prefix_caching")


def warn_plugin_spec(system: Mapping[str, Any]) -> None:
    """Log a warning when the run's system is a plugin's whose :class:`SystemSpec` sets
    :data:`SPEC_KEYS` otherwise than the run's ``system.*`` keys, which are what runs (the
    spec's are for ``build_scheduler`` / ``LLMEngine`` called without them): a spec written
    with ``watermark=0.0``, or built on ``vllm`` while the keys come from ``system=vllm_v1``,
    would otherwise run something else than it says, silently."""
    name = str(system.get("name"))
    plugin = plugin_of(name)
    if plugin is None:
        return
    spec = get_system(name)
    ran = {
        "chunked_prefill": bool(system.get("chunked_prefill", False)),
        "watermark": manager_options(system)["watermark"],
        "enable_prefix_caching": bool(system.get("enable_prefix_caching", False)),
    }
    differ = [k for k in SPEC_KEYS if getattr(spec, k) != ran[k]]
    if differ:
        log.warning(
            "system %s (plugin %s): the run takes %s from its system keys, not its "
            "SystemSpec's %s: set the keys as the spec does, or, for a policy built on "
            "vllm_v1, register dataclasses.replace(SYSTEMS['vllm_v1'], name=..., "
            "scheduler=...) (README, A policy of your own)",
            name, plugin, ", ".join(f"system.{k}={ran[k]}" for k in differ),
            ", ".join(f"{k}={getattr(spec, k)}" for k in differ),
        )  # fmt: skip


def scheduler_factory(
    system: Mapping[str, Any],
    num_slots: int,
    num_cpu_slots: int,
    max_model_len: int,
    requests: list[Request] | None = None,
    device: DeviceFacts | None = None,
) -> Callable[[], BaseScheduler]:
    """A function making a fresh scheduler (owning its manager) for the system group over
    ``num_slots`` device and ``num_cpu_slots`` CPU token slots (batch limits left null
    taken for ``device``: :func:`scheduler_config`). Given the ``requests``, a log line says
    how prefix caching reads those without token ids (:func:`prefix_caching_for`)."""
    config = scheduler_config(system, max_model_len, device)
    options = manager_options(system)
    warn_plugin_spec(system)
    if requests is not None:
        prefix_caching_for(system, requests)  # its log line; the option is the system's
    with config_errors():  # fail now, not in the first make_scheduler() call
        build_scheduler(system["name"], num_slots, config, num_cpu_slots=num_cpu_slots, **options)

    def make_scheduler() -> BaseScheduler:
        return build_scheduler(
            system["name"], num_slots, config, num_cpu_slots=num_cpu_slots, **options
        )

    return make_scheduler


# ---------------------------------------------------------------- workload and cost


def build_requests(
    c: Mapping[str, Any], max_model_len: int, vocab_size: int | None = None
) -> list[Request]:
    """The workload group's requests (:func:`build_run_workload`'s)."""
    return build_run_workload(c, max_model_len, vocab_size).requests


def build_run_workload(
    c: Mapping[str, Any], max_model_len: int, vocab_size: int | None = None
) -> Workload:
    """The workload group's requests and arrival window (:class:`Workload`). A trace file
    that yields none (empty, or every request filtered out) is a config error; a synthetic
    window that happens to hold no arrival (a low rate over a short duration, as in a rate
    sweep) only warns."""
    workload = dict(c["workload"])
    if vocab_size is not None:
        workload["vocab_size"] = vocab_size
    with config_errors(workload):
        loaded = load_workload(workload, max_model_len=max_model_len, seed=int(c.get("seed", 0)))
    requests = loaded.requests
    if not requests and workload.get("kind") in FILE_KINDS:
        raise ConfigError(
            "workload.path", "no requests (empty, or every request filtered out)", workload["path"]
        )
    if not requests:
        window = {k: workload.get(k) for k in ("rate", "duration_s", "num_requests")}
        said = ", ".join(f"workload.{k}={v}" for k, v in window.items() if v is not None)
        log.warning("the workload holds no request (%s)", said or workload.get("kind"))
    check_arrivals_resolvable(workload, requests)
    warn_idle_lead_in(workload, requests)
    return loaded


def warn_idle_lead_in(workload: Mapping[str, Any], requests: Sequence[Request]) -> None:
    """Warn where a native trace (whose times are kept as written) idles before its first
    arrival at least as long as its arrivals last, and over a second: ``offered_rate``
    counts that lead-in (e.g. arrival times written as Unix seconds)."""
    if workload.get("kind") != "native" or not requests:
        return
    first, last = requests[0].arrival_time, requests[-1].arrival_time
    if first > 1.0 and first >= last - first:
        log.warning(
            "%s: the first request arrives at %.6g s and the last at %.6g s: the replay idles "
            "until the first, and offered_rate counts that time (a native trace keeps its "
            "times as written); workload.start_s=%.6g starts the replay at the first arrival",
            workload.get("path"), first, last, first,
        )  # fmt: skip


# The latest arrival a run may have: 2**52 µs (~4.5e9 s, ~143 years). Past it, a float64
# clock in seconds no longer resolves a microsecond, and soon no step at all.
MAX_ARRIVAL_S = 2.0**52 / 1e6


def check_arrivals_resolvable(workload: Mapping[str, Any], requests: list[Request]) -> None:
    """Refuse arrivals past :data:`MAX_ARRIVAL_S`, naming the key that put them there:
    ``workload.time_scale`` when it scales a file's arrivals, ``workload.path`` for a file's
    own times, else ``workload.rate``."""
    last = max((r.arrival_time for r in requests), default=0.0)
    if last <= MAX_ARRIVAL_S:  # NaN passes: the workload's reader refuses it
        return
    scale = workload.get("time_scale")
    if scale is not None and scale != 1:
        key, got = "workload.time_scale", scale
    elif workload.get("kind") in FILE_KINDS:
        key, got = "workload.path", workload.get("path")
    else:
        key, got = "workload.rate", workload.get("rate")
    raise ConfigError(
        key,
        f"the last request arrives at {last:.3g} s, past {MAX_ARRIVAL_S:.3g} s (2**52 us), "
        "where a float64 clock in seconds no longer resolves a microsecond",
        got,
        f"arrivals before {MAX_ARRIVAL_S:.3g} s",
    )


_EFFICIENCY_KEYS = {
    "compute_efficiency": "compute",
    "memory_efficiency": "memory",
    "per_step_overhead_s": "per_step_overhead_s",
    "allreduce_latency_s": "allreduce_latency_s",
    "peer_link_efficiency": "peer_link_efficiency",
}


def make_cost_model(c: Mapping[str, Any], model: ModelSpec, gpu: GPUSpec, tp: int = 1) -> CostModel:
    """The ``cost`` group's model; efficiency overrides are labelled as such. A key the kind
    does not read is a ConfigError (:func:`check_cost_keys`); swaps and copies are priced at
    the run's ``system.block_size``, a calibrated model's included. A contiguous system
    (Orca, FasterTransformer) is priced without the preset stack's per-block kernel terms
    (:func:`~sim.cost.overhead.contiguous_kernel`); a ``measured`` stack keeps them."""
    cost_cfg = dict(c.get("cost") or {"kind": "roofline"})
    kind = cost_cfg.pop("kind", "roofline")
    check_cost_keys(kind, cost_cfg)
    if kind in COST_KEYS:  # what is left of the other keys is null: not given
        cost_cfg = {k: v for k, v in cost_cfg.items() if k in COST_KEYS[kind]}
    overrides = {
        _EFFICIENCY_KEYS[k]: float(v)
        for k, v in cost_cfg.items()
        if k in _EFFICIENCY_KEYS and v is not None
    }
    for config_key, field in _EFFICIENCY_KEYS.items():
        if field in overrides:  # each checked alone, so the error names its key
            try:
                Efficiency().with_values({field: "check"}, **{field: overrides[field]})
            except ValueError as exc:
                problem = str(exc).rsplit(", got ", 1)[0]  # the value is shown once, below
                raise ConfigError(f"cost.{config_key}", problem, overrides[field]) from None
    extra = {k: v for k, v in cost_cfg.items() if k not in _EFFICIENCY_KEYS}
    if overrides and kind == "profiled":  # the all-reduce's two, the added time
        extra["efficiency_overrides"] = overrides
    elif overrides:
        extra["efficiency"] = Efficiency().with_values(
            {k: "set in the run's config (cost group)" for k in overrides}, **overrides
        )
    if kind in ("roofline", "profiled"):
        extra.setdefault("block_size", block_size(c["system"]))
    if kind == "profiled" and extra.get("stack") is None:  # the system's own stack
        extra["stack"] = get_system(str(c["system"]["name"])).stack
    if kind == "profiled" and extra.get("profile") is not None:
        path = Path(str(extra["profile"]))  # relative: the working directory's, else the repo's
        found = located_input(str(path))
        extra["profile"] = found or (path if path.is_absolute() else REPO_ROOT / path)
    if kind == "calibrated" and extra.get("path") in (None, "???", ""):
        raise ConfigError(
            "cost.path", "cost=calibrated needs a calibration file", extra.get("path"),
            "cost.path=<calibration.json from experiments.calibrate or calibrate_vllm>",
        )  # fmt: skip
    if kind == "calibrated":
        path = located_input(str(extra["path"])) or Path(str(extra["path"]))
        return calibrated_from_file(path, model, gpu, tp, block_size=block_size(c["system"]))
    stack_path = extra.pop("stack_path", None)
    if stack_path is not None or extra.get("stack") == MEASURED:
        extra["stack"] = measured_stack(extra.get("stack"), stack_path)
    try:
        stack = extra.get("stack")
        if kind in ("roofline", "profiled") and is_contiguous(c.get("system") or {}):
            extra["stack"] = contiguous_kernel(
                stack if isinstance(stack, Stack) else get_stack(stack, tp)
            )
        return build_cost_model(kind, model, gpu, tp, **extra)
    except ProfileError as exc:  # names the file and row
        raise ConfigError("cost.profile", str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        if "cost.stack" in text:  # an unknown preset: the message lists the known ones
            raise ConfigError("cost.stack", text) from None
        raise ConfigError("cost", text, kind) from None


def measured_stack(name: Any, path: Any) -> Stack:
    """``cost.stack=measured`` read from ``cost.stack_path`` (a relative path from the
    working directory, else from the repository root: :func:`located_input`)."""
    if name != MEASURED:
        raise ConfigError("cost.stack_path", "is read only with cost.stack=measured", path, "null")
    if path is None:
        raise ConfigError(
            "cost.stack_path", "cost.stack=measured needs a stack file", None,
            "a file written by experiments.calibrate_overhead",
        )  # fmt: skip
    try:
        return load_stack_file(located_input(str(path)) or Path(str(path)))
    except ValueError as exc:
        raise ConfigError("cost.stack_path", str(exc)) from None


def with_profile_found(doc: dict[str, Any], calibration_path: Path) -> dict[str, Any]:
    """``doc`` with its operator ``profile`` path found from here; else unchanged.

    A relative path is taken from the calibration file's folder (what ``experiments.calibrate``
    writes), then from here, then from the repository root, as ``cost.path`` itself is found
    (the calibrations shipped under ``docs/`` name their profile from there). An absolute path
    that does not exist here (a calibration made on another machine, e.g. the GPU's
    ``/tmp/kvlab-gpu/profile`` of ``gpu_all.sh``) is looked for by its trailing parts in the
    calibration file's folder and the one above it, nearest first (``<call>/profile`` beside
    ``<call>/engine/calibration.json``); no higher, where an unrelated folder of the same
    name could be taken for it. A ``profile`` that is not a path is left for the document's
    check
    (:func:`~sim.cost.calibrated.check_calibration_doc`)."""
    name = doc.get("profile")
    if not name or not isinstance(name, str):
        return doc
    path, here = Path(name), Path(calibration_path).parent
    if path.is_absolute():
        if path.exists():
            return doc
        for folder in (here, here.parent):
            for n in range(len(path.parts) - 1, 0, -1):
                found = folder.joinpath(*path.parts[-n:])
                if found.exists():
                    return {**doc, "profile": str(found)}
        return doc
    beside = here / path
    if beside.exists():
        return {**doc, "profile": str(beside)}
    if path.exists() or not (REPO_ROOT / path).exists():
        return doc  # read from here, or left for the error
    return {**doc, "profile": str(REPO_ROOT / path)}


def check_calibration_fits(doc: Mapping[str, Any], key: str, model: str, gpu: str, tp: int) -> None:
    """A calibration document names this model, GPU and tensor-parallel size (or none of
    them); else a ConfigError under ``key``."""
    for field, ours in (("model", model), ("gpu", gpu), ("tp", tp)):
        if doc.get(field) not in (None, ours):
            raise ConfigError(key, f"fitted for another {field}", doc[field], ours)


def checked_calibration(doc: dict[str, Any], path: Path, key: str) -> dict[str, Any]:
    """A calibration document read from ``path``, its fields checked
    (:func:`~sim.cost.calibrated.check_calibration_doc`; else a ConfigError on ``key``
    naming the file and the field) and its operator profile found from there
    (:func:`with_profile_found`)."""
    try:
        check_calibration_doc(doc)
    except ValueError as exc:
        raise ConfigError(key, f"{path}: malformed calibration file: {exc}") from None
    return with_profile_found(doc, path)


def calibrated_from_file(
    path: Path, model: ModelSpec, gpu: GPUSpec, tp: int, block_size: int | None = None
) -> CostModel:
    """The calibrated model in ``path`` (``experiments.calibrate`` or ``calibrate_vllm``)
    applied to this run's model and GPU; a file fitted for another model, GPU or tensor
    parallel size is a config error. ``block_size`` (default: the file's) is the run's KV
    block: the fit does not price swaps and copies, the roofline adds them per byte
    (:meth:`~sim.cost.calibrated.CalibratedCostModel.step_time`), so they are priced at the
    run's block whatever block the file was fitted at."""
    if not path.is_file():
        raise ConfigError("cost.path", "no such calibration file", str(path))
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("cost.path", f"not JSON ({exc})", str(path)) from None
    if not isinstance(doc, dict) or doc.get("kind") != "calibrated" or "coefficients" not in doc:
        raise ConfigError(
            "cost.path", "not a calibration file", str(path), "kind 'calibrated', coefficients"
        )
    doc = checked_calibration(doc, path, "cost.path")
    check_calibration_fits(doc, "cost.path", model.name, gpu.name, tp)
    try:
        return build_cost_model(
            "calibrated", model, gpu, tp,
            coefficients=doc["coefficients"], fit_stats=doc.get("fit_stats"),
            dtype_bytes=int(doc.get("dtype_bytes", 2)),
            block_size=int(block_size or doc.get("block_size", DEFAULT_BLOCK_SIZE)),
            profile=doc.get("profile"),
        )  # fmt: skip
    except ValueError as exc:  # bad coefficients, or the operator profile it builds on
        raise ConfigError("cost.path", str(exc), str(path)) from None


# ---------------------------------------------------------------- the simulator's run


@dataclass
class RunSetup:
    model: ModelSpec
    gpu: GPUSpec
    tp: int
    capacity: KVCapacity
    sched_config: SchedulerConfig
    requests: list[Request]
    make_scheduler: Callable[[], BaseScheduler]
    max_model_len: int
    cost_model: CostModel
    batch_limits: BatchLimits
    # the workload's configured arrival window (Workload.window_s; None: its own span, or
    # requests of one's own), which the run's offered_rate is over
    arrival_window_s: float | None = None


@dataclass
class MemorySetup:
    """What a run's memory follows from: the model, GPU and tp, the served context, the
    device's facts, the batch limits and the KV capacity."""

    model: ModelSpec
    gpu: GPUSpec
    tp: int
    max_model_len: int
    device: DeviceFacts
    sched_config: SchedulerConfig
    batch_limits: BatchLimits
    capacity: KVCapacity


def memory_setup(c: Mapping[str, Any]) -> MemorySetup:
    """The memory side of a resolved simulator config (no workload, no clock); a config
    that cannot run raises ConfigError naming the key."""
    try:
        model = model_from_config(c["model"])
    except (KeyError, ValueError) as exc:
        key = model_key(c["model"])
        raise ConfigError(key, str(exc.args[0] if exc.args else exc)) from None
    gpu = run_gpu(c["hardware"])
    tp = int(c["model"].get("tp", 1))
    system = c["system"]
    mml = served_max_model_len(system, model)
    warn_unmodelled(model, mml)
    device = gpu_facts(gpu)
    sched_config = scheduler_config(system, mml, device)
    limits = batch_limits_for(system, mml, device)
    capacity = run_capacity(capacity_args(c, model, gpu, tp, sched_config, mml), limits)
    return MemorySetup(model, gpu, tp, mml, device, sched_config, limits, capacity)


def build_setup(
    cfg: DictConfig | Mapping[str, Any], requests: list[Request] | None = None
) -> RunSetup:
    """Resolve every config group of a simulator run into objects; a config that cannot
    run raises ConfigError naming the key. ``requests``: one's own, in place of the
    workload group's (prefix caching then follows their token ids)."""
    c = resolve_aliases(as_dict(cfg))
    mem = memory_setup(c)
    model, capacity, mml = mem.model, mem.capacity, mem.max_model_len
    num_cpu_slots = pool_slots(c, capacity, model)
    window = None
    if requests is None:
        loaded = build_run_workload(c, mml, vocab_size=model.vocab_size)  # as the engine does
        requests, window = loaded.requests, loaded.window_s
    make_scheduler = scheduler_factory(
        c["system"], capacity.num_slots, num_cpu_slots, mml, requests, mem.device
    )
    cost_model = make_cost_model(c, model, mem.gpu, mem.tp)
    return RunSetup(
        model, mem.gpu, mem.tp, capacity, mem.sched_config, requests, make_scheduler, mml,
        cost_model, mem.batch_limits, window,
    )  # fmt: skip


def warn_unmodelled(model: ModelSpec, max_model_len: int) -> None:
    """Log one warning line for what the model has and the simulator does not model: a
    sliding window shorter than the served length (KV and attention are then priced over
    the whole context, an upper bound past the window)."""
    window = model.sliding_window
    if window is not None and window < max_model_len:
        log.warning(
            "model.sliding_window: %s attends to the last %d tokens; kvlab does not model the "
            "window: KV memory and attention are priced over the whole context (up to %d)",
            model.name, window, max_model_len,
        )  # fmt: skip


def capacity_args(
    c: Mapping[str, Any],
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int,
    sched_config: SchedulerConfig,
    mml: int,
) -> dict[str, Any]:
    """The keyword arguments of :func:`sim.capacity.kv_capacity` for the run's config
    (values already checked by :data:`~experiments.lib.checks.RULES`)."""
    system = c["system"]
    kv_gb, blocks = c.get("kv_cache_gb"), c.get("num_gpu_blocks")
    return {
        "model": model,
        "gpu": gpu,
        "tp": tp,
        "dtype_bytes": DTYPE_BYTES.get(str(c.get("dtype") or "bfloat16"), 2),
        "gpu_memory_utilization": float(c.get("gpu_memory_utilization", 0.9)),
        "max_num_batched_tokens": sched_config.max_num_batched_tokens,
        "max_num_seqs": sched_config.max_num_seqs,
        "kv_cache_bytes": None if kv_gb is None else int(float(kv_gb) * GIB),
        "max_model_len": mml,
        "num_gpu_blocks": None if blocks is None else int(blocks),
        "block_size": block_size(system),
        "cuda_graph_max_size": int(system.get("cuda_graph_max_size") or 0),
        "non_torch_bytes": int(float(system.get("non_torch_gb") or 0) * GIB),
    }


def run_capacity(args: Mapping[str, Any], limits: BatchLimits | None = None) -> KVCapacity:
    """:func:`sim.capacity.kv_capacity` of ``args``; an impossible cache is a ConfigError
    naming the key at fault (:func:`capacity_error_key`). Where the weights fit but the
    profile run's activations do not, ``limits`` (how the token budget was set) names the
    key to lower: ``system.max_num_seqs`` when the sampler's rows make the peak, else the
    budget when given, else ``system.max_model_len`` when vLLM v0's default took the budget
    from it."""
    try:
        return kv_capacity(**args)
    except ValueError as exc:
        text = str(exc)
        if not isinstance(exc, DoesNotFit) or exc.peak is None or limits is None:
            raise ConfigError(capacity_error_key(text, args), text) from None
        key, advice = "system.max_num_batched_tokens", "set it lower"
        if exc.peak == "sampler":
            key = "system.max_num_seqs"
        elif limits.tokens_source.startswith("max_model_len"):
            key, advice = (
                "system.max_model_len",
                (
                    "the budget defaults to max_model_len: set system.max_model_len (or "
                    "system.max_num_batched_tokens) lower"
                ),
            )
        # the key's advice before kv_capacity's other way out (more of the GPU)
        more = f"; or {exc.more_memory}" if exc.more_memory else ""
        raise ConfigError(key, f"{exc.problem}; {advice}{more}") from None


# Memory a run's system group reserves beside the weights: key -> kv_capacity argument.
_RESERVED = (
    ("system.non_torch_gb", "non_torch_bytes"),
    ("system.cuda_graph_max_size", "cuda_graph_max_size"),
)


def capacity_error_key(text: str, args: Mapping[str, Any]) -> str:
    """The key to blame for :func:`sim.capacity.kv_capacity`'s error ``text`` on ``args``:
    the given KV budget (``num_gpu_blocks`` or ``kv_cache_gb``) for a cache that cannot be;
    the tensor-parallel size for a split that cannot be; else a memory reservation of the
    system group without which the run would fit; else ``system.max_model_len`` (a derived
    cache smaller than one such sequence), ``gpu_memory_utilization`` (where more of the GPU
    would do), ``kv_cache_gb`` (a derived cache too small) or ``model`` (weights too
    large)."""
    about_cache = "KV cache" in text or "block" in text
    if about_cache and args["num_gpu_blocks"] is not None:
        return "num_gpu_blocks"
    if about_cache and args["kv_cache_bytes"] is not None:
        return "kv_cache_gb"
    if not about_cache and "tp=" in text:
        return "model.tp"
    for key, arg in _RESERVED:
        if args[arg] and _fits({**args, arg: 0}):
            return key
    if about_cache and "lower system.max_model_len" in text:
        return "system.max_model_len"
    if "raise gpu_memory_utilization" in text:
        return "gpu_memory_utilization"
    return "kv_cache_gb" if about_cache else "model"


def _fits(args: Mapping[str, Any]) -> bool:
    try:
        kv_capacity(**args)
    except ValueError:
        return False
    return True


def pool_slots(c: Mapping[str, Any], capacity: KVCapacity, model: ModelSpec) -> int:
    """The CPU swap pool's token slots (``swap_space_gb`` over the KV bytes of a token);
    a device or swap pool of more than :data:`~core.kv.block_pool.MAX_BLOCKS` blocks is a
    ConfigError naming the key that sized it."""
    bs = block_size(c["system"])
    per_token = capacity.bytes_per_token_per_gpu
    device_blocks = capacity.num_slots // bs
    if device_blocks > MAX_BLOCKS:
        key = next((k for k in ("num_gpu_blocks", "kv_cache_gb") if c.get(k) is not None), None)
        key = key or "hardware.memory_gb"
        raise ConfigError(
            key, f"a KV cache of {_count(device_blocks)} blocks: {_POOL_RULE}", lookup(c, key)
        )
    swap_gb = float(c.get("swap_space_gb", 4))
    cpu_slots = int(swap_gb * GIB // per_token)
    check_swap_pool(c["system"], cpu_slots // bs, c.get("swap_space_gb"))
    if cpu_slots // bs > MAX_BLOCKS:
        most = MAX_BLOCKS * bs * per_token / GIB
        raise ConfigError(
            "swap_space_gb",
            f"a CPU swap pool of {_count(cpu_slots // bs)} blocks: {_POOL_RULE}",
            c.get("swap_space_gb"),
            f"at most {most:.4g} GiB for {model.name} at block_size {bs}",
        )
    return cpu_slots


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**12 else f"{n:.3g}"


_POOL_RULE = (
    f"more than the {MAX_BLOCKS:,} blocks (2**{MAX_BLOCKS.bit_length() - 1}) a KV block pool "
    "holds (the simulator keeps state for every block)"
)
