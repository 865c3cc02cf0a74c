"""A vLLM run directory (``meta.json``, ``requests.jsonl``, ``timeseries.csv``) read into
what the simulator needs: the requests, kvlab's ``system`` config group for the engine's
settings, the KV blocks, and the simulation of the whole run on them. Anything the
simulator cannot price is refused by name (:class:`RunError`); nothing is guessed."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from core.kv.block_pool import MAX_BLOCKS
from core.mapping_file import read_mapping, yaml_error_place
from core.model_spec import DTYPE_BYTES as MODEL_DTYPE_BYTES
from core.model_spec import ModelSpec
from core.request import Request
from core.sched.base import SchedulerConfig
from core.workload import vllm_log as vllm_log_module
from core.workload.vllm_log import (
    LoggedRequest,
    check_dataset_hash,
    read_token_ids,
    read_vllm_log,
    requests_from_log,
)
from experiments.lib.checks import ConfigError
from experiments.lib.setup import block_size as system_block_size
from experiments.lib.setup import scheduler_config, scheduler_factory
from sim.capacity import kv_capacity
from sim.catalog import (
    GPUSpec,
    check_self_label,
    differing_fields,
    get_gpu,
    get_model,
    gpu_from_config,
    gpus,
)
from sim.cost import CostModel
from sim.driver import simulate

# vLLM's max_cudagraph_capture_size default (the shared run's meta.json), for a meta.json
# without a compilation_config.
CUDA_GRAPH_MAX_SIZE = 512
# kvlab's dtype widths plus the short names vLLM's --dtype also takes
DTYPE_BYTES = {**MODEL_DTYPE_BYTES, "half": 2, "float": 4}


class RunError(ValueError):
    """A run directory or option that cannot be used; the message names file and key."""


@dataclass
class VLLMRun:
    """A vLLM run directory read into what the simulator needs."""

    name: str
    meta: dict[str, Any]
    logged: list[LoggedRequest]
    requests: list[Request]
    system: dict[str, Any]
    max_model_len: int
    num_gpu_blocks: int | None
    tp: int
    dtype_bytes: int
    model_name: str
    device_memory_bytes: int | None
    gpu_memory_utilization: float
    cuda_graph_max_size: int
    timeseries: pd.DataFrame | None
    # prefix caching on but the log without prompt token ids: each prompt stands for ids of
    # its own (core.kv.paged.stand_in_prompt_id), so no prefix the run shared is found
    prefix_caching_without_ids: bool = False
    # vLLM's kv_cache_memory_bytes (per GPU): sizes the cache when no block count is recorded
    kv_cache_memory_bytes: int | None = None
    device_name: str | None = None  # hardware.device_name of meta.json
    meta_path: Path | None = None
    max_model_len_key: str = "engine_kwargs.max_model_len"  # meta.json's key it was read from
    notes: list[str] = field(default_factory=list)  # what the reader chose between
    model_key: str = "model"  # meta.json's key model_name was read from
    vocab_size: int | None = None  # the simulated model's; prompt ids outside it are rejected

    @property
    def sched_config(self) -> SchedulerConfig:
        return scheduler_config(self.system, self.max_model_len)

    @property
    def block_size(self) -> int:
        return system_block_size(self.system)


_REQUIRED: Any = object()  # a default that makes a missing key an error


def _meta_entry(
    meta: dict[str, Any], path: Path, *keys: str, default: Any = _REQUIRED
) -> tuple[str | None, Any]:
    """The first of ``keys`` (dotted paths into meta.json) present (not null), with its
    value; ``(None, default)`` when none is, or an error naming ``keys[0]`` when there is
    no ``default``. A path through a value that is not a JSON object (``kv_cache`` a list
    or a string) is an error naming that key, not an absent setting."""
    for key in keys:
        node = _meta_path_value(meta, path, key)
        if node is not None:
            return key, node
    if default is _REQUIRED:
        raise RunError(f"{path}: missing key {keys[0]!r}")
    return None, default


def _meta_path_value(meta: dict[str, Any], path: Path, key: str) -> Any:
    """The value at the dotted ``key`` of meta.json, None when a part is absent or null;
    a RunError naming the part when one on the way is not a JSON object."""
    node: Any = meta
    parts = key.split(".")
    for i, part in enumerate(parts):
        if node is None:
            return None
        if not isinstance(node, dict):
            where = ".".join(parts[:i])
            raise RunError(f"{path}: {where} must be a JSON object (read for {key}), got "
                           f"{_json_kind(node)}")  # fmt: skip
        node = node.get(part)
    return node


def _json_kind(value: Any) -> str:
    """What a JSON value is, for an error (short: not the value itself when it is large)."""
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, str):
        return f"the string {value!r}" if len(value) <= 40 else "a string"
    return repr(value) if isinstance(value, bool | int | float) else type(value).__name__


def _meta_value(meta: dict[str, Any], path: Path, *keys: str, default: Any = None) -> Any:
    """The first of ``keys`` (dotted paths into meta.json) present; ``default`` or an
    error naming the key when none is."""
    return _meta_entry(meta, path, *keys, default=_REQUIRED if default is None else default)[1]


def _whole(v: Any) -> bool:
    """A finite number without a fractional part (``256`` or ``256.0``; not a bool)."""
    ok = isinstance(v, int | float) and not isinstance(v, bool)
    return ok and math.isfinite(v) and v == int(v)


@dataclass(frozen=True, slots=True)
class _Kind:
    """What a meta.json setting must be: ``ok`` tests the JSON value, ``what`` says it for
    the error, ``convert`` makes the Python value."""

    ok: Callable[[Any], bool]
    what: str
    convert: Callable[[Any], Any]


WHOLE = _Kind(lambda v: _whole(v) and v >= 1, "a whole number >= 1", int)
WHOLE_OR_ZERO = _Kind(lambda v: _whole(v) and v >= 0, "a whole number >= 0", int)
BLOCK_COUNT = _Kind(
    lambda v: _whole(v) and 1 <= v <= MAX_BLOCKS,
    f"a whole number in [1, {MAX_BLOCKS}] (2**26, the most a block pool holds)", int,
)  # fmt: skip
BLOCK_SIZE = _Kind(
    lambda v: _whole(v) and v >= 1 and int(v) & (int(v) - 1) == 0,
    "a power of two >= 1 (16, 32, ...)", int,
)  # fmt: skip
FRACTION = _Kind(
    lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1,
    "a number in (0, 1]", float,
)  # fmt: skip
BOOLEAN = _Kind(lambda v: isinstance(v, bool), "true or false (a JSON boolean)", bool)
MODEL_NAME = _Kind(
    lambda v: isinstance(v, str) and v.strip() != "", "a model name or Hugging Face id (a string)",
    str,
)  # fmt: skip


def _meta_setting(
    meta: dict[str, Any], path: Path, kind: _Kind, *keys: str, default: Any = _REQUIRED
) -> Any:
    """The first of ``keys`` present, checked and converted as ``kind`` says; ``default``
    (returned as is) when none is, else an error naming ``keys[0]``. A value of the wrong
    kind is an error naming the key it was read from, e.g. ``<path>: kv_cache.num_gpu_blocks
    must be a whole number >= 1, got '2588'``."""
    key, value = _meta_entry(meta, path, *keys, default=default)
    if key is None:
        return default
    if not kind.ok(value):
        raise RunError(f"{path}: {key} must be {kind.what}, got {value!r}")
    return kind.convert(value)


def read_run(run_dir: Path, workload: Path | None = None) -> VLLMRun:
    """Read ``run_dir``'s meta.json, requests.jsonl and timeseries.csv. Each engine setting
    is read from ``engine_kwargs`` or ``kv_cache``, else from vLLM's ``resolved_config``,
    else (where vLLM has one) vLLM's default, and must be of its kind (whole numbers,
    booleans, a block size that is a power of two, a memory fraction in (0, 1]): a value
    that is not, or a key on the way that is not a JSON object, is an error naming meta.json
    and the key, never converted. ``model`` must be a string; timeseries.csv all numbers
    (:func:`read_timeseries`). A ``workload`` whose sha256 is not meta.json's
    ``dataset_hash`` gives a warning (:func:`~core.workload.vllm_log.check_dataset_hash`).
    The readers' warnings (a log shorter than meta.json's ``num_requests``, that hash,
    outputs shorter than their row's) are the run's ``notes``, not printed here."""
    with _reader_warnings() as warned:
        run = _read_run(Path(run_dir), workload)
    return replace(run, notes=[*warned, *run.notes])


@contextmanager
def _reader_warnings() -> Iterator[list[str]]:
    """The warnings :mod:`core.workload.vllm_log` logs in the block, kept in a list instead
    of printed (also when a Hydra app run earlier in the process disabled the logger)."""
    reader_log = logging.getLogger(vllm_log_module.__name__)
    kept: list[str] = []
    handler = _KeepMessages(kept)
    reader_log.addHandler(handler)
    propagate, reader_log.propagate = reader_log.propagate, False
    disabled, reader_log.disabled = reader_log.disabled, False
    try:
        yield kept
    finally:
        reader_log.removeHandler(handler)
        reader_log.propagate, reader_log.disabled = propagate, disabled


class _KeepMessages(logging.Handler):
    def __init__(self, kept: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.kept = kept

    def emit(self, record: logging.LogRecord) -> None:
        self.kept.append(record.getMessage())


def _read_run(run_dir: Path, workload: Path | None) -> VLLMRun:
    meta_path = run_dir / "meta.json"
    if not meta_path.is_file():
        raise RunError(f"{meta_path}: not found (a vLLM run directory holds meta.json)")
    try:
        meta = read_mapping(meta_path, json.loads, json.JSONDecodeError, "JSON", "a JSON object")
    except ValueError as e:
        raise RunError(str(e)) from None
    logged = read_vllm_log(run_dir)
    ids = None if workload is None else read_token_ids(workload, logged)
    if workload is not None:
        try:
            check_dataset_hash(workload, meta, meta_path)
        except OSError as e:
            raise RunError(f"{workload}: not readable ({e.strerror})") from None
    ek = "engine_kwargs"
    rc = "resolved_config"
    sc = f"{rc}.scheduler_config"
    cc = f"{rc}.cache_config"

    def setting(kind: _Kind, *keys: str, default: Any = _REQUIRED) -> Any:
        return _meta_setting(meta, meta_path, kind, *keys, default=default)

    dtype = _dtype(meta, meta_path)
    _refuse_unmodelled(meta, meta_path, dtype)
    prefix_keys = ("kv_cache.enable_prefix_caching", f"{ek}.enable_prefix_caching",
                   f"{cc}.enable_prefix_caching")  # fmt: skip
    max_len_keys = (f"{ek}.max_model_len", f"{rc}.model_config.max_model_len")
    max_len_key = _meta_entry(meta, meta_path, *max_len_keys)[0]
    max_len = setting(WHOLE, *max_len_keys)
    # the run as kvlab's system config group; vLLM v1 keeps no watermark
    system = {
        "name": "vllm_v1",
        "max_num_seqs": setting(WHOLE, f"{ek}.max_num_seqs", f"{sc}.max_num_seqs"),
        "max_num_batched_tokens": setting(
            WHOLE, f"{ek}.max_num_batched_tokens", f"{sc}.max_num_batched_tokens"
        ),
        "preemption_mode": "recompute",
        "chunked_prefill": setting(
            BOOLEAN, f"{ek}.enable_chunked_prefill", f"{sc}.enable_chunked_prefill", default=True
        ),
        "block_size": setting(BLOCK_SIZE, "kv_cache.block_size", f"{cc}.block_size", default=16),
        "watermark": 0.0,
        "enable_prefix_caching": setting(BOOLEAN, *prefix_keys, default=True),
    }
    try:
        scheduler_config(system, max_len)
    except ConfigError as e:
        raise RunError(f"{meta_path}: the run's scheduler settings cannot be simulated: "
                       f"{e.key.removeprefix('system.')}: {e.problem}") from None  # fmt: skip
    requests = requests_from_log(logged, ids)
    without_ids = bool(system["enable_prefix_caching"]) and any(
        r.prompt_token_ids is None for r in requests
    )
    blocks_keys = ("kv_cache.num_gpu_blocks", f"{cc}.num_gpu_blocks")
    blocks = setting(BLOCK_COUNT, *blocks_keys, default=None)
    if blocks is not None and blocks * system["block_size"] < max_len:
        raise RunError(
            f"{meta_path}: {max_len_key} {max_len} is more tokens than the KV cache holds "
            f"({_meta_entry(meta, meta_path, *blocks_keys)[0]} {blocks} blocks × "
            f"{system['block_size']} = {blocks * system['block_size']}): vLLM does not start so"
        )
    memory = setting(WHOLE, "hardware.device_total_memory_bytes", default=None)
    kv_bytes = setting(WHOLE, "kv_cache.kv_cache_memory_bytes", f"{cc}.kv_cache_memory_bytes",
                       default=None)  # fmt: skip
    utilization = setting(FRACTION, "kv_cache.gpu_memory_utilization",
                          f"{cc}.gpu_memory_utilization", default=0.9)  # fmt: skip
    eager = setting(BOOLEAN, f"{ek}.enforce_eager", f"{rc}.model_config.enforce_eager",
                    default=False)  # fmt: skip
    graphs = setting(WHOLE_OR_ZERO, f"{rc}.compilation_config.max_cudagraph_capture_size",
                     default=CUDA_GRAPH_MAX_SIZE)  # fmt: skip
    tp_keys = (f"{ek}.tensor_parallel_size", f"{rc}.parallel_config.tensor_parallel_size")
    tp = setting(WHOLE, *tp_keys, default=1)
    device = _meta_value(meta, meta_path, "hardware.device_name", default="")
    if not isinstance(device, str):
        raise RunError(f"{meta_path}: hardware.device_name must be a string, got {device!r}")
    model_keys = ("model", f"{ek}.model")
    return VLLMRun(
        name=run_dir.name,
        meta=meta,
        logged=logged,
        requests=requests,
        system=system,
        max_model_len=max_len,
        num_gpu_blocks=blocks,
        tp=tp,
        dtype_bytes=DTYPE_BYTES[dtype],
        model_name=setting(MODEL_NAME, *model_keys),
        device_memory_bytes=memory,
        gpu_memory_utilization=utilization,
        kv_cache_memory_bytes=kv_bytes,
        cuda_graph_max_size=0 if eager else graphs,
        timeseries=read_timeseries(run_dir / "timeseries.csv"),
        prefix_caching_without_ids=without_ids,
        device_name=device or None,
        meta_path=meta_path,
        max_model_len_key=max_len_key or max_len_keys[0],
        notes=_tp_notes(meta, meta_path, tp_keys, tp),
        model_key=_meta_entry(meta, meta_path, *model_keys)[0] or model_keys[0],
    )


def read_timeseries(ts_path: Path) -> pd.DataFrame | None:
    """``timeseries.csv`` (None when there is none), every cell a number: a table pandas
    cannot read, or a cell that is not a number, is a one-line RunError naming the file
    (and the line and column of the cell)."""
    if not ts_path.is_file():
        return None
    try:
        frame = pd.read_csv(ts_path, skip_blank_lines=False)
    except (ValueError, UnicodeDecodeError) as e:  # pandas' EmptyDataError and ParserError
        raise RunError(f"{ts_path}: not a CSV table ({' '.join(str(e).split())})") from None
    for column in frame.columns:
        numbers = pd.to_numeric(frame[column], errors="coerce")
        bad = numbers.isna() & frame[column].notna()
        if bad.any():
            row = int(bad.to_numpy().argmax())
            raise RunError(f"{ts_path}, line {row + 2}: {column} is "
                           f"{frame[column].iloc[row]!r}, not a number")  # fmt: skip
        frame[column] = numbers
    return frame


def _tp_notes(meta: dict[str, Any], meta_path: Path, keys: tuple[str, str], tp: int) -> list[str]:
    """A line for each of meta.json's other records of the tensor-parallel size that
    disagrees with the ``tp`` read (``keys[1]``; ``hardware.device_count`` when fewer
    devices than ``tp``), saying which is used."""
    notes = []
    used = _meta_entry(meta, meta_path, *keys, default=None)[0]
    if used == keys[0]:
        other = _meta_entry(meta, meta_path, keys[1], default=None)[1]
        if other is not None and other != tp:
            notes.append(f"{meta_path}: {keys[0]} {tp} and {keys[1]} {other!r} disagree: "
                         f"the run is simulated with tp={tp} ({keys[0]})")  # fmt: skip
    devices = _meta_entry(meta, meta_path, "hardware.device_count", default=None)[1]
    if devices is not None and not (_whole(devices) and devices >= 1):
        raise RunError(
            f"{meta_path}: hardware.device_count must be a whole number >= 1, got {devices!r}"
        )
    if devices is not None and devices < tp:
        where = used or "the default, no tensor_parallel_size being recorded"
        notes.append(f"{meta_path}: tensor-parallel size {tp} is more than "
                     f"hardware.device_count {devices!r}: the run is simulated with tp={tp} "
                     f"({where})")  # fmt: skip
    return notes


def _dtype(meta: dict[str, Any], meta_path: Path) -> str:
    """The weights' dtype: ``engine_kwargs.dtype``, or the resolved model config's when that
    is missing or vLLM's default ``auto``; bfloat16 when neither is recorded (older logs),
    an error when ``auto`` is not resolved."""
    key, resolved = "engine_kwargs.dtype", "resolved_config.model_config.dtype"
    dtype = str(_meta_value(meta, meta_path, key, resolved, default="bfloat16"))
    if dtype == "auto":  # vLLM's default: the resolved config says which it chose
        key = resolved
        dtype = str(_meta_value(meta, meta_path, key, default="auto"))
    dtype = dtype.removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise RunError(f"{meta_path}: {key} {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    return dtype


def _refuse_unmodelled(meta: dict[str, Any], meta_path: Path, dtype: str) -> None:
    """Settings the simulator cannot price, refused by name rather than ignored: a KV cache
    dtype other than the weights' ``dtype`` and pipeline or data parallelism."""
    ek, rc = "engine_kwargs", "resolved_config"
    for key in (f"{ek}.kv_cache_dtype", f"{rc}.cache_config.cache_dtype"):
        value = str(_meta_value(meta, meta_path, key, default="auto"))
        if value not in ("auto", dtype, f"torch.{dtype}"):
            raise RunError(f"{meta_path}: {key} is {value!r}: kvlab prices the KV cache in "
                           f"the weights' dtype only ({dtype})")  # fmt: skip
    for key in (f"{rc}.parallel_config.pipeline_parallel_size",
                f"{ek}.pipeline_parallel_size", f"{ek}.data_parallel_size",
                f"{rc}.parallel_config.data_parallel_size"):  # fmt: skip
        value = _meta_setting(meta, meta_path, WHOLE, key, default=1)
        if value != 1:
            raise RunError(
                f"{meta_path}: {key} is {value!r}: kvlab models one engine with tensor "
                "parallelism only (pipeline and data parallel size 1)"
            )


def resolve_model(arg: str | None, run: VLLMRun) -> ModelSpec:
    """``--model``: a catalog name or HF id, or a ``config.json`` path; default the run's
    model id from meta.json. A name the catalog does not know is a RunError naming where
    it came from (``--model``, or meta.json's key) and the catalog's names; a ``.json``
    path that is not there, a RunError saying so."""
    if arg is not None and Path(arg).exists():
        return check_self_label(ModelSpec.from_json(arg), arg)
    if arg is not None and Path(arg).suffix == ".json":
        raise RunError(f"--model {arg}: no such file (a config.json, or a model name or HF id)")
    try:
        return get_model(arg or run.model_name)
    except KeyError as e:
        problem = e.args[0] if e.args else "unknown model"
        if arg:
            raise RunError(f"--model {arg}: {problem}") from None
        where = f"{run.meta_path or 'meta.json'}: {run.model_key} {run.model_name!r}"
        raise RunError(f"{where}: {problem} (or pass --model NAME or a config.json path)") from None


def model_note(arg: str | None, run: VLLMRun, model: ModelSpec) -> str | None:
    """A note when ``--model`` resolved to another model than the one meta.json says the
    run served (another shape: its timings would be fitted to a model they were not
    measured on), or when meta.json's model is not in the catalog, so it could not be
    checked; None without ``--model`` or when the shapes match (a config.json of the
    run's own model)."""
    if arg is None:
        return None
    where = f"{run.meta_path or 'meta.json'}'s {run.model_key} {run.model_name!r}"
    try:
        served = get_model(run.model_name)
    except KeyError:
        return f"{where} is not in the model catalog: --model {arg} not checked against it"
    differs = differing_fields(model, served)
    if not differs:
        return None
    return (
        f"--model {arg} ({model.name}) is not the model the run served, {where} "
        f"({served.name} in the catalog; {', '.join(differs)} differ): its timings are "
        f"fitted as {model.name}'s"
    )


def resolve_gpu(arg: str) -> GPUSpec:
    """``--hardware``: a catalog name or a hardware YAML path. A YAML that carries a shipped
    GPU's name with other numbers is a :class:`RunError`: its results would be labelled,
    and its replay would run, as the shipped GPU (the rule ``experiments.simulate`` keeps
    for a user's hardware YAML)."""
    path = Path(arg)
    if path.suffix in (".yaml", ".yml") and not path.is_file():
        raise RunError(f"--hardware {arg}: no such file (a hardware YAML, or one of the "
                       f"names {', '.join(sorted(gpus()))})")  # fmt: skip
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            where = f", {yaml_error_place(e)}" if yaml_error_place(e) else ""
            raise ValueError(f"{path}{where}: not YAML ({getattr(e, 'problem', e)})") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: not a mapping of the GPU's numbers")
        gpu = gpu_from_config(doc, str(path))
        shipped = gpus().get(gpu.name)
        if shipped is not None and gpu != shipped:
            raise RunError(f"--hardware {arg}: names the shipped GPU {gpu.name!r} with other "
                           f"numbers; give your GPU a name of its own in the YAML")  # fmt: skip
        return gpu
    return get_gpu(arg)


def check_device(
    run: VLLMRun, gpu: GPUSpec, hardware: str, allow_mismatch: bool = False
) -> str | None:
    """``--hardware`` against the GPU meta.json's ``hardware.device_name`` names. A device
    the catalog knows (its ``device_names``) that is another catalog GPU than ``--hardware``
    is a :class:`RunError` naming both, unless ``allow_mismatch``; then, and when the device
    is unknown to the catalog or ``--hardware`` is a YAML that does not list it, a one-line
    note is returned. None when they match or meta.json names no device."""
    device = run.device_name
    if device is None:
        return None
    where = f"{run.meta_path or 'meta.json'}: hardware.device_name {device!r}"
    if Path(hardware).suffix in (".yaml", ".yml"):
        if device.lower() in (d.lower() for d in gpu.device_names):
            return None
        return (
            f"--hardware {hardware} is a hardware YAML whose device_names do not list "
            f"{device!r} (meta.json's hardware.device_name): not checked against it"
        )
    try:
        known = get_gpu(device)
    except KeyError:
        return (
            f"meta.json's hardware.device_name {device!r} is not in the hardware catalog "
            f"(no device_names entry): --hardware {hardware} not checked against it"
        )
    if known.name == gpu.name:
        return None
    if allow_mismatch:
        return (
            f"--allow-device-mismatch: the run is simulated on {gpu.name} though it ran on "
            f"{device!r} ({known.name} in the catalog)"
        )
    named = hardware if hardware == gpu.name else f"{hardware} ({gpu.name})"
    raise RunError(
        f"{where} is the catalog's {known.name} but --hardware is {named}: "
        f"pass --hardware {known.name}, or add --allow-device-mismatch to simulate the run on "
        f"{gpu.name} deliberately"
    )


def num_blocks(run: VLLMRun, model: ModelSpec, gpu: GPUSpec) -> tuple[int, str]:
    """vLLM's block count when meta.json records it (:func:`read_run` checked that it holds
    one ``max_model_len`` sequence); else the cache its ``kv_cache_memory_bytes`` sizes (per
    GPU, as vLLM takes it, in place of ``gpu_memory_utilization``'s accounting); else
    kvlab's estimate (vllm_v1 accounting on the device memory meta.json records); the
    capacity description. An estimate that holds no ``max_model_len`` sequence is a
    RunError naming meta.json's key."""
    if run.device_memory_bytes is not None:  # the run's own device total, as vLLM read it
        total = int(run.device_memory_bytes)
        gpu = replace(
            gpu, memory_bytes=max(gpu.memory_bytes, total), reported_memory_bytes=total,
            source={
                **gpu.source,
                "reported_memory_gib": "hardware.device_total_memory_bytes of the run's meta.json",
            },
        )  # fmt: skip
    capacity = partial(
        kv_capacity, model, gpu, run.tp, run.dtype_bytes,
        max_num_batched_tokens=run.sched_config.max_num_batched_tokens,
        max_num_seqs=run.sched_config.max_num_seqs,
        gpu_memory_utilization=run.gpu_memory_utilization,
        block_size=run.block_size, cuda_graph_max_size=run.cuda_graph_max_size,
        kv_cache_bytes=None if run.kv_cache_memory_bytes is None
        else run.kv_cache_memory_bytes * run.tp,
    )  # fmt: skip
    try:
        estimate = capacity(max_model_len=run.max_model_len if run.num_gpu_blocks is None else 1)
    except ValueError:
        held = capacity(max_model_len=1).num_slots  # kv_capacity's own error if not the length
        raise RunError(
            f"{run.meta_path}: {run.max_model_len_key} {run.max_model_len} is more tokens than "
            f"kvlab's estimate of the run's KV cache holds ({held}; meta.json records no "
            "kv_cache.num_gpu_blocks)"
        ) from None
    text = estimate.describe()
    if run.num_gpu_blocks is None:
        return estimate.num_blocks(run.block_size), text
    est = estimate.num_blocks(run.block_size)
    text += (
        f"\n  vLLM allocated {run.num_gpu_blocks} blocks (meta.json, used); kvlab's estimate "
        f"{est} blocks ({est / run.num_gpu_blocks - 1:+.1%})"
    )
    return run.num_gpu_blocks, text


def run_simulation(run: VLLMRun, cost: CostModel, blocks: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Simulate the whole run on ``run.system`` (vllm_v1); the requests and steps frames.
    A log without prompt token ids keeps prefix caching: each request stands for a prompt of
    its own (:func:`core.kv.paged.stand_in_prompt_id`). A request with a
    prompt token id outside ``run.vocab_size`` is rejected, as ``experiments.simulate``
    rejects it (the model's vocabulary)."""
    slots = blocks * run.block_size
    make_scheduler = scheduler_factory(run.system, slots, 0, run.max_model_len, run.requests)
    rec = simulate(run.requests, make_scheduler, cost, vocab_size=run.vocab_size).recorder
    return rec.requests_frame(), rec.steps_frame()


def measured_frame(logged: list[LoggedRequest]) -> pd.DataFrame:
    """The log as a requests frame (columns of ``core.metrics.recorder``)."""
    return pd.DataFrame(
        {
            "request_id": [r.index for r in logged],
            "arrival_s": [r.arrival for r in logged],
            "output_len": [r.output_len for r in logged],
            "first_scheduled_s": [r.scheduled for r in logged],
            "first_token_s": [r.first_token for r in logged],
            "finish_s": [r.last_token for r in logged],
            "ttft_s": [r.ttft for r in logged],
            "tpot_s": [r.tpot for r in logged],
            "e2el_s": [r.e2e for r in logged],
        }
    )
