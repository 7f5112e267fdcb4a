"""Several GPUs on one host: one identity (the PCI bus id) per device, one clock domain each.

Two parts.  (1) Two synthetic GPU domains with different skews, one with a clock step, in
one run file: each is fitted on its own, the step is found where it is, and the two
timers are compared against each other.  (2) A fake two-device host built from the real
NVML capture of tests/data/nvml (one H200, recorded by scripts/data/capture_nvml.py):
its records are replayed as two devices whose NVML indices run in the other order from
the CUDA ordinals (NVML 0 = bus 18 = CUDA 1), through the recorder's own device table,
clock-probe thread (with a synthetic %globaltimer per CUDA ordinal in place of a GPU),
NVML decoder and run writer; then every stage downstream (dump, align, report, Perfetto)
must put the counters, Xids and clock domain of one device under one name.
"""
import collections
import copy
import json
import time
from pathlib import Path

import numpy as np
import pytest

from clockalign.align import fit_run
from clockalign.align.compare import compare
from clockalign.capture.clocks import clockprobe
from clockalign.capture.gpu.counters import RowBuffer
from clockalign.capture.gpu.counters.nvml_decode import NvmlDecoder
from clockalign.capture.gpu.counters.nvml_events import event_row
from clockalign.capture.clocks.devices import cuda_bus_ids, device_table
from clockalign.export import export_run
from clockalign.report import build_report
from clockalign.store.devices import Devices, bus_id, join
from clockalign.store.reader import RunReader
from clockalign.store.schema import EVENT_DTYPE, Chunk, Kind
from clockalign.store.writer import RunWriter
from clockalign.timeline import Timeline

from .test_align_cli import _run
from .test_align_fit import synthetic
from .test_export import parse

NVML = Path(__file__).resolve().parents[1] / "data" / "nvml"
BUS18, BUS2A = "00000000:18:00.0", "00000000:2A:00.0"


# ---------------------------------------------------------------- identity
def test_bus_id_every_spelling():
    for text in ("0000:18:00.0", "00000000:18:00.0", "0000:18:00", "18:00.0", " 0000:18:00.0\n"):
        assert bus_id(text) == BUS18
    assert bus_id("0000:2a:00.0") == bus_id("00000000:2A:00.0") == BUS2A
    assert bus_id("GPU-b9267e26") is None and bus_id(None) is None


def test_h200_xid_and_nvml_spellings_meet():
    """The H200 fault recording: the tracepoint's dev and NVML's inventory name one device."""
    r = RunReader(Path(__file__).resolve().parents[1] / "data" / "gpu-h200" / "faults.ca")
    xid = [e for e in r.events() if e["kind"] == Kind.XID]
    dev = r.xid_messages.of(xid[0])[0]
    assert dev == "0000:00:06.0" and r.meta["gpus"][0]["pci_bus_id"] == "00000000:00:06.0"
    devs = Devices.from_meta(r.meta, r.rows(Chunk.CLOCK_INFO))
    assert devs.by_bus(dev).name == "GPU0" and devs.label("GPU0") == "GPU0 00000000:00:06.0"


def _two_device_inventory():
    """NVML's inventory of the capture, as two devices: NVML 0 at bus 18, NVML 1 at 2A."""
    inv = json.loads((NVML / "nvml_capture.json").read_text())["inventory"][0]
    a, b = dict(inv), dict(inv)
    a.update(index=0, pci_bus_id=BUS18, uuid=inv["uuid"][:-1] + "0")
    b.update(index=1, pci_bus_id=BUS2A, uuid=inv["uuid"][:-1] + "1")
    return [a, b]


class FakeDriver:
    """cuda-bindings' driver calls used by capture/clocks/devices.py, for two devices that CUDA
    numbers in the other order from NVML (CUDA 0 = bus 2A, CUDA 1 = bus 18)."""

    BUSES = {0: (0, 0x2A, 0), 1: (0, 0x18, 0)}

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, \
            CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 50, 33, 34

    def cuDeviceGetCount(self):
        return (0, len(self.BUSES))

    def cuDeviceGet(self, o):
        return (0, o) if o in self.BUSES else (101, None)

    def cuDeviceGetAttribute(self, attr, dev):
        dom, bus, slot = self.BUSES[dev]
        return (0, {50: dom, 33: bus, 34: slot}[attr])


def test_device_table_joins_nvml_and_cuda_on_the_bus_id():
    assert cuda_bus_ids(FakeDriver()) == {0: BUS2A, 1: BUS18}
    devices, notes = device_table(_two_device_inventory(), cu=FakeDriver())
    assert notes == []
    assert [(d.name, d.bus_id, d.nvml_index, d.cuda_ordinal) for d in devices] == [
        ("GPU0", BUS18, 0, 1), ("GPU1", BUS2A, 1, 0)]
    # CUDA not asked (no GPU clock): no ordinals, no note; CUDA failing: a note, not an error
    devices, notes = device_table(_two_device_inventory(), use_cuda=False)
    assert [d.cuda_ordinal for d in devices] == [None, None] and notes == []

    class NoDevice(FakeDriver):
        def cuDeviceGetCount(self):
            return (100, None)              # CUDA_ERROR_NO_DEVICE
    devices, notes = device_table(_two_device_inventory(), cu=NoDevice())
    assert [d.cuda_ordinal for d in devices] == [None, None]
    assert notes[0].startswith("CUDA device ordinals unknown (") and "not probed" in notes[0]
    assert device_table([], cu=NoDevice()) == ([], [])      # no GPU anywhere: nothing to say


def test_join_without_nvml_numbers_cuda_devices_in_bus_order():
    devices, notes = join([], {0: "0000:2a:00.0", 1: "0000:18:00.0"})
    assert [(d.name, d.bus_id, d.cuda_ordinal) for d in devices] == [
        ("GPU0", BUS18, 1), ("GPU1", BUS2A, 0)]
    devices, notes = join(_two_device_inventory(), {0: BUS2A})
    assert devices[0].cuda_ordinal is None and "not visible to CUDA" in notes[0]


# ---------------------------------------------------------------- two synthetic domains
HOST0 = 5_000_000_000
STEP_NS, STEP_AT_S = 40_000, 23.7


@pytest.fixture(scope="module")
def two_domains(tmp_path_factory):
    """GPU0 at +12 ppm, GPU1 at -7 ppm with a +40 us step at 23.7 s, one run file."""
    d0 = synthetic(31, seconds=40, skew_ppm=12.0, host0=HOST0)
    d1 = synthetic(32, seconds=40, skew_ppm=-7.0, host0=HOST0, step_ns=STEP_NS,
                   step_at_s=STEP_AT_S)
    path = tmp_path_factory.mktemp("two") / "two.ca"
    meta = {"devices": [{"name": "GPU0", "number": 0, "bus_id": BUS18, "nvml_index": 0,
                         "cuda_ordinal": 1},
                        {"name": "GPU1", "number": 1, "bus_id": BUS2A, "nvml_index": 1,
                         "cuda_ordinal": 0}]}
    with RunWriter(path, meta) as w:
        w.write_rows(Chunk.CLOCK_INFO, [{"domain": f"GPU{g}", "tick_ns": 32} for g in (0, 1)])
        for g, d in ((0, d0), (1, d1)):
            n = d.t0.size
            w.write_columns(Chunk.GPU_CLOCK, {"gpu": np.full(n, g, np.uint8),
                                              "method": np.ones(n, np.uint8),
                                              "t0": d.t0, "remote": d.remote, "t1": d.t1})
    return path, d0, d1


def test_each_gpu_domain_fitted_on_its_own(two_domains):
    path, d0, d1 = two_domains
    models = fit_run(RunReader(path))
    assert sorted(models) == ["GPU0", "GPU1"] and not models.failed
    s0, s1 = models["GPU0"].summary(), models["GPU1"].summary()
    assert abs(s0["skew_ppm"] - 12.0) < 0.2 and abs(s1["skew_ppm"] + 7.0) < 0.2
    assert s0["steps"] == []
    (st,) = s1["steps"]
    lo, hi = st["host_window_ns"]
    assert lo <= d1.clock.step_host <= hi
    assert abs(st["remote_jump_ns"] - STEP_NS) < 3_000
    for m, d in ((models["GPU0"], d0), (models["GPU1"], d1)):
        host, unc = m.map(d.ev_r)
        assert np.mean(np.abs(host - d.ev_h) <= unc) >= 0.99


def test_gpu_timers_against_each_other(two_domains):
    path, d0, d1 = two_domains
    r = RunReader(path)
    models = fit_run(r)
    gpu = r.columns(Chunk.GPU_CLOCK)
    rel = compare(models["GPU0"], gpu["remote"][gpu["gpu"] == 0],
                  models["GPU1"], gpu["remote"][gpu["gpu"] == 1])
    assert abs(rel["skew_ppm"] - (-7.0 - 12.0)) < 0.5          # GPU1 runs 19 ppm slower
    (st,) = rel["steps"]                                       # GPU1's step, from its fit
    assert st["domain"] == "b" and abs(st["remote_jump_ns"] - STEP_NS) < 3_000
    # the true offset GPU1 - GPU0 at a host instant lies within the stated uncertainty
    t = np.array(rel["host_span_ns"])
    truth = d1.clock.remote(t) - d0.clock.remote(t)
    assert abs(rel["offset_first_ns"] - truth[0]) < 2 * rel["unc_p99_ns"]
    assert abs(rel["offset_last_ns"] - truth[1]) < 2 * rel["unc_p99_ns"]


def test_report_shows_each_domain_with_its_device(two_domains, tmp_path):
    path, _, _ = two_domains
    rep = build_report(Timeline.open(path), tmp_path)
    rows = {r["domain"]: r for r in rep.numbers["alignment"]}
    assert rows["GPU0"]["device"].startswith(f"{BUS18}, NVML 0, CUDA 1")
    assert rows["GPU1"]["device"].startswith(f"{BUS2A}, NVML 1, CUDA 0")
    (pair,) = rep.numbers["gpu_clock_pairs"]
    assert pair["a_label"] == f"GPU0 {BUS18}" and pair["b_label"] == f"GPU1 {BUS2A}"
    assert "GPU clocks against each other" in rep.markdown


# ---------------------------------------------------------------- a fake two-device host
SKEW_PPM = {0: -40.0, 1: 25.0}     # by CUDA ordinal: CUDA 1 (bus 18, NVML 0) runs +25 ppm
BUS_OF_ORDINAL = {0: "0000:2a:00.0", 1: "0000:18:00.0"}   # as cuDeviceGetPCIBusId spells it


class SyntheticGpuClock:
    """Stands in for capture/clocks/gpuclock.GpuClock where there is no GPU: a %globaltimer per
    CUDA ordinal (its own skew) read between two MONOTONIC reads, so every sandwich is a
    true t0 <= host(remote) <= t1."""

    opened = []
    bases = {}

    @staticmethod
    def remote_at(ordinal, h):
        """The timer of CUDA device ``ordinal`` at host MONOTONIC ``h`` (ns, int64 array)."""
        h = np.asarray(h, dtype=np.int64)
        base = SyntheticGpuClock.bases[ordinal]
        return 1_795_942_000_000_000_000 + h + np.rint(
            (h - base) * SKEW_PPM[ordinal] * 1e-6).astype(np.int64)

    def __init__(self, ordinal, number=None, **kw):
        self.ordinal, self.number = ordinal, ordinal if number is None else number
        self.domain = f"GPU{self.number}"
        self.info = {"domain": self.domain, "ordinal": ordinal}
        self.tick_ns, self.last_note, self.last_start_wait_ns = 32, None, 0

    def open(self):
        self.info["pci_bus_id"] = BUS_OF_ORDINAL[self.ordinal]
        self.info["tick_ns"] = 32
        self.base = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        SyntheticGpuClock.bases[self.ordinal] = self.base
        SyntheticGpuClock.opened.append((self.ordinal, self.number))
        return self

    def pingpong(self, n):
        get, mono = time.clock_gettime_ns, time.CLOCK_MONOTONIC
        out = np.zeros((3, n), dtype=np.int64)
        for k in range(n):
            t0 = get(mono)
            h = get(mono)
            t1 = get(mono)
            r = int(self.remote_at(self.ordinal, h))
            out[:, k] = t0, r // 32 * 32, t1
        return out[0], out[1], out[2]

    def close(self):
        pass


def _shifted(records, d_real, d_mono, gpu):
    """The capture's raw records moved to now and given to NVML device ``gpu``."""
    out = []
    for rec in copy.deepcopy(records):
        rec["gpu"] = gpu
        rec["t0"] += d_real
        rec["t1"] += d_real
        rec["recv"] += d_mono
        for v in rec.get("values", ()):
            v[2] = v[2] + d_real // 1000 if v[2] else 0
        for s in rec.get("samples", ()):
            s[0] += d_real // 1000
        if "last_seen" in rec:
            rec["last_seen"] += d_real // 1000
        out.append(rec)
    return out


def _xid(t_ns, dev, code, pid=4242):
    e = np.zeros(1, dtype=EVENT_DTYPE)
    e["ts"], e["pid"], e["tid"], e["kind"], e["ret"] = t_ns, pid, pid, Kind.XID, code
    raw = dev.encode().ljust(16, b"\0") + b"fake Xid for the test".ljust(40, b"\0")
    e["data"] = np.frombuffer(raw, dtype="V56")
    return e


@pytest.fixture(scope="module")
def two_gpu_run(tmp_path_factory):
    """A run file made by the recorder's own pieces on a fake two-device host."""
    if not (NVML / "burst_idle.json").is_file():
        pytest.skip("tests/data/nvml/burst_idle.json is not committed")
    devices, notes = device_table(_two_device_inventory(), cu=FakeDriver())
    assert notes == []
    path = tmp_path_factory.mktemp("fake2") / "two-gpu.ca"
    records = json.loads((NVML / "burst_idle.json").read_text())["records"]
    mp = pytest.MonkeyPatch()
    mp.setattr(clockprobe, "GpuClock", SyntheticGpuClock)
    mp.setattr(clockprobe, "_available", lambda gpus: (True, "synthetic"))
    SyntheticGpuClock.opened = []
    meta = {"gpus": _two_device_inventory(), "devices": [d.row() for d in devices]}
    try:
        with RunWriter(path, meta) as w:
            probe = clockprobe.ClockProbeThread(w, gpus=devices, cpu_period_s=0.02,
                                                gpu_period_s=0.05, pings=16)
            probe.start()
            now_real = time.clock_gettime_ns(time.CLOCK_REALTIME)
            now_mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            d_real, d_mono = now_real - records[0]["t0"], now_mono - records[0]["recv"]
            # NVML 0 gets every record, NVML 1 only the field reads: the counts tell them apart
            both = _shifted(records, d_real, d_mono, 0) + _shifted(
                [r for r in records if r["op"] == "fields"], d_real, d_mono, 1)
            span = max(r["recv"] for r in both) - now_mono
            rows = RowBuffer()
            NvmlDecoder().decode(both, rows)
            w.write_columns(Chunk.COUNTERS, rows.take())
            t_mid = now_mono + span // 2
            w.write_records(Chunk.EVENTS, _xid(t_mid, "0000:18:00.0", 31))   # NVML 0's bus
            w.write_rows(Chunk.GPU_EVENTS, [event_row(1, 0x8, 79, t_mid + 1000, now_real, 10**8)])
            time.sleep(max(2.0, span / 1e9 + 0.2))
            probe.stop()
    finally:
        mp.undo()
    return path, probe.stats()


def test_clock_probe_opens_each_devices_cuda_ordinal(two_gpu_run):
    path, stats = two_gpu_run
    assert sorted(SyntheticGpuClock.opened) == [(0, 1), (1, 0)]   # (CUDA ordinal, GPU<n>)
    assert stats["bursts"]["GPU0"] > 10 and stats["bursts"]["GPU1"] > 10
    r = RunReader(path)
    info = {x["domain"]: x for x in r.rows(Chunk.CLOCK_INFO) if x["domain"].startswith("GPU")}
    assert info["GPU0"]["ordinal"] == 1 and info["GPU0"]["bus_id"] == BUS18
    assert info["GPU1"]["ordinal"] == 0 and info["GPU1"]["bus_id"] == BUS2A


def test_one_name_per_device_end_to_end(two_gpu_run, tmp_path, capsys):
    path, _ = two_gpu_run
    r = RunReader(path)
    cnt = r.columns(Chunk.COUNTERS)
    n_cnt = collections.Counter(cnt["gpu"].tolist())
    assert n_cnt[0] > n_cnt[1] > 0
    # dump: the tracepoint's Xid names its device
    code, out, _ = _run(["dump", str(path)], capsys)
    (xid,) = [json.loads(x) for x in out.splitlines() if '"xid"' in x]
    assert code == 0 and (xid["gpu"], xid["bus_id"]) == ("GPU0", BUS18)
    # align: GPU0 is the device at bus 18 (CUDA 1, the +25 ppm timer)
    code, out, _ = _run(["align", "--json", str(path)], capsys)
    fits = json.loads(out)
    assert code == 0
    for name, ordinal, bus in (("GPU0", 1, BUS18), ("GPU1", 0, BUS2A)):
        assert fits[name]["device"]["bus_id"] == bus
        assert fits[name]["device"]["cuda_ordinal"] == ordinal
        assert abs(fits[name]["skew_ppm"] - SKEW_PPM[ordinal]) < 5
    # timeline and report: counters and faults of a device under its name
    tl = Timeline.open(path)
    faults = {f.gpu: f for f in tl.faults() if f.kind == "xid"}
    assert faults[0].code == 31 and faults[1].code == 79
    rep = build_report(tl, tmp_path / "report")
    assert f"GPU0 {BUS18}" in rep.text and f"GPU1 {BUS2A}" in rep.text
    lines = [ln for ln in rep.text.splitlines() if "sm_clock" in ln and "GPU" in ln]
    assert any(ln.lstrip().startswith(f"GPU0 {BUS18}") for ln in lines)
    # Perfetto: each GPU track holds its own counters, clock band and faults
    pf = tmp_path / "two.pftrace"
    export_run(tl, str(pf), "perfetto")
    declared, counters = {}, collections.Counter()
    for p in parse(pf).packet:
        if p.HasField("track_descriptor"):
            declared[p.track_descriptor.uuid] = p.track_descriptor
        elif p.HasField("track_event") and p.track_event.type == p.track_event.TYPE_COUNTER:
            counters[p.track_event.track_uuid] += 1
    gpu_tracks = {d.name: u for u, d in declared.items() if d.name.startswith("GPU")
                  and not d.parent_uuid}
    assert set(gpu_tracks) == {f"GPU0 {BUS18}", f"GPU1 {BUS2A}"}
    for g, label in ((0, f"GPU0 {BUS18}"), (1, f"GPU1 {BUS2A}")):
        kids = [u for u, d in declared.items() if d.parent_uuid == gpu_tracks[label]]
        names = {declared[u].name for u in kids}
        assert f"GPU{g} clock ± (ns)" in names and "faults" in names
        n_points = sum(counters[u] for u in kids if not declared[u].name.startswith("GPU"))
        assert n_points == n_cnt[g]


def _results_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "multi_results", Path(__file__).resolve().parents[2] / "scripts" / "gpu" /
        "multi_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_results_script_places_all_reduces_on_both_gpus(two_gpu_run, tmp_path):
    """scripts/gpu/multi_results.py: stamps taken at known host instants on each GPU's own
    timer (GPU1 5 us after GPU0) come back 5 us apart within the stated uncertainty,
    although the two timers drift 65 ppm apart; a rank finds its GPU by bus id."""
    path, _ = two_gpu_run
    mod = _results_script()
    tl = Timeline.open(path)
    g = tl.reader.columns(Chunk.GPU_CLOCK)
    h = np.sort(g["t0"])[100:-100:50]          # host instants inside both probed spans
    ranks = []
    for rank, (ordinal, bus, lag) in enumerate(((1, "0000:18:00.0", 0), (0, "0000:2A:00.0", 5000))):
        st = np.stack([SyntheticGpuClock.remote_at(ordinal, h + lag),
                       SyntheticGpuClock.remote_at(ordinal, h + lag + 30_000)], 1).ravel()
        ranks.append({"rank": rank, "device": {"bus_id": bus}, "gpu_stamps": st.tolist()})
    p = mod.allreduce_pairs(tl, ranks)
    assert (p["a"].name, p["b"].name) == ("GPU0", "GPU1") and p["outside"] == 0
    assert np.all(np.abs(p["start_a"] - h) <= p["unc_a"])
    assert np.all(np.abs(p["start_b"] - p["start_a"] - 5000) <= p["unc_a"] + p["unc_b"])
    naive = (ranks[1]["gpu_stamps"][-2] - ranks[0]["gpu_stamps"][-2]) - 5000
    assert abs(naive) > 10 * int((p["unc_a"] + p["unc_b"]).max())   # the timers do differ
    assert f"{len(h)} all-reduces (0 outside" in mod.allreduce_md(tl, ranks)


def test_results_script_pairs_nccl_kernels_of_two_gpus():
    """The CUPTI section: the i-th AllReduce kernel of one GPU beside the i-th of the other,
    other kernels left out, each start with its own uncertainty."""
    from clockalign.store.schema import GPU_NAME_KERNEL, GpuKind
    from clockalign.timeline.gpu_activity import ACTIVITY_DTYPE, GpuActivity
    mod = _results_script()
    rows = np.zeros(7, dtype=ACTIVITY_DTYPE)
    rows["kind"] = GpuKind.KERNEL
    #            GPU0 AR, GPU1 AR, GPU0 gemm, GPU0 AR, GPU1 AR, GPU1 gemm, GPU1 AR (no pair)
    rows["gpu"] = [0, 1, 0, 0, 1, 1, 1]
    rows["pid"] = [10, 11, 10, 10, 11, 11, 11]
    rows["name"] = [1, 1, 2, 1, 1, 2, 1]
    rows["t_ns"] = [1000, 1700, 5000, 9000, 9400, 9500, 20000]
    rows["end_ns"] = rows["t_ns"] + 3000
    rows["unc_ns"] = [300, 400, 300, 310, 410, 400, 420]
    names = {(p, GPU_NAME_KERNEL, 1): "ncclDevKernel_AllReduce_Sum_f32_RING_LL" for p in (10, 11)}
    names.update({(p, GPU_NAME_KERNEL, 2): "gemm" for p in (10, 11)})
    acts = GpuActivity(rows, names, {}, [], {})

    class TL:
        devices = Devices.from_meta({"devices": [
            {"name": "GPU0", "number": 0, "bus_id": BUS18},
            {"name": "GPU1", "number": 1, "bus_id": BUS2A}]})

        def gpu_activity(self):
            return acts
    md = mod.nccl_kernels_md(TL())
    assert f"2 NCCL AllReduce kernels on GPU0 {BUS18}, 3 on GPU1 {BUS2A}" in md
    assert "| 0 | 0.000 | 300 | 3.0 | 0.001 | 400 | 3.0 | 700 | 700 |" in md
    assert "| 1 | 0.008 | 310 | 3.0 | 0.008 | 410 | 3.0 | 400 | 720 |" in md
    assert "| 2 |" not in md
