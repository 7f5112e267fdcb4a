"""NVML Xid events as a fallback to the nvidia:nvidia_dev_xid tracepoint.

NVML events carry no time, so each is stamped on receipt with MONOTONIC and REALTIME.
The thread blocks in nvmlEventSetWait_v2, which returns as soon as an event arrives;
``unc_ns`` is set to the wait timeout, a deliberately loose bound on how late the
stamp can be, since NVML states no delivery latency.  Each event is written at once
(one GPU_EVENTS chunk per event) so a crash right after an Xid still keeps it.

    w = NvmlEventWatcher(pynvml, {0: handle}, writer, timeout_ms=100); w.start(); w.stop()
"""
import ctypes
import threading
import time

from ....store.schema import Chunk

XID_CRITICAL_ERROR = 0x8          # nvmlEventTypeXidCriticalError
NO_INSTANCE = 0xFFFFFFFF          # gpuInstanceId / computeInstanceId outside MIG


def _address(handle) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def event_row(gpu, event_type, event_data, t_mono_ns, t_real_ns, unc_ns,
              gpu_instance=NO_INSTANCE, compute_instance=NO_INSTANCE) -> dict:
    """One GPU_EVENTS row for an NVML event received at (t_mono_ns, t_real_ns)."""
    row = {"source": "nvml", "gpu": gpu,
           "type": "xid" if event_type & XID_CRITICAL_ERROR else f"nvml_event_{event_type:#x}",
           "code": int(event_data), "t_mono_ns": t_mono_ns, "t_real_ns": t_real_ns,
           "unc_ns": unc_ns}
    if gpu_instance != NO_INSTANCE:
        row["gpu_instance"] = int(gpu_instance)
    if compute_instance != NO_INSTANCE:
        row["compute_instance"] = int(compute_instance)
    return row


class NvmlEventWatcher:
    """A thread waiting on one NVML event set for Xid critical errors of chosen GPUs."""

    def __init__(self, nv, handles: dict, writer, timeout_ms=100):
        self.nv = nv
        self.handles = dict(handles)
        self.writer = writer
        self.timeout_ms = int(timeout_ms)
        self.count = 0
        self.registered = []
        self._by_address = {_address(h): g for g, h in self.handles.items()}
        self._notices = []
        self._stop = threading.Event()
        self._thread = None
        self._set = None

    def start(self):
        nv = self.nv
        try:
            self._set = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            self._notices.append(("warning", f"NVML Xid events unavailable: "
                                             f"nvmlEventSetCreate failed ({e})"))
            return
        for gpu, h in self.handles.items():
            try:
                supported = nv.nvmlDeviceGetSupportedEventTypes(h)
                if not supported & XID_CRITICAL_ERROR:
                    self._notices.append(("info", f"NVML offers no Xid events on GPU {gpu}"))
                    continue
                nv.nvmlDeviceRegisterEvents(h, XID_CRITICAL_ERROR, self._set)
                self.registered.append(gpu)
            except nv.NVMLError as e:
                self._notices.append(("info", f"NVML Xid events unavailable on GPU {gpu} ({e})"))
        if not self.registered:
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="clockalign-nvml-events",
                                        daemon=True)
        self._thread.start()

    def _run(self):
        nv = self.nv
        unc = self.timeout_ms * 1_000_000
        failures = 0
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._set, self.timeout_ms)
            except nv.NVMLError as e:
                if e.value == 10:          # TIMEOUT: nothing happened
                    continue
                failures += 1
                if failures == 1:
                    self._notices.append(("warning", f"NVML event wait failed ({e}); retrying"))
                if failures >= 50:
                    self._notices.append(("warning", "NVML event wait keeps failing; "
                                                     "Xid events from NVML stop here"))
                    return
                self._stop.wait(self.timeout_ms / 1000)
                continue
            t_mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            t_real = time.clock_gettime_ns(time.CLOCK_REALTIME)
            gpu = self._by_address.get(_address(data.device), -1)
            row = event_row(gpu, int(data.eventType), int(data.eventData), t_mono, t_real, unc,
                            getattr(data, "gpuInstanceId", NO_INSTANCE),
                            getattr(data, "computeInstanceId", NO_INSTANCE))
            self.count += 1
            try:
                self.writer.write_rows(Chunk.GPU_EVENTS, [row])
            except ValueError:             # run file already closed: recording is over
                return

    def drain_notices(self) -> list:
        out, self._notices = self._notices, []
        return out

    def _free(self):
        if self._set is not None:
            try:
                self.nv.nvmlEventSetFree(self._set)
            except self.nv.NVMLError:
                pass
            self._set = None

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_ms / 1000 + 2.0)
            if self._thread.is_alive():
                # still inside nvmlEventSetWait_v2: freeing the set under it is unsafe
                return
            self._thread = None
        self._free()
