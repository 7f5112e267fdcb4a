"""clockalign record: attach the probes to a process (or spawn one) and write a run file."""
import click

from ..capture.recorder import Recorder, RecordOptions
from ..errors import ClockalignError

# A BPF ring buffer is a power-of-two number of pages below 4 GiB (the kernel's
# RINGBUF_MAX_DATA_SZ), so 2 GiB is the largest one that can be created.
MAX_RING_MB = 2048

EPILOG = """\b
Examples:
  sudo clockalign record --pid 1234 --duration 30 -o serve.ca
  sudo clockalign record --pid 1234 --pid 1240          # two processes, until Ctrl-C
  sudo clockalign record --pid $(docker inspect -f '{{.State.Pid}}' triton)  # in a container
  sudo clockalign record -o run.ca -- python3 infer.py  # probes armed before it starts
  sudo clockalign record --gpu-activity -o run.ca -- python3 infer.py  # + GPU kernels
  sudo clockalign record --no-cuda --pid 1234           # sched/connect only
  clockalign record --dump-bpf                          # print the BPF C and cflags
"""


def probe_options(f):
    """The options `record` and `watch` share: targets, probes, counters, clocks, buffers."""
    opts = [
        click.option("--pid", "pids", type=int, multiple=True,
                     help="Process to record (repeatable)."),
        click.option("--force", is_flag=True, help="Let -o replace a file that is not a run "
                     "file, or write through a symbolic link."),
        click.option("--duration", type=click.FloatRange(0, min_open=True),
                     help="Stop after this many seconds (> 0)."),
        click.option("--libcuda", type=click.Path(dir_okay=False), help="libcuda to probe, a "
                     "path on this host (default: the one each target maps, or would load, in "
                     "its own root)."),
        click.option("--no-cuda", is_flag=True, help="Record without CUDA driver probes."),
        click.option("--cuda-args", type=click.Choice(["full", "registers"]), default="full",
                     show_default=True,
                     help="'registers': keep only the arguments passed in registers (no stack "
                          "arguments such as a launch's stream, no struct fields, "
                          "out-parameters or kernel names), saving one user-memory read per "
                          "call (results/overhead/ says how much)."),
        click.option("--cuda-returns", type=click.Choice(["all", "blocking"]), default="all",
                     show_default=True,
                     help="'blocking': probe the returns only of calls that can block or "
                          "fail on their own; launches, async copies and memsets, event "
                          "records and stream waits are recorded at entry (no duration, no "
                          "return code) for one trap a call instead of two "
                          "(results/serving-loop.md says what it saves)."),
        click.option("--cuda-duty", type=click.FloatRange(0, 1, min_open=True), default=1.0,
                     show_default=True,
                     help="Share of every --cuda-duty-period the CUDA probes are attached; "
                          "detached for the rest, they cost the process nothing.  Calls are "
                          "recorded only inside the attached windows (listed in the run "
                          "file; watch's /metrics states the share)."),
        click.option("--cuda-duty-period", type=click.FloatRange(0.1), default=1.0,
                     show_default=True, help="Seconds of one --cuda-duty cycle."),
        click.option("--follow-children/--no-follow-children", default=None,
                     help="Also record processes the targets fork (default: on for a "
                          "command)."),
        click.option("--counters", type=click.Choice(["auto", "nvml", "dcgm", "none"]),
                     default="auto", show_default=True, help="GPU counter backend."),
        click.option("--counter-interval", type=float, default=0.1, show_default=True,
                     help="Seconds between counter samples (>= 0.01)."),
        click.option("--no-gpu-clock", is_flag=True, help="Do not probe the GPU clocks."),
        click.option("--gpu-clock-period", type=float, default=1.0, show_default=True,
                     help="Seconds between GPU clock bursts."),
        click.option("--gpu-clock-pings", type=int, default=64, show_default=True,
                     help="Pings per GPU clock burst."),
        click.option("--ring-mb", type=click.FloatRange(0, MAX_RING_MB, min_open=True),
                     default=None,
                     help="Event buffer MiB, all CPUs together (one slot ring per CPU, a "
                          "power of two pages each; default 8 MiB a CPU, at most 512 MiB)."),
        click.option("--quiet", is_flag=True, help="No live status line."),
        click.option("--dump-bpf", is_flag=True,
                     help="Print the BPF program and cflags, then exit."),
        click.argument("command", nargs=-1, type=click.UNPROCESSED),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def dump_bpf_text(no_cuda, libcuda, cuda_args, ring_mb, cuda_returns="all") -> str:
    from ..capture.probes.cflags import ProbeOptions, dump_bpf as dump
    return dump(ProbeOptions(cuda_lib=None if no_cuda else (libcuda or "libcuda.so.1"),
                             cuda_args=cuda_args, ring_mb=ring_mb, cuda_returns=cuda_returns))


def record_options(output, force, pids, duration, libcuda, no_cuda, cuda_args, cuda_returns,
                   cuda_duty, cuda_duty_period, follow_children,
                   counters, counter_interval, no_gpu_clock, gpu_clock_period, gpu_clock_pings,
                   ring_mb, quiet, command, **extra) -> RecordOptions:
    """RecordOptions from probe_options' values, each checked (one sentence when bad);
    extra: RecordOptions fields only one command has."""
    if counter_interval < 0.01:
        raise click.BadParameter("must be >= 0.01 s", param_hint="--counter-interval")
    if not no_gpu_clock and gpu_clock_pings < 1:
        raise click.BadParameter("must be at least 1", param_hint="--gpu-clock-pings")
    if not no_gpu_clock and not gpu_clock_period > 0:
        raise click.BadParameter("must be more than 0 s", param_hint="--gpu-clock-period")
    _check_ring_memory(ring_mb)
    return RecordOptions(output=output, force=force, pids=list(pids),
                         command=list(command) or None, duration=duration, libcuda=libcuda,
                         cuda=not no_cuda, cuda_args=cuda_args, cuda_returns=cuda_returns,
                         cuda_duty=cuda_duty, cuda_duty_period=cuda_duty_period,
                         follow_children=follow_children, ring_mb=ring_mb, counters=counters,
                         counter_interval=counter_interval, gpu_clock=not no_gpu_clock,
                         gpu_clock_period=gpu_clock_period, gpu_clock_pings=gpu_clock_pings,
                         status=False if quiet else None, **extra)


@click.command("record", epilog=EPILOG, context_settings={"ignore_unknown_options": False})
@click.option("-o", "--output", default="clockalign.ca", show_default=True,
              help="Run file (created 0600, owned by the sudo user).")
@click.option("--gpu-activity", is_flag=True,
              help="Inject CUPTI into the command (CUDA_INJECTION64_PATH) or, with --pid, into "
                   "the running process (ptrace + dlopen; off again at the end) and record "
                   "every kernel, copy and memset it runs on the GPU, on the GPU's own clock, "
                   "mapped to MONOTONIC with the stated uncertainty.")
@click.option("--gpu-activity-timestamps", type=click.Choice(["raw", "converted"]),
              default="raw", show_default=True,
              help="'converted': keep CUPTI's own conversion to CPU time (no stated bound; "
                   "for comparisons).")
@click.option("--gpu-activity-duty", type=click.FloatRange(0, 1, min_open=True), default=1.0,
              show_default=True,
              help="With --pid: CUPTI attached for this share of every "
                   "--gpu-activity-duty-period and detached for the rest (sampled GPU "
                   "activity: what the GPU runs between the windows is not recorded; the "
                   "windows are listed in the run file and by 'info' and 'report').")
@click.option("--gpu-activity-duty-period", type=click.FloatRange(2.0), default=10.0,
              show_default=True, help="Seconds of one --gpu-activity-duty cycle.")
@probe_options
def command(output, dump_bpf, gpu_activity, gpu_activity_timestamps, gpu_activity_duty,
            gpu_activity_duty_period, **kw):
    """Record CUDA driver calls, context switches, connect(), Xids, GPU clocks and counters
    of running processes (--pid) or of a COMMAND given after --, until --duration,
    Ctrl-C/SIGTERM or the targets' exit.

    A process in a container is recorded from the host with --pid and its host pid: the
    libcuda probed is the one it maps (or would load) inside its own root, and the run
    file keeps its pid inside the container and its cgroup and container id (see
    'clockalign info').  Spawn mode (-- COMMAND) runs the command on this host, never
    inside a container: start the service in its container, then use --pid."""
    if dump_bpf:
        click.echo(dump_bpf_text(kw["no_cuda"], kw["libcuda"], kw["cuda_args"], kw["ring_mb"],
                                 kw["cuda_returns"]))
        return
    if gpu_activity_duty < 1:
        _check_activity_duty(gpu_activity, kw, gpu_activity_duty, gpu_activity_duty_period)
    s = Recorder(record_options(output, **kw, gpu_activity=gpu_activity,
                                gpu_activity_timestamps=gpu_activity_timestamps,
                                gpu_activity_duty=gpu_activity_duty,
                                gpu_activity_duty_period=gpu_activity_duty_period)).run()
    counts = ", ".join(f"{k} {v}" for k, v in s["counts"].items() if v) or "no events"
    drops = sum(s["drops"].values())
    click.echo(f"wrote {s['output']} ({s['size'] / 1e6:.2f} MB): {counts}; "
               f"{drops} dropped; stopped by {s['reason']}", err=True)


def _check_activity_duty(gpu_activity, kw, share, period) -> None:
    """Sampled GPU activity switches CUPTI by attaching and detaching it, which only --pid
    does; each window on and off must outlast an attach (~0.1 s on the H200)."""
    if not gpu_activity:
        raise click.BadParameter("needs --gpu-activity", param_hint="--gpu-activity-duty")
    if not kw.get("pids") or kw.get("command"):
        raise click.BadParameter(
            "samples the GPU activity of running processes (--pid): a spawned command's CUPTI "
            "is not switched at run time (results/serving-loop.md finding 5: switching what "
            "it collects crashed a target replaying CUDA graphs)",
            param_hint="--gpu-activity-duty")
    if min(share, 1 - share) * period < 1.0:
        raise click.BadParameter(
            f"{share:g} of {period:g} s leaves a window on or off shorter than 1 s: choose a "
            "longer --gpu-activity-duty-period", param_hint="--gpu-activity-duty")


def _check_ring_memory(ring_mb: float) -> None:
    """A ring the host cannot hold fails in the kernel with a misleading message: refuse it."""
    if ring_mb is None:
        return
    try:
        with open("/proc/meminfo") as f:
            avail_kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return
    if ring_mb * 1024 > avail_kb / 2:
        raise ClockalignError(f"--ring-mb {ring_mb:g} is more than half of this host's available "
                              f"memory ({avail_kb // 1024} MiB): choose a smaller ring")
