#!/usr/bin/env bash
# One storm recorded by `clockalign record --pid`, with the recorder's own output kept:
#   scripts/bench/storm_record.sh THREADS SECONDS [RATE_PER_THREAD] OUTDIR
# (PY=... a python with clockalign installed, default python3)
set -u
cd "$(dirname "$0")/../.."
T=$1 S=$2 R=${3:-0} O=$4
PY=${PY:-python3}
mkdir -p "$O/lib"
gcc -O2 -o "$O/storm" scripts/workloads/storm.c -ldl -lpthread
gcc -shared -fPIC -O0 -fcf-protection=none -o "$O/lib/libcuda.so.1" scripts/workloads/stormlib.c
args=(--lib "$O/lib/libcuda.so.1" --threads "$T" --seconds "$S" --wait)
[ "$R" != 0 ] && args+=(--rate "$R")
rm -f "$O/storm-$T-$R.ca"
coproc ST { "$O/storm" "${args[@]}"; }
read -u "${ST[0]}" _ pid
"$PY" -X faulthandler -m clockalign.cli.main record --pid "$pid" \
    --libcuda "$O/lib/libcuda.so.1" -o "$O/storm-$T-$R.ca" --quiet > "$O/rec-$T-$R.txt" 2>&1 &
rp=$!
while [ ! -f "$O/storm-$T-$R.ca" ] && kill -0 $rp 2>/dev/null; do sleep 0.1; done; sleep 0.5
echo go >&"${ST[1]}"; read -u "${ST[0]}" res; echo "storm: $res"
sleep 0.5; kill -INT $rp 2>/dev/null; wait $rp; echo "recorder rc=$?"
tail -8 "$O/rec-$T-$R.txt"
