"""The GPU run's environment check: ``python -m experiments.bench.gpu_env --out FILE [--dry]``.

The first part of ``experiments/gpu_all.sh``. Writes ``FILE`` (JSON): date, Python,
platform, torch / triton / CUDA versions, whether torch sees a GPU and which (name,
compute capability, memory, multiprocessors), the version and location of every package
kvlab needs (so a run shows which came from the carried wheels), and the result of
importing every kvlab module plus a look-up of every third-party package kvlab's source
imports anywhere (lazy imports included, found by reading the source). Exit 1 when an
import fails or, unless ``--dry``, when torch sees no CUDA device: then no GPU part can run.
"""

from __future__ import annotations

import ast
import datetime
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from experiments.lib.args import OneLineParser, out_dir_problem

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "sim", "engine", "kernels", "experiments")
DISTRIBUTIONS = ("torch", "triton", "numpy", "pandas", "tqdm", "safetensors", "pyyaml",
                 "simpy", "hydra-core", "omegaconf", "antlr4-python3-runtime")  # fmt: skip


def project_modules(root: Path = ROOT) -> list[str]:
    """Every module of kvlab's packages, by walking the source tree (nothing imported)."""
    names = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def third_party_imports(root: Path = ROOT) -> list[str]:
    """Top-level names of every non-stdlib, non-kvlab module kvlab's source imports."""
    names: set[str] = set()
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return sorted(names - set(sys.stdlib_module_names) - set(PACKAGES) - {"__future__"})


def check_imports(root: Path = ROOT) -> dict[str, str]:
    """Name -> "ok" or the error, for every kvlab module (imported) and every third-party
    top-level name its source imports (looked up with ``find_spec``, not imported)."""
    results = {}
    for name in third_party_imports(root):
        try:
            found = importlib.util.find_spec(name) is not None
            results[name] = "ok" if found else "ModuleNotFoundError: not installed"
        except Exception as exc:  # an import hook or a broken package: report, go on
            results[name] = f"{type(exc).__name__}: {exc}"
    for name in project_modules(root):
        try:
            importlib.import_module(name)
            results[name] = "ok"
        except Exception as exc:
            results[name] = f"{type(exc).__name__}: {exc}"
    return results


def distributions() -> dict[str, dict[str, str] | None]:
    """Version and install location of each package kvlab needs (None if absent)."""
    out: dict[str, dict[str, str] | None] = {}
    for name in DISTRIBUTIONS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
            continue
        out[name] = {"version": dist.version, "location": str(dist.locate_file(""))}
    return out


def gpu_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"cuda_available": torch.cuda.is_available(),
                            "torch_cuda": torch.version.cuda}  # fmt: skip
    if info["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        info.update({
            "device_count": torch.cuda.device_count(),
            "name": torch.cuda.get_device_name(0),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "memory_gib": props.total_memory / 2**30,
            "multiprocessors": props.multi_processor_count,
        })  # fmt: skip
    return info


def out_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be written as a file (a folder, or its folder cannot be made or
    written in: :func:`experiments.lib.args.out_dir_problem`), or None. Checked here rather
    than with ``experiments.lib.cli``, which imports hydra: this check must run without."""
    if path.is_dir():
        return f"{path} is a folder; give the file to write"
    return out_dir_problem(path.parent)


def main(argv: list[str] | None = None) -> int:
    """Check the environment, write ``--out``; 0 when everything imports (and, unless
    ``--dry``, torch sees a GPU), 1 otherwise, 2 with one line for an unwritable ``--out``."""
    parser = OneLineParser(prog="python -m experiments.bench.gpu_env", description=__doc__)
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--dry", action="store_true", help="a CPU run: no GPU is fine")
    args = parser.parse_args(argv)
    problem = out_file_problem(args.out)
    if problem is not None:
        print(f"error: --out: {problem}", file=sys.stderr)
        return 2
    imports = check_imports()
    failed = {k: v for k, v in imports.items() if v != "ok"}
    gpu = gpu_info()
    import triton

    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "dry": args.dry,
        "gpu": gpu,
        "triton": triton.__version__,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "distributions": distributions(),
        "imports_checked": len(imports),
        "import_failures": failed,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(args.out)
    name = gpu.get("name", "no CUDA device")
    print(f"python {doc['python']}, torch {importlib.metadata.version('torch')} "
          f"(CUDA {gpu['torch_cuda']}), triton {doc['triton']}, GPU: {name}; "
          f"{len(imports)} imports checked, {len(failed)} failed")  # fmt: skip
    for k, v in failed.items():
        print(f"import {k}: {v}")
    if not args.dry and not gpu["cuda_available"]:
        print("torch sees no CUDA device: no GPU part can run")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
