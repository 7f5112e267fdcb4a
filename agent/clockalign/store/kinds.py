"""The one table of BPF event kinds: for each, where it comes from, the clock it is stamped
on, what shape it has on a timeline, and its fields with their decoders.

Read by dump's JSON lines (event_dicts below: every field of every kind), the stamping
uncertainty and the source fault sightings name (timeline/stamps.py), the export's
slices, instants, tracks and call rows (export/model.py: SPAN_KINDS, CALL_KINDS, track),
and the report's and watch's calls seen at their entry only (ENTRY_KINDS).
bpf/clockalign.h and store/schema.Kind hold the numbers (tests/unit/test_event_layout.py
checks them); a new kind adds a row here (an import fails without one).  Still decided per
kind by hand: what only one consumer does with a kind (the report's latency tables,
watch's metrics, the fault rules of timeline/fault_*.py, inject/segments.py).

    spec = KINDS[Kind.CUDA_ENTRY]     # KindSpec(source="uprobe", shape="entry", ...)
    for d in event_dicts(batch, xid_messages=r.xid_messages, devices=devices): ...
"""
import dataclasses
import errno

import numpy as np

from . import cuda_api
from .event_text import XidMessages, cstring, decode_comm, decode_sockaddr
from .schema import KIND_NAMES, Kind, TcpCode, task_state_name, unpack_dims

# shapes: "call" a call that returned (ts = entry, dur, ret = its result); "unfinished" a
# call still running at stop (dur = how long so far, no result); "entry" a call seen at its
# entry only (no result, no duration: an instant); "interval" a span that is not a call
# (off-CPU); "instant" a point in time
SPANS = ("call", "unfinished", "interval")


@dataclasses.dataclass(frozen=True)
class KindSpec:
    source: str            # the probe type that stamps it (fault sightings name it)
    attach: str            # what it is attached to
    shape: str             # see above
    track: str             # where the export draws it: thread, offcpu, process, xid
    fields: tuple          # dump's fields, in order: each f(e, raw, ctx) -> [(key, value)]
    result: bool = False   # ``ret`` is the outcome (0 success, else a failure)
    domain: str = "MONOTONIC"    # bpf_ktime_get_ns() everywhere: STAMP_UNC_NS is 0


@dataclasses.dataclass
class Context:
    """What some decoders need beyond the event: the reader's Xid messages, the devices."""
    xid_messages: XidMessages
    devices: object = None


def _fn(e, raw, ctx):
    return [("fn", cuda_api.function_name(int(e["code"])))]


def _args(e, raw, ctx):
    fid = int(e["code"])
    fn = cuda_api.FUNCTIONS.get(fid)
    out = []
    for j, a in enumerate(fn.arg_names if fn else ()):
        if not a:
            continue
        v = int(e[f"a{j}"])
        if j == fn.string_slot:
            out.append((a, cstring(raw)))        # the string itself, kept in data
        elif a in ("grid", "block"):
            out.append((a, [int(x) for x in unpack_dims(v)]))
        else:
            out.append((a, v))
    return out


def _const(key, value):
    return lambda e, raw, ctx: [(key, value)]


def _int(key, col):
    return lambda e, raw, ctx: [(key, int(e[col]))]


def _bool(key, col):
    return lambda e, raw, ctx: [(key, bool(e[col]))]


def _comm(key):
    return lambda e, raw, ctx: [(key, decode_comm(raw))]


def _connect(e, raw, ctx):
    ret = int(e["ret"])
    return [("fd", int(e["a0"])), ("dur_ns", int(e["dur"])), ("ret", ret),
            ("errno", errno.errorcode.get(-ret, str(-ret)) if ret < 0 else None),
            ("peer", decode_sockaddr(raw, e["a1"]))]


def _sched(e, raw, ctx):
    return [("off_cpu_ns", int(e["dur"])), ("prev_state", task_state_name(int(e["ret"]))),
            ("preempted", bool(e["code"])), ("wakeup_to_run_ns", int(e["a0"])),
            ("cpu_out", int(e["a1"])), ("cpu_in", int(e["a2"])),
            ("in_cuda", cuda_api.function_name(e["a3"]) if int(e["a3"]) else None)]


def _xid(e, raw, ctx):
    dev, msg, whole = ctx.xid_messages.of(e)
    out = [("code", int(e["ret"])), ("dev", dev), ("msg", msg), ("msg_whole", whole)]
    g = ctx.devices.by_bus(dev) if ctx.devices is not None else None
    if g is not None:
        out += [("gpu", g.name), ("bus_id", g.bus_id)]
    return out


def _tcp(e, raw, ctx):
    code = int(e["code"])
    b = bytes(raw)
    return [("event", TcpCode(code).name.lower() if code in TcpCode._value2member_map_
             else str(code)), ("local", decode_sockaddr(b[:28])),
            ("remote", decode_sockaddr(b[28:56])), ("state", int(e["ret"]))]


_CUDA = "libcuda functions (store/cuda_api.py), uprobe_multi entry"
KINDS = {
    Kind.CUDA: KindSpec("uprobe", _CUDA + " and return", "call", "thread",
                        (_fn, _int("ret", "ret"), _int("dur_ns", "dur"), _args), result=True),
    Kind.CUDA_UNFINISHED: KindSpec(
        "uprobe", _CUDA + "; read from the call slots at stop", "unfinished", "thread",
        (_fn, _const("ret", None), _const("unfinished", True), _int("running_ns", "dur"),
         _args)),
    Kind.CUDA_ENTRY: KindSpec(
        "uprobe", _CUDA + " only (record --cuda-returns blocking: enqueue functions)",
        "entry", "thread", (_fn, _const("ret", None), _const("entry_only", True), _args)),
    Kind.CONNECT: KindSpec("tracepoint", "syscalls:sys_enter_connect / sys_exit_connect",
                           "call", "thread", (_connect,), result=True),
    Kind.SCHED: KindSpec("tracepoint", "sched:sched_switch, sched:sched_wakeup", "interval",
                         "offcpu", (_sched,)),
    Kind.XID: KindSpec("tracepoint", "nvidia:nvidia_dev_xid", "instant", "xid", (_xid,),
                       result=True),
    Kind.XID_MSG: KindSpec("tracepoint", "nvidia:nvidia_dev_xid (the message, in parts)",
                           "instant", "xid", ()),
    Kind.THREAD_NEW: KindSpec("tracepoint", "sched:sched_process_fork", "instant", "process",
                              (_comm("comm"), _int("parent_tid", "a0"))),
    Kind.THREAD_NAME: KindSpec("tracepoint", "task:task_rename", "instant", "process",
                               (_comm("comm"),)),
    Kind.THREAD_EXIT: KindSpec("tracepoint", "sched:sched_process_exit", "instant", "process",
                               (_comm("comm"), _bool("group_dead", "code"))),
    Kind.PROC_EXIT: KindSpec("tracepoint", "syscalls:sys_enter_exit_group", "instant",
                             "process", (_int("exit_code", "ret"),), result=True),
    Kind.SIGNAL: KindSpec("tracepoint", "signal:signal_generate", "instant", "process",
                          (_int("signal", "ret"), _int("sender_pid", "a0"),
                           _comm("sender_comm"), _int("result", "code")), result=True),
    Kind.TCP: KindSpec("tracepoint", "tcp:tcp_send_reset / tcp_receive_reset / "
                       "tcp_retransmit_skb", "instant", "process", (_tcp,)),
}
assert set(KINDS) == set(Kind), "every Kind needs its row in store/kinds.py KINDS"

# the kinds that are CUDA driver calls (all three are counted as calls), and those seen at
# their entry only (a call with no duration and no result)
CALL_KINDS = tuple(k for k in KINDS if KINDS[k].source == "uprobe")
ENTRY_KINDS = tuple(k for k, s in KINDS.items() if s.shape == "entry")
SPAN_KINDS = tuple(k for k, s in KINDS.items() if s.shape in SPANS)


def kinds_where(**want) -> np.ndarray:
    """The kind numbers (uint16) whose spec has every attribute given: kinds_where(track=
    "thread"), kinds_where(shape="call")."""
    return np.asarray([int(k) for k, s in KINDS.items()
                       if all(getattr(s, a) == v for a, v in want.items())], dtype=np.uint16)


def event_dicts(ev: np.ndarray, t_field="ts", xid_messages: XidMessages = None,
                devices=None):
    """One JSON-ready dict per event (dump's schema: kind, t_ns, pid, tid + the kind's fields
    from KINDS); an Xid's whole message comes from xid_messages (the reader's), its device
    name (gpu: "GPU0", bus_id) from ``devices`` (store/devices.Devices of the run)."""
    ctx = Context(xid_messages or XidMessages(), devices)
    data = ev["data"]
    for i in range(len(ev)):
        e = ev[i]
        kind = int(e["kind"])
        d = {"kind": KIND_NAMES.get(kind, str(kind)), "t_ns": int(e[t_field]),
             "pid": int(e["pid"]), "tid": int(e["tid"])}
        spec = KINDS.get(kind)
        for field in spec.fields if spec else ():
            d.update(field(e, data[i], ctx))
        yield d
