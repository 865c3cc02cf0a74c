#!/usr/bin/env bash
# Compile kvlab's Triton kernels for sm_90 (python -m kernels.aot_check) with the current
# environment's triton and with other triton releases, each in a throwaway venv that holds
# the current torch and that triton (installed with --no-deps: a CPU torch pins none).
# Run by hand, not in CI (it downloads wheels):
#
#   bash experiments/check_triton_versions.sh [TRITON_VERSION ...]    (default: 3.6.0, the
#                                                                      H200 image's triton)
# Exit status 1 if any version fails; each version's lines are prefixed with it.
set -u -o pipefail

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.6.0)
torch_version=$(python -c 'import torch; print(torch.__version__)') || exit 1
status=0

check() {  # check LABEL PYTHON
    local label=$1 python=$2
    "$python" -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)' \
        | sed "s/^/[$label] python torch triton: /"
    env -u TRITON_INTERPRET "$python" -m kernels.aot_check 2>&1 | sed "s/^/[$label] /"
    local rc=${PIPESTATUS[0]}
    echo "[$label] kernels.aot_check: $([ "$rc" -eq 0 ] && echo PASS || echo "FAIL (exit $rc)")"
    [ "$rc" -eq 0 ] || status=1
}

check "current" python
for version in "${versions[@]}"; do
    venv=$(mktemp -d "${TMPDIR:-/tmp}/kvlab-triton-$version.XXXXXX")
    if python -m venv "$venv" &&
        "$venv/bin/pip" install -q "torch==$torch_version" numpy &&
        "$venv/bin/pip" install -q --no-deps "triton==$version"; then
        check "triton $version" "$venv/bin/python"
    else
        echo "[triton $version] could not build the venv in $venv"
        status=1
    fi
    rm -rf "$venv"
done
exit $status
