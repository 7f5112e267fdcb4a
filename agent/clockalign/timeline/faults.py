"""Faults from every source as one record type, merged across sources, with their chains.

Sources: CUDA driver calls that returned an error (uprobes), connect() failures,
exit_group() with a non-zero status, a fatal signal that ended the target (tracepoints),
Xids (the nvidia_dev_xid tracepoint and NVML/DCGM events stamped on receipt), and clock
event reasons (power / thermal capping) switching on in the counters.

Grouping rules, so that one problem reads as one line and its consequences:

- The first CUDA error with a sticky code (ILLEGAL_ADDRESS, LAUNCH_FAILED, ...; see
  codes.STICKY_CURESULTS) in a process is a ``cuda_error``; every later call of that
  process that fails with the same (or another sticky) code is a ``cuda_sticky_error``
  whose ``parent`` is the first.
- A failed call of the same function with the same code while an earlier error of that
  function is not yet recovered is a retry: an entry of the first error's chain, not a
  fault of its own.
- An Xid seen by the tracepoint and by NVML/DCGM (same code, same GPU, receipt no more than
  the two uncertainties before and XID_RECEIPT_TOLERANCE_NS after the in-kernel stamp) is
  one fault with two sightings, and ``delays`` gives the time between the sources.

A chain lists what followed from a fault in the same process, in time order: ``retry``
(the same call again, failed), ``error`` (another call of the same family failed, before
the process had a successful call again: one CUDA role such as alloc; a connect() chain
holds only its own peer), ``sticky_error`` (the context is broken: any call), then
``success`` (the next successful call of the same function or peer: the recovery) or
``exit``.  ``recovery_ns`` runs from the failing call's entry to the return of that
successful call; ``healthy_ns`` from the fault to the return of the first successful call
after the last error of the chain (CUDA: of any function; connect: to that peer).

Known benign patterns are not faults (timeline/benign.py, one table: the nscd and MPS
socket probes, the driver shut down at exit, a kernel lookup not found followed by normal
work): they are left out before grouping, so they start no chain and sit in none, and are
counted per rule in ``tl.benign`` (one line each in ``tl.notes``).

Memory follows the number of failing calls, not the run (fault_events.py).  The record
is timeline/fault.py; failing calls and chains fault_chains.py; exits, signals, Xids and
capping fault_sources.py.

    for f in find_faults(tl): print(f.id, f.kind, f.name, f.recovery_ns)
"""
from ..store.schema import Kind
from . import benign
from .fault import KINDS, Fault  # noqa: F401 (the record, re-exported)
from .fault_chains import connect_calls, cuda_calls, split_benign_connects
from .fault_events import collect, next_successes
from .fault_sources import death_faults, link_xids, throttle_faults, xid_faults

_RANK = {k: i for i, k in enumerate(KINDS)}


def find_faults(tl) -> list:
    """Every fault of the Timeline tl, numbered 1.. in time order, chains resolved to ids."""
    data = collect(tl)
    data["connect"], conn_benign = split_benign_connects(data["connect"])
    c = data["cuda"]
    nexts = next_successes(tl, c, data["connect"],
                           benign.thread_rule_calls(c) if c is not None else None)
    deathf, deaths = death_faults(tl, data["other"])
    cuda_benign = []
    if c is not None:
        by_op, by_pid, op, by_tid = nexts[Kind.CUDA]
        keep, cuda_benign = benign.classify_cuda(
            c, deaths, by_pid.get,
            lambda pid, tid, x: by_tid.get(pid << 32 | tid, x) if by_tid else None)
        if not keep.all():
            data["cuda"] = {k: v[keep] for k, v in c.items()} if keep.any() else None
            nexts[Kind.CUDA] = (by_op, by_pid, op[keep], by_tid)
    tl.benign = benign.notes(cuda_benign, c, conn_benign)
    tl.notes.extend(t for t in map(benign.note_text, tl.benign) if t not in tl.notes)
    parents = {}          # id(sticky repeat) -> the first sticky error it repeats
    cuda = (cuda_calls(data["cuda"], nexts).run(deaths, parents)
            if data["cuda"] is not None else [])
    conn = (connect_calls(data["connect"], nexts).run(deaths, parents)
            if data["connect"] is not None else [])
    xids = xid_faults(tl, data["other"])
    link_xids(xids, [f for f in cuda if f.kind == "cuda_error"], deaths)
    faults = cuda + conn + xids + deathf + throttle_faults(tl)
    faults.sort(key=lambda f: (f.t_ns, _RANK.get(f.kind, 99), f.pid or 0, f.tid or 0))
    for i, f in enumerate(faults, 1):
        f.id = i
    for f in faults:
        if f.tid is not None:
            f.thread = tl.thread_name(f.tid, f.t_ns)
        parent = parents.get(id(f))
        f.parent = parent.id if parent is not None else None
        f.related = [r.id for r in f.related]
        for e in f.chain:
            if e["fault"] is not None:
                e["fault"] = e["fault"].id
            if e.get("tid") is not None:
                e["thread"] = tl.thread_name(e["tid"], e["t_ns"])
    return faults
