#!/usr/bin/env bash
# Every GPU measurement of kvlab in one command, sized to finish within 9 minutes on one
# H200 (the sum of the part limits below is 520 s):
#
#   bash experiments/gpu_all.sh OUT_DIR          (default: $OUT)
#   PACK_DIR=$OUT bash experiments/gpu_all.sh /tmp/kvlab-gpu     (the device call; see README)
#
# Runs from anywhere (it changes to the repository root). First, if .whl/ holds wheels
# (experiments/gpu_prepare.sh puts there what the device image lacks), they are installed
# with pip --no-index --no-deps into a temporary target that is put on PYTHONPATH. Then:
#
#   part       limit  writes
#   env          30s  OUT_DIR/env.json: torch sees a GPU? its name, versions, imports
#                     (python -m experiments.bench.gpu_env); if it fails nothing else runs
#   profile      70s  OUT_DIR/profile/operator_profile.{csv,json}
#                     (python -m experiments.bench.profile_gpu)
#   kernels      60s  OUT_DIR/kernels/  (python -m experiments.bench.kernels_gpu)
#   engine      190s  OUT_DIR/engine/   (python -m experiments.bench.engine_gpu --max-seconds
#                     150: starts no run after 150 s, rewrites its summary after every run)
#   calibrate    20s  OUT_DIR/engine/calibration.json (CPU): the step-time model fitted to
#                     the <model>_vllm_offline run, operator times from the profile above
#                     (experiments.calibrate --profile --weighting relative)
#   validate     40s  OUT_DIR/engine/<model>_vllm_online/validation.json (CPU): that model
#                     predicting another run, the online one (the offline run if it is absent);
#                     skipped if calibrate failed
#   overhead     10s  OUT_DIR/engine/overhead_stack.json: the framework overhead fitted to
#                     the vllm offline + online runs' CPU phases (experiments.calibrate_overhead)
#   sync         40s  OUT_DIR/sync/sync_check.json: does the forward wait for the GPU?
#                     (python -m experiments.bench.sync_check)
#   host         60s  OUT_DIR/host/host_time{,_summary}.csv: the host's time inside the
#                     forward by part and step kind, vllm and orca_oracle online
#                     (python -m experiments.bench.host_time)
#
# plus OUT_DIR/<part>.log (each part's output) and OUT_DIR/parts.tsv (part, limit, exit
# status, seconds). A part that fails or times out does not stop the later ones; the exit
# status is 1 if any did. With PACK_DIR set, OUT_DIR is also packed into
# PACK_DIR/kvlab-gpu.tar.gz, with env.json, parts.tsv and the profile beside it (the device
# tool returns at most 8 files). PYTHON (default python3) is the interpreter. DRY=1 runs
# every part in its --dry mode on CPU (a check of this script; timings meaningless), with
# every limit times LIMIT_SCALE (default 10 when DRY=1, else 1).
set -u -o pipefail

OUT_DIR="${1:-${OUT:?give an output directory or set OUT}}"
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd) || exit 1
cd "$(dirname "$0")/.." || exit 1
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
status=0
dry=()
model=opt-13b
min_steps=5
scale=${LIMIT_SCALE:-1}
if [ "${DRY:-0}" = 1 ]; then
    dry=(--dry)
    export TRITON_INTERPRET=1 # before Python starts: triton 3.6 reads it when imported
    model=tiny-opt
    min_steps=1 # a dry run's few steps
    scale=${LIMIT_SCALE:-10}
fi
printf 'part\tlimit_s\texit\tseconds\n' >"$OUT_DIR/parts.tsv"

part() { # part NAME SECONDS COMMAND...
    local name=$1 seconds=$(($2 * scale))
    shift 2
    echo "== $name (limit ${seconds}s): $*"
    local start=$SECONDS
    timeout --kill-after=5 "$seconds" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - start))s$([ "$rc" -ge 124 ] && echo ' (time limit?)')"
    printf '%s\t%s\t%s\t%s\n' "$name" "$seconds" "$rc" "$((SECONDS - start))" >>"$OUT_DIR/parts.tsv"
    [ "$rc" -eq 0 ] || status=1
    return "$rc"
}

pack() {
    [ -n "${PACK_DIR:-}" ] || return 0
    mkdir -p "$PACK_DIR"
    tar -czf "$PACK_DIR/kvlab-gpu.tar.gz" -C "$(dirname "$OUT_DIR")" "$(basename "$OUT_DIR")"
    for f in env.json parts.tsv profile/operator_profile.csv profile/operator_profile.json; do
        [ -f "$OUT_DIR/$f" ] && cp "$OUT_DIR/$f" "$PACK_DIR/"
    done
    echo "packed $OUT_DIR into $PACK_DIR/kvlab-gpu.tar.gz"
}

wheels=(.whl/*.whl)
if [ -e "${wheels[0]}" ]; then
    site=$(mktemp -d "${TMPDIR:-/tmp}/kvlab-site.XXXXXX")
    echo "== installing ${#wheels[@]} wheels from .whl/ into $site"
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$site" "${wheels[@]}"; then
        echo "wheel install failed: nothing can run"
        exit 1
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "== no wheels in .whl/: using the installed environment"
fi

if ! part env 30 "$PYTHON" -m experiments.bench.gpu_env --out "$OUT_DIR/env.json" "${dry[@]}"; then
    echo "environment check failed (see $OUT_DIR/env.log): no other part runs"
    pack
    exit 1
fi
part profile 70 "$PYTHON" -m experiments.bench.profile_gpu --out "$OUT_DIR/profile" "${dry[@]}"
part kernels 60 "$PYTHON" -m experiments.bench.kernels_gpu --out "$OUT_DIR/kernels" "${dry[@]}"
part engine 190 "$PYTHON" -m experiments.bench.engine_gpu --out "$OUT_DIR/engine" \
    --max-seconds $((150 * scale)) "${dry[@]}"
fit_run="$OUT_DIR/engine/${model}_vllm_offline"
held_run="$OUT_DIR/engine/${model}_vllm_online"
if [ -f "$fit_run/steps.csv" ]; then
    profile=()
    [ -f "$OUT_DIR/profile/operator_profile.csv" ] && profile=(--profile "$OUT_DIR/profile")
    check_run=$fit_run
    [ -f "$held_run/steps.csv" ] && check_run=$held_run # another run than the fit's, if any
    if part calibrate 20 "$PYTHON" -m experiments.calibrate "$fit_run" --weighting relative \
        "${profile[@]}" --out "$OUT_DIR/engine/calibration.json"; then
        part validate 40 "$PYTHON" -m experiments.validate "$check_run" \
            --calibration "$OUT_DIR/engine/calibration.json" --out "$check_run/validation.json"
    else
        echo "calibrate failed: validate skipped (no calibration of this call to check)"
    fi
    runs=()
    for run in "$fit_run" "$held_run"; do
        [ -f "$run/steps.csv" ] && runs+=("$run")
    done
    part overhead 10 "$PYTHON" -m experiments.calibrate_overhead "${runs[@]}" \
        --out "$OUT_DIR/engine/overhead_stack.json" --min-steps "$min_steps" "${dry[@]}"
else
    echo "no $fit_run/steps.csv: calibrate, validate and overhead skipped"
    status=1
fi
part sync 40 "$PYTHON" -m experiments.bench.sync_check --out "$OUT_DIR/sync" "${dry[@]}"
part host 60 "$PYTHON" -m experiments.bench.host_time --out "$OUT_DIR/host" "${dry[@]}"
pack
exit $status
