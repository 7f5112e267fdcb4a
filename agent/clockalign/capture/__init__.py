"""Recording: everything that runs while `clockalign record` (or `watch`) does.

One subpackage per job, the recorder on top that arms and drives them:

    probes/     the BPF program (bpf/probes.c): its cflags, load and links (uprobe_multi,
                prologues, the CUDA stubs, --cuda-duty), the libcuda to probe, tracefs
    transport/  events from the BPF side to the run file: the per-CPU slot rings (perf
                buffers where they do not load), the C reader thread, the chunk sinks
    targets/    the processes recorded: spawned and held, --pid, --follow, containers,
                a library loaded into a running process (ptrace + dlopen)
    clocks/     clock domains against MONOTONIC: CPU clocks, each GPU's %globaltimer
                (ping-pong), the NVML/CUDA device table, the clock-probe thread
    gpu/        what the GPU itself reports: CUPTI activity (injected, its wire format),
                counters/ (NVML, DCGM, NVML Xid events)

    recorder.py   Recorder: arm, stream, finish (with arming.py, header.py, helpers.py,
                  status.py);  preflight.py: what `doctor` checks and `record` requires
"""
