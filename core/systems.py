"""System presets: a scheduling policy paired with a KV-cache manager (vLLM paper §6.1).

==================  ==========================  ===============================
system              scheduler                   KV-cache manager
==================  ==========================  ===============================
vllm                paged continuous batching   paged blocks (block_size 16)
vllm_v1             the same policy with        paged blocks, prefix caching
                    today's vLLM defaults:
                    chunked prefill, mixed
                    steps (configs/system)
orca_max            iteration-level (Orca)      contiguous, reserve max_model_len
orca_pow2           iteration-level (Orca)      contiguous, reserve pow2(output)
orca_oracle         iteration-level (Orca)      contiguous, reserve true output
fastertransformer   request-level               contiguous, reserve max_model_len
==================  ==========================  ===============================

``build_scheduler`` is what both the simulator and the engine call, so the two bodies
run the very same policy objects.

A policy of one's own is a plugin: a module that subclasses :class:`BaseScheduler` (a
``schedule``; queues, admission and ``update`` are shared) and calls
:func:`register_system` with a :class:`SystemSpec` pairing it with paged or contiguous KV.
``system.plugin=<module>`` (:func:`load_plugin`) imports it, and ``system.name`` picks the
registered name, in the simulator and the engine alike. A spec's ``manager`` swaps in a KV-cache
manager of one's own, a subclass of the shipped paged or contiguous one (:func:`build_manager`
builds it wherever a scheduler is built).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from core.defaults import DEFAULT_BLOCK_SIZE, DEFAULT_WATERMARK
from core.kv.base import KVCacheManager
from core.kv.contiguous import POLICIES, ContiguousKVCacheManager
from core.kv.paged import PagedKVCacheManager
from core.sched.base import BaseScheduler, SchedulerConfig
from core.sched.batch_defaults import VERSIONS as BATCH_DEFAULT_VERSIONS
from core.sched.batch_defaults import batch_limits
from core.sched.fastertransformer import FasterTransformerScheduler
from core.sched.orca import OrcaScheduler
from core.sched.vllm import VLLMScheduler


class SystemConfigError(ValueError):
    """Unknown system name or an impossible system configuration."""


@dataclass(frozen=True, slots=True)
class SystemSpec:
    name: str
    scheduler: type[BaseScheduler]
    kv: str  # "paged" or "contiguous"
    reservation: str | None = None  # contiguous policy
    # paged, prefix caching: index a block when its step is scheduled (vLLM V1's
    # KVCacheManager.allocate_slots caches the full blocks of the tokens it allocates for)
    cache_scheduled_blocks: bool = False
    # paged, chunked prefill: a prompt's blocks come chunk by chunk, as each step schedules
    # it (vLLM V1's allocate_slots), not whole at admission (vLLM v0)
    allocate_per_chunk: bool = False
    # paged: a preempted group of several live sequences is swapped whatever
    # preemption_mode says (vLLM v0); False: it follows preemption_mode, as in vLLM V1,
    # which has no swap and serves a request's n samples as requests of their own
    swap_groups: bool = True
    # how a request of n > 1 parallel samples is served: "group", one sequence group whose
    # prompt is computed once and then forked, the samples sharing its blocks copy-on-write
    # (vLLM v0); "requests", n requests of one sample each (core.request.ParentRequest), each
    # admitted, preempted and finished on its own and sharing the prompt's full blocks only
    # through the prefix cache (vLLM V1's ParentRequest, vllm/v1/engine/parallel_sampling.py)
    sampling_fanout: str = "group"
    # whether a request may search beams in the engine (fork + copy-on-write, vLLM v0).
    # vLLM V1 runs beam search on top of its engine, a 1-token request per beam per step
    # (vllm-project/vllm PRs 8726 and 9296, since 0.6.3), which kvlab does not model, so
    # vllm_v1 rejects a beam request rather than price v0's in-engine beams as today's vLLM
    beam_search: bool = True
    # the serving stack around the policy (sim.cost.overhead's presets) that cost=profiled
    # prices it in unless cost.stack is given: the paper's 2023 eager stack; vLLM V1's CUDA
    # graphs and async scheduling for vllm_v1
    stack: str = "vllm-2023"
    # whose defaults null batch limits take (core.sched.batch_defaults): vLLM v0's, or
    # vllm serve's (V1) for the run's GPU
    batch_defaults: str = "v0"
    # what the system does when the caller of build_scheduler / LLMEngine gives no
    # SchedulerConfig, watermark or prefix-caching switch (configs/system/<name>.yaml sets
    # the same; tests/test_systems_defaults.py holds the two alike)
    chunked_prefill: bool = False
    watermark: float = DEFAULT_WATERMARK
    enable_prefix_caching: bool = False
    # a KV-cache manager of one's own, built instead of the shipped one with the arguments
    # build_manager gives it: a PagedKVCacheManager subclass for kv="paged", a
    # ContiguousKVCacheManager subclass for kv="contiguous"; None: the shipped class
    manager: type[PagedKVCacheManager] | type[ContiguousKVCacheManager] | None = None


SYSTEMS: dict[str, SystemSpec] = {
    "vllm": SystemSpec("vllm", VLLMScheduler, "paged"),
    "vllm_v1": SystemSpec(
        "vllm_v1",
        VLLMScheduler,
        "paged",
        cache_scheduled_blocks=True,
        allocate_per_chunk=True,
        swap_groups=False,
        sampling_fanout="requests",
        beam_search=False,
        stack="vllm-v1",
        batch_defaults="v1",
        chunked_prefill=True,
        watermark=0.0,
        enable_prefix_caching=True,
    ),
    "orca_max": SystemSpec("orca_max", OrcaScheduler, "contiguous", "max"),
    "orca_pow2": SystemSpec("orca_pow2", OrcaScheduler, "contiguous", "pow2"),
    "orca_oracle": SystemSpec("orca_oracle", OrcaScheduler, "contiguous", "oracle"),
    "fastertransformer": SystemSpec(
        "fastertransformer", FasterTransformerScheduler, "contiguous", "max"
    ),
}


BUILT_IN = frozenset(SYSTEMS)
SAMPLING_FANOUTS = ("group", "requests")  # SystemSpec.sampling_fanout's values
# the shipped policies' classes: the tests hold their plans to plan_problem (core.loop checks
# only a plugin's at run time)
SHIPPED_SCHEDULERS = frozenset(spec.scheduler for spec in SYSTEMS.values())
# the managers a spec's kv names; a spec's own manager subclasses one of them
MANAGER_OF_KV: dict[str, type[PagedKVCacheManager] | type[ContiguousKVCacheManager]] = {
    "paged": PagedKVCacheManager,
    "contiguous": ContiguousKVCacheManager,
}
SHIPPED_MANAGERS = frozenset(MANAGER_OF_KV.values())
# system name -> the plugin module whose import registered it (load_plugin)
_PLUGIN_OF: dict[str, str] = {}
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def register_system(spec: SystemSpec) -> None:
    """Add ``spec`` to :data:`SYSTEMS` (a plugin's policy), so every name lookup finds it.
    Registering the same spec again is a no-op. Raises :class:`SystemConfigError` for a
    name a built-in or another spec holds, a ``kv`` other than ``paged`` / ``contiguous``,
    a scheduler that is not a :class:`BaseScheduler` subclass, that defines no ``schedule``
    or whose ``kv_kinds`` exclude ``kv`` (a vLLM-style scheduler over contiguous KV, an
    Orca-style one over paged blocks), or a ``reservation`` that is
    not one of the contiguous manager's policies (none for paged), and for paged-only
    options on a contiguous spec, a ``manager`` that is not a subclass of the manager its
    ``kv`` names (:data:`MANAGER_OF_KV`), or a name that is not letters, digits, ``_.-`` (it
    names run folders). A spec whose scheduler and manager are the held one's, by module and
    name, replaces it (a plugin imported again, e.g. reloaded in a notebook)."""
    if not _NAME.fullmatch(spec.name):
        raise SystemConfigError(f"system name {spec.name!r}: use letters, digits, '_', '.', '-'")
    held = SYSTEMS.get(spec.name)
    if held == spec:
        return
    if held is not None and not (spec.name not in BUILT_IN and _same_class(held, spec)):
        whose = "a built-in system" if spec.name in BUILT_IN else "another registered system"
        owner = _PLUGIN_OF.get(spec.name)
        if owner is not None:
            whose += f" (from plugin {owner!r})"
        raise SystemConfigError(f"system name {spec.name!r} is taken by {whose}")
    if spec.batch_defaults not in BATCH_DEFAULT_VERSIONS:
        raise SystemConfigError(
            f"system {spec.name!r}: batch_defaults {spec.batch_defaults!r} is not one of "
            f"{', '.join(BATCH_DEFAULT_VERSIONS)}"
        )
    if spec.sampling_fanout not in SAMPLING_FANOUTS:
        raise SystemConfigError(
            f"system {spec.name!r}: sampling_fanout {spec.sampling_fanout!r} is not one of "
            f"{', '.join(SAMPLING_FANOUTS)}"
        )
    if not (isinstance(spec.scheduler, type) and issubclass(spec.scheduler, BaseScheduler)):
        raise SystemConfigError(
            f"system {spec.name!r}: scheduler {spec.scheduler!r} is not a BaseScheduler subclass"
        )
    if spec.scheduler.schedule is BaseScheduler.schedule:
        raise SystemConfigError(
            f"system {spec.name!r}: scheduler {spec.scheduler.__name__} defines no schedule"
        )
    if spec.kv not in spec.scheduler.kv_kinds and spec.kv in ("paged", "contiguous"):
        raise SystemConfigError(
            f"system {spec.name!r}: scheduler {spec.scheduler.__name__} runs over "
            f"{' or '.join(spec.scheduler.kv_kinds)} KV (its kv_kinds), not {spec.kv}"
        )
    manager_problem = _manager_problem(spec)
    if manager_problem is not None:
        raise SystemConfigError(f"system {spec.name!r}: {manager_problem}")
    if spec.kv == "paged":
        if spec.reservation is not None:
            raise SystemConfigError(f"system {spec.name!r}: a paged system takes no reservation")
        if spec.allocate_per_chunk and spec.swap_groups:
            raise SystemConfigError(
                f"system {spec.name!r}: allocate_per_chunk preempts by recompute (vLLM V1 has "
                "no swap): set swap_groups=False"
            )
    elif spec.kv == "contiguous":
        if (spec.reservation or "max") not in POLICIES:
            raise SystemConfigError(
                f"system {spec.name!r}: reservation {spec.reservation!r} is not one of "
                f"{', '.join(POLICIES)}"
            )
        if spec.cache_scheduled_blocks or spec.allocate_per_chunk:
            raise SystemConfigError(f"system {spec.name!r}: block options need paged KV")
        if spec.sampling_fanout != "group":  # its manager holds KV by request id
            raise SystemConfigError(
                f"system {spec.name!r}: sampling_fanout {spec.sampling_fanout!r} needs paged KV"
            )
    else:
        raise SystemConfigError(
            f"system {spec.name!r}: kv {spec.kv!r} is not 'paged' or 'contiguous'"
        )
    SYSTEMS[spec.name] = spec


def _manager_problem(spec: SystemSpec) -> str | None:
    """What is wrong with ``spec.manager`` for its ``kv`` (None: nothing, or no manager of
    its own); a ``kv`` no manager serves is the caller's to refuse."""
    want = MANAGER_OF_KV.get(spec.kv)
    if spec.manager is None or want is None:
        return None
    if isinstance(spec.manager, type) and issubclass(spec.manager, want):
        return None
    what = spec.manager.__name__ if isinstance(spec.manager, type) else repr(spec.manager)
    return f"manager {what} is not a {want.__name__} subclass (kv={spec.kv!r})"


def _same_class(held: SystemSpec, spec: SystemSpec) -> bool:
    def key(s: SystemSpec) -> tuple[object, ...]:
        manager = s.manager or MANAGER_OF_KV.get(s.kv)
        classes = (s.scheduler, manager)
        return tuple(getattr(c, n, None) for c in classes for n in ("__module__", "__qualname__"))

    return key(held) == key(spec)


def _defined_in(spec: SystemSpec, module: str) -> bool:
    """Whether ``spec``'s scheduler or its own manager is a class of ``module``."""
    return spec.scheduler.__module__ == module or (
        spec.manager is not None and spec.manager.__module__ == module
    )


def load_plugin(module: str | None) -> None:
    """Import ``module`` (a dotted name importable from ``sys.path``; None: nothing), which
    registers its systems (:func:`register_system`) as it is imported; they are then
    :func:`plugin_of` it (so are systems of no plugin whose scheduler or manager class the
    module defines: the module was imported before, e.g. in a notebook, and registered them
    then). Raises :class:`SystemConfigError` naming the module when it cannot be imported,
    fails while it is (its error's type and message), or its registration fails."""
    if not module:
        return
    before = set(SYSTEMS)
    try:
        importlib.import_module(module)
    except SystemConfigError as exc:
        raise SystemConfigError(f"plugin {module!r}: {exc}") from None
    except ImportError as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name == module.split(".")[0]:
            hint = " (put the folder that holds it on PYTHONPATH, or run from that folder)"
        raise SystemConfigError(f"plugin {module!r} cannot be imported: {exc}{hint}") from None
    except Exception as exc:  # the plugin's own code failed as it ran
        raise SystemConfigError(
            f"plugin {module!r} failed while importing: {type(exc).__name__}: {exc}"
        ) from None
    for name in set(SYSTEMS) - before:
        _PLUGIN_OF[name] = module
    for name, spec in SYSTEMS.items():  # registered by an earlier plain import of the module
        if name not in BUILT_IN and name not in _PLUGIN_OF and _defined_in(spec, module):
            _PLUGIN_OF[name] = module


def plugin_of(name: str) -> str | None:
    """The plugin module whose import registered system ``name`` (:func:`load_plugin`);
    None for a built-in system or one registered from Python directly."""
    return _PLUGIN_OF.get(name)


def get_system(name: str) -> SystemSpec:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise SystemConfigError(
            f"unknown system {name!r}; choose one of {', '.join(SYSTEMS)}"
        ) from None


def paged_only_problem(
    system: str,
    preemption_mode: str = "recompute",
    chunked_prefill: bool = False,
    enable_prefix_caching: bool = False,
) -> tuple[str, str] | None:
    """The first option set that ``system`` cannot take, as ``(its key, why)``, or None.
    Swap preemption, chunked prefill and prefix caching need paged KV: a contiguous system
    reserves each request's KV at admission and never preempts. A system that allocates a
    prompt chunk by chunk (``vllm_v1``) preempts by recompute, as vLLM V1, which has no
    swap. The one rule for :func:`build_scheduler` and the experiments' config check."""
    spec = get_system(system)
    if spec.kv == "paged":
        if spec.allocate_per_chunk and preemption_mode == "swap":
            return "preemption_mode", (
                f"preemption_mode swap: {system} allocates a prompt chunk by chunk and "
                "preempts by recompute, as vLLM V1, which has no swap (system=vllm "
                "system.chunked_prefill=true swaps with chunked prefill)"
            )
        return None
    why = f"applies to paged systems only, not {system} (it reserves each request's KV at "
    why += "admission and never preempts)"
    if preemption_mode == "swap":
        return "preemption_mode", f"preemption_mode swap {why}"
    if chunked_prefill:
        return "chunked_prefill", f"chunked_prefill {why}"
    if enable_prefix_caching:
        return "enable_prefix_caching", f"prefix caching {why}"
    return None


def build_manager(
    spec: SystemSpec,
    num_slots: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_model_len: int = 2048,
    num_cpu_slots: int = 0,
    watermark: float | None = None,
    enable_prefix_caching: bool = False,
) -> KVCacheManager:
    """A KV-cache manager over ``num_slots`` device token slots (rounded down to whole
    blocks) and, for paged systems, ``num_cpu_slots`` of CPU swap space (``watermark``
    None: the spec's). Contiguous systems never swap and admit by whole reservations, so
    they ignore ``num_cpu_slots`` and ``watermark`` (experiments pass both to every
    system). The class built is ``spec.manager``, else the shipped one its ``kv`` names; a
    spec's own manager that fails to build is a :class:`SystemConfigError` naming it."""
    watermark = spec.watermark if watermark is None else watermark
    if block_size < 1 or block_size & (block_size - 1):
        raise SystemConfigError(f"block_size must be a power of two, got {block_size}")
    num_blocks = num_slots // block_size
    if num_blocks < 1:
        raise SystemConfigError(
            f"KV cache of {num_slots} slots holds no block of {block_size} slots"
        )
    problem = paged_only_problem(spec.name, enable_prefix_caching=enable_prefix_caching)
    if problem is not None:
        raise SystemConfigError(problem[1])
    cls = spec.manager or MANAGER_OF_KV[spec.kv]
    if spec.kv == "paged":
        args = dict(
            num_device_blocks=num_blocks,
            block_size=block_size,
            num_cpu_blocks=num_cpu_slots // block_size,
            watermark=watermark,
            enable_prefix_caching=enable_prefix_caching,
            cache_scheduled_blocks=spec.cache_scheduled_blocks,
            allocate_per_chunk=spec.allocate_per_chunk,
        )
    else:
        args = dict(
            capacity_slots=num_blocks * block_size,
            policy=spec.reservation or "max",
            max_model_len=max_model_len,
            block_size=block_size,
        )
    try:
        return cls(**args)  # type: ignore[arg-type]
    except Exception as exc:
        if cls in SHIPPED_MANAGERS:
            raise
        raise SystemConfigError(  # the plugin's own class failed as it was built
            f"system {spec.name!r}: manager {cls.__name__} cannot be built from "
            f"build_manager's arguments ({', '.join(args)}): {type(exc).__name__}: {exc}"
        ) from None


def default_config(system: str, max_model_len: int | None = None) -> SchedulerConfig:
    """The SchedulerConfig ``system`` runs with when none is given: its chunked-prefill
    switch and its batch limits by its version's rule for no known GPU
    (:func:`core.sched.batch_defaults.batch_limits`), at ``max_model_len`` (None:
    SchedulerConfig's)."""
    spec = get_system(system)
    mml = SchedulerConfig().max_model_len if max_model_len is None else max_model_len
    limits = batch_limits(None, None, spec.batch_defaults, mml)
    return SchedulerConfig(
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_model_len=mml,
        chunked_prefill=spec.chunked_prefill,
    )


def build_scheduler(
    system: str,
    num_slots: int,
    config: SchedulerConfig | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    num_cpu_slots: int = 0,
    watermark: float | None = None,
    enable_prefix_caching: bool = False,
) -> BaseScheduler:
    """The scheduler (owning its KV-cache manager) for a named system preset. What the
    caller leaves out is the system's own (:class:`SystemSpec`): ``config`` None is
    :func:`default_config`, ``watermark`` None the spec's. Prefix caching is on only when
    asked: it needs every request's token ids, which requests of lengths alone lack (the
    apps turn it on from the system's YAML, :attr:`SystemSpec.enable_prefix_caching`, when
    the workload carries them; the engine, whose requests always do, follows the spec)."""
    spec = get_system(system)
    config = config or default_config(system)
    watermark = spec.watermark if watermark is None else watermark
    problem = paged_only_problem(system, config.preemption_mode, config.chunked_prefill)
    if problem is not None:
        raise SystemConfigError(problem[1])
    manager = build_manager(
        spec,
        num_slots,
        block_size=block_size,
        max_model_len=config.max_model_len,
        num_cpu_slots=num_cpu_slots,
        watermark=watermark,
        enable_prefix_caching=enable_prefix_caching,
    )
    scheduler = spec.scheduler(manager, config)
    scheduler.swap_groups = spec.swap_groups
    scheduler.beam_search = spec.beam_search
    scheduler.sampling_fanout = spec.sampling_fanout
    scheduler.name = spec.name  # what its messages call it (a subclass may inherit "vllm")
    return scheduler
