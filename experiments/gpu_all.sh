#!/usr/bin/env bash
# Every GPU measurement of kvlab in one command, sized for a single 10-minute session on one
# H200:  bash experiments/gpu_all.sh [OUT_DIR]   (default: $OUT)
#
#   OUT_DIR/kernels/  python -m experiments.bench.kernels_gpu            (timeout 200 s)
#   OUT_DIR/engine/   python -m experiments.bench.engine_gpu       (timeout 330 s; starts no run
#                     after 280 s and rewrites its summary after every run)
#   OUT_DIR/engine/opt-13b_vllm_online/{calibration,validation}.json
#                     calibrate + validate of one engine run (CPU only, timeout 60 s)
#   OUT_DIR/*.log     each part's output
#
# A part that fails or times out does not stop the others; the exit status is 1 if any did.
# Run from the repository root with the project's Python environment active. DRY=1 runs
# every part in its --dry mode on CPU (a check of this script; timings meaningless).
set -u -o pipefail

OUT_DIR="${1:-${OUT:?give an output directory or set OUT}}"
mkdir -p "$OUT_DIR"
status=0
dry=()
model=opt-13b
if [ "${DRY:-0}" = 1 ]; then
    dry=(--dry)
    model=tiny-opt
fi

part() {  # part NAME SECONDS COMMAND...
    local name=$1 seconds=$2
    shift 2
    echo "== $name (timeout ${seconds}s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - start))s"
    [ "$rc" -eq 0 ] || status=1
}

part kernels 200 python -m experiments.bench.kernels_gpu --out "$OUT_DIR/kernels" "${dry[@]}"
part engine 330 python -m experiments.bench.engine_gpu --out "$OUT_DIR/engine" --max-seconds 280 "${dry[@]}"
run_dir="$OUT_DIR/engine/${model}_vllm_online"
if [ -f "$run_dir/steps.csv" ]; then
    part calibrate 60 python -m experiments.calibrate "$run_dir"
    part validate 60 python -m experiments.validate "$run_dir"
fi
exit $status
