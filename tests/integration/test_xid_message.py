"""An Xid's whole message, kept end to end: run file, dump, faults, report, Perfetto.

No NVIDIA driver here, so nvidia:nvidia_dev_xid never fires.  With CLOCKALIGN_TEST_XID_PRINTK
the probes also attach the Xid code (bpf/probes.c emit_xid) to printk:console for the
targets, and the target writes an H200-style Xid line to /dev/kmsg: a real in-kernel
__data_loc string, read and sent by the same code as a real Xid.  What the kernel handed the
tracepoint is read independently from a tracefs instance of that tracepoint.
"""
import json
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

from clockalign.capture.probes.cflags import XID_PRINTK_CODE, XID_PRINTK_ENV
from clockalign.store.reader import RunReader
from clockalign.store.schema import XID_PART_LEN, Chunk, Kind

from ..unit.trace_strings import check_strings
from .conftest import run_clockalign

BASE = ["--counters", "none", "--no-gpu-clock", "--quiet", "--no-cuda"]
TRACEFS = "/sys/kernel/tracing"
# the H200 recording's Xid 31 as the driver logs it; the long line repeats it up to just
# under what /dev/kmsg takes in one write (LOG_LINE_MAX, 992 bytes): ten records' worth
H200_XID = ("NVRM: Xid (PCI:0000:18:00): 31, pid=2761473, name=python3, channel 0x0000001e, "
            "intr 00000000. MMU Fault: ENGINE GRAPHICS GPC1 GPCCLIENT_T1_3 faulted @ "
            "0x7f3a_c4000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ")
TARGET = """import os, sys
fd = os.open("/dev/kmsg", os.O_WRONLY)
for line in sys.argv[1:]:
    os.write(fd, line.encode())
os.close(fd)
"""


@pytest.fixture
def console_trace():
    """A tracefs instance with printk:console on: what the kernel gave the tracepoint."""
    inst = f"{TRACEFS}/instances/clockalign-test-{uuid.uuid4().hex[:8]}"
    if not os.path.isdir(f"{TRACEFS}/events/printk/console"):
        pytest.skip("no printk:console tracepoint on this kernel")
    os.mkdir(inst)
    try:
        with open(f"{inst}/events/printk/console/enable", "w") as f:
            f.write("1")
        yield inst
    finally:
        with open(f"{inst}/events/printk/console/enable", "w") as f:
            f.write("0")
        os.rmdir(inst)


def _traced_lines(inst, marker):
    with open(f"{inst}/trace") as f:
        return [line.rstrip("\n").split(": console: ", 1)[1] for line in f
                if ": console: " in line and marker in line]


def test_whole_xid_message_end_to_end(tmp_path, console_trace):
    marker = f"clockalign-test-{uuid.uuid4().hex[:8]}"
    short = f"{marker} short Xid"
    long = (f"{marker} " + " ".join([H200_XID] * 6))[:980]
    exact = f"{marker} " + H200_XID[:XID_PART_LEN * 2 - len(marker) - 1]   # two full parts
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    run = tmp_path / "xid.ca"
    env = dict(os.environ, **{XID_PRINTK_ENV: "1"})
    p = run_clockalign("record", *BASE, "-o", str(run), "--", sys.executable, str(script),
                       short, exact, long, env=env)
    assert p.returncode == 0, p.stderr
    kernel = _traced_lines(console_trace, marker)
    assert kernel == [short, exact, long]

    # run file: the parts are there, each Xid says its length and is followed by none
    r = RunReader(str(run))
    raw = np.concatenate([c["kind"] for c in r.iter_columns(Chunk.EVENTS)])
    need = sum(-(-len(m.encode()) // XID_PART_LEN) for m in kernel)
    assert int((raw == Kind.XID_MSG).sum()) == need
    assert r.trailer["counts"]["xid_msg"] == need and not any(r.trailer["drops"].values())
    ev = r.events()
    assert Kind.XID_MSG not in set(ev["kind"].tolist())
    xids = ev[ev["kind"] == Kind.XID]
    assert sorted(xids["a0"].tolist()) == sorted(len(m.encode()) for m in kernel)

    # dump: the whole message, as the kernel gave it
    d = run_clockalign("dump", str(run))
    assert d.returncode == 0, d.stderr
    rows = [json.loads(line) for line in d.stdout.splitlines()]
    got = [x for x in rows if x["kind"] == "xid"]
    assert [x["msg"] for x in got] == kernel
    assert all(x["code"] == XID_PRINTK_CODE and x["msg_whole"] for x in got)

    # faults and the report
    f = run_clockalign("faults", "--json", str(run))
    assert f.returncode == 0, f.stderr
    faults = json.loads(f.stdout)
    assert sorted(x["message"] for x in faults["faults"] if x["kind"] == "xid") == sorted(kernel)
    rep = tmp_path / "report"
    p = run_clockalign("report", str(run), "-o", str(rep))
    assert p.returncode == 0, p.stderr
    text = "".join(open(os.path.join(rep, n)).read() for n in os.listdir(rep)
                   if n.endswith((".md", ".txt", ".json")))
    assert kernel[2] in text

    # Perfetto: every string annotation equals its dump field / faults entry
    pf = tmp_path / "xid.pftrace"
    p = run_clockalign("export", str(run), "-o", str(pf))
    assert p.returncode == 0, p.stderr
    checked = check_strings(str(pf), rows, faults)
    assert checked["msg"] == 3 and checked["message"] >= 3


# nvidia:nvidia_dev_xid as the NVIDIA driver declares it (kernel-open/nvidia/nv-tracepoint.h:
# __string(dev, pci_name(pdev)), __field(u32, error_code), __string(msg, msg)): the layout
# the tracefs format file has on a host with the driver loaded
NVIDIA_XID_FORMAT = """name: nvidia_dev_xid
ID: 99999
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] dev;\toffset:8;\tsize:4;\tsigned:0;
\tfield:u32 error_code;\toffset:12;\tsize:4;\tsigned:0;
\tfield:__data_loc char[] msg;\toffset:16;\tsize:4;\tsigned:0;

print fmt: "Xid (PCI:%s): %u, %s", __get_str(dev), REC->error_code, __get_str(msg)
"""
LOAD_ONLY = """import sys
from clockalign.capture.probes import cflags
BPF = cflags.import_bcc().BPF
BPF._trace_autoload = lambda self: None        # compile and verify; nothing is attached
flags, _ = cflags.build_cflags(cflags.ProbeOptions(cuda_lib=None))
assert "-DCA_XID" in flags and "-DCA_XID_DATALOC" in flags, flags
b = BPF(text=cflags.bpf_text(), cflags=flags + [f"-I{cflags.bpf_source_dir()}"])
b.load_func(b"tracepoint__nvidia__nvidia_dev_xid", BPF.TRACEPOINT)
print("verified")
"""


def test_the_real_xid_program_passes_the_verifier(tmp_path):
    """No NVIDIA driver here: in a private mount namespace, tracefs's events seen through a
    copy with nvidia_dev_xid's format added, so BCC compiles the real Xid program and the
    kernel's verifier loads it (not attached: the tracepoint does not exist)."""
    import shutil
    events = tmp_path / "events"
    for cat in ("sched", "task", "syscalls", "signal", "printk"):
        for ev in os.listdir(f"{TRACEFS}/events/{cat}"):
            src = f"{TRACEFS}/events/{cat}/{ev}"
            if os.path.isdir(src):
                (events / cat / ev).mkdir(parents=True)
                for name in ("format", "id"):
                    if os.path.exists(f"{src}/{name}"):
                        shutil.copyfile(f"{src}/{name}", events / cat / ev / name)
    (events / "nvidia" / "nvidia_dev_xid").mkdir(parents=True)
    (events / "nvidia" / "nvidia_dev_xid" / "format").write_text(NVIDIA_XID_FORMAT)
    if not shutil.which("unshare"):
        pytest.skip("unshare(1) not found")
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        f"mount --bind {events} {TRACEFS}/events && exec {sys.executable} -c "
                        f"'{LOAD_ONLY}'"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "verified" in p.stdout, p.stdout + p.stderr
