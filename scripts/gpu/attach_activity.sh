#!/usr/bin/env bash
# record --pid --gpu-activity on a running decode loop (issue 29 item 4), on a GPU host:
#   scripts/gpu/attach_activity.sh OUTDIR
# Starts the serving-loop benchmark's decode loop (scripts/workloads/decode_loop.py: GPT-2,
# static cache, CUDA graphs), lets it run plain 25 s, attaches `clockalign record --pid PID
# --gpu-activity` for 20 s, 25 s plain, attaches again for 10 s (the second enabling of CUPTI
# in one process: the serving-loop run saw a target die there), 20 s plain, then ends the
# loop with SIGTERM and checks its exit code.  Writes the raw files (decode.log, marks.txt,
# attach*.ca's summaries, the record outputs) and summary.md / summary.json:
# tokens/s before / attached / after each recording (windows from the run files' MODE
# records), kernels recorded, joined to their BPF launch, mapped with their bound.
# About 3 minutes.  Needs root, the offline bundle (scripts/make_bundle.sh) at .bundle/ or
# ../.bundle/, python3 with torch and transformers.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$(mkdir -p "$1" && cd "$1" && pwd)
export PYTHONUNBUFFERED=1
log() { echo "== $* ($(date -u +%T))"; }
mono() { python3 -c 'import time; print(time.monotonic_ns())'; }
B=.bundle/clockalign-bcc-bundle.tar.xz
[ -f "$B" ] || B=../.bundle/clockalign-bcc-bundle.tar.xz
scripts/install_bundle.sh "$B" > "$out/install.txt" 2>&1 || { cat "$out/install.txt"; exit 1; }
. /opt/clockalign-bcc/env.sh
{ date -u +%FT%TZ; uname -a; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch,sys; print(sys.version.split()[0], torch.__version__)'
  echo "command: scripts/gpu/attach_activity.sh $1"; git log -1 --format='commit %H' 2>/dev/null
} > "$out/host.txt" 2>&1; cat "$out/host.txt"
log build
python3 -c 'from clockalign.capture.gpu import cupti; i = cupti.find_cupti(); print(i)
print(cupti.injection_library(i))' \
    > "$out/build.txt" 2>&1; cat "$out/build.txt"
log "decode loop"
python3 scripts/workloads/decode_loop.py --seconds 170 --log "$out/decode.log" > "$out/loop.txt" 2>&1 &
loop=$!
for _ in $(seq 120); do grep -q '"ready"' "$out/loop.txt" 2>/dev/null && break
    kill -0 $loop 2>/dev/null || break; sleep 1; done
cat "$out/loop.txt"
grep -q '"ready"' "$out/loop.txt" || { echo "the decode loop did not get ready"; kill $loop; exit 1; }
grep -E 'libcupti|libcuda' /proc/$loop/maps | awk '{print $6}' | sort -u > "$out/maps-before.txt"
ls /proc/$loop/task | wc -l > "$out/threads-before.txt"
: > "$out/marks.txt"
attach() {  # attach N SECONDS
    log "attach $1 for $2 s"
    echo "record$1_start $(mono)" >> "$out/marks.txt"
    timeout 120 clockalign record --pid $loop --gpu-activity --duration "$2" \
        -o "$out/attach$1.ca" > "$out/attach$1-record.txt" 2>&1
    echo "record rc=$?"; echo "record$1_end $(mono)" >> "$out/marks.txt"
    grep -E "GPU activity|CUPTI|wrote|error" "$out/attach$1-record.txt"
    ls /proc/$loop/task 2>/dev/null | wc -l > "$out/threads-after$1.txt"
    kill -0 $loop 2>/dev/null || echo "the decode loop is gone"
}
sleep 25
attach 1 20
sleep 25
attach 2 10
sleep 20
log "end of the loop"
kill -TERM $loop; wait $loop; rc=$?
echo "loop_rc $rc" >> "$out/marks.txt"; echo "decode loop rc=$rc (0: it ended normally)"
echo "threads before $(cat "$out/threads-before.txt"), after each detach: $(cat "$out"/threads-after*.txt | tr '\n' ' ')"
{ echo "Made by \`sudo scripts/gpu/attach_activity.sh $1\` on $(date -u +%F) ($(head -3 "$out/host.txt" | tr '\n' ' '))"; echo
  timeout 300 python3 scripts/gpu/attach_summary.py --log "$out/decode.log" --marks "$out/marks.txt" \
    --run "$out/attach1.ca" --run "$out/attach2.ca" --out "$out/summary.json"; } > "$out/summary.md" 2>&1
cat "$out/summary.md"
for n in 1 2; do timeout 60 clockalign info "$out/attach$n.ca" > "$out/attach$n-info.txt" 2>&1; done
rm -f "$out"/attach*.ca     # large; the summaries hold what they showed
