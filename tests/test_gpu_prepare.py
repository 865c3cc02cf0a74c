"""The preparation of a GPU run: which packages travel, and that their wheels suffice.

``experiments/gpu_prepare.sh`` fills ``.whl/`` (skipped below when it has not been run): the
wheels are installed into a temporary target exactly as ``gpu_all.sh`` does on the device,
then every kvlab module is imported in a subprocess whose import hook
(``tests/device_image_guard.py``) refuses third-party modules that are neither in the
device image nor in the target, so this environment's own simpy or hydra cannot mask a
missing wheel. Two controls show the hook bites: without the target, and with one wheel
left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.lib.device_image import missing_from_image, normalize, root_requirements

ROOT = Path(__file__).resolve().parents[1]
WHEELS = sorted((ROOT / ".whl").glob("*.whl"))
needs_wheels = pytest.mark.skipif(
    not WHEELS, reason="no .whl/: run `bash experiments/gpu_prepare.sh` first"
)
CARRIED = {"simpy", "hydra-core", "omegaconf", "antlr4-python3-runtime"}
pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")


def test_the_image_lacks_exactly_simpy_hydra_and_their_requirements() -> None:
    pins = missing_from_image(root_requirements())
    assert set(pins) == CARRIED
    assert pins["antlr4-python3-runtime"].startswith("4.9.")  # hydra-core 1.3 pins 4.9.*


def test_an_unmet_requirement_is_named() -> None:
    with pytest.raises(LookupError, match="kvlab-no-such-package"):
        missing_from_image(["kvlab-no-such-package>=1"])
    with pytest.raises(LookupError, match=r"simpy .* needs simpy<1"):
        missing_from_image(["simpy<1"])
    assert missing_from_image(["torch>=1", "numpy"]) == {}  # both in the image


def _install(wheels: list[Path], target: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--target", str(target), *map(str, wheels)]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=300)


def _guarded(target: Path, *modules: str, on_path: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if on_path:
        env["PYTHONPATH"] = str(target)
    cmd = [sys.executable, "-m", "tests.device_image_guard", str(target), *modules]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_wheels
def test_wheels_are_the_needed_set_for_the_device() -> None:
    pins = missing_from_image(root_requirements())
    found = {}
    for wheel in WHEELS:
        name, version, *_, python, abi, plat = wheel.stem.split("-")
        found[normalize(name)] = version
        assert (python, abi, plat) in {("py3", "none", "any"), ("py2.py3", "none", "any")} or (
            python == "cp312" and "manylinux" in plat and plat.endswith("x86_64")
        ), wheel.name
    assert found == pins


@needs_wheels
def test_every_module_imports_with_the_wheels_on_the_image(tmp_path: Path) -> None:
    target = tmp_path / "site"
    _install(WHEELS, target)
    doc = _guarded(target)
    assert doc["failures"] == {}
    for module in ("simpy", "hydra", "omegaconf", "antlr4"):
        assert doc["origins"][module].startswith(str(target)), module
    blocked = _guarded(target, "simpy", "hydra", on_path=False)  # control: the hook bites
    assert set(blocked["failures"]) == {"simpy", "hydra"}


@needs_wheels
def test_a_missing_wheel_is_caught(tmp_path: Path) -> None:
    target = tmp_path / "site"
    _install([w for w in WHEELS if not w.name.startswith("antlr4")], target)
    doc = _guarded(target, "omegaconf", "experiments.serve")
    assert set(doc["failures"]) == {"omegaconf", "experiments.serve"}
    assert "antlr4" in doc["failures"]["omegaconf"]
