"""The device table on a real host: NVML and CUDA agree on every GPU's bus id, and the clock
probe opens the device the table names (on one GPU or several)."""
import time

import pytest

from clockalign.capture.clocks.clockprobe import ClockProbeThread
from clockalign.capture.gpu.counters import gpu_inventory
from clockalign.capture.clocks.devices import cuda_bus_ids, device_table
from clockalign.store.devices import Devices, bus_id
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk
from clockalign.store.writer import RunWriter

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def devices():
    gpus, why = gpu_inventory()
    if not gpus:
        pytest.skip(f"NVML lists no GPU ({why})")
    devs, notes = device_table(gpus)
    return gpus, devs, notes


def test_every_nvml_gpu_has_a_cuda_ordinal(devices):
    gpus, devs, notes = devices
    visible = len(cuda_bus_ids())
    if visible < len(gpus):
        pytest.skip(f"CUDA sees {visible} of NVML's {len(gpus)} GPUs (CUDA_VISIBLE_DEVICES)")
    assert notes == []
    assert [d.bus_id for d in devs] == [bus_id(g["pci_bus_id"]) for g in gpus]
    assert sorted(d.cuda_ordinal for d in devs) == list(range(len(gpus)))


def test_clock_domains_carry_the_nvml_name_and_bus_id(devices, tmp_path):
    _, devs, _ = devices
    devs = [d for d in devs if d.cuda_ordinal is not None]
    path = tmp_path / "devs.ca"
    with RunWriter(path, {"devices": [d.row() for d in devs]}) as w:
        probe = ClockProbeThread(w, gpus=devs, cpu_period_s=0.1, gpu_period_s=0.1, pings=8)
        probe.start()
        time.sleep(1.0)
        probe.stop()
    r = RunReader(path)
    info = {x["domain"]: x for x in r.rows(Chunk.CLOCK_INFO) if x["domain"].startswith("GPU")}
    table = Devices.from_meta(r.meta)
    for d in devs:
        assert info[d.name]["ordinal"] == d.cuda_ordinal
        assert info[d.name]["bus_id"] == d.bus_id == table.by_name(d.name).bus_id
    gpu = r.columns(Chunk.GPU_CLOCK)
    assert set(gpu["gpu"].tolist()) == {d.number for d in devs}
