"""Imports under the device image's constraints: ``python -m tests.device_image_guard TARGET
[MODULE ...]`` (from the repository root, ``PYTHONPATH=TARGET`` or not).

Installs an import hook: when kvlab's code or a package from ``TARGET`` (where the carried
wheels were installed) imports a third-party top-level module, it may load only from
``TARGET`` or from a distribution the H200 image has
(``experiments.lib.device_image.IMAGE_PACKAGES``); anything else, such as this
environment's own simpy or hydra, fails as it would on the device. Imports made by the
image's own packages (numpy, torch, ...) are left alone: the image brings their needs. Then imports
``MODULE``s, or with none runs ``experiments.bench.gpu_env.check_imports`` (every kvlab
module, every third-party name kvlab's source imports). Prints one JSON document:
``{"failures": {name: error}, "origins": {top-level module: file}}``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import os
import sys
import sysconfig

from experiments.bench.gpu_env import PACKAGES, ROOT, check_imports
from experiments.lib.device_image import IMAGE_PACKAGES, normalize


class ImageOnly(importlib.abc.MetaPathFinder):
    def __init__(self, target: str) -> None:
        self.target = os.path.realpath(target) + os.sep
        self.vetted_importers = (self.target, str(ROOT) + os.sep)
        paths = sysconfig.get_paths()
        self.stdlib = tuple({os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib")})
        self.dists = importlib.metadata.packages_distributions()
        self.origins: dict[str, str] = {}

    def _importer(self) -> str:
        """File of the innermost frame outside the import machinery and this hook."""
        frame = sys._getframe(2)
        while frame is not None:
            file = frame.f_code.co_filename
            own = file == __file__ and frame.f_code.co_name in ("find_spec", "_importer")
            if not (own or file.startswith("<frozen") or "importlib" in file):
                return os.path.realpath(file)
            frame = frame.f_back
        return ""

    def _is_stdlib(self, where: str) -> bool:
        where = os.path.realpath(where)
        return where.startswith(self.stdlib) and "site-packages" not in where

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in self.origins or top in sys.stdlib_module_names or top in PACKAGES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(top)
        if spec is None:
            return None  # not importable at all: the normal machinery says so
        where = spec.origin or next(iter(spec.submodule_search_locations or []), "")
        if self._is_stdlib(where) or not self._importer().startswith(self.vetted_importers):
            return None
        from_target = os.path.realpath(where).startswith(self.target)
        in_image = any(normalize(d) in IMAGE_PACKAGES for d in self.dists.get(top, []))
        if not (from_target or in_image):
            raise ModuleNotFoundError(
                f"{top} ({where}) is neither in the device image nor among the wheels"
            )
        self.origins[top] = where
        return None  # vetted: let the normal finders load it


def main(argv: list[str]) -> int:
    guard = ImageOnly(argv[0])
    sys.meta_path.insert(0, guard)
    if argv[1:]:
        failures = {}
        for name in argv[1:]:
            try:
                importlib.import_module(name)
            except Exception as exc:
                failures[name] = f"{type(exc).__name__}: {exc}"
    else:
        failures = {k: v for k, v in check_imports().items() if v != "ok"}
    print(json.dumps({"failures": failures, "origins": guard.origins}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
