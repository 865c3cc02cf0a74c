#!/usr/bin/env bash
# Every GPU measurement of kvlab in one command, sized to finish within 9 minutes on one
# H200 (the sum of the part limits below is 520 s); it runs on an H100 too (untried there):
# the runs are served as the catalog GPU whose device_names hold the device's own name.
#
#   bash experiments/gpu_all.sh OUT_DIR          (default: $OUT)
#   DEADLINE_S=580 PACK_DIR=$OUT bash experiments/gpu_all.sh /tmp/kvlab-gpu   (the device
#                                                 call: see README, "On a GPU")
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
#                     its limit less 15 s times LIMIT_SCALE, at least half the limit: skips a
#                     run expected to end after that, rewrites its summary after every run)
#   calibrate    20s  OUT_DIR/engine/calibration.json (CPU): the step-time model fitted to
#                     the <model>_vllm_offline run, operator times from the profile above
#                     (experiments.calibrate --profile --weighting relative) when the profile
#                     is complete ("complete": true in its sidecar; one its limit cut short
#                     lacks the decode rows), else without it (said in the output)
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
# status or "skipped", seconds). A part that fails or times out does not stop the later
# ones; the exit status is 1 if any failed or was skipped, 2 for a bad setting (one line).
#
# PACK_DIR (the device call's $OUT): after every part, OUT_DIR is packed into
# PACK_DIR/kvlab-gpu.tar.gz, with env.json, parts.tsv and the profile beside it (5 files;
# the device tool returns at most 8), each written under a temporary name and renamed, so a
# call killed at its limit returns every part finished before it (a kill during a pack may
# leave one .*.tmp file beside them).
# DEADLINE_S (a positive integer, seconds from this script's start; the device call's time
# limit less a margin): each part's limit is capped at the time left before it less
# PACK_RESERVE_S (15 s: the kill's 5 s grace and the pack), and a part left less than
# min(its limit, MIN_PART_S = 10 s) is skipped, recorded in parts.tsv; so the script ends,
# packed, before the deadline.
# An OUT_DIR holding an earlier call's parts.tsv (a warm device machine keeps /tmp/kvlab-gpu)
# is first cleared of what this script writes there.
# PYTHON (default python3) is the interpreter. DRY=1 runs every part in its --dry mode on
# CPU (a check of this script; timings meaningless), with every limit times LIMIT_SCALE (a
# positive integer; default 10 when DRY=1, else 1).
set -u -o pipefail

PACK_RESERVE_S=15
MIN_PART_S=10
ENGINE_RESERVE_S=15 # of the engine's limit, kept to end the runs and write the summary

bad_setting() { # one line on stderr, exit 2
    echo "gpu_all.sh: error: $*" >&2
    exit 2
}
positive_int() { [[ $1 =~ ^[0-9]+$ ]] && [ "$((10#$1))" -gt 0 ]; }

dry=()
model=opt-13b
min_steps=5
default_scale=1
if [ "${DRY:-0}" = 1 ]; then
    dry=(--dry)
    export TRITON_INTERPRET=1 # before Python starts: triton 3.6 reads it when imported
    model=tiny-opt
    min_steps=1 # a dry run's few steps
    default_scale=10
fi
scale=${LIMIT_SCALE:-$default_scale}
positive_int "$scale" || bad_setting "LIMIT_SCALE must be a positive integer, got '$scale'"
scale=$((10#$scale))
deadline=${DEADLINE_S:-}
if [ -n "$deadline" ]; then
    positive_int "$deadline" || bad_setting "DEADLINE_S must be a positive integer (seconds" \
        "from the start), got '$deadline'"
    deadline=$((10#$deadline))
fi

OUT_DIR="${1:-${OUT:-}}"
[ -n "$OUT_DIR" ] || bad_setting "give an output directory (OUT_DIR) or set OUT"
if [ -n "${PACK_DIR:-}" ]; then # the pack of OUT_DIR must not land inside it (it would nest)
    case "$(realpath -m "$PACK_DIR")/" in "$(realpath -m "$OUT_DIR")"/*)
        bad_setting "PACK_DIR ($PACK_DIR) is OUT_DIR or inside it: give OUT_DIR another" \
            "folder (the device call: /tmp/kvlab-gpu)" ;;
    esac
fi
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd) || exit 1
if [ -f "$OUT_DIR/parts.tsv" ]; then
    # An earlier call's output (a warm device machine keeps /tmp/kvlab-gpu): remove what this
    # script writes, so a part that fails or is skipped now leaves no earlier file behind for
    # calibrate, validate, the pack or gpu_report to take as this call's.
    echo "== $OUT_DIR holds an earlier call's output: removing it"
    rm -rf "$OUT_DIR"/{env.json,profile,kernels,engine,sync,host} \
        "$OUT_DIR"/{env,profile,kernels,engine,calibrate,validate,overhead,sync,host}.log
fi
cd "$(dirname "$0")/.." || exit 1
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
status=0
printf 'part\tlimit_s\texit\tseconds\n' >"$OUT_DIR/parts.tsv"

pack() { # bring PACK_DIR up to date (if set): each file written aside, then renamed
    [ -n "${PACK_DIR:-}" ] || return 0
    mkdir -p "$PACK_DIR" || return 0
    local tmp="$PACK_DIR/.kvlab-gpu.tar.gz.tmp" f name
    if tar -czf "$tmp" -C "$(dirname "$OUT_DIR")" "$(basename "$OUT_DIR")"; then
        mv -f "$tmp" "$PACK_DIR/kvlab-gpu.tar.gz"
    else
        rm -f "$tmp"
        echo "pack: tar failed; $PACK_DIR/kvlab-gpu.tar.gz kept as it was"
    fi
    for f in env.json parts.tsv profile/operator_profile.csv profile/operator_profile.json; do
        name=$(basename "$f")
        [ -f "$OUT_DIR/$f" ] && cp "$OUT_DIR/$f" "$PACK_DIR/.$name.tmp" &&
            mv -f "$PACK_DIR/.$name.tmp" "$PACK_DIR/$name"
    done
    echo "packed $OUT_DIR into $PACK_DIR/kvlab-gpu.tar.gz"
}

plan_part() { # plan_part NAME SECONDS: set $limit (module header), or record a skip: 1
    local name=$1 full=$(($2 * scale))
    limit=$full
    [ -n "$deadline" ] || return 0
    local left=$((deadline - SECONDS - PACK_RESERVE_S))
    local least=$((full < MIN_PART_S ? full : MIN_PART_S))
    [ "$left" -lt "$limit" ] && limit=$left
    [ "$limit" -ge "$least" ] && return 0
    echo "== $name skipped: ${left}s left before DEADLINE_S=$deadline, less ${PACK_RESERVE_S}s" \
        "to pack; it needs ${least}s"
    printf '%s\t%s\t%s\t%s\n' "$name" "$full" skipped 0 >>"$OUT_DIR/parts.tsv"
    status=1
    pack
    return 1
}

run_part() { # run_part NAME COMMAND...: run it under $limit, log it, record it, pack
    local name=$1
    shift
    echo "== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    local rc=$?
    local took=$((SECONDS - start))
    echo "== $name: exit $rc after ${took}s$([ "$rc" -ge 124 ] && echo ' (time limit?)')"
    printf '%s\t%s\t%s\t%s\n' "$name" "$limit" "$rc" "$took" >>"$OUT_DIR/parts.tsv"
    [ "$rc" -eq 0 ] || status=1
    pack
    return "$rc"
}

part() { # part NAME SECONDS COMMAND...
    local name=$1 seconds=$2
    shift 2
    plan_part "$name" "$seconds" && run_part "$name" "$@"
}

profile_complete() { # the profile part wrote a whole profile ("complete": true)
    local side="$OUT_DIR/profile/operator_profile.json"
    [ -f "$OUT_DIR/profile/operator_profile.csv" ] &&
        grep -Eq '"complete"[[:space:]]*:[[:space:]]*true' "$side" 2>/dev/null
}

wheels=(.whl/*.whl)
if [ -e "${wheels[0]}" ]; then
    site=$(mktemp -d "${TMPDIR:-/tmp}/kvlab-site.XXXXXX")
    trap 'rm -rf "$site"' EXIT # the wheels' install is this run's alone
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

if ! part env 30 "$PYTHON" -m experiments.bench.gpu_env --out "$OUT_DIR/env.json" \
    "${dry[@]}"; then
    echo "environment check failed or skipped (see $OUT_DIR/env.log): no other part runs"
    pack
    exit 1
fi
part profile 70 "$PYTHON" -m experiments.bench.profile_gpu --out "$OUT_DIR/profile" "${dry[@]}"
part kernels 60 "$PYTHON" -m experiments.bench.kernels_gpu --out "$OUT_DIR/kernels" "${dry[@]}"
if plan_part engine 190; then
    cutoff=$((limit - ENGINE_RESERVE_S * scale))
    [ "$cutoff" -lt $((limit / 2)) ] && cutoff=$((limit / 2))
    run_part engine "$PYTHON" -m experiments.bench.engine_gpu --out "$OUT_DIR/engine" \
        --max-seconds "$cutoff" "${dry[@]}"
fi
fit_run="$OUT_DIR/engine/${model}_vllm_offline"
held_run="$OUT_DIR/engine/${model}_vllm_online"
if [ -f "$fit_run/steps.csv" ]; then
    profile=()
    if profile_complete; then
        profile=(--profile "$OUT_DIR/profile")
    else
        echo "== no complete profile (none, or its sidecar lacks \"complete\": true): calibrate" \
            "fits without it"
    fi
    check_run=$fit_run
    [ -f "$held_run/steps.csv" ] && check_run=$held_run # another run than the fit's, if any
    if part calibrate 20 "$PYTHON" -m experiments.calibrate "$fit_run" --weighting relative \
        "${profile[@]}" --out "$OUT_DIR/engine/calibration.json"; then
        part validate 40 "$PYTHON" -m experiments.validate "$check_run" \
            --calibration "$OUT_DIR/engine/calibration.json" --out "$check_run/validation.json"
    else
        echo "calibrate failed or skipped: validate skipped (no calibration of this call to check)"
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
exit $status
