"""clockalign demo: record the bundled reference workload and show what was seen."""
import json
import os
import socket
import sys

import click

from ..capture.recorder import Recorder, RecordOptions
from ..errors import ClockalignError
from ..report import brief
from ..store.reader import RunReader
from ..timeline import Timeline
from ..timeline.codes import cuda_result_name

EPILOG = """\b
Examples:
  sudo clockalign demo                 # writes ./clockalign-demo/
  sudo clockalign demo -o /tmp/demo --host-only
"""


def _gpu_ready():
    """(True, "") where a CUDA workload can run here, else (False, why not)."""
    try:
        from ..capture.gpu.counters import gpu_inventory
        gpus, why = gpu_inventory()
    except ImportError as e:
        return False, f"GPU inventory unavailable ({e})"
    if not gpus:
        return False, why or "no NVIDIA GPU"
    try:
        import torch
    except ImportError:
        return False, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return False, "PyTorch sees no CUDA device"
    return True, ""


@click.command("demo", epilog=EPILOG)
@click.option("-o", "--out-dir", default="clockalign-demo", show_default=True)
@click.option("--host-only", is_flag=True, help="Use the host-only workload even with a GPU.")
def command(out_dir, host_only):
    """Record the bundled reference workload (a real CUDA workload where a GPU is; a host-only
    one with a stand-in libcuda otherwise, saying so), check the recording against what the
    workload says it did, and write the run file, a report and a Perfetto trace."""
    from ..workloads import check
    os.makedirs(out_dir, exist_ok=True)
    run = os.path.join(out_dir, "demo.ca")
    gpu, why = (False, "--host-only given") if host_only else _gpu_ready()
    env = dict(os.environ)
    if gpu:
        click.echo("demo: GPU found: recording the reference CUDA workload (PyTorch: launch "
                   "loop, out-of-memory attempt and retry, synchronizes, connect())")
        wjson = os.path.join(out_dir, "workload.json")
        cmd = [sys.executable, "-m", "clockalign.workloads.reference_gpu", "--out", wjson]
    else:
        from ..workloads.standin import EXPECTED_CALLS, EXPECTED_OOM, build
        click.echo(f"demo: no GPU workload possible here ({why}): recording the HOST-ONLY "
                   "reference workload, a stand-in libcuda with known calls, so the CUDA "
                   "probes, context switches and connect() are real but no GPU is involved")
        libdir, target = build(os.path.join(out_dir, "standin"))
        env["LD_LIBRARY_PATH"] = libdir
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        cmd = [target, "--sleep-ms", "200", "--connect", str(listener.getsockname()[1]), "1"]
    summary = Recorder(RecordOptions(output=run, command=cmd, env=env,
                                     libcuda=None, status=False)).run()
    r = RunReader(run)
    ev = r.events()
    click.echo(f"demo: recorded {run}: " + ", ".join(
        f"{k} {v}" for k, v in summary["counts"].items() if v))
    chosen = None
    if gpu:
        with open(wjson) as f:
            rows = check.check_reference_gpu(ev, json.load(f))
    else:
        from ..workloads.standin import SWEEP_CALLS, sweep_faults
        pid = r.meta["targets"][0]["pid"]
        rows = check.check_standin(ev, pid, EXPECTED_CALLS, EXPECTED_OOM)
        chosen = (SWEEP_CALLS, sweep_faults())
    lines = brief.counts_line(rows)
    click.echo("demo: " + lines[0] + "".join("\n" + x for x in lines[1:]))
    ok = all(row[3] for row in rows)
    ok &= _faults(Timeline.open(run), chosen)
    _outputs(run, out_dir)
    if not ok:
        raise ClockalignError("the recording does not match the workload (see DIFF lines)")


def _faults(tl, chosen) -> bool:
    """The faults that matter in full, the stand-in sweep's chosen failures and the benign
    notes one line each.  ``chosen``: (sweep functions, {(symbol, code): n} it predicts) or
    None.  False where the chosen failures differ from the prediction."""
    faults, ok = tl.faults(), True
    if chosen is not None:
        sweep_fns, want = chosen
        got = {}
        for f in faults:
            if f.kind == "cuda_error" and f.function in sweep_fns:
                got[(f.function, f.code)] = got.get((f.function, f.code), 0) + 1
        faults = [f for f in faults if not (f.function in sweep_fns and f.kind.startswith("cuda"))]
        ok = got == want
        click.echo(f"demo: {sum(got.values())} faults are the stand-in sweep's chosen error "
                   f"returns on {len({k[0] for k in got})} functions"
                   + (", exactly as it predicts" if ok else ", NOT as it predicts:"))
        for k in sorted(set(got) | set(want)):
            if got.get(k, 0) != want.get(k, 0):
                click.echo(f"  DIFF {k[0]} -> {cuda_result_name(k[1])}: expected "
                           f"{want.get(k, 0)}, recorded {got.get(k, 0)}")
    n = sum(f.kind != "cuda_sticky_error" for f in faults)
    click.echo(f"demo: {n} fault{'s' if n != 1 else ''}"
               + (" that matter" if chosen is not None else "")
               + (f" (and {len(faults) - n} sticky repeats)" if len(faults) > n else "") + ":")
    for line in brief.fault_lines(faults, tl.start_ns, limit=8):
        click.echo(line)
    if tl.benign:
        click.echo("demo: " + brief.benign_line(tl.benign))
    return ok


def _outputs(run, out_dir):
    """Report and trace, each only where that part of clockalign is installed."""
    report_dir = os.path.join(out_dir, "report")
    trace = os.path.join(out_dir, "demo.pftrace")
    try:
        from ..export import export_run
        from ..report import build_report
    except ImportError as e:
        click.echo(f"demo: report and trace not written ({e})", err=True)
        return
    build_report(Timeline.open(run), report_dir)
    export_run(Timeline.open(run), trace, "perfetto")
    click.echo(f"demo: report {os.path.join(report_dir, 'report.md')} (every table in "
               f"report.json); trace {trace} (open it in ui.perfetto.dev); every fault: "
               f"clockalign faults {run}")
