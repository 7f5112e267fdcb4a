"""clockalign demo: record the bundled reference workload and show what was seen."""
import json
import os
import socket
import sys

import click

from ..capture.recorder import Recorder, RecordOptions
from ..errors import ClockalignError
from ..store.reader import RunReader

EPILOG = """\b
Examples:
  sudo clockalign demo                 # writes ./clockalign-demo/
  sudo clockalign demo -o /tmp/demo --host-only
"""


def _gpu_ready():
    """(True, "") where a CUDA workload can run here, else (False, why not)."""
    try:
        from ..capture.counters import gpu_inventory
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


def _show_rows(rows):
    ok_all = True
    for what, expected, seen, ok in rows:
        ok_all &= bool(ok)
        click.echo(f"  {'ok  ' if ok else 'DIFF'} {what}: expected {expected}, recorded {seen}")
    return ok_all


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
    if gpu:
        with open(wjson) as f:
            rows = check.check_reference_gpu(ev, json.load(f))
    else:
        pid = r.meta["targets"][0]["pid"]
        rows = check.check_standin(ev, pid, EXPECTED_CALLS, EXPECTED_OOM)
    click.echo("demo: recording vs what the workload did:")
    ok = _show_rows(rows)
    _outputs(run, out_dir)
    if not ok:
        raise ClockalignError("the recording does not match the workload (see DIFF lines)")


def _outputs(run, out_dir):
    """Faults, report and trace, each only where that part of clockalign is installed."""
    from .main import main as cli_main
    for args in (["faults", run], ["report", run, "-o", os.path.join(out_dir, "report")],
                 ["export", run, "-o", os.path.join(out_dir, "demo.pftrace")]):
        try:
            cli_main(args)
        except SystemExit as e:
            if e.code not in (0, None):
                click.echo(f"demo: 'clockalign {' '.join(args)}' exited {e.code}", err=True)
