#!/usr/bin/env bash
# The H200 run behind results/fault-recovery.md: `clockalign inject` with PyTorch (CUDA)
# and ONNX Runtime, every fault each engine can have, N repetitions, under background load.
#   scripts/gpu/lifecycle.sh OUTDIR        # as root; under 8 minutes with the defaults
# Env: BUDGET_S (all the steps together, default 450 s), N (default 20), LOAD (users,
# default 8), DEADLINE_MS (the watchdog's deadline for the timeout fault, default 500;
# the other faults run with 2000, so that an oversized batch is the engine's
# out-of-memory, not the watchdog's), PYTHON (default python3),
# LIMIT_SCALE (multiplies each step's time limit, default 1: a slow machine).
# Needs the offline bundle at .bundle/ (scripts/make_bundle.sh) unless BCC is importable
# already, and the wheels of scripts/gpu/lifecycle.wheels in .whl/ where python3 lacks them.
# Without torch (or without a GPU) it runs the ONNX Runtime rows and says what it left out.
# Writes OUTDIR/lifecycle.{json,md,png}, a run file + Perfetto trace per engine x fault,
# OUTDIR/fault-recovery.md (the table with how it was made) and OUTDIR.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/gpu/lifecycle.sh OUTDIR}
mkdir -p "$out"
N=${N:-20}; LOAD=${LOAD:-8}; DEADLINE_MS=${DEADLINE_MS:-500}; PY=${PYTHON:-python3}
NAME=lifecycle.sh; t_start=$(date +%s)
BUDGET_S=${BUDGET_S:-450}     # every step together, so the script ends within 8 minutes
. scripts/gpu/inject_common.sh
common=(-n "$N" --load "$LOAD" -o "$out")

if torch_gpu; then
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
if ! ort_gpu; then
    skipped+=("onnxruntime illegal-address: not exercised, this onnxruntime has no CUDA execution provider (a CPU build)")
fi
for f in "$out"/*.ca; do [ -e "$f" ] && "${CA[@]}" info "$f" > "${f%.ca}.info.txt" 2>&1; done

{ echo "# Fault recovery: inject -> detect -> recover per engine"
  echo
  echo "Made by \`scripts/gpu/lifecycle.sh $out\` (N=$N, LOAD=$LOAD, DEADLINE_MS=$DEADLINE_MS) on"
  echo "$(hostname), $(date -u +%F), $(( $(date +%s) - t_start )) s in all; the commands:"
  echo; echo '```'; cat "$out/commands.txt"; echo '```'
  echo; echo '```'; cat "$out/host.txt"; echo '```'
  for s in "${skipped[@]}"; do echo; echo "- $s"; done
  echo; [ -f "$out/lifecycle.md" ] && sed 1d "$out/lifecycle.md"
  echo; echo "![segments](lifecycle.png)"
} > "$out/fault-recovery.md"
log "pack ($(( $(date +%s) - t_start )) s in all)"
tar -C "$out" -cJf "$out.tar.xz" . && ls -la "$out.tar.xz"
