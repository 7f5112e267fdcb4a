#!/usr/bin/env bash
# Benign patterns on a host without a GPU (issue 27): the stand-in libcuda's target with
# glibc's passwd lookup (nscd probe), a driver that answers DEINITIALIZED once exit began,
# kernel lookups not found before normal work, next to real faults (two OOMs, a connect()
# to a missing unix socket); and ONNX Runtime's CPU build, a real library, recorded as is.
#   sudo scripts/gpu/benign_runs_vm.sh OUTDIR       (PYTHON=... for the venv with clockalign)
# Writes OUTDIR/*.ca, *-workload.json, *-record.txt and summary.md (scripts/gpu/benign_summary.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$(mkdir -p "$1" && cd "$1" && pwd)
PY=${PYTHON:-python3}
ca() { "$PY" -m clockalign.cli.main "$@"; }
{ date -u +%FT%TZ; uname -a; "$PY" --version; ldd --version | head -1
  "$PY" -c 'import onnxruntime as r; print("onnxruntime", r.__version__, r.get_available_providers())' 2>&1 | tail -1
  ls -l /var/run/nscd/socket 2>&1; grep -E '^(passwd|group|hosts):' /etc/nsswitch.conf
} > "$out/host.txt" 2>&1; cat "$out/host.txt"
sb=$(mktemp -d)
"$PY" -c "from clockalign.workloads.standin import build; build('$sb')"
LD_LIBRARY_PATH=$sb ca record -o "$out/standin.ca" --counters none --no-gpu-clock --quiet -- \
    "$sb/target" --no-sweep --getpwuid --deinit 3 --connect-unix /tmp/ca-missing-infer.sock \
    > "$out/standin-record.txt" 2>&1
tail -1 "$out/standin-record.txt"
# no libcuda on this host: ONNX Runtime's CPU build is recorded without CUDA probes
ca record -o "$out/ort.ca" --no-cuda --counters none --no-gpu-clock --quiet -- \
    "$PY" scripts/workloads/benign.py ort --out "$out/ort-workload.json" \
    > "$out/ort-record.txt" 2>&1
tail -1 "$out/ort-record.txt"
for r in standin ort; do ca faults "$out/$r.ca" > "$out/$r-faults.txt" 2>&1; done
rm -rf "$sb"
"$PY" scripts/gpu/benign_summary.py "$out" "sudo scripts/gpu/benign_runs_vm.sh $1" > /dev/null \
    && cat "$out/summary.md"
