"""What made a result, for a reader months later: ``provenance.json`` beside a run's files.

``config.yaml`` says what was asked and ``inputs.json`` stamps the inputs for resuming (sizes
and times, cheap to compare, but not an identity: a copied trace gets a new time, an edited
one may keep its size). Neither says which code ran. :func:`provenance` records:

- ``code``: the git commit of the checkout the code was imported from, whether its tracked
  files differed from that commit (``git_dirty``, as ``git describe --dirty`` counts them:
  untracked files aside), and the sha256 of the sources behind a run's results
  (:func:`experiments.lib.input_stamps.code_digest`, which does count an untracked source
  file); ``git_commit`` and ``git_dirty`` are null where the code is not a git checkout or
  git cannot be run;
- ``python`` and ``packages``: the interpreter's version and those of the libraries that make
  or write the numbers (null for one not installed);
- ``inputs``: per config key that names an input file or directory
  (:data:`experiments.lib.input_stamps.INPUT_KEYS`), the path the run read and the sha256 of
  each file under it, null for a file over :data:`MAX_HASH_BYTES` (a checkpoint: its size
  and time are in ``inputs.json``); a process hashes an unchanged file once
  (:func:`file_sha256`).

It is written for reading, never compared: a finished run is reused by its ``config.yaml``
and ``inputs.json`` alone (:func:`experiments.lib.results.finished_metrics`), so a new commit
that leaves the sources alone does not run it again.
"""

from __future__ import annotations

import hashlib
import platform
import shlex
import subprocess
from collections.abc import Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from experiments.lib.input_stamps import REPO, code_digest, input_files, input_paths

# the libraries whose versions a run's numbers or files depend on
PACKAGES = ("numpy", "pandas", "simpy", "hydra-core", "omegaconf", "torch", "triton")
MAX_HASH_BYTES = 1 << 28  # a file larger than this (256 MiB) is not hashed: null
GIT_TIMEOUT_S = 10.0


def _git(*args: str) -> str | None:
    """``git -C REPO <args>``'s stdout, or None where it fails or git is missing."""
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True,
            timeout=GIT_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@cache
def code_version() -> dict[str, Any]:
    """``git_commit`` (40 hex digits), ``git_dirty`` (tracked files differ from it),
    ``git_changed`` (those files, as ``git status --porcelain`` lists them) and
    ``code_sha256`` of the code this process imported; the git keys null outside a git
    checkout (once per process: the code does not change under a running process)."""
    head = _git("rev-parse", "--verify", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if head else None
    changed = None if status is None else [line for line in status.splitlines() if line]
    return {
        "git_commit": head.strip() if head else None,
        "git_dirty": None if changed is None else bool(changed),
        "git_changed": changed,
        "code_sha256": code_digest(),
    }


def code_words() -> str:
    """:func:`code_version` in a line, e.g. ``git 32d8fe71014b (with uncommitted changes),
    sources sha256 5568f63841b7``."""
    v = code_version()
    commit = "not a git checkout" if v["git_commit"] is None else f"git {v['git_commit'][:12]}"
    dirty = " (with uncommitted changes)" if v["git_dirty"] else ""
    return f"{commit}{dirty}, sources sha256 {v['code_sha256'][:12]}"


@cache
def package_versions() -> dict[str, str | None]:
    """:data:`PACKAGES`' installed versions (null for one not installed), read once per
    process: a sweep's runs share them."""
    return {name: _version(name) for name in PACKAGES}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# digests hashed in this process, by the file's identity (path, device, inode, size, times)
_DIGESTS: dict[tuple[Any, ...], str] = {}


def file_sha256(path: Path) -> str | None:
    """sha256 of the file's bytes, or None when it is larger than :data:`MAX_HASH_BYTES`.
    A file is read once per process while its path, device, inode, size and modification
    and change times (ns) stay the same, so the runs of a sweep in one process (a multirun,
    a worker of ``reproduce``) do not hash the same inputs again; an edit changes them."""
    st = path.stat()
    if st.st_size > MAX_HASH_BYTES:
        return None
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
           st.st_ctime_ns)  # fmt: skip
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def input_digests(cfg: Any) -> dict[str, dict[str, Any]]:
    """Per key of :data:`INPUT_KEYS` whose value names an existing file or directory:
    ``{"path": <the path read, absolute>, "sha256": {<file, relative to it>: digest}}``."""
    plain = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    return {
        key: {"path": str(path.resolve()),
              "sha256": {name: file_sha256(f) for name, f in input_files(path)}}
        for key, path in input_paths(plain).items()
    }  # fmt: skip


def command_line(module: str, argv: Sequence[str]) -> str:
    """The command ``python -m <module> <argv>``, quoted for a POSIX shell."""
    return shlex.join(["python", "-m", module, *argv])


def options_of(args: Any) -> dict[str, Any]:
    """A command's parsed options (an ``argparse.Namespace``) as JSON values: paths as text."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def provenance(cfg: Any = None) -> dict[str, Any]:
    """The code, interpreter and packages of this process, and the digests of the input
    files ``cfg`` names (none without ``cfg``)."""
    return {
        "code": code_version(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "inputs": input_digests(cfg) if cfg is not None else {},
    }
