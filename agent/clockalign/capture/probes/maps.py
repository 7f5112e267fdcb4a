"""Reading the loaded program's maps while it runs: the drop counters, the kernel's skipped
runs, the calls in flight (bpf/clockalign.h struct ca_slot), all through mappings or
fdinfo, never by map syscalls on the hot maps (bpf/probes.c says why).

Probes (program.py) is a ProbeMaps: ``probes.drops()``, ``probes.unfinished_cuda(now)``.
"""
import mmap

import numpy as np

from ...store.schema import EVENT_DTYPE, Kind
from ..transport.slotring import possible_cpus

CA_NEST = 2       # bpf/clockalign.h: probed calls one thread can be inside at once
CA_NKINDS = 32    # bpf/clockalign.h: drop counters a CPU (indexed by kind, CA_DROP_*)

# struct ca_call / ca_slot (bpf/clockalign.h): the calls in flight of one thread, mapped at stop
CALL_DTYPE = np.dtype([("ts", "<u8"), ("fn", "<u4"), ("pad", "<u4"), ("a", "<u8", 5)])
SLOT_DTYPE = np.dtype([("tid", "<u4"), ("depth", "<u4"), ("c", CALL_DTYPE, CA_NEST)])

# drops[] indices that are not record kinds (bpf/clockalign.h CA_DROP_*)
DROP_NAMES = {0: "state_map_full", 29: "cuda_unpaired", 30: "cuda_nested",
              31: "cuda_slot_busy"}


class ProbeMaps:
    """The maps part of Probes: needs self._bpf, self.opts, self.ring, self.cuda_paused
    and self._drops_mm (None until first read)."""

    def drops(self) -> dict:
        """Records that could not be sent, per kind name (summed over CPUs), plus the
        state-map and CUDA-pairing failures (DROP_NAMES), plus records the kernel itself
        reported lost from a full buffer (perf_lost: a cross-check, not added twice)."""
        out = {}
        for idx, n in enumerate(self._drop_counts()):
            if n:
                out[DROP_NAMES.get(idx) or Kind(idx).name.lower()] = int(n)
        if self.ring is not None and self.ring.malformed:
            out["malformed"] = self.ring.malformed     # sent, but not of the record's size
        return out

    def _drop_counts(self):
        """The drops array summed over CPUs, per index (bpf/clockalign.h), read through its
        mapping: no map syscall while the probes run (probes.c says why)."""
        if self._drops_mm is None:
            self._drop_slots = possible_cpus() * CA_NKINDS      # the CA_CPU_IDS it was built with
            size = -(-self._drop_slots * 8 // mmap.PAGESIZE) * mmap.PAGESIZE
            self._drops_mm = mmap.mmap(self._bpf["drops"].map_fd, size, mmap.MAP_SHARED,
                                       mmap.PROT_READ)
        counts = np.frombuffer(self._drops_mm, np.uint64, count=self._drop_slots)
        out = counts.reshape(-1, CA_NKINDS).sum(axis=0).tolist()
        del counts                    # no view left, so the mapping can close
        return out

    def skipped_runs(self) -> int:
        """Runs of these programs that the kernel skipped because another BPF program was
        running on that CPU (their recursion misses, bpfinfo.py).  Not drops: most runs of
        the host-wide tracepoints are other processes' (sched_switch runs for every context
        switch), so a skip may have lost a target's record or nothing; the recorder reports
        them beside the drops."""
        from .bpfinfo import prog_info
        total = 0
        for fn in (self._bpf.funcs.values() if self._bpf is not None else ()):
            info = prog_info(fn.fd)
            total += info["recursion_misses"] if info else 0
        return total

    def _call_slots(self, write=False):
        """The call-slot array (bpf/probes.c inflight, struct ca_slot in clockalign.h), mapped."""
        size = self.opts.call_slots * SLOT_DTYPE.itemsize
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        return mmap.mmap(self._bpf["inflight"].map_fd, size, mmap.MAP_SHARED,
                         mmap.PROT_READ | (mmap.PROT_WRITE if write else 0))

    def unfinished_cuda(self, now_ns: int):
        """CUDA calls entered but not returned (still in flight at stop), as events: the
        call-slot array, mapped and read with numpy in one go."""
        if self.opts.cuda_lib is None or self.cuda_paused:   # paused: slots are stale
            return np.empty(0, dtype=EVENT_DTYPE)
        with self._call_slots() as mm:
            arr = np.frombuffer(mm, dtype=SLOT_DTYPE, count=self.opts.call_slots).copy()
        busy = arr[arr["depth"] > 0]
        rows = [(int(s["tid"]), s["c"][i]) for s in busy for i in range(min(int(s["depth"]),
                                                                                CA_NEST))]
        out = np.zeros(len(rows), dtype=EVENT_DTYPE)
        for i, (tid, c) in enumerate(rows):
            out[i]["ts"] = c["ts"]
            out[i]["dur"] = max(0, now_ns - int(c["ts"]))
            out[i]["tid"] = tid
            out[i]["pid"] = _tgid_of(tid)
            out[i]["kind"] = Kind.CUDA_UNFINISHED
            out[i]["code"] = c["fn"]
            for j in range(5):
                out[i][f"a{j}"] = c["a"][j]
        return out


def _tgid_of(tid: int) -> int:
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
