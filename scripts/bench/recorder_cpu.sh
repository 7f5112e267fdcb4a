#!/usr/bin/env bash
# Recorder CPU per event, native batch helper against the numpy path, interleaved rounds:
#   scripts/bench/recorder_cpu.sh ROUNDS THREADS SECONDS OUTDIR
# Each round runs one storm (scripts/bench/probe_cost.py --parts storm) per path; the json
# files keep each run's recorder CPU time, events recorded and drops.
set -u
cd "$(dirname "$0")/../.."
R=$1 T=$2 S=$3 O=$4
PY=${PY:-python3}
mkdir -p "$O"
for r in $(seq 1 "$R"); do
    order="native numpy"; [ $((r % 2)) -eq 0 ] && order="numpy native"   # rotate
    for path in $order; do
        env $( [ $path = numpy ] && echo CLOCKALIGN_NO_NATIVE=1 ) "$PY" scripts/bench/probe_cost.py \
            --parts storm --storm-threads "$T" --storm-seconds "$S" --out "$O/$path-$r" \
            > "$O/$path-$r.txt" 2>&1
    done
done
"$PY" - "$O" <<'PY'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
rows = {}
for f in sorted(out.glob("*-*/overhead.json")):
    path = f.parent.name.rsplit("-", 1)[0]
    for r in json.loads(f.read_text())["storm"]["runs"]:
        if r["recorded"]:
            rows.setdefault(path, []).append(
                (1e9 * r["recorder_cpu_s_during_storm"] / r["recorded"], r["recorded"], r["drops"]))
print("| path | recorder CPU ns per event, median (min-max) | runs | events | drops |")
print("|---|---|---|---|---|")
for path, v in rows.items():
    ns = [x[0] for x in v]
    print(f"| {path} | {statistics.median(ns):.0f} ({min(ns):.0f}-{max(ns):.0f}) | {len(v)} | "
          f"{sum(x[1] for x in v)} | {sum(x[2] for x in v)} |")
PY
