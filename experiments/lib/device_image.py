"""The lent H200's Python image, and which of kvlab's requirements it lacks.

The GPU machine (kind ``nvidia-h200``) runs CPython 3.12 on manylinux x86_64 with a fixed
image and no package index, so whatever kvlab needs beyond the image travels with the call
as wheels (``experiments/gpu_prepare.sh``). ``IMAGE_PACKAGES`` is that image's list of
distributions as the device tool's documentation gives it (KINDS.md, "Python packages
already there", read on 2026-11-17; its pip list names torch 2.11.0, triton 3.6.0, numpy
2.5.2 and Python 3.12.3).

``python -m experiments.lib.device_image`` prints ``name==version``, one a line, for every
distribution that kvlab's runtime requirements (``pyproject.toml``'s ``dependencies`` and
its ``engine`` extra) pull in and the image lacks. Requirements are followed only through
the distributions that travel (the image's own packages come with their own requirements),
markers are evaluated for the device's Python, and versions are this environment's (the
ones kvlab is tested with here); a missing or out-of-range one is one clear error line.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

DEVICE_PYTHON = "3.12"
DEVICE_PLATFORMS = (  # pip --platform tags the device accepts, newest first
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

_IMAGE_LIST = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp
"""
IMAGE_PACKAGES = frozenset(_IMAGE_LIST.split())


def normalize(name: str) -> str:
    """A distribution name in PEP 503 normal form (``PyYAML`` -> ``pyyaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def root_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """kvlab's runtime requirements: ``dependencies`` plus the ``engine`` extra."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["engine"]]


def missing_from_image(roots: list[str]) -> dict[str, str]:
    """Normalized name -> installed version of every distribution ``roots`` need that the
    image lacks (see the module doc). Raises ``LookupError`` naming a requirement that is
    not installed here or whose installed version is out of its range."""
    from packaging.requirements import Requirement

    env = {"python_version": DEVICE_PYTHON, "python_full_version": f"{DEVICE_PYTHON}.0",
           "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
           "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}  # fmt: skip
    found: dict[str, str] = {}
    todo = [(Requirement(r), "pyproject.toml") for r in roots]
    while todo:
        req, wanted_by = todo.pop()
        name = normalize(req.name)
        if (req.marker and not req.marker.evaluate(env)) or name in IMAGE_PACKAGES:
            continue
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise LookupError(f"{req} (needed by {wanted_by}) is not installed here") from None
        if not req.specifier.contains(version, prereleases=True):
            raise LookupError(f"{name} {version} is installed, but {wanted_by} needs {req}")
        if name in found:
            continue
        found[name] = version
        for sub in importlib.metadata.requires(name) or []:
            todo.append((Requirement(sub), name))
    return dict(sorted(found.items()))


def main() -> int:
    try:
        pins = missing_from_image(root_requirements())
    except (LookupError, OSError, KeyError) as exc:
        print(f"device_image: {exc}", file=sys.stderr)
        return 1
    for name, version in pins.items():
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
