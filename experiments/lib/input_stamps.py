"""Stamps of the files a run reads, so that resuming a finished run notices an edited input.

A run's ``config.yaml`` names its input files (a trace, a vLLM run directory, a profile, a
calibration, a checkpoint) but not what they held. :func:`input_stamps` records, for each
config key that names an existing file or directory, the size and modification time of
every file under it (sizes and times, not digests: a checkpoint may be gigabytes). A run
writes them beside its results (``inputs.json``); a finished run is reused only when they
still match (``experiments.lib.results.finished_metrics``). A file rewritten with the same
bytes counts as changed: the run is done again, never reused wrongly. The code that makes
a run's results is stamped too (:func:`code_digest`), so a run made by other code is done
again rather than reused.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from experiments.lib.checks import lookup

REPO = Path(__file__).resolve().parents[2]
# config keys whose value may name an input file or directory
INPUT_KEYS = (
    "workload.path", "workload.tokens_path", "cost.path", "cost.profile", "cost.stack_path",
    "model.hf_config", "model.path",
)  # fmt: skip


def located_input(value: str) -> Path | None:
    """The path as the run reads it: as given (from the working directory), else from the
    repository root (where the shipped profiles and stack files are); None if neither
    exists. One rule for every input key (``cost.profile``, ``cost.stack_path``,
    ``cost.path``: :mod:`experiments.lib.setup`)."""
    for path in (Path(value), REPO / value):
        if path.exists():
            return path
    return None


def input_files(path: Path) -> list[tuple[str, Path]]:
    """The file ``path``, or every file under the directory ``path`` (sorted), each with the
    name a run's records give it: a file's own name, or its path relative to the directory."""
    if path.is_file():
        return [(path.name, path)]
    return [
        (str(f.relative_to(path)), f) for f in sorted(p for p in path.rglob("*") if p.is_file())
    ]


def input_paths(plain: Any) -> dict[str, Path]:
    """Per key of :data:`INPUT_KEYS` whose value in the plain config ``plain`` names an
    existing file or directory, the path the run reads (:func:`located_input`)."""
    out = {}
    for key in INPUT_KEYS:
        value = lookup(plain, key)  # a missing key: not a str either
        if isinstance(value, str) and value:
            path = located_input(value)
            if path is not None:
                out[key] = path
    return out


def _stamp(path: Path) -> list[list[Any]]:
    out = []
    for name, f in input_files(path):
        st = os.stat(f)
        out.append([name, st.st_size, st.st_mtime_ns])
    return out


# the sources a run's results depend on, under the repository: the policies, the simulator,
# the engine and its kernels, and the apps with their library (the report writers are not)
CODE = ("core", "sim", "engine", "kernels", "experiments/lib", "experiments/simulate.py",
        "experiments/serve.py")  # fmt: skip


def sources_digest(paths: list[Path], base: Path) -> str:
    """sha256 over the path (relative to ``base``) and bytes of each file of ``paths`` and
    every ``.py`` file under each directory of them, in path order."""
    digest = hashlib.sha256()
    for path in paths:
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        for f in files:
            digest.update(str(f.relative_to(base)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


@cache
def code_digest() -> str:
    """:func:`sources_digest` of :data:`CODE`: it changes with any edit of the code that
    makes a run's results (a comment's too: a run is then done again, never reused
    wrongly)."""
    return sources_digest([REPO / entry for entry in CODE], REPO)


def plugin_digest(module: str) -> str | None:
    """sha256 over the path and bytes of the ``.py`` files of the policy plugin ``module``
    (``system.plugin``): its file when it is a top-level module, else every file of its
    top-level package (``pkg.mod``: all of ``pkg/``, so a helper module it imports counts);
    None when it cannot be found (the run then fails to load it). Found as Python would
    import it, from the working directory and ``sys.path``."""
    try:
        spec = importlib.util.find_spec(module.partition(".")[0])
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    origin = Path(spec.origin)
    root = origin.parent if spec.submodule_search_locations is not None else origin
    return sources_digest([root], root.parent)


def calibration_profile(path: Path) -> Path | None:
    """The operator profile the calibration file ``path`` builds on (its ``profile``,
    found as the run finds it: :func:`experiments.lib.setup.with_profile_found`, then
    :func:`located_input`); None when it names none, or the file is not a readable JSON
    document."""
    from experiments.lib.setup import with_profile_found

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    name = with_profile_found(doc, path).get("profile")
    return located_input(name) if isinstance(name, str) and name else None


def input_stamps(cfg: Any) -> dict[str, list[list[Any]]]:
    """Per key of :data:`INPUT_KEYS` whose value names an existing file or directory:
    ``[[name, size, mtime_ns], ...]`` of the file, or of every file under the directory;
    under ``code``, ``[["sha256", digest]]`` of the code (:func:`code_digest`); and under
    ``system.plugin``, when one is named and found, ``[["sha256", digest]]`` of its source
    (:func:`plugin_digest`), so an edited policy is simulated again; under
    ``cost.path.profile``, the operator profile a calibration file (``cost.path``) builds on
    (:func:`calibration_profile`), which the run reads too."""
    plain = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    out: dict[str, list[list[Any]]] = {"code": [["sha256", code_digest()]]}
    plugin = lookup(plain, "system.plugin")
    if isinstance(plugin, str) and plugin:
        found = plugin_digest(plugin)
        if found is not None:
            out["system.plugin"] = [["sha256", found]]
    for key, path in input_paths(plain).items():
        out[key] = _stamp(path)
        profile = calibration_profile(path) if key == "cost.path" and path.is_file() else None
        if profile is not None:
            out["cost.path.profile"] = _stamp(profile)
    return out
