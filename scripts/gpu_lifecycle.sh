#!/usr/bin/env bash
# The H200 run behind results/fault-recovery.md: `clockalign inject` with PyTorch (CUDA)
# and ONNX Runtime, every fault each engine can have, N repetitions, under background load.
#   scripts/gpu_lifecycle.sh OUTDIR        # as root; under 8 minutes with the defaults
# Env: BUDGET_S (all the steps together, default 450 s), N (default 20), LOAD (users,
# default 8), DEADLINE_MS (the watchdog's deadline for the timeout fault, default 500;
# the other faults run with 2000, so that an oversized batch is the engine's
# out-of-memory, not the watchdog's), PYTHON (default python3),
# LIMIT_SCALE (multiplies each step's time limit, default 1: a slow machine).
# Needs the offline bundle at .bundle/ (scripts/make_bundle.sh) unless BCC is importable
# already, and the wheels of scripts/gpu_lifecycle.wheels in .whl/ where python3 lacks them.
# Without torch (or without a GPU) it runs the ONNX Runtime rows and says what it left out.
# Writes OUTDIR/lifecycle.{json,md,png}, a run file + Perfetto trace per engine x fault,
# OUTDIR/fault-recovery.md (the table with how it was made) and OUTDIR.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
out=${1:?usage: scripts/gpu_lifecycle.sh OUTDIR}
mkdir -p "$out"
N=${N:-20}; LOAD=${LOAD:-8}; DEADLINE_MS=${DEADLINE_MS:-500}; PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
log() { echo "== $* ($(date -u +%T))"; }
t_start=$(date +%s)

if [ -f .bundle/clockalign-bcc-bundle.tar.xz ]; then
    scripts/install_bundle.sh > "$out/install.txt" 2>&1 || { cat "$out/install.txt"; exit 1; }
    . /opt/clockalign-bcc/env.sh
    SITE=/opt/clockalign-bcc/site
elif "$PY" -c "import bcc" 2>/dev/null; then
    echo "BCC from the OS (no offline bundle here)" > "$out/install.txt"
    export PYTHONPATH="$ROOT/agent${PYTHONPATH:+:$PYTHONPATH}"
    SITE=$ROOT/.whl/site
else
    echo "gpu_lifecycle: no BCC: no .bundle/clockalign-bcc-bundle.tar.xz and $PY cannot import bcc" >&2
    exit 1
fi
for mod in uvicorn starlette; do
    "$PY" -c "import $mod" 2>/dev/null && continue
    w=$(ls .whl/$mod-*.whl 2>/dev/null | head -1)
    [ -n "$w" ] || { echo "gpu_lifecycle: $PY has no $mod and .whl/ has no wheel of it (scripts/gpu_lifecycle.wheels)" >&2; exit 1; }
    mkdir -p "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$w" >> "$out/install.txt" 2>&1
    case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE" ;; esac
done
CA=("$PY" -m clockalign.cli.main)
{ uname -a; date -u; nproc; { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv || echo "no nvidia-smi"; } 2>&1 | head -3
  "$PY" -c 'import sys; print(sys.version)'
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -1
  "$PY" -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())' 2>&1 | tail -1
  "$PY" -c 'import uvicorn, starlette; print("uvicorn", uvicorn.__version__, "starlette", starlette.__version__)' 2>&1 | tail -1
  "$PY" -c 'import locust; print("locust", locust.__version__)' 2>&1 | tail -1
} > "$out/host.txt" 2>&1
cat "$out/host.txt"
skipped=()
rm -f "$out/commands.txt"
common=(-n "$N" --load "$LOAD" -o "$out")
BUDGET_S=${BUDGET_S:-450}     # every step together, so the script ends within 8 minutes
left() { echo $(( BUDGET_S * ${LIMIT_SCALE:-1} - ($(date +%s) - t_start) )); }
run() {   # run NAME SECONDS ARGS...: one `clockalign inject`, bounded, interrupted like Ctrl-C
    local name=$1 secs=$(( $2 * ${LIMIT_SCALE:-1} )) l; shift 2
    l=$(left); [ "$l" -lt "$secs" ] && secs=$l
    if [ "$secs" -lt 20 ]; then skipped+=("$name: not run, the time budget ($BUDGET_S s) was spent"); return; fi
    log "$name (at most $secs s)"
    echo "clockalign inject $* ${common[*]}" >> "$out/commands.txt"
    timeout -s INT "$secs" "${CA[@]}" inject "$@" "${common[@]}" > "$out/inject-$name.txt" 2>&1
    echo "$name rc=$?"; grep -vE "^inject: " "$out/inject-$name.txt" | tail -6
}

if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    log "torch engine tests (tests/gpu/test_inject_torch.py)"
    timeout 60 "$PY" -m pytest -q -ra -p no:cacheprovider tests/gpu/test_inject_torch.py \
        > "$out/pytest-torch.txt" 2>&1; tail -3 "$out/pytest-torch.txt"
    run torch 200 --engine torch --fault oom --fault invalid-input --fault illegal-address \
        --deadline-ms 2000
    run torch-timeout 160 --engine torch --fault timeout --deadline-ms "$DEADLINE_MS"
elif "$PY" -c "import torch" 2>/dev/null; then
    skipped+=("torch: installed but sees no CUDA GPU here, so its rows were not run")
else
    skipped+=("torch: not installed for $PY, so its rows were not run")
fi
run onnxruntime 70 --engine onnxruntime --fault oom --fault invalid-input --deadline-ms 2000
run onnxruntime-timeout 70 --engine onnxruntime --fault timeout --deadline-ms "$DEADLINE_MS"
if ! "$PY" -c "import onnxruntime as o, sys; sys.exit(0 if 'CUDAExecutionProvider' in o.get_available_providers() else 1)" 2>/dev/null; then
    skipped+=("onnxruntime illegal-address: not exercised, this onnxruntime has no CUDA execution provider (a CPU build)")
fi
for f in "$out"/*.ca; do [ -e "$f" ] && "${CA[@]}" info "$f" > "${f%.ca}.info.txt" 2>&1; done

{ echo "# Fault recovery: inject -> detect -> recover per engine"
  echo
  echo "Made by \`scripts/gpu_lifecycle.sh $out\` (N=$N, LOAD=$LOAD, DEADLINE_MS=$DEADLINE_MS) on"
  echo "$(hostname), $(date -u +%F), $(( $(date +%s) - t_start )) s in all; the commands:"
  echo; echo '```'; cat "$out/commands.txt"; echo '```'
  echo; echo '```'; cat "$out/host.txt"; echo '```'
  for s in "${skipped[@]}"; do echo; echo "- $s"; done
  echo; [ -f "$out/lifecycle.md" ] && sed 1d "$out/lifecycle.md"
  echo; echo "![segments](lifecycle.png)"
} > "$out/fault-recovery.md"
log "pack ($(( $(date +%s) - t_start )) s in all)"
tar -C "$out" -cJf "$out.tar.xz" . && ls -la "$out.tar.xz"
