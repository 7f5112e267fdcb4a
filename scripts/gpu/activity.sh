#!/usr/bin/env bash
# GPU activity (issue 14) on a GPU host, in two stages (each fits one device call):
#   scripts/gpu/activity.sh smoke OUTDIR    # build the CUPTI injection library and the native
#                                           # ping-pong; short raw and converted stamp-kernel
#                                           # runs; native vs Python probe; ResNet-18 under it
#   scripts/gpu/activity.sh converted OUTDIR  # converted vs raw timestamps, each under a
#                                           # watchdog that writes a hang's stacks
#   scripts/gpu/activity.sh measure OUTDIR  # (a) raw CUPTI vs in-kernel %globaltimer,
#                                           # (b) mapped kernels inside launch..sync,
#                                           # (c) 300 s converted CUPTI vs clockalign's mapping
#                                           #     (= the 5-minute alignment rerun under load),
#                                           # (d) ResNet-18 cost, probe cost
# Needs root, the offline bundle (scripts/make_bundle.sh) at .bundle/ or ../.bundle/, and
# python3 with torch, torchvision and cuda-bindings; results/gpu-activity.md is written from
# OUTDIR's check-*.json (scripts/gpu/activity_check.py) and cost.json (there is no script for
# it).  KEEP_DIR=DIR copies each small result there as soon as it is made (a device run returns
# few files).
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=$1
out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONUNBUFFERED=1
log() { echo "== $* ($(date -u +%T))"; }
keep() { [ -n "${KEEP_DIR:-}" ] && cp "$@" "$KEEP_DIR/" 2>/dev/null; return 0; }  # small results, as they come
B=.bundle/clockalign-bcc-bundle.tar.xz
[ -f "$B" ] || B=../.bundle/clockalign-bcc-bundle.tar.xz
scripts/install_bundle.sh "$B" > "$out/install.txt" 2>&1 || { cat "$out/install.txt"; exit 1; }
. /opt/clockalign-bcc/env.sh
{ date -u +%FT%TZ; uname -a; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch,sys; print(sys.version.split()[0], torch.__version__)'; gcc --version | head -1
} > "$out/host.txt" 2>&1; cat "$out/host.txt"
log build
python3 - > "$out/build.txt" 2>&1 <<'PY'
from clockalign.capture.clocks import gpuclock
from clockalign.capture.gpu import cupti
inst = cupti.find_cupti(); print("cupti:", inst)
print("injection library:", cupti.injection_library(inst))
print("native ping-pong:", gpuclock.native_loop())
PY
cat "$out/build.txt"
stamp() {  # stamp NAME SECONDS [record options...] -- [workload options...]
    local name=$1 secs=$2; shift 2
    local ropts=() wopts=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do ropts+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    wopts=("$@")
    timeout 400 clockalign record --gpu-activity -o "$out/$name.ca" --quiet "${ropts[@]}" -- \
        python3 scripts/workloads/stamp_kernels.py --seconds "$secs" --out "$out/$name-stamps.npz" \
        "${wopts[@]}" > "$out/$name-record.txt" 2>&1
    echo "record rc=$?"; tail -3 "$out/$name-record.txt"
    timeout 60 clockalign info "$out/$name.ca" > "$out/$name-info.txt" 2>&1
}
if [ "$stage" = smoke ]; then
    log raw;       stamp raw 5
    log converted; stamp conv 5 --gpu-activity-timestamps converted
    python3 scripts/gpu/activity_check.py --run "$out/raw.ca" --stamps "$out/raw-stamps.npz" \
        --out "$out/check-raw.json" 2>&1 | tail -25
    clockalign dump "$out/raw.ca" 2>&1 | grep -m3 gpu_kernel
    log probe
    for loop in native; do
        clockalign record --no-cuda --duration 12 --gpu-clock-period 0.25 \
            -o "$out/probe-$loop.ca" --quiet -- sleep 20 > "$out/probe-$loop.txt" 2>&1
        clockalign align "$out/probe-$loop.ca" --json > "$out/probe-$loop.json" 2>&1
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(sys.argv[2], k, v.get('min_rtt_ns', v.get('summary',{}).get('min_rtt_ns')), v.get('halfwidth_ns') or v.get('summary',{}).get('halfwidth_ns')) for k,v in (d.get('domains') or d).items() if k.startswith('GPU')]" "$out/probe-$loop.json" $loop 2>&1 | head -3
    done
    log resnet
    clockalign record --gpu-activity -o "$out/resnet.ca" --quiet -- \
        python3 scripts/workloads/resnet_loop.py --seconds 8 --log "$out/resnet.log" > "$out/resnet.txt" 2>&1
    tail -3 "$out/resnet.txt"; clockalign info "$out/resnet.ca" 2>&1 | grep -iE "gpu_|notice|cupti|stopped" | head
    rm -f "$out/resnet.ca"
elif [ "$stage" = converted ]; then
    # --gpu-activity-timestamps converted hung once (results/gpu-activity.md): each mode
    # under a 90 s watchdog that, on a hang, writes every thread's state and kernel stack and
    # has the recorder and the workload print their Python stacks (SIGUSR1, faulthandler)
    FH='import faulthandler,signal,sys; faulthandler.register(signal.SIGUSR1, all_threads=True); sys.argv[0]="clockalign"; from clockalign.cli.main import main; main()'
    tree() { local p; for p in $(pgrep -P "$1"); do echo "$p"; tree "$p"; done; }
    # CONV_S (default 5) seconds of stamp kernels; MODES (default "converted raw");
    # STAMP_OPTS: more scripts/workloads/stamp_kernels.py options (e.g. "--round-sleep-ms 2")
    for mode in ${MODES:-converted raw}; do
        log "$mode"
        python3 -c "$FH" record --gpu-activity --gpu-activity-timestamps "$mode" \
            -o "$out/$mode.ca" --quiet -- python3 scripts/workloads/stamp_kernels.py --seconds "${CONV_S:-5}" \
            --out "$out/$mode-stamps.npz" ${STAMP_OPTS:-} > "$out/$mode-record.txt" 2>&1 &
        rp=$!
        for _ in $(seq $((${CONV_S:-5} + 85))); do kill -0 $rp 2>/dev/null || break; sleep 1; done
        if kill -0 $rp 2>/dev/null; then
            echo "$mode: still running $((${CONV_S:-5} + 85)) s later"
            for p in $rp $(tree $rp); do
                echo "## $p $(tr '\0' ' ' < /proc/$p/cmdline)"
                for t in /proc/$p/task/*; do
                    echo "# task ${t##*/} $(cat $t/comm) $(awk '{print $3}' $t/stat) wchan=$(cat $t/wchan)"
                    cat $t/stack 2>/dev/null | head -12
                done
                case "$(cat /proc/$p/comm)" in python*) kill -USR1 $p;; esac
            done > "$out/$mode-hang.txt" 2>&1
            sleep 3; kill -INT $rp; sleep 5; pkill -KILL -P $rp; kill -KILL $rp 2>/dev/null
        fi
        wait $rp; echo "record rc=$?"; tail -4 "$out/$mode-record.txt"
        timeout 60 clockalign info "$out/$mode.ca" > "$out/$mode-info.txt" 2>&1
        grep -iE "gpu_|cupti|notice|stopped|timestamps" "$out/$mode-info.txt" | head -8
        timeout 60 clockalign dump "$out/$mode.ca" 2>&1 | grep -m2 gpu_kernel
        timeout 120 python3 scripts/gpu/activity_check.py --run "$out/$mode.ca" \
            --stamps "$out/$mode-stamps.npz" --out "$out/check-$mode.json" --plot "$out/$mode.png" \
            > "$out/check-$mode.txt" 2>&1
        echo "check rc=$?"; tail -12 "$out/check-$mode.txt"
    done
    rm -f "$out"/*.ca "$out"/*-stamps.npz
elif [ "$stage" = measure ]; then
    # 5-minute recording under load (bf16 matmuls + self-stamping kernels), raw timestamps:
    # (a), (b) and the alignment rerun; torch.profiler's converted times for (c) from a second
    # process of self-stamping kernels while the GPU clock is probed; then (d)
    log long
    ( sleep 30; timeout 150 python3 scripts/gpu/kineto_stamps.py --seconds 70 \
        --out "$out/kineto.npz" > "$out/kineto.txt" 2>&1 ) &
    kin=$!
    stamp long 295 --duration 305 --gpu-clock-period 0.25 -- --matmul --per-sync 4 --round-sleep-ms 2 \
        --gap-every 25
    wait $kin; tail -2 "$out/kineto.txt"; keep "$out/kineto.txt"; cat "$out/long-info.txt"
    timeout 60 clockalign align "$out/long.ca" --json --write-pairs "$out/align" > "$out/align.json" \
        2> "$out/align-extract.txt"; keep "$out/align.json"
    timeout 120 python3 scripts/gpu/activity_check.py --run "$out/long.ca" \
        --stamps "$out/long-stamps.npz" --kineto "$out/kineto.npz" --out "$out/check-long.json" \
        --plot "$out/gpu-activity.png" > "$out/check-long.txt" 2>&1; tail -40 "$out/check-long.txt"
    keep "$out/check-long.json" "$out/gpu-activity.png"
    xz -T4 "$out/align/gpu0_sandwiches.csv"; keep "$out/align/gpu0_sandwiches.csv.xz"
    log resnet-cost
    timeout 120 python3 scripts/bench/gpu_activity_cost.py --seconds 5 --rounds 1 \
        --configs plain,+gpu-activity,torch.profiler --out "$out/cost.json" > "$out/cost.txt" 2>&1
    tail -12 "$out/cost.txt"; keep "$out/cost.json"
fi
[ -n "${KEEP_DIR:-}" ] && exit 0
log pack
tar -C "$out" --exclude='*.ca' --exclude='conv-stamps.npz' -cJf "$out.tar.xz" . && ls -la "$out.tar.xz"
