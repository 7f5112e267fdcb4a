#!/usr/bin/env bash
# Issue 12 item 4 on a host with two GPUs (nvidia-h200-x2): a 5-minute recording of an NCCL
# all-reduce loop, one process per GPU, then results/multi-gpu.md.
#   scripts/gpu/multi.sh OUTDIR
# Writes OUTDIR/multi.ca (and .xz), the ranks' records OUTDIR/ranks/rank<r>.json, align
# (text + json), the report (per-GPU alignment, the GPUs' skew against each other,
# counters per device), the Perfetto trace, and OUTDIR/multi-gpu.md (scripts/gpu/
# multi_results.py: the tables above and each all-reduce on both GPUs side by side, from
# the ranks' %globaltimer stamps and from CUPTI's NCCL kernel records, --gpu-activity);
# copy that to results/multi-gpu.md.  NVLink multicast stays off (the lent machines ask it).
# Needs root, the offline bundle at .bundle/ (scripts/make_bundle.sh), python3 with torch
# (and cupy for the %globaltimer stamps around each all-reduce).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$1
mkdir -p "$out/ranks"
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
seconds=${SECONDS_RECORD:-300}
log() { echo "== $* ($(date -u +%T))"; }
scripts/install_bundle.sh > "$out/install.txt" 2>&1 || { cat "$out/install.txt"; exit 1; }
. /opt/clockalign-bcc/env.sh
{ uname -a; nvidia-smi -L; nvidia-smi --query-gpu=index,pci.bus_id,name,driver_version,clocks.sm --format=csv
  nvidia-smi topo -m; python3 -c 'import torch,sys; print(sys.version, torch.__version__, torch.cuda.device_count())'
  env | grep -E '^(NCCL|NVSHMEM|TORCH_SYMM|CUDA_)' ; } > "$out/host.txt" 2>&1
ngpu=$(nvidia-smi -L | grep -c '^GPU')
[ "$ngpu" -ge 2 ] || { echo "multi.sh needs two GPUs, nvidia-smi lists $ngpu"; exit 2; }

log doctor; clockalign doctor > "$out/doctor.txt" 2>&1; cat "$out/doctor.txt"
log record "(${seconds} s, 2 ranks)"
# the recording outlives the loop (it ends when the workload exits), so every all-reduce
# lies inside both GPUs' probed spans
cmd=(clockalign record -o "$out/multi.ca" --duration $((seconds + 120)) --gpu-clock-period 0.25
     --gpu-activity --quiet -- python3 scripts/workloads/allreduce_gpu.py --gpus 2 --seconds "$seconds"
     --interval 0.01 --out "$out/ranks")
echo "${cmd[*]}" > "$out/command.txt"
"${cmd[@]}" > "$out/record.txt" 2>&1; echo "record rc=$?"; tail -5 "$out/record.txt"
ls -la "$out/ranks"
clockalign info "$out/multi.ca" > "$out/info.txt" 2>&1; grep -E "^(gpu|events|drops|stopped|notice)" "$out/info.txt"
log align
clockalign align "$out/multi.ca" > "$out/align.txt" 2>&1; grep -A1 '^GPU' "$out/align.txt"
clockalign align --json "$out/multi.ca" > "$out/align.json" 2>&1
log report
clockalign report "$out/multi.ca" -o "$out/report" > "$out/report.txt" 2>&1; sed -n '/Alignment/,/connect/p' "$out/report.txt" | head -40
log export
clockalign export "$out/multi.ca" -o "$out/multi.pftrace" > "$out/export.txt" 2>&1; tail -2 "$out/export.txt"
clockalign dump "$out/multi.ca" 2>/dev/null | grep '"xid"' > "$out/xids.jsonl"
log results
python3 scripts/gpu/multi_results.py "$out/multi.ca" "$out/ranks" "$out/multi-gpu.md" \
    --command "scripts/gpu/multi.sh OUTDIR  (${cmd[*]})" > "$out/results.txt" 2>&1
cat "$out/results.txt"; sed -n '1,80p' "$out/multi-gpu.md"
log pack
rm -f "$out/multi.ca.xz"; xz -T4 -k "$out/multi.ca"
tar -C "$out" --exclude=multi.ca --exclude=multi.pftrace -cJf "$out.tar.xz" . && ls -la "$out.tar.xz"
