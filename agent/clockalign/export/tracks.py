"""The trace's tracks: one per process, thread, off-CPU lane of a thread, CUDA stream, GPU,
counter, clock, GPU stream and fault list, created on first use with their Perfetto uuids
and sequence ids and their Chrome JSON pid/tid.

Stream tracks.  A call that puts work on a stream (cuda_api.STREAM_WORK: launches, graph
launches, copies, memsets) is also drawn on one track per CUDA stream of its process, from
its stream argument (the legacy default stream, a thread's per-thread default stream for
the _ptsz/_ptds twins and CU_STREAM_PER_THREAD, or the handle), category "stream": what
was queued where, whichever thread queued it.

    tracks = Tracks(tl.threads, processes, run_salt(tl.meta), gpu_label=tl.devices.label)
    t = tracks.thread(pid, tid)             # Track: idx, uuid, seq, json_pid, json_tid, ...
    for t in tracks.take_new(): ...         # declare the tracks made since the last call
"""
import dataclasses

import numpy as np

STREAM_HANDLE, STREAM_LEGACY, STREAM_PER_THREAD = 0, 1, 2     # Tracks.stream's cls

@dataclasses.dataclass
class Track:
    idx: int
    uuid: int
    kind: str              # process, thread, offcpu, lane, xid, gpu, counter, faults
    name: str
    pid: int = 0
    tid: int = 0
    parent: "Track" = None
    json_pid: int = 0
    json_tid: int = 0
    unit: str = ""
    # Perfetto writer of the track's events: its trusted_packet_sequence_id
    seq: int = 0


PSEUDO = 1 << 30   # pseudo pid/tid for tracks Chrome JSON has no notion of (lanes, GPUs)

# Perfetto ids that another trace concatenated with ours (`cat run.pftrace system.pftrace`)
# does not use: traced numbers its writers' sequences 1, 2, ... and its track uuids are
# hashes, so clockalign's sequences start at 2^21 plus a window of 2^16 chosen by the run
# (one of SEQ_WINDOWS; every id stays below 2^28, a 4-byte varint in each packet), and its
# uuids carry a 40-bit run salt above the track index.
SEQ_BASE = 1 << 21
SEQ_WINDOWS = ((1 << 28) - SEQ_BASE) >> 16


def run_salt(meta: dict) -> int:
    """40 bits that differ between runs (host, start clocks, targets): two exports of
    different runs get disjoint uuids and, but for 1 in 4064, disjoint sequence windows."""
    import hashlib
    import json
    key = json.dumps([meta.get("host"), meta.get("clocks"), meta.get("targets")],
                     sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=5).digest(), "little")


class Tracks:
    """Every track of the trace, created on first use; parents are created first."""

    def __init__(self, threads: dict, processes: dict, salt: int = 0,
                 gpu_label=lambda g: f"GPU{g}"):
        self.threads = threads
        self.processes = processes
        self.gpu_label = gpu_label      # GPU n's track name: "GPU0 00000000:18:00.0"
        self.uuid_base = (salt & ((1 << 40) - 1)) << 24
        self.seq_base = SEQ_BASE + ((salt % SEQ_WINDOWS) << 16)
        self.clock_seq = self.seq_base + 1     # the clock snapshot's sequence
        self.all = []
        self.by_key = {}
        self.new = []          # created since the last take_new()
        self._pseudo = PSEUDO
        self.uuid_lut = np.zeros(0, dtype=np.uint64)
        self.seq_lut = np.zeros(0, dtype=np.int64)
        self.jpid_lut = np.zeros(0, dtype=np.int64)
        self.jtid_lut = np.zeros(0, dtype=np.int64)

    def _pseudo_id(self) -> int:
        self._pseudo += 1
        return self._pseudo

    def _add(self, key, **kw) -> Track:
        t = Track(idx=len(self.all), uuid=self.uuid_base + len(self.all) + 1, **kw)
        t.seq = self.seq_base + t.idx + 2
        self.all.append(t)
        self.by_key[key] = t
        self.new.append(t)
        return t

    def take_new(self) -> list:
        new, self.new = self.new, []
        if new:
            n = len(self.all)
            self.uuid_lut = np.array([t.uuid for t in self.all], dtype=np.uint64)
            self.seq_lut = np.array([t.seq for t in self.all], dtype=np.int64)
            self.jpid_lut = np.array([t.json_pid for t in self.all], dtype=np.int64)
            self.jtid_lut = np.array([t.json_tid for t in self.all], dtype=np.int64)
            assert len(self.uuid_lut) == n
        return new

    def process(self, pid: int) -> Track:
        key = ("process", pid)
        t = self.by_key.get(key)
        if t is None:
            name = self.processes.get(pid) or self.threads.get(pid) or f"process {pid}"
            t = self._add(key, kind="process", name=name, pid=pid, json_pid=pid,
                          json_tid=self._pseudo_id())
        return t

    def thread(self, pid: int, tid: int) -> Track:
        key = ("thread", pid, tid)
        t = self.by_key.get(key)
        if t is None:
            proc = self.process(pid)
            t = self._add(key, kind="thread", name=self.threads.get(tid) or f"thread {tid}",
                          pid=pid, tid=tid, parent=proc, json_pid=pid, json_tid=tid)
        return t

    def offcpu(self, pid: int, tid: int) -> Track:
        key = ("offcpu", pid, tid)
        t = self.by_key.get(key)
        if t is None:
            th = self.thread(pid, tid)
            t = self._add(key, kind="offcpu", name="off-CPU", pid=pid, tid=tid, parent=th,
                          json_pid=pid, json_tid=self._pseudo_id())
        return t

    def xid(self) -> Track:
        t = self.by_key.get(("xid",))
        if t is None:
            p = self._pseudo_id()
            t = self._add(("xid",), kind="xid", name="NVIDIA Xid", json_pid=p, json_tid=p)
        return t

    def lane(self, base: Track, lane: int) -> Track:
        key = ("lane", base.idx, lane)
        t = self.by_key.get(key)
        if t is None:
            t = self._add(key, kind="lane", name=f"{base.name} overlapping #{lane}",
                          pid=base.pid, tid=base.tid, parent=base, json_pid=base.json_pid,
                          json_tid=self._pseudo_id())
        return t

    def gpu(self, gpu: int) -> Track:
        key = ("gpu", gpu)
        t = self.by_key.get(key)
        if t is None:
            p = self._pseudo_id()
            t = self._add(key, kind="gpu", name=self.gpu_label(gpu), json_pid=p, json_tid=p)
        return t

    def counter(self, gpu: int, field: int, name: str, unit: str) -> Track:
        key = ("counter", gpu, field)
        t = self.by_key.get(key)
        if t is None:
            g = self.gpu(gpu)
            t = self._add(key, kind="counter", name=name, parent=g, unit=unit,
                          json_pid=g.json_pid, json_tid=g.json_tid)
        return t

    def clock(self, gpu: int) -> Track:
        """GPU n's clock domain: its band half-width over time, a counter under the GPU."""
        key = ("clock", gpu)
        t = self.by_key.get(key)
        if t is None:
            g = self.gpu(gpu)
            t = self._add(key, kind="counter", name=f"GPU{gpu} clock ±", parent=g, unit="ns",
                          json_pid=g.json_pid, json_tid=g.json_tid)
        return t

    def stream(self, pid: int, cls: int, value: int) -> Track:
        """The track of one CUDA stream of process pid: cls STREAM_HANDLE (value: the
        handle), STREAM_LEGACY (the legacy default stream), STREAM_PER_THREAD (value: the
        thread whose per-thread default stream it is)."""
        key = ("stream", pid, cls, value)
        t = self.by_key.get(key)
        if t is None:
            name = (f"stream {value:#x}" if cls == STREAM_HANDLE else
                    "stream: legacy default" if cls == STREAM_LEGACY else
                    f"stream: per-thread default of {self.threads.get(value) or 'thread'} "
                    f"{value}")
            proc = self.process(pid)
            t = self._add(key, kind="stream", name=name, pid=pid, parent=proc,
                          json_pid=pid, json_tid=self._pseudo_id())
        return t

    def gpu_stream(self, gpu: int, pid: int, stream: int) -> Track:
        """Executions (record --gpu-activity) of one CUDA stream of process pid on GPU gpu."""
        key = ("gpu_stream", gpu, pid, stream)
        t = self.by_key.get(key)
        if t is None:
            g = self.gpu(gpu)
            t = self._add(key, kind="gpu_stream", name=f"GPU{gpu} stream {stream} (pid {pid})",
                          pid=pid, parent=g, json_pid=g.json_pid, json_tid=self._pseudo_id())
        return t

    def faults(self, pid: int = None, gpu: int = None) -> Track:
        key = ("faults", pid, gpu)
        t = self.by_key.get(key)
        if t is None:
            parent = self.gpu(gpu) if gpu is not None else (
                self.process(pid) if pid else None)
            jp = parent.json_pid if parent else self._pseudo_id()
            t = self._add(key, kind="faults", name="faults", parent=parent, pid=pid or 0,
                          json_pid=jp, json_tid=self._pseudo_id())
        return t
