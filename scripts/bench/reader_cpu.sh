#!/usr/bin/env bash
# The recorder's CPU with the C buffer reader against the Python one (scripts/bench/
# python_reader.py, the benchmark's arm: BENCH_READER=python), interleaved:
# ROUNDS rounds, each mode in turn (order flipped every round), one paced storm thread of
# RATE calls/s for SECONDS, through scripts/bench/probe_cost.py --parts storm.
#   sudo PY=.venv/bin/python scripts/bench/reader_cpu.sh ROUNDS RATE SECONDS OUTDIR
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=$1 rate=$2 secs=$3 out=$4
PY=${PY:-python3}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then order="native python"; else order="python native"; fi
    for m in $order; do
        BENCH_READER=$m "$PY" scripts/bench/probe_cost.py --parts storm --storm-threads "" \
            --paced "1x${rate}x${secs}" --out "$out/$m-$r" > "$out/$m-$r.txt" 2>&1
        rm -f "$out/$m-$r/overhead.png"
        echo "round $r $m: $(grep -E '^\| 1 ' "$out/$m-$r/overhead.md")"
    done
done
