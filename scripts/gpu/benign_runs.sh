#!/usr/bin/env bash
# Benign patterns on real workloads (issue 27), on a GPU host, < 3 min:
#   scripts/gpu/benign_runs.sh OUTDIR
# Records with `clockalign record` (spawn mode, counters and GPU clock on) four short
# workloads of scripts/workloads/benign.py: PyTorch eager, torch.compile with CUDA
# graphs (mode="reduce-overhead"), a transformers GPT-2 (2-layer config, generate), and
# ONNX Runtime (whatever build is installed: the CPU one on the H200 host, recorded anyway:
# its workload JSON says whether the process mapped libcuda); then `clockalign demo`.
# Each run leaves NAME.ca, NAME-workload.json, NAME-record.txt, NAME-faults.txt/.json; then
# scripts/gpu/benign_summary.py writes OUTDIR/summary.md: every failing CUDA call and
# connect() of each run, the faults clockalign lists and the notes timeline/benign.py made.
# Needs root, the offline bundle (scripts/make_bundle.sh) at .bundle/ or ../.bundle/, and
# python3 with torch (+ transformers, onnxruntime, onnx where available); no network.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$(mkdir -p "$1" && cd "$1" && pwd)
export PYTHONUNBUFFERED=1
log() { echo "== $* ($(date -u +%T))"; }
B=.bundle/clockalign-bcc-bundle.tar.xz
[ -f "$B" ] || B=../.bundle/clockalign-bcc-bundle.tar.xz
scripts/install_bundle.sh "$B" > "$out/install.txt" 2>&1 || { cat "$out/install.txt"; exit 1; }
. /opt/clockalign-bcc/env.sh
{ date -u +%FT%TZ; uname -a; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  python3 -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 | tail -1
  python3 -c 'import onnxruntime as r; print("onnxruntime", r.__version__, r.get_available_providers())' 2>&1 | tail -1
  ls -l /var/run/nscd/socket /tmp/nvidia-mps 2>&1
  grep -E '^(passwd|group|hosts):' /etc/nsswitch.conf
} > "$out/host.txt" 2>&1; cat "$out/host.txt"
for mode in eager compile gpt2 ort; do
    log "$mode"
    timeout 150 clockalign record -o "$out/$mode.ca" --quiet -- \
        python3 scripts/workloads/benign.py "$mode" --out "$out/$mode-workload.json" \
        > "$out/$mode-record.txt" 2>&1
    echo "record rc=$?"; tail -2 "$out/$mode-record.txt"
    clockalign faults "$out/$mode.ca" > "$out/$mode-faults.txt" 2>&1
    clockalign faults "$out/$mode.ca" --json > "$out/$mode-faults.json" 2>&1
    head -3 "$out/$mode-faults.txt"
done
log demo
timeout 150 clockalign demo -o "$out/demo-dir" > "$out/demo-output.txt" 2>&1
echo "demo rc=$? ($(wc -l < "$out/demo-output.txt") lines)"; cat "$out/demo-output.txt"
cp "$out/demo-dir/demo.ca" "$out/demo.ca" 2>/dev/null
cp "$out/demo-dir/workload.json" "$out/demo-workload.json" 2>/dev/null
{ echo "Made by \`clockalign demo\` inside \`sudo scripts/gpu/benign_runs.sh $1\` on $(date -u +%F) (host.txt)"; echo
  cat "$out/demo-dir/report/report.md"; } > "$out/demo-report.md" 2>/dev/null
rm -rf "$out/demo-dir"
log summary
python3 scripts/gpu/benign_summary.py "$out" > /dev/null 2>"$out/summary-errors.txt"
cat "$out/summary.md"
