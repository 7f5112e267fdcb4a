"""DCGM counter backend: host-engine field watches, including the profiling (DCP) fields.

DCGM's Python bindings are not on PyPI; they ship with the DCGM package and are found
in the standard install folders (BINDING_DIRS).  clockalign connects to a running
nv-hostengine first and starts an embedded host engine (root) only if none answers.

Times: a DCGM value's ``ts`` is µs since 1970 (CLOCK_REALTIME of the host engine), stored
as ts * 1000 with a latency of 1 µs (DCGM states no collection latency).  Profiling
fields (DCGM_FI_PROF_*) and utilisation are averages over the watch interval ending at
``ts``: window_ns says so, so the timeline draws them as intervals.

Not verified on hardware (no DCGM on the development or test hosts): the live calls in
DcgmBackend follow DCGM's documented Python API (pydcgm.DcgmHandle, DcgmGroup,
DcgmFieldGroup, dcgm_field_helpers.DcgmFieldValueCollection); the mapping and
conversions below are unit-tested.

    backend = DcgmBackend(gpus=None, interval_s=0.1)
"""
import importlib.util
import os
import sys
import time

from ....errors import ClockalignError
from ....store.counter_fields import FIELD_BY_NAME

BINDING_DIRS = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",   # DCGM 4.x packages
    "/usr/local/dcgm/bindings/python3",                        # DCGM 3.x packages
)

SECOND_NS = 1_000_000_000
MIB = 1 << 20
WATCH = "watch"          # window = the watch interval of the field's group

# DCGM_FI_* id -> (field name, scale to stored unit, window)
DCGM_FIELDS = {
    100: ("sm_clock", 1.0, 0),                     # DEV_SM_CLOCK, MHz
    101: ("mem_clock", 1.0, 0),                    # DEV_MEM_CLOCK, MHz
    203: ("gpu_util", 1.0, WATCH),                 # DEV_GPU_UTIL, %
    204: ("mem_util", 1.0, WATCH),                 # DEV_MEM_COPY_UTIL, %
    252: ("mem_used", float(MIB), 0),              # DEV_FB_USED, MiB
    251: ("mem_free", float(MIB), 0),              # DEV_FB_FREE, MiB
    157: ("power", 1.0, 0),                        # DEV_POWER_USAGE_INSTANT, W
    155: ("power_avg", 1.0, SECOND_NS),            # DEV_POWER_USAGE, W (1 s average, Ampere+)
    150: ("gpu_temp", 1.0, 0),                     # DEV_GPU_TEMP, C
    140: ("mem_temp", 1.0, 0),                     # DEV_MEMORY_TEMP, C
    112: ("clock_event_reasons", 1.0, 0),          # DEV_CLOCKS_EVENT_REASONS, bitmask
    156: ("energy", 1.0, 0),                       # DEV_TOTAL_ENERGY_CONSUMPTION, mJ
    202: ("pcie_replays", 1.0, 0),                 # DEV_PCIE_REPLAY_COUNTER
    160: ("power_limit", 1.0, 0),                  # DEV_POWER_MGMT_LIMIT, W
    240: ("power_violation", 1.0, 0),              # DEV_POWER_VIOLATION, ns
    241: ("thermal_violation", 1.0, 0),            # DEV_THERMAL_VIOLATION, ns
    310: ("ecc_sbe_volatile", 1.0, 0),             # DEV_ECC_SBE_VOL_TOTAL
    311: ("ecc_dbe_volatile", 1.0, 0),             # DEV_ECC_DBE_VOL_TOTAL
    312: ("ecc_sbe_aggregate", 1.0, 0),            # DEV_ECC_SBE_AGG_TOTAL
    313: ("ecc_dbe_aggregate", 1.0, 0),            # DEV_ECC_DBE_AGG_TOTAL
    390: ("retired_pages_sbe", 1.0, 0),            # DEV_RETIRED_SBE
    391: ("retired_pages_dbe", 1.0, 0),            # DEV_RETIRED_DBE
    392: ("retired_pages_pending", 1.0, 0),        # DEV_RETIRED_PENDING
    393: ("remapped_rows_uncorrectable", 1.0, 0),  # DEV_UNCORRECTABLE_REMAPPED_ROWS
    394: ("remapped_rows_correctable", 1.0, 0),    # DEV_CORRECTABLE_REMAPPED_ROWS
    395: ("remapped_rows_failure", 1.0, 0),        # DEV_ROW_REMAP_FAILURE
    396: ("remapped_rows_pending", 1.0, 0),        # DEV_ROW_REMAP_PENDING
    1001: ("gr_engine_active", 1.0, WATCH),        # PROF_GR_ENGINE_ACTIVE, ratio
    1002: ("sm_active", 1.0, WATCH),               # PROF_SM_ACTIVE
    1003: ("sm_occupancy", 1.0, WATCH),            # PROF_SM_OCCUPANCY
    1004: ("tensor_active", 1.0, WATCH),           # PROF_PIPE_TENSOR_ACTIVE
    1005: ("dram_active", 1.0, WATCH),             # PROF_DRAM_ACTIVE
    1009: ("pcie_tx_rate", 1.0, WATCH),            # PROF_PCIE_TX_BYTES, B/s
    1010: ("pcie_rx_rate", 1.0, WATCH),            # PROF_PCIE_RX_BYTES, B/s
    1011: ("nvlink_tx_rate", 1.0, WATCH),          # PROF_NVLINK_TX_BYTES, B/s
    1012: ("nvlink_rx_rate", 1.0, WATCH),          # PROF_NVLINK_RX_BYTES, B/s
}
XID_FIELD = 230                                    # DEV_XID_ERRORS: value = the Xid number
MAIN_FIELD_IDS = tuple(f for f in DCGM_FIELDS if f < 1000) + (XID_FIELD,)
PROF_FIELD_IDS = tuple(f for f in DCGM_FIELDS if f >= 1000)
# Tried when the host engine cannot watch all profiling fields at once.
PROF_CORE_IDS = (1002, 1003, 1004, 1005)

# dcgmvalue.py sentinels: a value at or above BLANK is not a measurement.
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0
BLANK_REASONS = {0: "blank", 1: "not_found", 2: "not_supported", 3: "no_permission"}


def classify(value):
    """'ok', or why DCGM sent a placeholder instead ('blank', 'not_supported', ...)."""
    if value is None:
        return "blank"
    if isinstance(value, float):
        if value >= FP64_BLANK:
            return BLANK_REASONS.get(int(value - FP64_BLANK), "blank")
        return "ok"
    if isinstance(value, int):
        if value >= INT64_BLANK:
            return BLANK_REASONS.get(value - INT64_BLANK, "blank")
        return "ok"
    return "blank"


def window_ns(dcgm_field: int, watch_ns: int) -> int:
    spec = DCGM_FIELDS[dcgm_field][2]
    return watch_ns if spec == WATCH else spec


def decode_dcgm_values(values, out, recv_mono_ns, watch_ns, since_us=0, xid_unc_ns=None):
    """DCGM field values -> counter rows in ``out``, Xid rows, and problems.

    ``values``: iterable of (gpu, dcgm_field_id, ts_us, value), gpu being the NVML index.
    ``watch_ns``: the watch interval of these fields (the window of averaged fields).
    Values stamped before ``since_us`` (the host engine's cache from before the
    recording) are dropped.  Returns ``(xid_rows, problems)``, problems being
    ``[(gpu, dcgm_field_id, reason)]`` for placeholders other than 'blank'.

        xids, problems = decode_dcgm_values([(0, 1002, ts, 0.42)], rows, mono, 100_000_000)
    """
    xids, problems = [], []
    for gpu, fid, ts_us, value in values:
        if ts_us < since_us:
            continue
        status = classify(value)
        if status != "ok":
            if status != "blank":
                problems.append((gpu, fid, status))
            continue
        if fid == XID_FIELD:
            xids.append({"source": "dcgm", "gpu": gpu, "type": "xid", "code": int(value),
                         "t_mono_ns": None, "t_real_ns": ts_us * 1000,
                         "unc_ns": xid_unc_ns if xid_unc_ns is not None else watch_ns,
                         "recv_mono_ns": recv_mono_ns})
            continue
        spec = DCGM_FIELDS.get(fid)
        if spec is None:
            continue
        name, scale, _ = spec
        out.add(gpu, FIELD_BY_NAME[name], ts_us * 1000, 1000, recv_mono_ns,
                float(value) * scale, window_ns(fid, watch_ns))
    return xids, problems


def find_bindings():
    """The first standard folder holding DCGM's Python bindings, or None."""
    for d in BINDING_DIRS:
        if os.path.isfile(os.path.join(d, "pydcgm.py")):
            return d
    return None


def import_dcgm():
    """Import DCGM's Python modules from an install folder, or raise ClockalignError."""
    if importlib.util.find_spec("pydcgm") is None:
        path = find_bindings()
        if path is None:
            raise ClockalignError("DCGM is not usable: its Python bindings were not found in "
                                  + " or ".join(BINDING_DIRS)) from None
        if path not in sys.path:
            sys.path.append(path)      # appended, so the bindings never shadow other modules
    try:
        import dcgm_agent
        import dcgm_field_helpers
        import dcgm_fields
        import dcgm_structs
        import pydcgm
    except Exception as e:
        raise ClockalignError(f"DCGM is not usable: its Python bindings failed to import ({e})") \
            from None
    return pydcgm, dcgm_structs, dcgm_fields, dcgm_agent, dcgm_field_helpers


def _remote_handle(pydcgm, host):
    try:
        return pydcgm.DcgmHandle(ipAddress=host, timeoutMs=1000)
    except TypeError:                      # bindings older than the timeoutMs argument
        return pydcgm.DcgmHandle(ipAddress=host)


def connect(pydcgm, dcgm_structs, host="127.0.0.1"):
    """A DcgmHandle to nv-hostengine at ``host``, else an embedded host engine."""
    try:
        return _remote_handle(pydcgm, host), f"nv-hostengine at {host}"
    except Exception as first:
        try:
            return (pydcgm.DcgmHandle(ipAddress=None,
                                      opMode=dcgm_structs.DCGM_OPERATION_MODE_AUTO),
                    "an embedded host engine")
        except Exception as second:
            raise ClockalignError(f"DCGM is not usable: no nv-hostengine answered at {host} "
                                  f"({first}) and an embedded host engine did not start "
                                  f"({second})") from None


def dcgm_status():
    """(usable, reason) for `clockalign doctor`; connects to nv-hostengine only."""
    try:
        pydcgm, dcgm_structs, *_ = import_dcgm()
    except ClockalignError as e:
        return False, str(e)
    try:
        handle = _remote_handle(pydcgm, "127.0.0.1")
    except Exception as e:
        return False, ("DCGM bindings found but no nv-hostengine answered at 127.0.0.1 "
                       f"({e}); as root an embedded host engine would be tried")
    try:
        n = len(handle.GetSystem().discovery.GetAllSupportedGpuIds())
        return True, f"DCGM works: nv-hostengine at 127.0.0.1, {n} supported GPU(s)"
    finally:
        handle.Shutdown()


def _nvml_index_by_uuid():
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        return {pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)): i
                for i in range(pynvml.nvmlDeviceGetCount())}
    except Exception:
        return {}
    finally:
        pynvml.nvmlShutdown()


class DcgmBackend:
    """Counter backend over DCGM field watches (main fields + profiling + Xid)."""

    name = "dcgm"

    def __init__(self, gpus=None, interval_s=0.1, prof_interval_s=None, host="127.0.0.1",
                 max_keep_age_s=10.0):
        (self.pydcgm, self.dcgm_structs, self.dcgm_fields, self.dcgm_agent,
         self.helpers) = import_dcgm()
        self.handle, self.connection = connect(self.pydcgm, self.dcgm_structs, host)
        self._notices = []
        self.unsupported = []
        self._said = set()
        self.errors = 0
        self.writer = None
        self.event_count = 0
        try:
            self._setup(gpus, interval_s, prof_interval_s, max_keep_age_s)
        except ClockalignError:
            self.close()
            raise
        except Exception as e:
            self.close()
            raise ClockalignError(f"DCGM is not usable: setting up field watches failed ({e})") \
                from None

    def _setup(self, gpus, interval_s, prof_interval_s, max_keep_age_s):
        system = self.handle.GetSystem()
        dcgm_ids = list(system.discovery.GetAllSupportedGpuIds())
        by_uuid = _nvml_index_by_uuid()
        self.nvml_index = {}
        for gid in dcgm_ids:
            uuid = system.discovery.GetGpuAttributes(gid).identifiers.uuid
            self.nvml_index[gid] = by_uuid.get(uuid, gid)
        if not by_uuid:
            self._notices.append(("info", "DCGM GPU ids taken as NVML indices "
                                          "(NVML was not available to match UUIDs)"))
        if gpus is not None:
            want = {int(g) for g in gpus}
            dcgm_ids = [g for g in dcgm_ids if self.nvml_index[g] in want]
            missing = want - {self.nvml_index[g] for g in dcgm_ids}
            if missing:
                raise ClockalignError(f"DCGM does not support or see GPU {min(missing)}")
        if not dcgm_ids:
            raise ClockalignError("DCGM is not usable: it supports none of this host's GPUs")
        self.gpus = sorted(self.nvml_index[g] for g in dcgm_ids)
        tag = f"clockalign_{os.getpid()}_{time.monotonic_ns()}"
        self.group = system.GetGroupWithGpuIds(tag, dcgm_ids)
        group_id = self.group.GetId() if hasattr(self.group, "GetId") else self.group._groupId
        self.watch_ns = int(interval_s * 1e9)
        self.prof_watch_ns = int((prof_interval_s or interval_s) * 1e9)
        self._watches = []
        main = self.pydcgm.DcgmFieldGroup(self.handle, name=tag + "_main",
                                          fieldIds=list(MAIN_FIELD_IDS))
        self.group.samples.WatchFields(main, self.watch_ns // 1000, max_keep_age_s, 0)
        self._watches.append((main, self.helpers.DcgmFieldValueCollection(
            self.handle.handle, group_id), self.watch_ns))
        for ids in (PROF_FIELD_IDS, PROF_CORE_IDS):
            try:
                prof = self.pydcgm.DcgmFieldGroup(self.handle, name=f"{tag}_prof{len(ids)}",
                                                  fieldIds=list(ids))
                self.group.samples.WatchFields(prof, self.prof_watch_ns // 1000,
                                               max_keep_age_s, 0)
            except Exception as e:
                self._notices.append(("info", f"DCGM cannot watch profiling fields {list(ids)} "
                                              f"({e})"))
                continue
            self._watches.append((prof, self.helpers.DcgmFieldValueCollection(
                self.handle.handle, group_id), self.prof_watch_ns))
            break
        self.since_us = time.clock_gettime_ns(time.CLOCK_REALTIME) // 1000
        self._dcgm_to_nvml = dict(self.nvml_index)

    def sample(self, out) -> None:
        for fg, coll, watch_ns in self._watches:
            coll.GetAllSinceLastCall(fg)
            recv = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            values = [(self._dcgm_to_nvml.get(gid, gid), fid, v.ts, v.value)
                      for gid, by_field in coll.values.items()
                      for fid, series in by_field.items()
                      for v in series.values]
            coll.EmptyValues()
            xids, problems = decode_dcgm_values(values, out, recv, watch_ns, self.since_us)
            for gpu, fid, reason in problems:
                if (gpu, fid) not in self._said:
                    self._said.add((gpu, fid))
                    name = DCGM_FIELDS.get(fid, (f"field {fid}",))[0]
                    self.unsupported.append(f"gpu{gpu} {name} (DCGM field {fid}): {reason}")
                    self._notices.append(("info", f"DCGM reports {name} (field {fid}) on GPU "
                                                  f"{gpu} as {reason}"))
            if xids:
                self.event_count += len(xids)
                if self.writer is not None:
                    from ....store.schema import Chunk
                    self.writer.write_rows(Chunk.GPU_EVENTS, xids)

    def drain_notices(self) -> list:
        out, self._notices = self._notices, []
        return out

    def start_events(self, writer):
        """Xid errors arrive as DCGM_FI_DEV_XID_ERRORS values; sample() writes them."""
        self.writer = writer

    def stop_events(self):
        self.writer = None

    def close(self):
        for fg, _, _ in getattr(self, "_watches", []):
            try:
                self.group.samples.UnwatchFields(fg)
                fg.Delete()
            except Exception:
                pass
        self._watches = []
        group = getattr(self, "group", None)
        if group is not None:
            try:
                group.Delete()
            except Exception:
                pass
            self.group = None
        if getattr(self, "handle", None) is not None:
            try:
                self.handle.Shutdown()
            except Exception:
                pass
            self.handle = None
