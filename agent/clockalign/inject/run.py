"""One `clockalign inject`: check the request, record each engine x fault session with the
recorder (spawn mode: the session, the service, its workers and the load are all its
children), cut the repetitions into segments and write the outputs.

    paths = inject(Plan(engines=["onnxruntime"], faults=["timeout"], n=5, out_dir="out"))

Per engine x fault in out_dir (ENGINE-FAULT-standbyN with --standby N): ENGINE-FAULT.ca (the run file), ENGINE-FAULT.pftrace (its
Perfetto trace), ENGINE-FAULT/ (client.json: the client's stamps; events.jsonl: the
service's log; load.json; repetitions.json: every boundary of every repetition).
"""
import dataclasses
import json
import os
import signal
import socket
import sys
import time

from ..errors import ClockalignError
from . import engines
from .faults import FAULTS, normal_request

ENGINES = engines.ENGINES + ("v2",)
SESSION_EXIT_S = 30


@dataclasses.dataclass
class Plan:
    engines: list
    faults: list
    out_dir: str
    n: int = 20
    url: str = None
    model: str = None
    port: int = 0
    load: int = 0
    load_generator: str = "auto"
    standby: int = 0
    deadline_ms: float = 1000.0
    recovery_deadline_ms: float = 2800.0
    device: str = "auto"
    cuda_probes: bool = True
    export: bool = True


def _gpus() -> list:
    """NVML's GPUs of this host ([] without NVML)."""
    try:
        from ..capture.gpu.counters import gpu_inventory
        gpus, _ = gpu_inventory()
    except ImportError:
        gpus = []
    return gpus


def made_by(plan: Plan) -> str:
    """How these outputs were made, for lifecycle.md's notes: the command that repeats the
    plan, the machine and the date (each invocation adds its own line)."""
    import datetime
    import shlex
    args = [a for e in plan.engines for a in ("--engine", e)]
    args += [a for f in plan.faults for a in ("--fault", f)]
    args += ["-n", str(plan.n), "--deadline-ms", f"{plan.deadline_ms:g}",
             "--recovery-deadline", f"{plan.recovery_deadline_ms / 1000:g}"]
    args += ["--url", plan.url] if plan.url else []
    args += ["--model", plan.model] if plan.model else []
    args += ["--load", str(plan.load), "--load-generator", plan.load_generator] if plan.load else []
    args += ["--standby", str(plan.standby)] if plan.standby else []
    args += ["--port", str(plan.port)] if plan.port else []
    args += ["--device", plan.device] if plan.device != "auto" else []
    args += [] if plan.export else ["--no-export"]
    cmd = " ".join(shlex.quote(a) for a in ["clockalign", "inject", *args, "-o", plan.out_dir])
    u = os.uname()
    gpus = ", ".join(sorted({g.get("name", "?") for g in _gpus()})) or "no GPU"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"made by `{cmd}` on {u.nodename} ({u.machine}, kernel {u.release}, "
            f"{os.cpu_count()} CPUs, {gpus}), {when}")


def free_port(port: int) -> int:
    """``port`` if it can be bound on 127.0.0.1 (0: any free one), else one sentence."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return s.getsockname()[1]
    except OSError as e:
        raise ClockalignError(f"port {port} on 127.0.0.1 is in use ({e.strerror}): "
                              "choose another with --port") from None
    finally:
        s.close()


def check(plan: Plan) -> None:
    """Refuse, in one sentence, what cannot run here: before anything is recorded."""
    from .load import is_loopback
    if plan.standby and "v2" in plan.engines:
        raise ClockalignError("--standby is the reference service's (--engine torch or "
                              "onnxruntime); a V2 server at --url keeps its own workers")
    if plan.n < 1:
        raise ClockalignError(f"-n must be at least 1 (got {plan.n})")
    for e in plan.engines:
        if e not in ENGINES:
            raise ClockalignError(f"unknown engine {e!r}; choose one of {', '.join(ENGINES)}")
    for f in plan.faults:
        if f not in FAULTS:
            raise ClockalignError(f"unknown fault {f!r}; choose one of {', '.join(FAULTS)}")
    writable(plan.out_dir)
    if "v2" in plan.engines:
        if not plan.url:
            raise ClockalignError("--engine v2 drives a running V2 server: give its --url")
        for f in plan.faults:
            if not FAULTS[f].generic:
                raise ClockalignError(f"--fault {f} needs the reference service's engines "
                                      "(--engine torch or onnxruntime); a V2 server has no "
                                      "standard way to be made to " +
                                      ("hang" if f == "timeout" else "fault its GPU"))
        from .driver import Driver
        d = Driver(plan.url, plan.model)
        d.check_live()
        normal_request(d.metadata())      # inputs this driver cannot generate: refused
        if plan.load:
            from .driver import split_url
            if not is_loopback(split_url(plan.url)[0]):
                raise ClockalignError(f"--load sends traffic to loopback addresses only; "
                                      f"{plan.url} is not one")
    elif plan.url:
        raise ClockalignError("--url is for --engine v2; the torch and onnxruntime engines run "
                              "the reference service here")
    gpu_faults = [f for f in plan.faults if FAULTS[f].gpu_only]
    need_gpu = f"--fault {gpu_faults[0]}" if gpu_faults else (
        "--device cuda" if plan.device == "cuda" else None)
    for e in plan.engines:
        if e == "v2":
            continue
        why = engines.available(e)
        if why:
            raise ClockalignError(why)
        if need_gpu and e == "onnxruntime":
            import onnxruntime
            if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
                raise ClockalignError(f"{need_gpu} needs a GPU engine: this onnxruntime has "
                                      "no CUDAExecutionProvider (onnxruntime-gpu is not "
                                      "installed)")
    if need_gpu and not _gpus():
        raise ClockalignError(f"{need_gpu} needs an NVIDIA GPU and none is visible here "
                              "(NVML found none)")
    if plan.port:
        free_port(plan.port)


def writable(out_dir: str) -> None:
    """Make ``out_dir`` and write a file in it, or say in one sentence why not (a read-only
    mount, a file in the way, no permission)."""
    import tempfile
    try:
        os.makedirs(out_dir, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out_dir, prefix=".clockalign-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ClockalignError(f"-o {out_dir}: cannot write there "
                              f"({e.strerror or e})") from None



def _session_cmd(plan, engine, fault, work, port, device):
    cmd = [sys.executable, "-m", "clockalign.inject.session", "--engine", engine,
           "--fault", fault, "-n", str(plan.n), "--work", work,
           "--deadline-ms", str(plan.deadline_ms), "--device", device,
           "--load-generator", plan.load_generator]
    if plan.url:
        cmd += ["--url", plan.url]
    else:
        cmd += ["--port", str(port)]
    if plan.model:
        cmd += ["--model", plan.model]
    if plan.load:
        cmd += ["--load", str(plan.load)]
    if plan.standby:
        cmd += ["--standby", str(plan.standby)]
    return cmd


def _env():
    import clockalign
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(clockalign.__file__)))
    env["PYTHONPATH"] = root + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _end_session(rec):
    """Ctrl-C reached the session too; give it time to stop its children, then make sure."""
    child = rec.child
    if child is None:
        return
    end = time.monotonic() + SESSION_EXIT_S
    while child.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
        os.waitpid(child.pid, 0)


def record_one(plan, engine, fault, notices) -> dict:
    from ..capture.probes.libcuda import resolve_like_loader
    from ..capture.recorder import Recorder, RecordOptions
    stem = f"{engine}-{fault}" + (f"-standby{plan.standby}" if plan.standby else "")
    work = os.path.join(plan.out_dir, stem)
    try:
        os.makedirs(work, exist_ok=True)
        for name in ("client.json", "events.jsonl", "load.json"):
            if os.path.exists(os.path.join(work, name)):
                os.unlink(os.path.join(work, name))
    except OSError as e:
        raise ClockalignError(f"cannot prepare {work}: {e.strerror or e}") from None
    env = _env()
    port = 0 if plan.url else free_port(plan.port)
    device = "cuda" if FAULTS[fault].gpu_only else plan.device
    cuda = plan.cuda_probes and resolve_like_loader(env)[0] is not None
    if plan.cuda_probes and not cuda:
        notices.append("no libcuda.so.1 on this host: recorded without CUDA driver probes")
    run_path = os.path.join(plan.out_dir, stem + ".ca")
    rec = Recorder(RecordOptions(output=run_path, command=_session_cmd(
        plan, engine, fault, work, port, device), cuda=cuda, status=False, env=env))
    try:
        summary = rec.run()
    finally:
        _end_session(rec)
    if summary["reason"] in ("SIGINT", "SIGTERM"):
        raise KeyboardInterrupt
    ex = summary.get("child_exit") or {}
    if ex.get("exit_code") != 0:
        raise ClockalignError(f"the {engine} {fault} session failed ({_exit_text(ex)}); "
                              f"its messages are above, its recording is {run_path}")
    return {"stem": stem, "run": run_path, "work": work, "summary": summary}


def _exit_text(ex):
    if "signal_name" in ex:
        return f"killed by {ex['signal_name']}"
    return f"exit status {ex.get('exit_code')}"


def analyse(plan, done, notices) -> tuple:
    from ..export import export_run
    from ..timeline import Timeline
    from .eventlog import read_events
    from .output import detail, make_row
    from .segments import split
    rows, details = [], {}
    for d in done:
        with open(os.path.join(d["work"], "client.json")) as f:
            client = json.load(f)
        tl = Timeline.open(d["run"])
        reps = split(tl, client, read_events(os.path.join(d["work"], "events.jsonl")))
        with open(os.path.join(d["work"], "repetitions.json"), "w") as f:
            json.dump(reps, f, indent=1)
        engine = client["engine"]
        if engine == "v2":
            engine = f"v2 ({client['metadata'].get('platform') or client['model']})"
        standby = client.get("standby") or 0
        if standby:
            engine = f"{engine} + {standby} standby"
        row = make_row(engine, client["fault"], reps, plan.recovery_deadline_ms, standby)
        rows.append(row)
        details[(row["engine"], row["fault"])] = detail(reps)
        ok = sum(1 for r in reps if r["status"] is not None and r["status"] < 400)
        missed = sum(1 for r in reps if r["total_ns"] is None) - ok
        if ok:
            notices.append(f"{d['stem']}: {ok} of {len(reps)} requests were answered "
                           f"{reps[0]['status'] if ok == len(reps) else 'with success'}: the "
                           "fault did not happen there (not in the percentiles)")
        if missed:
            notices.append(f"{d['stem']}: {missed} of {len(reps)} repetitions got no answer "
                           "or were not ready again (not in the percentiles)")
        drops = sum((d["summary"].get("drops") or {}).values())
        if drops:
            notices.append(f"{d['stem']}: the recording lost {drops} events (see clockalign "
                           f"info {d['run']})")
        dl = (client.get("metadata") or {}).get("parameters", {}).get("deadline_ms")
        if dl:
            notices.append(f"{d['stem']}: the service's watchdog deadline was {dl:g} ms")
        if client.get("load"):
            ld = client["load"]
            notices.append(f"{d['stem']}: background load {ld['users']} users "
                           f"({ld['generator']}): {ld['requests']} requests, {ld['ok']} ok, "
                           f"failures {ld['failures'] or 'none'}, p50 {ld['p50_ms']} ms")
        if plan.export:
            export_run(tl, os.path.join(plan.out_dir, d["stem"] + ".pftrace"))
    return rows, details


def inject(plan: Plan) -> dict:
    """Record and analyse each engine x fault in turn; the outputs are rewritten after
    each one, so an interrupted run keeps the rows it finished."""
    from .output import write_all
    check(plan)
    notices, all_rows, paths = [made_by(plan)], [], None
    for engine in plan.engines:
        for fault in plan.faults:
            mine = []
            d = record_one(plan, engine, fault, mine)
            rows, details = analyse(plan, [d], mine)
            notices += [n for n in mine if n not in notices]
            all_rows += rows
            paths = write_all(plan.out_dir, rows, details, notices)
    return {"paths": paths, "rows": all_rows, "notes": notices}
