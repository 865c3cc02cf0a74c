#!/usr/bin/env bash
# Run the whole GPU script in its dry mode (DRY=1 experiments/gpu_all.sh, on CPU) in a
# throwaway venv that holds only what the lent H200's image holds of kvlab's imports, at the
# image's versions where the device tool's KINDS.md gives them (torch 2.11.0 with its triton
# 3.6.0, transformers 5.17.0, safetensors 0.8.0), plus the wheels experiments/gpu_prepare.sh
# put in .whl/. It catches, before device minutes are spent, an import or an API that the
# image's torch and triton lack. Run by hand, not in CI (it downloads torch's CUDA build,
# about 3 GB with its libraries):
#
#   bash experiments/check_device_image.sh [OUT_DIR]     (default: a temporary directory)
#
# The venv's Python is IMAGE_PYTHON, by default python3.12 (the image's CPython) when it runs
# here, else python3.
#
# One difference from the image: numpy is held below 2.4 (the image has 2.5.2). Triton
# 3.6's interpreter, which the dry mode runs the kernels on, turns one-element arrays into
# Python ints, which numpy 2.4 refuses ("only 0-dimensional arrays can be converted to
# Python scalars"); on the GPU the kernels are compiled and the interpreter is not used.
# Exit status: gpu_all.sh's (0 when every part passed), 1 if the venv could not be built.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1

out="${1:-$(mktemp -d "${TMPDIR:-/tmp}/kvlab-device-dry.XXXXXX")}"
if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "check_device_image: no wheels in .whl/: run bash experiments/gpu_prepare.sh first"
    exit 1
fi
venv=$(mktemp -d "${TMPDIR:-/tmp}/kvlab-image.XXXXXX")
image=(torch==2.11.0 "numpy<2.4" pandas tqdm safetensors==0.8.0 pyyaml packaging matplotlib
    transformers==5.17.0)
base="${IMAGE_PYTHON:-python3}"
[ -n "${IMAGE_PYTHON:-}" ] || ! python3.12 -c '' 2>/dev/null || base=python3.12
if ! { "$base" -m venv "$venv" && "$venv/bin/pip" install -q "${image[@]}"; }; then
    echo "check_device_image: could not build the image's venv in $venv"
    rm -rf "$venv"
    exit 1
fi
"$venv/bin/python" -c 'import sys, torch, triton, numpy; print("image venv: python",
sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "numpy",
numpy.__version__)'
DRY=1 PYTHON="$venv/bin/python" bash experiments/gpu_all.sh "$out"
status=$?
echo "check_device_image: gpu_all.sh DRY=1 exit $status; parts in $out/parts.tsv"
rm -rf "$venv"
exit $status
