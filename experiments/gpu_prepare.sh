#!/usr/bin/env bash
# Step 1 of a GPU run, here where pip reaches a package index: put into .whl/ (git-ignored),
# as wheels for the lent GPU machine's CPython 3.12 on manylinux x86_64 (an H100 or an H200:
# the scripts take the GPU from the device's own name), exactly the packages kvlab
# needs that the device image lacks (python -m experiments.lib.device_image: names and the
# versions installed here), then print the device call (step 2: experiments/gpu_all.sh).
#
#   bash experiments/gpu_prepare.sh      (from the repository root, project environment active)
#
# A release published only as a source archive (antlr4-python3-runtime 4.9.3, which
# hydra-core 1.3 pins) is built into a wheel here; it must come out pure Python
# (py3-none-any), since nothing can be compiled for the device on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."

pins=$(python -m experiments.lib.device_image)
platforms=$(python -c 'from experiments.lib.device_image import DEVICE_PLATFORMS as p
print(" ".join("--platform " + t for t in p))')
device_python=$(python -c 'from experiments.lib.device_image import DEVICE_PYTHON as v; print(v)')

rm -rf .whl && mkdir .whl # one version of each package: two would stop the install there
for pin in $pins; do
    # shellcheck disable=SC2086  # $platforms is a list of flags
    if ! python -m pip download -q --no-deps --only-binary=:all: --implementation cp \
        --python-version "$device_python" $platforms -d .whl "$pin" 2>/dev/null; then
        echo "gpu_prepare: no wheel of $pin on the index; building one from its source archive"
        python -m pip wheel -q --no-deps --no-binary=:all: -w .whl "$pin"
    fi
done

bad=0
for wheel in .whl/*.whl; do
    case "$wheel" in
    *-py3-none-any.whl | *-py2.py3-none-any.whl | *-cp${device_python/./}-*manylinux*x86_64*.whl) ;;
    *) echo "gpu_prepare: $wheel cannot run on the device (CPython $device_python, x86_64)"; bad=1 ;;
    esac
done
count=$(find .whl -type f -name '*.whl' | wc -l)
if [ "$bad" -ne 0 ] || [ "$count" -ne "$(echo "$pins" | wc -w)" ]; then
    echo "gpu_prepare: expected one wheel for each of: $pins" >&2
    exit 1
fi

echo "gpu_prepare: $count wheels in .whl/ ($(du -sh .whl | cut -f1)):"
ls .whl | sed 's/^/  /'

# The device tool sends the working tree (tracked files, untracked ones git does not ignore,
# the carried .whl/) and refuses a call over 64 MiB: say how close this one is.
travel=$({ git ls-files -z --cached --others --exclude-standard; find .whl -type f -print0; } |
    du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
travel=${travel:-0}
limit=$((64 * 1024 * 1024))
echo "gpu_prepare: the call would send $((travel / 1024 / 1024)) MiB of the device tool's 64 MiB"
if [ "$travel" -gt "$limit" ]; then
    echo "gpu_prepare: over the device tool's 64 MiB: the call would be refused; ignore or" \
        "compress what need not travel (docs/validation holds most of it)" >&2
    exit 1
fi
cat <<'CALL'

Device call (the device tool's `run`; one call, so make it the whole of it):
  kind:    nvidia-h200   (named, or the first call gets an H100; gpu_all.sh runs on either)
  carry:   [".whl"]
  command: DEADLINE_S=580 PACK_DIR=$OUT bash experiments/gpu_all.sh /tmp/kvlab-gpu
  timeout_s: 600   (gpu_all.sh is sized to finish in 9 minutes)
If the device time left (`status`: budget_left_s, less the machine's start) is under
timeout_s, lower timeout_s to it and DEADLINE_S to 20 s below it: the parts that cannot
finish by then are skipped, and every part done is packed under $OUT as it ends.
CALL
