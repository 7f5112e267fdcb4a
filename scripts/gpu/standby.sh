#!/usr/bin/env bash
# Recovery with a warm standby against the cold restart (issue 28), on the H200: `clockalign
# inject` with PyTorch (CUDA) and ONNX Runtime, each fault cold (one worker: restarted) and
# with --standby (a ready worker takes over, a new one replenishes it), under the same
# background load, N repetitions each.
#   scripts/gpu/standby.sh OUTDIR        # as root
# Env: N (repetitions, default 20), COLD (1: the cold rows too, default; 0: standby rows
# only), STANDBY (standby workers, default 1; 0: cold rows only), ENGINES (default
# "torch onnxruntime"), FAULTS (default "illegal-address timeout oom"), LOAD (users, default
# 8), DEADLINE_MS (the watchdog's deadline for the timeout fault, default 500; the other
# faults run with 2000), BUDGET_S (every step together, default 470, so that the script
# ends within 9 minutes: a step that does not fit is cut or left out and the summary says
# so), PYTHON (default python3), LIMIT_SCALE (multiplies each step's limit).
# Needs the offline bundle at .bundle/ (or /opt/clockalign-bcc installed) unless BCC is
# importable, and the wheels of scripts/gpu/lifecycle.wheels in .whl/ where python3 lacks
# them. Without torch or a GPU it runs the ONNX Runtime rows (the 2-core VM does so).
# Writes OUTDIR/lifecycle.{json,md,png} (cold rows "ENGINE", standby rows "ENGINE + 1
# standby"), per engine x fault its run file and logs, OUTDIR/fault-recovery-standby.md
# (the comparison with how it was made; scripts/gpu/standby_summary.py) and OUTDIR.tar.xz (all
# but the run files).
# Time (H200, N=20): a PyTorch restart is ~4-5 s, and each standby repetition waits for the
# replenish, so each torch illegal-address/timeout row is ~100-130 s and everything together
# ~10 min: make it two calls, each within 9 minutes, and one summary of both:
#   FAULTS="illegal-address oom" scripts/gpu/standby.sh A; FAULTS=timeout scripts/gpu/standby.sh B
#   python3 scripts/gpu/standby_summary.py A B        # writes A/fault-recovery-standby.md
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/gpu/standby.sh OUTDIR}
mkdir -p "$out"
N=${N:-20}; LOAD=${LOAD:-8}; DEADLINE_MS=${DEADLINE_MS:-500}; PY=${PYTHON:-python3}
COLD=${COLD:-1}; STANDBY=${STANDBY:-1}; ENGINES=${ENGINES:-torch onnxruntime}
FAULTS=${FAULTS:-illegal-address timeout oom}
NAME=standby.sh; t_start=$(date +%s)
BUDGET_S=${BUDGET_S:-470}
. scripts/gpu/inject_common.sh
common=(-n "$N" --load "$LOAD" --no-export -o "$out")
modes=()
[ "$STANDBY" -gt 0 ] && modes+=("--standby $STANDBY")
[ "$COLD" = 1 ] && modes+=("")
[ ${#modes[@]} -gt 0 ] || { echo "standby.sh: COLD=0 and STANDBY=0 leave nothing to run" >&2; exit 1; }

pair() {   # pair ENGINE FAULT DEADLINE_MS SECONDS: the fault with a standby, then cold
    local engine=$1 fault=$2 dl=$3 secs=$4 m tag
    for m in "${modes[@]}"; do
        tag=$engine-$fault${m:+-standby$STANDBY}
        # shellcheck disable=SC2086
        run "$tag" "$secs" --engine "$engine" --fault "$fault" --deadline-ms "$dl" $m
    done
}
limit() {   # limit ENGINE FAULT: seconds for one row of N repetitions
    case $1-$2 in
    torch-illegal-address|torch-timeout) echo $(( 40 + 7 * N )) ;;   # a ~4-5 s restart each
    torch-*|*-illegal-address) echo $(( 30 + 3 * N )) ;;
    *) echo $(( 20 + 2 * N )) ;;
    esac
}
if [[ " $ENGINES " == *" torch "* ]] && torch_gpu; then
    log "the standby on the GPU (tests/gpu/test_inject_standby_torch.py)"
    timeout 150 "$PY" -m pytest -q -ra -p no:cacheprovider tests/gpu/test_inject_standby_torch.py \
        > "$out/pytest-standby-torch.txt" 2>&1; tail -3 "$out/pytest-standby-torch.txt"
fi
for engine in $ENGINES; do
    case $engine in
    torch) torch_gpu || { skipped+=("torch: not installed or sees no CUDA GPU for $PY, so its rows were not run"); continue; } ;;
    onnxruntime) ;;
    *) skipped+=("$engine: not an engine of the reference service"); continue ;;
    esac
    for fault in $FAULTS; do
        if [ "$fault" = illegal-address ] && [ "$engine" = onnxruntime ] && ! ort_gpu; then
            skipped+=("onnxruntime illegal-address: not exercised, this onnxruntime has no CUDA execution provider (a CPU build)")
            continue
        fi
        dl=2000; [ "$fault" = timeout ] && dl=$DEADLINE_MS
        pair "$engine" "$fault" "$dl" "$(limit "$engine" "$fault")"
    done
done
for f in "$out"/*.ca; do [ -e "$f" ] && "${CA[@]}" info "$f" > "${f%.ca}.info.txt" 2>&1; done
printf '%s\n' "${skipped[@]}" > "$out/skipped.txt"
echo "\`scripts/gpu/standby.sh $out\` (N=$N, COLD=$COLD, STANDBY=$STANDBY, ENGINES=\"$ENGINES\", FAULTS=\"$FAULTS\", LOAD=$LOAD, DEADLINE_MS=$DEADLINE_MS, BUDGET_S=$BUDGET_S) on $(hostname), $(date -u '+%F %H:%M') UTC, $(( $(date +%s) - t_start )) s in all" > "$out/made.txt"
"$PY" scripts/gpu/standby_summary.py "$out" && cat "$out/fault-recovery-standby.md" | head -30
log "pack ($(( $(date +%s) - t_start )) s in all)"
tar -C "$out" --exclude='*.ca' -cJf "$out.tar.xz" . && ls -la "$out.tar.xz"
