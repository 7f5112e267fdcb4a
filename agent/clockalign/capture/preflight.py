"""What `clockalign doctor` checks and `record` requires, each naming what to do.

    for c in run_checks(): print(c.name, c.ok, c.detail, c.fix)
    require(needs_cuda=False)               # raises ClockalignError at the first failed need
"""
import dataclasses
import os

from ..errors import ClockalignError
from .probes.cflags import import_bcc
from .probes.tracefs import mount_tracefs, tracefs_dir, tracepoint_exists

CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39

REQUIRED_TRACEPOINTS = [
    ("sched", "sched_switch"), ("sched", "sched_wakeup"), ("sched", "sched_process_fork"),
    ("sched", "sched_process_exit"), ("task", "task_rename"),
    ("syscalls", "sys_enter_connect"), ("syscalls", "sys_exit_connect"),
    ("syscalls", "sys_enter_exit_group"), ("signal", "signal_generate"),
]
OPTIONAL_TRACEPOINTS = [("nvidia", "nvidia_dev_xid"), ("sock", "inet_sock_set_state"),
                        ("tcp", "tcp_send_reset"), ("tcp", "tcp_receive_reset"),
                        ("tcp", "tcp_retransmit_skb")]
SETUP = "run scripts/setup.sh"


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True

    def line(self) -> str:
        status = "ok" if self.ok else ("missing" if self.required else "missing (optional)")
        text = f"{status:<19} {self.name}: {self.detail}"
        if not self.ok and self.fix:
            text += f" -> {self.fix}"
        return text


def _capabilities() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def check_architecture() -> Check:
    """The probes read x86-64 registers and the SysV stack layout (stack_arg, launch_enter),
    and perfbuf/uprobe_multi call perf_event_open and bpf by their x86-64 numbers."""
    machine = os.uname().machine
    if machine == "x86_64":
        return Check("architecture", True, "x86-64")
    return Check("architecture", False, f"this host is {machine}; clockalign's probes are "
                 "written for x86-64 only (register and stack layout, syscall numbers)",
                 "record on an x86-64 host; run files from anywhere can be read here")


def check_privileges() -> Check:
    caps = _capabilities()
    if os.geteuid() == 0 and caps & (1 << CAP_SYS_ADMIN):
        return Check("privileges", True, "running as root")
    if caps & (1 << CAP_BPF) and caps & (1 << CAP_PERFMON):
        return Check("privileges", True, "CAP_BPF and CAP_PERFMON")
    return Check("privileges", False, "not root and no CAP_BPF+CAP_PERFMON",
                 "run with sudo: sudo clockalign ...")


def check_tracefs() -> Check:
    mount_tracefs()
    d = tracefs_dir()
    if d:
        return Check("tracefs", True, d)
    return Check("tracefs", False, "tracefs is not mounted",
                 "mount -t tracefs nodev /sys/kernel/tracing (as root)")


def check_bcc() -> Check:
    try:
        bcc = import_bcc()
    except ImportError:
        return Check("BCC", False, "python module bcc not importable",
                     f"{SETUP} (installs the OS package python3-bpfcc; never 'pip install bcc')")
    return Check("BCC", True, os.path.dirname(bcc.__file__))


def check_headers() -> Check:
    build = f"/lib/modules/{os.uname().release}/build"
    try:
        BPF = import_bcc().BPF
    except ImportError:
        return Check("kernel headers", False, "cannot test without BCC", SETUP)
    try:
        b = BPF(text="int ca_probe(void *ctx) { return 0; }")
        b.load_func("ca_probe", BPF.TRACEPOINT)
        b.cleanup()
    except Exception as e:
        where = os.path.realpath(build) if os.path.exists(build) else "none"
        return Check("kernel headers", False,
                     f"a trivial BPF program does not compile ({str(e).splitlines()[0][:80]}); "
                     f"headers at {build}: {where}",
                     f"{SETUP} (installs headers, or links the newest distro headers)")
    return Check("kernel headers", True, f"BPF compiles ({os.path.realpath(build)})")


def check_native():
    """The C helpers every recording runs, built at install (native/build.py)."""
    from .. import native
    return [Check(f"C helper for {what}", path is not None, str(path) if path else why,
                  native.HOW_TO_BUILD) for what, path, why in native.check()]


def check_tracepoints():
    out = []
    for cat, ev in REQUIRED_TRACEPOINTS + OPTIONAL_TRACEPOINTS:
        required = (cat, ev) not in OPTIONAL_TRACEPOINTS
        ok = tracepoint_exists(cat, ev)
        fix = "" if ok else ("load the NVIDIA kernel driver" if cat == "nvidia"
                             else "kernel built without this tracepoint")
        out.append(Check(f"tracepoint {cat}:{ev}", ok, "present" if ok else "absent", fix,
                         required=required))
    return out


def check_uprobes() -> Check:
    ok = os.path.isdir("/sys/bus/event_source/devices/uprobe")
    return Check("uprobes", ok, "supported" if ok else "no uprobe PMU in this kernel",
                 "kernel needs CONFIG_UPROBE_EVENTS")


def check_libcuda(pid=None, explicit=None, required=True) -> Check:
    from .probes.libcuda import resolve_for_pid, resolve_like_loader
    if explicit:
        ok = os.path.exists(explicit)
        return Check("libcuda", ok, explicit if ok else f"{explicit} does not exist",
                     "give the path of libcuda.so.1", required)
    path, how = resolve_for_pid(pid) if pid else resolve_like_loader(dict(os.environ))
    if path:
        return Check("libcuda", True, f"{path} ({how})", required=required)
    return Check("libcuda", False, "no libcuda.so.1 in LD_LIBRARY_PATH, the ldconfig cache "
                 "or the default directories", "install the NVIDIA driver, pass --libcuda "
                 "PATH, or record without CUDA probes (--no-cuda)", required)


def check_counters():
    try:
        from .gpu.counters import available
    except ImportError as e:
        return [Check("NVML", False, f"counter backends not importable ({e})", required=False)]
    out = []
    for name, (ok, reason) in available().items():
        out.append(Check(name.upper(), ok, reason,
                         "" if ok else ("install nvidia-ml-py and the NVIDIA driver"
                                        if name == "nvml" else "install DCGM 3/4"),
                         required=False))
    return out


def check_gpus() -> Check:
    try:
        from .gpu.counters import gpu_inventory
        gpus, why = gpu_inventory()
    except ImportError as e:
        return Check("GPUs", False, f"cannot enumerate ({e})", required=False)
    if not gpus:
        return Check("GPUs", False, f"no NVIDIA GPU seen through NVML ({why})",
                     "GPU clock and counters will be off", required=False)
    names = ", ".join(f"{g.get('index')}: {g.get('name')}" for g in gpus)
    return Check("GPUs", True, names, required=False)


def check_gpu_clock() -> Check:
    try:
        from .clocks.gpuclock import gpu_clock_available
        ok, reason = gpu_clock_available()
    except Exception as e:
        ok, reason = False, f"gpu clock probe not importable ({e})"
    return Check("GPU clock probe", ok, reason, "" if ok else "pip install cuda-bindings",
                 required=False)


def check_cupti() -> Check:
    """CUPTI for record --gpu-activity: found, and the injection library built against it."""
    from .gpu.cupti import find_cupti, injection_library
    try:
        inst = find_cupti()
        injection_library(inst)
    except ClockalignError as e:
        return Check("CUPTI (--gpu-activity)", False, str(e), required=False)
    return Check("CUPTI (--gpu-activity)", True, f"{inst.lib} ({inst.where}); injection "
                 "library built", required=False)


def _check_steps(pid=None, libcuda=None, needs_cuda=True, full=True):
    """Checks in order, as callables, so `require` stops at the first failure."""
    steps = [check_architecture, check_native, check_privileges, check_tracefs, check_bcc,
             check_headers, check_tracepoints]
    if needs_cuda:
        steps += [check_uprobes, lambda: check_libcuda(pid, libcuda, required=False)]
    if full:
        steps += [check_counters, check_gpus, check_gpu_clock, check_cupti]
    return steps


def run_checks(pid=None, libcuda=None, needs_cuda=True, full=True):
    """Every check's result (doctor)."""
    out = []
    for step in _check_steps(pid, libcuda, needs_cuda, full):
        res = step()
        out.extend(res if isinstance(res, list) else [res])
    return out


def require(needs_cuda=True) -> None:
    """Stop with one sentence at the first failed requirement (record's preflight)."""
    for step in _check_steps(needs_cuda=needs_cuda, full=False):
        res = step()
        for c in res if isinstance(res, list) else [res]:
            if c.required and not c.ok:
                raise ClockalignError(f"{c.name}: {c.detail}" + (f"; {c.fix}" if c.fix else ""))
