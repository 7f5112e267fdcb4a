#!/usr/bin/env bash
# The GPU-host measurements behind results/*-gpu.md, in two stages (each fits one device call).
#   scripts/gpu/session.sh record OUTDIR   # bundle install, doctor, demo (reference workload),
#                                          # faults run, idle/busy counters, NVML capture, GPU tests
#   scripts/gpu/session.sh final OUTDIR    # demo with report and trace, --pid before `import torch`, GPU tests
#   scripts/gpu/session.sh align OUTDIR    # a 5-minute recording with a co-running matmul
#                                          # loop (its sandwiches, align --json), probe cost
#   scripts/gpu/session.sh coverage OUTDIR # libcuda entry points reached, clockalign vs CUPTI
#                                          # counts (results/coverage.md), probe cost per call
#   scripts/gpu/session.sh overhead OUTDIR # probe cost per call, to a ResNet-18 loop, event
#                                          # storms (results/overhead/)
#   scripts/gpu/session.sh rerun OUTDIR    # RERUN_S (default 510) seconds after the install:
#                                          # the 2 M/s storm on the current recorder, watch's
#                                          # probe cost beside record's, ResNet-18 plain / empty
#                                          # programs / clockalign in the time that is left
#   scripts/gpu/session.sh cost OUTDIR     # ResNet-18 (rate and launching thread's CPU
#                                          # time) in COST_ROUNDS rounds, then the micro
#   scripts/gpu/session.sh slots OUTDIR    # the slot rings against the perf buffers: storms
#                                          # (drops at 2 and 3 M/s), the micro A/B with every
#                                          # configuration's BPF run time, watch beside record
#   scripts/gpu/session.sh pinned OUTDIR   # the micro A/B with the storm pinned to one CPU,
#                                          # then ResNet-18 in the rounds that fit PINNED_S
#   scripts/gpu/session.sh ab OUTDIR       # per call with the configurations switched inside
#                                          # one pinned storm process (AB_ROUNDS), then
#                                          # ResNet-18 in the rounds that fit AB_S
# Needs root, the offline bundle at .bundle/ (scripts/make_bundle.sh) and python3 with torch.
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=$1
out=$2
mkdir -p "$out"
export PYTHONUNBUFFERED=1
log() { echo "== $* ($(date -u +%T))"; }
# ResNet-18 plain / empty programs / clockalign in as many rounds as fit in what is left of
# BUDGET seconds since $t0, at SECS_PER_ROUND a round (3 configurations x (3 s window + 1 s
# settle + attach/detach, the recorder's start most of it)), at most MAX rounds
model_in_time_left() {
    local left=$(( $1 - ($(date +%s) - t0) )) rounds
    log "model ($left s left)"
    [ "$left" -gt 120 ] || return 0
    rounds=$(( (left - 60) / $2 )); [ "$rounds" -gt "$3" ] && rounds=$3
    timeout "$left" python3 scripts/bench/probe_cost.py --parts model --rounds "$rounds" \
        --window 3 --configs plain,pair_empty_multi,clockalign_full --out "$out/model" \
        > "$out/model.txt" 2>&1; echo "model rc=$?"; grep -E '^\|' "$out/model/overhead.md"
}
scripts/install_bundle.sh > "$out/install.txt" 2>&1 || { cat "$out/install.txt"; exit 1; }
. /opt/clockalign-bcc/env.sh
{ uname -a; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c 'import torch,sys; print(sys.version, torch.__version__)'; } > "$out/host.txt" 2>&1

if [ "$stage" = record ]; then
    log doctor;   clockalign doctor > "$out/doctor.txt" 2>&1; cat "$out/doctor.txt"
    log demo;     clockalign demo -o "$out/demo" > "$out/demo.txt" 2>&1; tail -30 "$out/demo.txt"
    clockalign info "$out/demo/demo.ca" > "$out/demo-info.txt" 2>&1
    clockalign dump "$out/demo/demo.ca" > "$out/demo-dump.jsonl" 2>&1
    log faults
    clockalign record -o "$out/faults.ca" --counter-interval 0.02 --quiet -- \
        python3 scripts/workloads/known_faults.py --out "$out/faults.json" > "$out/faults-record.txt" 2>&1
    clockalign faults "$out/faults.ca" > "$out/faults.txt" 2>&1; tail -40 "$out/faults.txt"
    dmesg 2>/dev/null | grep -i xid | tail -5 > "$out/dmesg-xid.txt"
    log idle;     clockalign record -o "$out/idle.ca" --no-cuda --quiet -- sleep 5 > "$out/idle.txt" 2>&1
    log busy
    clockalign record -o "$out/busy.ca" --quiet -- python3 -c "
import torch,time
a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16); t=time.time()
while time.time()-t<6: a@a
torch.cuda.synchronize()" > "$out/busy.txt" 2>&1
    log nvml;     python3 scripts/data/capture_nvml.py --out "$out/nvml" > "$out/nvml.txt" 2>&1; tail -5 "$out/nvml.txt"
    log gputests; python3 -m pytest -q -ra tests/gpu tests/unit -p no:cacheprovider > "$out/pytest-gpu.txt" 2>&1; tail -15 "$out/pytest-gpu.txt"
elif [ "$stage" = final ]; then
    log demo;     clockalign demo -o "$out/demo" > "$out/demo.txt" 2>&1; grep -E "ok  |DIFF|wrote" "$out/demo.txt"
    log late-import   # --pid on a python that imports torch only after the probes are armed
    python3 -c "
import time; time.sleep(4)
import torch; x=torch.ones(8,device='cuda')
for _ in range(100): x.add_(1)
torch.cuda.synchronize(); print('late', float(x[0]))" > "$out/late-target.txt" 2>&1 &
    tp=$!; sleep 1
    clockalign record --pid $tp -o "$out/late.ca" --quiet > "$out/late-record.txt" 2>&1
    wait $tp; cat "$out/late-record.txt" "$out/late-target.txt"
    clockalign info "$out/late.ca" | grep -E "events|notice|stopped"
    log gputests; python3 -m pytest -q -ra tests/gpu tests/unit -p no:cacheprovider > "$out/pytest-gpu.txt" 2>&1; tail -6 "$out/pytest-gpu.txt"
elif [ "$stage" = align ]; then
    log align-record   # issue 14 item 5: 5 minutes under load, then the probe's cost
    clockalign record -o "$out/align.ca" --duration 300 --gpu-clock-period 0.25 --quiet -- python3 -c "
import torch,time
a=torch.randn(4096,4096,device='cuda',dtype=torch.bfloat16); n=0; t=time.time()
while time.time()-t<310:
    for _ in range(20): a@a
    torch.cuda.synchronize(); n+=20
print('matmuls', n)" > "$out/align-record.txt" 2>&1; tail -3 "$out/align-record.txt"
    clockalign info "$out/align.ca" > "$out/align-info.txt" 2>&1; grep -iE "ping|GPU0|notice" "$out/align-info.txt" | head -8
    timeout 60 clockalign align "$out/align.ca" --json --write-pairs "$out" > "$out/align.json" \
        2>> "$out/align-record.txt"
    xz -T4 "$out/gpu0_sandwiches.csv"; rm -f "$out"/cpu_*_sandwiches.csv "$out/align.ca"
    log probe-cost
    python3 scripts/bench/clock_probe_cost.py --seconds 100 --interval 5 --gpu-period 0.25 --out "$out/cost" > "$out/cost.txt" 2>&1; tail -8 "$out/cost.txt"
    rm -f "$out/cost/probe_run.ca"
elif [ "$stage" = coverage ]; then
    log entrypoints
    timeout 240 python3 scripts/gpu/cuda_entrypoints.py --out "$out/entrypoints.json" -- \
        scripts/workloads/coverage_window.py --no-profiler --out "$out/ep-workload.json" \
        > "$out/entrypoints.txt" 2>&1; grep -E '^#|attached' "$out/entrypoints.txt" | head -5
    log coverage
    timeout 300 python3 scripts/gpu/cupti_coverage.py --out "$out/coverage" > "$out/coverage.txt" 2>&1
    echo "coverage rc=$?"; grep -E '^\|' "$out/coverage/coverage.md" | head -40
    rm -f "$out/coverage/coverage-dump.jsonl"
    log micro
    timeout 200 python3 scripts/bench/probe_cost.py --parts micro --rounds 5 --calls 100000 \
        --configs entry_empty,pair_empty,pair_empty_multi,clock,args_array,record_perf,probes_cuda,probes_all,clockalign_min,clockalign_full \
        --out "$out/micro" > "$out/micro.txt" 2>&1; grep -E '^\|' "$out/micro/overhead.md"
elif [ "$stage" = overhead ]; then
    log model-storm
    timeout 540 python3 scripts/bench/probe_cost.py --parts micro,model,storm --rounds 5 \
        --calls 100000 --window 2.5 --storm-threads 1,4,8,16 --storm-seconds 5 \
        --paced 8x250000x60 --out "$out/overhead" \
        --configs pair_empty,pair_empty_multi,probes_cuda,probes_cuda_map,probes_cuda_regs,probes_all,clockalign_min,clockalign_full \
        > "$out/overhead.txt" 2>&1; grep -E '^\||^#' "$out/overhead/overhead.md"
elif [ "$stage" = rerun ]; then
    t0=$(date +%s)
    log storm
    timeout 200 python3 scripts/bench/probe_cost.py --parts storm --storm-threads 1 \
        --storm-seconds 5 --paced 8x250000x60,12x250000x20 --out "$out/storm" \
        > "$out/storm.txt" 2>&1; echo "storm rc=$?"; grep -E '^\|' "$out/storm/overhead.md"
    log micro-watch
    timeout 150 python3 scripts/bench/probe_cost.py --parts micro --rounds 7 --calls 100000 \
        --configs pair_empty_multi,clockalign_full,watch --out "$out/watch" \
        > "$out/watch.txt" 2>&1; echo "micro rc=$?"; grep -E '^\|' "$out/watch/overhead.md"
    model_in_time_left "${RERUN_S:-510}" 40 8
elif [ "$stage" = slots ]; then
    log storm
    timeout 200 python3 scripts/bench/probe_cost.py --parts storm --storm-threads 1 \
        --storm-seconds 5 --paced 8x250000x60,12x250000x20 --out "$out/storm" \
        > "$out/storm.txt" 2>&1; echo "storm rc=$?"; grep -E '^\|' "$out/storm/overhead.md"
    log micro-ab
    timeout 330 python3 scripts/bench/probe_cost.py --parts micro --rounds "${AB_ROUNDS:-9}" \
        --calls 100000 --configs pair_empty_multi,probes_cuda,probes_cuda_perf,clockalign_full,clockalign_full_perf,watch \
        --out "$out/micro" > "$out/micro.txt" 2>&1; echo "micro rc=$?"; grep -E '^\|' "$out/micro/overhead.md"
elif [ "$stage" = pinned ]; then
    t0=$(date +%s)
    log micro-pinned
    timeout 270 python3 scripts/bench/probe_cost.py --parts micro --rounds "${AB_ROUNDS:-8}" \
        --calls 200000 --cpu 3 --stats probes_cuda,probes_cuda_perf,clockalign_full \
        --configs pair_empty_multi,probes_cuda,probes_cuda_perf,clockalign_full,clockalign_full_perf \
        --out "$out/micro" > "$out/micro.txt" 2>&1; echo "micro rc=$?"; grep -E '^\|' "$out/micro/overhead.md"
    model_in_time_left "${PINNED_S:-540}" 24 99
elif [ "$stage" = ab ]; then
    t0=$(date +%s)
    log ab
    timeout 200 python3 scripts/bench/probe_cost.py --parts ab --rounds "${AB_ROUNDS:-60}" \
        --calls 100000 --cpu 3 --out "$out/ab" > "$out/ab.txt" 2>&1; echo "ab rc=$?"
    grep -E '^\|' "$out/ab/overhead.md"
    model_in_time_left "${AB_S:-500}" 24 99
elif [ "$stage" = cost ]; then
    # ResNet-18 plain / empty programs / clockalign for COST_ROUNDS (default 14) rounds, by
    # rate and by the launching thread's CPU time; then the per-call micro with watch
    log model
    timeout 430 python3 scripts/bench/probe_cost.py --parts model --rounds "${COST_ROUNDS:-14}" \
        --window 3 --configs plain,pair_empty_multi,clockalign_full --out "$out/model" \
        > "$out/model.txt" 2>&1; echo "model rc=$?"; grep -E '^\|' "$out/model/overhead.md"
    log micro
    timeout 130 python3 scripts/bench/probe_cost.py --parts micro --rounds 5 --calls 100000 \
        --configs pair_empty_multi,clockalign_full,watch --out "$out/micro" \
        > "$out/micro.txt" 2>&1; echo "micro rc=$?"; grep -E '^\|' "$out/micro/overhead.md"
fi
log pack
tar -C "$out" --exclude=align.ca --exclude=standin -cJf "$out.tar.xz" . && ls -la "$out.tar.xz"
