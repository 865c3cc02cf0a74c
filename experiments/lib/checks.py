"""Configuration checks, in one place, run before any work starts.

A bad configuration raises :class:`ConfigError`, which the entry points print as ONE line::

    error: <key>: <problem> (got <value>; expected <what is valid>)

and exit non-zero without a traceback (``experiments.lib.cli``). The checks are a table:

- :data:`RULES`: one row per key (dotted path in the resolved config): which apps it applies
  to, a predicate on the value and what a valid value is. ``None`` (YAML ``null``) passes
  every rule; keys that must be set say so with ``required=True``.
- :data:`CROSS_CHECKS`: functions for what one key cannot say alone (a name that must be
  in a catalog, a trace file that must exist and hold requests, a KV budget that must fit
  the device). Each takes the config, the app and the :class:`Facts` of the run.

To check a new key, add a row (or a function) here; nothing else changes.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.defaults import DEFAULT_BLOCK_SIZE
from core.loop import PolicyError
from core.model_spec import DTYPE_BYTES, kv_bytes_per_token  # the one table of dtype widths
from core.sched.batch_defaults import BatchLimits, DeviceFacts, batch_limits
from core.workload.spec import FILE_KINDS, KINDS

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
GROUPS = ("model", "hardware", "workload", "system", "cost")
SLO_KEYS = ("ttft", "tpot", "itl", "e2el")


class _Unset:
    """Marks a value that is absent (not even null); pickles as itself."""

    def __reduce__(self) -> str:
        return "_UNSET"

    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


class ConfigError(ValueError):
    """A configuration that cannot run; ``line()`` is the one line the user sees."""

    def __init__(
        self, key: str, problem: str, got: Any = _UNSET, expected: str | None = None
    ) -> None:
        self.key, self.problem, self.got, self.expected = key, problem, got, expected
        super().__init__(self.line())

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across process pools
        return (type(self), (self.key, self.problem, self.got, self.expected))

    def line(self) -> str:
        detail = []
        if self.got is not _UNSET:
            detail.append(f"got {_show(self.got)}")
        if self.expected:
            detail.append(f"expected {self.expected}")
        tail = f" ({'; '.join(detail)})" if detail else ""
        return f"error: {self.key}: {self.problem}{tail}"


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if value == "???":  # OmegaConf's mark of a value the config leaves to the command line
        return "unset"
    return repr(value) if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class Facts:
    """What the checks need to know about the machine: the memory of the device the KV
    cache lives on and of the host that holds swapped blocks (None: unknown), and whether
    CUDA is available."""

    device_memory_bytes: int | None = None
    cuda_available: bool = False
    host_memory_bytes: int | None = None


# ---------------------------------------------------------------- predicates


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def positive(v: Any) -> bool:
    return _is_number(v) and v > 0


def non_negative(v: Any) -> bool:
    return _is_number(v) and v >= 0


def positive_int(v: Any) -> bool:
    return _is_int(v) and v > 0


def non_negative_int(v: Any) -> bool:
    return _is_int(v) and v >= 0


def at_least_one(v: Any) -> bool:
    return _is_number(v) and v >= 1


def power_of_two(v: Any) -> bool:
    return positive_int(v) and v & (v - 1) == 0


def fraction_open(v: Any) -> bool:
    """In (0, 1]."""
    return _is_number(v) and 0 < v <= 1


def fraction_low(v: Any) -> bool:
    """In [0, 1)."""
    return _is_number(v) and 0 <= v < 1


def one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda v: v in values


def is_text(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def auto_or_positive_int(v: Any) -> bool:
    """``auto`` or a whole number > 0 (``workload.max_total_tokens``)."""
    return v == "auto" or positive_int(v)


def module_name(v: Any) -> bool:
    """A dotted Python module name (``mypolicies`` or ``lab.policies.lifo``)."""
    return isinstance(v, str) and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", v) is not None


@dataclass(frozen=True)
class Rule:
    """``key`` must satisfy ``ok`` in the apps named in ``apps``."""

    key: str
    ok: Callable[[Any], bool]
    expected: str
    problem: str = "invalid value"
    apps: frozenset[str] = field(default_factory=lambda: frozenset({"simulate", "serve"}))
    required: bool = False
    nullable: bool = True  # False: a key that has no "null: default" meaning


# The most requests a synthetic workload may draw: every request is held in memory (about
# 1 KB each with its sequence state), so 10 million is ~10 GB; a day at 100 req/s is 8.6 M.
MAX_REQUESTS = 10_000_000

SIM = frozenset({"simulate"})
SERVE = frozenset({"serve"})
_POS = "a number > 0"
_POS_INT = "an integer > 0"
_FRACTION_OR_NULL = "a fraction in (0, 1] or null"

RULES: tuple[Rule, ...] = (
    Rule("seed", non_negative_int, "an integer >= 0", "not a seed", nullable=False),
    Rule(
        "workload.kind", one_of(*KINDS), f"one of {', '.join(KINDS)}", "unknown kind", required=True
    ),
    Rule("workload.rate", positive, f"{_POS} (requests/s) or null", "not a positive rate"),
    Rule("workload.duration_s", positive, f"{_POS} (seconds) or null", "not a positive duration"),
    Rule("workload.start_s", non_negative, "a number >= 0 (seconds) or null", "not a start time"),
    Rule("workload.num_requests", positive_int, f"{_POS_INT} or null", "not a positive count"),
    Rule("workload.time_scale", positive, _POS, "not a positive scale"),
    Rule("workload.burstiness", positive, _POS, "not a positive gamma shape"),
    Rule("workload.n", positive_int, _POS_INT, "not a positive sample count"),
    Rule("workload.beam_width", positive_int, _POS_INT, "not a positive beam width"),
    Rule("workload.temperature", non_negative, "a number >= 0", "not a temperature"),
    Rule("workload.apply_filter", is_bool, "true or false", "not a boolean"),
    Rule(
        "workload.max_total_tokens",
        auto_or_positive_int,
        "auto (the served max_model_len), an integer > 0 (prompt + output tokens) or null",
        "not a token count",
    ),
    Rule("workload.with_token_ids", is_bool, "true or false", "not a boolean"),
    Rule("workload.vocab_size", positive_int, _POS_INT, "not a vocabulary size"),
    Rule("workload.hash_block_tokens", positive_int, f"{_POS_INT} (tokens)", "not a block size"),
    Rule("workload.prefix_len", non_negative_int, "an integer >= 0 (tokens)", "not a length"),
    Rule("workload.suffix_len_mean", at_least_one, "a number >= 1 (tokens)", "not a mean length"),
    Rule("workload.output_len_mean", at_least_one, "a number >= 1 (tokens)", "not a mean length"),
    Rule("workload.num_conversations", positive_int, f"{_POS_INT} or null", "not a count"),
    Rule("workload.rounds", positive_int, _POS_INT, "not a round count"),
    Rule("workload.think_time_s", non_negative, "a number >= 0 (seconds)", "not a time"),
    Rule("workload.max_prompt_len", positive_int, f"{_POS_INT} (tokens)", "not a length"),
    Rule("workload.max_output_len", positive_int, f"{_POS_INT} (tokens)", "not a length"),
    Rule("workload.sigma_input", positive, f"{_POS} or null (the dataset's)", "not a spread"),
    Rule("workload.sigma_output", positive, f"{_POS} or null (the dataset's)", "not a spread"),
    Rule(
        "workload.arrival",
        one_of("poisson", "gamma", "all_at_once"),
        "poisson, gamma or all_at_once",
        "unknown arrival process",
    ),
    Rule(
        "system.block_size",
        power_of_two,
        "a positive power of two (1, 2, 4, ..., 16, ...)",
        "not a positive power of two",
    ),
    Rule("system.max_num_seqs", positive_int, _POS_INT, "not a positive count"),
    Rule("system.max_num_batched_tokens", positive_int, _POS_INT, "not a positive count"),
    Rule(
        "system.max_model_len",
        positive_int,
        f"{_POS_INT} or null (the model's)",
        "not a positive length",
    ),
    Rule(
        "system.preemption_mode",
        one_of("recompute", "swap"),
        "recompute or swap",
        "unknown preemption mode",
    ),
    # no null: the shipped systems default differently (vllm_v1: on), and a null read as
    # false would turn the feature off without a word
    Rule("system.chunked_prefill", is_bool, "true or false", "not a boolean", nullable=False),
    Rule("system.watermark", fraction_low, "a fraction in [0, 1)", "not a fraction"),
    Rule("system.enable_prefix_caching", is_bool, "true or false", "not a boolean", nullable=False),
    Rule("system.plugin", module_name, "a module name (a.b.c) or null", "not a module name"),
    Rule("system.non_torch_gb", non_negative, "a number >= 0 (GiB per GPU)", "not a size"),
    Rule(
        "system.cuda_graph_max_size",
        non_negative_int,
        "an integer >= 0 (tokens; 0: no CUDA graphs)",
        "not a capture size",
    ),
    Rule(
        "model.tp", positive_int, f"{_POS_INT} (GPUs)", "not a positive GPU count", nullable=False
    ),
    Rule("kv_cache_gb", positive, f"{_POS} (GiB) or null (derived)", "KV budget must be positive"),
    Rule(
        "kv_budget_gb", positive, f"{_POS} (GiB) or null", "KV budget must be positive", apps=SERVE
    ),
    Rule(
        "gpu_memory_utilization",
        fraction_open,
        "a fraction in (0, 1]",
        "not a fraction",
        apps=SIM,
        nullable=False,
    ),
    Rule("swap_space_gb", non_negative, "a number >= 0 (GiB)", "not a size", nullable=False),
    Rule("num_replicas", positive_int, _POS_INT, "not a positive count", apps=SIM, nullable=False),
    Rule(
        "kv_budget_fraction",
        fraction_open,
        "a fraction in (0, 1] or null",
        "not a fraction",
        apps=SERVE,
    ),
    Rule(
        "threads",
        positive_int,
        f"{_POS_INT} or null (torch's default)",
        "not a thread count",
        apps=SERVE,
    ),
    Rule("device", one_of("cpu", "cuda"), "cpu or cuda", "unknown device", apps=SERVE),
    Rule(
        "dtype",
        one_of("float32", "float16", "bfloat16"),
        "float32, float16 or bfloat16",
        "unknown dtype",
        apps=SERVE,
    ),
    Rule(
        "backend",
        one_of("torch", "triton"),
        "torch or triton",
        "unknown attention backend",
        apps=SERVE,
    ),
    Rule("mode", one_of("online", "offline"), "online or offline", "unknown mode", apps=SERVE),
    Rule("clock", one_of("virtual", "wall"), "virtual or wall", "unknown clock", apps=SERVE),
    Rule(
        "step_timer",
        one_of("wall", "thread_cpu"),
        "wall or thread_cpu",
        "unknown step timer",
        apps=SERVE,
    ),
    Rule(
        "time_phases",
        is_bool,
        "true, false or null (on CPU only)",
        "not a boolean",
        apps=SERVE,
    ),
    Rule("warmup", is_bool, "true, false or null (on CUDA only)", "not a boolean", apps=SERVE),
    Rule("progress", is_bool, "true, false or null", "not a boolean"),
    Rule(
        "check_integrity_every",
        non_negative_int,
        "an integer >= 0 (steps; 0: never)",
        "not a step count",
        nullable=False,
    ),
    Rule("num_gpu_blocks", positive_int, f"{_POS_INT} (KV blocks) or null", "not a block count"),
    Rule("cost.compute_efficiency", fraction_open, _FRACTION_OR_NULL, "not a fraction"),
    Rule("cost.memory_efficiency", fraction_open, _FRACTION_OR_NULL, "not a fraction"),
    Rule("cost.per_step_overhead_s", non_negative, "a number >= 0 (s) or null", "not a time"),
    Rule("cost.allreduce_latency_s", non_negative, "a number >= 0 (s) or null", "not a time"),
    Rule("cost.peer_link_efficiency", fraction_open, _FRACTION_OR_NULL, "not a fraction"),
    Rule("cost.path", is_text, "a file path or null", "not a path"),
    Rule("workload.dataset", is_text, "a dataset name (sharegpt, alpaca)", "not a name"),
)


def lookup(c: Mapping[str, Any], key: str) -> Any:
    """The value at dotted ``key`` (``_UNSET`` when a part is missing)."""
    node: Any = c
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _UNSET
        node = node[part]
    return node


def check_values(c: Mapping[str, Any], app: str) -> None:
    """Raise :class:`ConfigError` for the first key of ``c`` that breaks its rule in
    :data:`RULES` for ``app`` (the per-key part of :func:`check_config`)."""
    for rule in RULES:
        if app not in rule.apps:
            continue
        value = lookup(c, rule.key)
        if value is None and not rule.nullable:
            raise ConfigError(rule.key, "null is not a value here", None, rule.expected)
        if value is _UNSET or value is None:
            if rule.required:
                raise ConfigError(
                    rule.key, "missing", value if value is None else _UNSET, rule.expected
                )
            continue
        if not rule.ok(value):
            raise ConfigError(rule.key, rule.problem, value, rule.expected)


# ---------------------------------------------------------------- cross checks


def hydra_search_dirs() -> list[Path]:
    """The folders a Hydra run's ``hydra.searchpath`` put on its search path (``file://``
    entries; ``configs/`` aside); empty outside a Hydra app."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    sources = HydraConfig.get().runtime.get("config_sources") or ()
    return [
        Path(str(s.get("path")))
        for s in sources
        if s.get("schema") == "file" and Path(str(s.get("path"))).resolve() != CONFIG_DIR
    ]


def policy_hint(choice: Any) -> str:
    """The end of an unknown system ``choice``'s line: both ways to run a policy of one's
    own, alone through ``system.plugin`` and ``system.name``, or as an option of the system
    group (a sweep beside other systems) through a system YAML on ``hydra.searchpath``."""
    return (
        "or a policy of your own: system.plugin=<module> system.name=<its name> on the "
        "shipped system it builds on, or, to sweep it beside other systems, "
        f"<dir>/system/{choice}.yaml naming it and its plugin, with "
        "hydra.searchpath=[file://<dir>] (README: A policy of your own)"
    )


# the end of an unregistered system.name's line: a YAML of settings names a shipped system
VARIANT_HINT = (
    "a setting of a shipped system (prefix caching off, another block size, ...) keeps its "
    "name in a system YAML of its own (name: vllm_v1), whose file's name labels its runs "
    "(README: Comparing settings of one system)"
)


def misplaced(group: str, choice: Any, search: Sequence[Path] = ()) -> str | None:
    """Where a folder of ``search`` holds ``<choice>.yaml`` outside its ``<group>/``
    subfolder, which Hydra does not read: where it belongs instead; None where none does."""
    for folder in search:
        flat = Path(folder) / f"{choice}.yaml"
        if not flat.is_file():
            continue
        if Path(folder).name == group:  # the group's own folder put on the path
            return (
                f"found {flat}: put its parent folder on hydra.searchpath "
                f"(file://{Path(folder).parent}), not {folder}"
            )
        return f"found {flat}: move it to {Path(folder) / group / flat.name}"
    return None


def how_to_add(group: str, choice: Any, search: Sequence[Path] = ()) -> str:
    """The end of an unknown ``model``'s or ``hardware``'s line: how a user adds one (a
    ``<dir>/<group>/<choice>.yaml``, ``<dir>`` on ``hydra.searchpath``); where a folder of
    ``search`` holds ``<choice>.yaml`` outside its ``<group>/`` subfolder, where it belongs
    instead (:func:`misplaced`)."""
    found = misplaced(group, choice, search)
    if found is not None:
        return found
    return (
        f"or add <dir>/{group}/{choice}.yaml, run with hydra.searchpath=[file://<dir>] "
        f"{group}={choice} (README: GPUs and models are data)"
    )


def system_hint(choice: Any, search: Sequence[Path] = ()) -> str:
    """The end of an unknown ``system=<choice>``'s line: where a folder of ``search`` holds
    ``<choice>.yaml`` outside its ``system/`` subfolder, where it belongs
    (:func:`misplaced`); else :func:`policy_hint`."""
    found = misplaced("system", choice, search)
    return policy_hint(choice) if found is None else found


def hardware_origin() -> str | None:
    """Where a Hydra run's ``hardware`` group came from, for its errors: the file of Hydra's
    choice for the group (a user's YAML on ``hydra.searchpath`` by its path, a shipped one as
    ``hardware/<name>.yaml``), or ``hardware=<choice>`` where no file is found; None outside
    a Hydra app or without a choice."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    runtime = HydraConfig.get().runtime
    choice = (runtime.get("choices") or {}).get("hardware")
    if not choice:
        return None
    for source in runtime.get("config_sources") or ():
        if source.get("schema") != "file":
            continue
        path = Path(str(source.get("path"))) / "hardware" / f"{choice}.yaml"
        if path.is_file():
            shipped = path.resolve().parent == (CONFIG_DIR / "hardware").resolve()
            where = f"hardware/{path.name}" if shipped else str(path)
            return f"{where} or hardware.* overrides"
    return f"hardware={choice}"


def run_gpu(hardware: Mapping[str, Any] | None) -> Any:
    """The run's GPU (:func:`sim.catalog.resolve_gpu`, errors naming the file Hydra chose,
    :func:`hardware_origin`); a group that describes no GPU is a ConfigError naming the key
    at fault."""
    from sim.catalog import HardwareError, resolve_gpu

    try:
        return resolve_gpu(hardware, hardware_origin())
    except KeyError:
        name = (hardware or {}).get("name")
        search = hydra_search_dirs()
        valid = f"one of {', '.join(options('hardware', search))}; "
        raise ConfigError(
            "hardware", "unknown hardware", name, valid + how_to_add("hardware", name, search)
        ) from None
    except HardwareError as exc:
        raise ConfigError(f"hardware.{exc.key}" if exc.key else "hardware", str(exc)) from None


def check_catalog(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """The model and hardware resolve (a catalog name, or numbers of their own), the
    system's plugin imports (``system.plugin``) and the system name exists."""
    from core.systems import SYSTEMS, SystemConfigError, load_plugin, plugin_of
    from sim.catalog import MODEL_GROUP_KEYS, model_from_config, model_key

    model = c.get("model") or {}
    unknown = [str(k) for k in model if k not in MODEL_GROUP_KEYS]
    if unknown:  # a misspelt key of a model YAML would be ignored (e.g. tp run as 1)
        raise ConfigError(
            f"model.{unknown[0]}",
            f"not a key of the model group (a model YAML holds {', '.join(MODEL_GROUP_KEYS)};"
            " the model's HF config.json keys go under shape)",
        )
    try:
        model_from_config(model)
    except KeyError:
        search = hydra_search_dirs()
        valid = f"one of {', '.join(options('model', search))}, an HF id in the catalog; "
        hint = how_to_add("model", model.get("name"), search)
        raise ConfigError("model", "unknown model", model.get("name"), valid + hint) from None
    except (ValueError, OSError) as exc:
        raise ConfigError(model_key(model), str(exc)) from None
    except TypeError as exc:  # e.g. a number of the shape given as text
        raise ConfigError(
            model_key(model), f"a value of the model's shape has the wrong type ({exc})"
        ) from None
    hardware = c.get("hardware") or {}
    if app == "simulate" or hardware.get("name") is not None:
        run_gpu(hardware)
    plugin = lookup(c, "system.plugin")
    plugin = None if plugin is _UNSET or not plugin else str(plugin)  # a config from before it
    try:
        load_plugin(plugin)
    except SystemConfigError as exc:
        raise ConfigError("system.plugin", str(exc)) from None
    system = lookup(c, "system.name")
    registered = [name for name in SYSTEMS if plugin and plugin_of(name) == plugin]
    if system not in SYSTEMS:
        problem = "unknown system"
        expected = "one of " + ", ".join(SYSTEMS)
        if plugin:
            problem += f" (plugin {plugin!r} registered {', '.join(registered) or 'none'})"
        else:
            expected += "; " + policy_hint(system) + "; " + VARIANT_HINT
        raise ConfigError("system", problem, system, expected)
    if registered and system not in registered:  # the plugin's policy would not run
        raise ConfigError("system.name", f"plugin {plugin!r} registers {', '.join(registered)}; "
                          f"{system!r} is not one of them", system)  # fmt: skip
    owner = plugin_of(system)
    if owner is not None and owner != plugin:  # loaded by another job of this process
        raise ConfigError("system.plugin", f"system {system!r} comes from a plugin",
                          plugin, owner)  # fmt: skip


def plugin_failure(exc: Exception, c: Mapping[str, Any]) -> ConfigError | None:
    """``exc`` (a :class:`~sim.driver.SimulationError` or
    :class:`~engine.engine.EngineError`) as one line naming ``system.plugin`` when a policy
    plugin's scheduler broke the step loop's contract (its cause a
    :class:`~core.loop.PolicyError`); None otherwise (a shipped scheduler's stall is kvlab's
    bug: its traceback is kept)."""
    plugin = lookup(c, "system.plugin")
    if not (isinstance(exc.__cause__, PolicyError) and isinstance(plugin, str) and plugin):
        return None
    return ConfigError("system.plugin", f"the policy of plugin {plugin!r} failed: {exc}")


def check_workload_size(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """A synthetic workload needs exactly one of num_requests and duration_s, and draws at
    most :data:`MAX_REQUESTS`."""
    w = c.get("workload") or {}
    if w.get("kind") not in ("synthetic", "shared_prefix"):
        return
    n, d = w.get("num_requests"), w.get("duration_s")
    if n is None and d is None:
        raise ConfigError(
            "workload.num_requests",
            "the workload has no size",
            None,
            "workload.num_requests or workload.duration_s",
        )
    if n is not None and d is not None:
        raise ConfigError(
            "workload.duration_s",
            "give one of num_requests and duration_s",
            d,
            f"null when workload.num_requests={n}",
        )
    if w.get("rate") is None and n is None:
        raise ConfigError("workload.rate", "a duration needs a rate", None, _POS)
    drawn = n if n is not None else w["rate"] * d
    if drawn > MAX_REQUESTS:
        if n is not None:
            key, problem, got = "workload.num_requests", "too many requests to hold in memory", n
        else:
            key, got = "workload.rate", w["rate"]
            problem = f"rate x duration_s ({d}) is {drawn:.3g} requests, too many to hold in memory"
        raise ConfigError(key, problem, got, f"at most {MAX_REQUESTS:,} requests")


def check_sampling_width(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """A workload's ``n`` or ``beam_width`` (every request's) is at most the system's
    ``max_num_seqs``: a wider group can never be scheduled, so every request would be
    rejected. (A file's own wider request is rejected alone, with its reason.) A system that
    serves samples as requests of one (``core.systems.SystemSpec.sampling_fanout``:
    ``vllm_v1``) seats them one by one, so its ``n`` has no such limit."""
    from core.systems import SYSTEMS

    w = c.get("workload") or {}
    limit = _served_max_num_seqs(c, app)
    if not isinstance(limit, int) or isinstance(limit, bool):
        return
    spec = SYSTEMS.get(str((c.get("system") or {}).get("name")))
    fanout = spec is not None and spec.sampling_fanout == "requests"
    for key in ("beam_width",) if fanout else ("n", "beam_width"):
        width = w.get(key)
        if isinstance(width, int) and not isinstance(width, bool) and width > limit:
            raise ConfigError(
                f"workload.{key}", f"every request holds {width} sequences, more than "
                f"system.max_num_seqs={limit} can schedule", width,
                f"at most {limit}, or a larger system.max_num_seqs",
            )  # fmt: skip


def check_beam_search(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """A workload of beam search (``beam_width`` > 1) on a system that runs no beams in its
    engine (``core.systems.SystemSpec.beam_search``: ``vllm_v1``) is refused before anything
    is built: every request would be rejected. (A file's own beam request is rejected alone.)"""
    from core.systems import SYSTEMS

    width = (c.get("workload") or {}).get("beam_width")
    name = str((c.get("system") or {}).get("name"))
    spec = SYSTEMS.get(name)
    if isinstance(width, int) and width > 1 and spec is not None and not spec.beam_search:
        raise ConfigError(
            "workload.beam_width", f"{name} runs no beams in its engine, as vLLM V1, which "
            "searches beams on top of its engine, a request per beam per step (kvlab does not "
            "model that)", width, "1, or system=vllm for v0's in-engine beam search",
        )  # fmt: skip


def check_greedy_samples(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """A workload of ``n`` > 1 samples at a greedy ``temperature`` (below
    :data:`core.request.GREEDY_BELOW`) is refused before anything is built, as
    :class:`core.request.SamplingParams` refuses it (its samples would be one sequence)."""
    from core.request import GREEDY_BELOW, SamplingParams

    w = c.get("workload") or {}
    n, temperature = w.get("n"), w.get("temperature")
    if not (isinstance(n, int) and n > 1 and isinstance(temperature, (int, float))):
        return
    if temperature < GREEDY_BELOW:
        try:
            SamplingParams(n=n, temperature=float(temperature))
        except ValueError as exc:
            raise ConfigError("workload.temperature", str(exc)) from None


def _served_max_num_seqs(c: Mapping[str, Any], app: str) -> Any:
    """``system.max_num_seqs``, or where null the default the run will take
    (:func:`batch_limits_for`); None where that is read off a CUDA device as the engine
    starts."""
    system = c.get("system") or {}
    if system.get("max_num_seqs") is not None:
        return system["max_num_seqs"]
    if app == "simulate":
        device: DeviceFacts | None = gpu_facts(run_gpu(c.get("hardware")))
    elif str(c.get("device", "cpu")) == "cpu":
        device = None
    else:
        return None
    return batch_limits_for(system, 2, device).max_num_seqs


def batch_limits_for(
    system: Mapping[str, Any], max_model_len: int, device: DeviceFacts | None = None
) -> BatchLimits:
    """``system.max_num_seqs`` and ``system.max_num_batched_tokens``, each null one by
    vLLM's rule (:mod:`core.sched.batch_defaults`) for the system's vLLM version
    (``SystemSpec.batch_defaults``), the served ``max_model_len`` and the GPU (None: none,
    the engine on a CPU)."""
    from core.systems import get_system

    return batch_limits(
        system.get("max_num_seqs"),
        system.get("max_num_batched_tokens"),
        # a partial system group without a name (a caller's own) takes vLLM v0's
        get_system(str(system["name"])).batch_defaults if system.get("name") else "v0",
        max_model_len,
        device,
    )


def gpu_facts(gpu: Any) -> DeviceFacts:
    """A catalog GPU (:class:`sim.catalog.GPUSpec`) as vLLM's batch-limit rule reads a
    device: its name and total memory in GiB."""
    return DeviceFacts(gpu.name, gpu.total_memory_bytes / 1024**3)


def check_trace_file(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """A file workload names a readable, non-empty file (or a directory, for the kinds that
    read one)."""
    w = c.get("workload") or {}
    if w.get("kind") not in FILE_KINDS:
        return
    path = w.get("path")
    if path in (None, "???", ""):
        what = "a vLLM run directory" if w.get("kind") == "vllm_log" else "a trace file"
        raise ConfigError(
            "workload.path", f"workload kind {w.get('kind')!r} needs {what}", path,
            f"the path of {what}",
        )  # fmt: skip
    p = Path(str(path))
    tokens = w.get("tokens_path")
    if tokens is not None and not Path(str(tokens)).is_file():
        raise ConfigError(
            "workload.tokens_path", "no such file", str(tokens),
            "the workload JSONL that was sent (input_tok_ids per line), or null",
        )  # fmt: skip
    if p.is_dir():
        if w.get("kind") == "vllm_log":  # a run directory: its reader checks the files
            return
        raise ConfigError("workload.path", "a directory, not a file", str(path), "a trace file")
    if not p.is_file():
        if w.get("kind") == "vllm_log":
            raise ConfigError(
                "workload.path", "no such directory", str(path),
                "a vLLM run directory (requests.jsonl, meta.json)",
            )  # fmt: skip
        raise ConfigError("workload.path", "no such file", str(path), "an existing trace file")
    try:
        empty = not p.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(
            "workload.path",
            f"cannot read the file ({exc.strerror})",
            str(path),
            "a readable trace file",
        ) from None
    if empty:
        raise ConfigError("workload.path", "empty", str(path), "a trace file with requests")


def check_slo(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """``slo_ms`` maps ttft/tpot/itl/e2el to positive milliseconds."""
    slo = c.get("slo_ms")
    if slo is None:
        return
    expected = "a mapping like {ttft: 2000, tpot: 200} with keys " + ", ".join(SLO_KEYS)
    if not isinstance(slo, Mapping) or not slo:
        raise ConfigError("slo_ms", "not a mapping of SLOs", slo, expected)
    for key, limit in slo.items():
        if key not in SLO_KEYS:
            raise ConfigError(f"slo_ms.{key}", "unknown SLO", key, "one of " + ", ".join(SLO_KEYS))
        if not positive(limit):
            raise ConfigError(
                f"slo_ms.{key}", "not a positive limit", limit, f"{_POS} (milliseconds)"
            )


def check_kv_fits_device(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """An explicit KV budget fits the memory of the device(s) it lives on, and is given
    one way only."""
    gib = c.get("kv_cache_gb")
    if gib is not None and c.get("num_gpu_blocks") is not None:
        raise ConfigError(
            "num_gpu_blocks", "give one of num_gpu_blocks and kv_cache_gb",
            c["num_gpu_blocks"], f"null when kv_cache_gb={gib}",
        )  # fmt: skip
    if gib is None:
        return
    if app == "simulate":
        gpu = run_gpu(c["hardware"])
        tp = int(lookup(c, "model.tp") or 1)
        limit, where = gpu.total_memory_bytes * tp, f"{tp} x {gpu.name}"
    else:
        if facts.device_memory_bytes is None:
            return
        limit, where = facts.device_memory_bytes, f"the {c.get('device', 'cpu')} device"
    if gib * 1024**3 > limit:
        raise ConfigError(
            "kv_cache_gb",
            f"more than the memory of {where}",
            gib,
            f"at most {limit / 1024**3:.1f} GiB",
        )


def check_weights_fit_device(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """The engine's weights (parameters x dtype bytes) plus an explicit KV budget fit the
    device's memory: a model that cannot is refused before any tensor is made (on a CPU
    the kernel's out-of-memory killer would end the process, or another one, silently)."""
    if app != "serve" or facts.device_memory_bytes is None:
        return
    from sim.catalog import model_from_config

    spec = model_from_config(c["model"])
    width = DTYPE_BYTES.get(str(c.get("dtype", "float32")), 4)
    weights = spec.num_params() * width
    kv = float(c.get("kv_cache_gb") or 0) * 1024**3
    limit = facts.device_memory_bytes
    blocks = c.get("num_gpu_blocks")
    if blocks is not None:  # a pool of that many blocks of the run's size
        size = lookup(c, "system.block_size")
        block_size = size if isinstance(size, int) and size > 0 else DEFAULT_BLOCK_SIZE
        per_block = block_size * kv_bytes_per_token(spec, width)
        kv = float(blocks) * per_block
        if weights + kv > limit:
            raise ConfigError(
                "num_gpu_blocks",
                f"{blocks} blocks of {block_size} tokens need {kv / 1024**3:.1f} GiB of KV "
                f"besides {spec.name}'s {weights / 1024**3:.1f} GiB of weights, more than the "
                f"{limit / 1024**3:.1f} GiB of the {c.get('device', 'cpu')} device",
                blocks,
                f"at most {max(0, int((limit - weights) // per_block))}",
            )
    if weights + kv > limit:
        raise ConfigError(
            "model",
            f"{spec.name}'s weights need {weights / 1024**3:.1f} GiB in {c.get('dtype', 'float32')}"
            f"{f' (+ {kv / 1024**3:.1f} GiB of KV)' if kv else ''}, more than the "
            f"{limit / 1024**3:.1f} GiB of the {c.get('device', 'cpu')} device",
            spec.name,
            "a smaller model (model=tiny-opt, opt-125m, ...) or a device with more memory",
        )


def check_swap_fits_host(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """The engine's swap space (pinned host memory for swapped-out blocks) fits the host's
    memory: a larger one is refused before the allocation fails."""
    gib = c.get("swap_space_gb")
    if app != "serve" or facts.host_memory_bytes is None or not gib:
        return
    limit = facts.host_memory_bytes
    if float(gib) * 1024**3 > limit:
        raise ConfigError(
            "swap_space_gb",
            f"more than the {limit / 1024**3:.1f} GiB of host memory",
            gib,
            f"at most {limit / 1024**3:.1f} GiB",
        )


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")  # what engine.weights.load_checkpoint reads


def check_checkpoint(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """``model.path`` (serve) names a weights file or a folder holding one."""
    path = lookup(c, "model.path")
    if app != "serve" or path in (_UNSET, None, ""):
        return
    p = Path(str(path))
    expected = "a local HF checkpoint: a folder with *.safetensors, *.bin or *.pt, or such a file"
    if not p.exists():
        raise ConfigError("model.path", "no such file or folder", str(path), expected)
    if p.is_dir() and not any(f.suffix in WEIGHT_SUFFIXES and f.is_file() for f in p.iterdir()):
        raise ConfigError("model.path", "no weights in the folder", str(path), expected)


def check_engine_device(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """The engine can run on the requested device with the requested backend."""
    if app != "serve":
        return
    device = c.get("device", "cpu")
    if device == "cuda" and not facts.cuda_available:
        raise ConfigError("device", "CUDA is not available on this machine", device, "cpu")
    if (
        c.get("backend") == "triton"
        and device == "cpu"
        and os.environ.get("TRITON_INTERPRET") != "1"
    ):
        raise ConfigError(
            "backend",
            "Triton on CPU needs its interpreter",
            "triton",
            "backend=torch on CPU, or TRITON_INTERPRET=1 in the environment",
        )
    if c.get("step_timer") == "thread_cpu":
        if device != "cpu":
            raise ConfigError("step_timer", "thread CPU time times a CPU engine", device, "wall")
        if c.get("threads") != 1:
            raise ConfigError(
                "step_timer",
                "thread CPU time misses the work of other torch threads",
                f"threads={c.get('threads')}",
                "threads=1",
            )
        if c.get("clock") == "wall":
            raise ConfigError("step_timer", "clock=wall runs in real time", "thread_cpu", "wall")
    if c.get("kv_budget_fraction") is not None and device != "cuda":
        raise ConfigError(
            "kv_budget_fraction",
            "a fraction of free memory needs a CUDA device",
            c["kv_budget_fraction"],
            "kv_cache_gb on CPU",
        )
    if lookup(c, "model.tp") not in (_UNSET, None, 1):
        raise ConfigError("model.tp", "the engine runs on one device", lookup(c, "model.tp"), "1")
    if c.get("dtype") == "bfloat16" and device == "cpu":
        raise ConfigError(
            "dtype", "bfloat16 runs on GPU only", "bfloat16", "float32 or float16 on CPU"
        )


def check_paged_only(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """Swap preemption, chunked prefill and prefix caching on a system that is not paged, and
    swap preemption on one that allocates prompts chunk by chunk (``vllm_v1``: vLLM V1 has
    no swap), refused before anything is built, by core's rule
    (``core.systems.paged_only_problem``)."""
    from core.systems import paged_only_problem

    system = c.get("system") or {}
    problem = paged_only_problem(
        str(system["name"]),
        preemption_mode=str(system.get("preemption_mode", "recompute")),
        chunked_prefill=system.get("chunked_prefill") is True,
        enable_prefix_caching=system.get("enable_prefix_caching") is True,
    )
    if problem is not None:
        raise ConfigError(f"system.{problem[0]}", problem[1])


# The keys each cost kind reads besides ``kind`` (experiments.lib.setup.make_cost_model);
# any other key given a value is refused.
COST_KEYS: dict[str, tuple[str, ...]] = {
    "roofline": (
        "compute_efficiency", "memory_efficiency", "per_step_overhead_s", "allreduce_latency_s",
        "peer_link_efficiency", "stack", "stack_path", "dtype_bytes", "block_size",
    ),
    "profiled": (
        "profile", "stack", "stack_path", "dtype_bytes", "block_size", "allreduce_latency_s",
        "peer_link_efficiency", "per_step_overhead_s",
    ),
    "calibrated": ("path",),
}  # fmt: skip


def check_cost_keys(kind: str, cost_cfg: Mapping[str, Any]) -> None:
    """Refuse a key of the ``cost`` group (``kind`` aside) that cost=``kind`` does not read
    (:data:`COST_KEYS`) and that is set (not null): it would be ignored, or fail deep in the
    model's constructor. An unknown kind is left to :func:`sim.cost.build_cost_model`."""
    known = COST_KEYS.get(kind)
    if known is None:
        return
    for key, value in cost_cfg.items():
        if key not in (*known, "kind") and value is not None:
            raise ConfigError(
                f"cost.{key}", f"cost={kind} takes no such key (known: {', '.join(known)})", value
            )


def check_cost_group(c: Mapping[str, Any], app: str, facts: Facts) -> None:
    """The simulator's ``cost`` group is there and holds only keys its kind reads
    (:func:`check_cost_keys`). A config without one that holds the engine's keys is a
    ``serve`` run's (its ``config.yaml`` given to ``simulate``), and is said to be."""
    if app != "simulate":
        return
    cost = c.get("cost")
    if isinstance(cost, Mapping):
        check_cost_keys(str(cost.get("kind", "roofline")), cost)
        return
    serve_keys = [k for k in ("device", "dtype", "backend", "step_timer") if k in c]
    cure = "cost=roofline (or another cost option)"
    if serve_keys:
        cure = (
            "a config of experiments.simulate: this one is experiments.serve's (it has "
            f"{', '.join(serve_keys)}); run it again with python -m experiments.serve"
        )
    raise ConfigError("cost", "the simulator's cost model is missing", cost, cure)


def check_swap_pool(system: Mapping[str, Any], cpu_blocks: int, swap_gb: Any) -> None:
    """``preemption_mode=swap`` with a CPU swap pool of no whole block (``swap_space_gb`` 0,
    or less than a block's bytes): every preemption would recompute (a group the pool
    cannot take is recomputed, :mod:`core.sched.vllm`), so the run would be a recompute
    run under the name of a swap one; refused. Called where the pool's blocks are known."""
    if system.get("preemption_mode") == "swap" and cpu_blocks < 1:
        raise ConfigError(
            "swap_space_gb",
            "system.preemption_mode=swap with a CPU swap pool of no whole KV block: every "
            "preemption would recompute",
            swap_gb,
            "a pool of at least one block, or system.preemption_mode=recompute",
        )


CROSS_CHECKS: tuple[Callable[[Mapping[str, Any], str, Facts], None], ...] = (
    check_catalog,
    check_paged_only,
    check_workload_size,
    check_sampling_width,
    check_beam_search,
    check_greedy_samples,
    check_trace_file,
    check_slo,
    check_cost_group,
    check_kv_fits_device,
    check_engine_device,
    check_weights_fit_device,
    check_swap_fits_host,
    check_checkpoint,
)


def check_config(c: Mapping[str, Any], app: str, facts: Facts | None = None) -> None:
    """Raise :class:`ConfigError` for the first problem of ``c`` (a resolved config of
    ``app``: ``simulate`` or ``serve``)."""
    check_values(c, app)
    for check in CROSS_CHECKS:
        check(c, app, facts or Facts())


# ---------------------------------------------------------------- command line


def options(group: str, extra_dirs: Sequence[Path] = ()) -> list[str]:
    """The options of a config group (files in ``configs/<group>/`` and in ``<dir>/<group>/``
    of each of ``extra_dirs``, ``_``-files excluded)."""
    found = {
        p.stem
        for folder in (CONFIG_DIR, *extra_dirs)
        for p in (Path(folder) / group).glob("*.yaml")
        if not p.stem.startswith("_")
    }
    return sorted(found)
