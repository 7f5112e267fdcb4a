"""The recorder's device table: NVML index -> PCI bus id -> CUDA ordinal (store/devices.py).

CUDA's side is asked through the same libcuda the clock probe uses (cuda-bindings,
capture/clocks/gpuclock.py): each ordinal's PCI domain, bus and device attributes.  NVML lists
devices by index with their bus id; the two are joined on the bus id, so the clock probe
opens the right device and its domain carries the NVML-index name the counters use.

    devices, notes = device_table(nvml_gpus)        # [Device(name="GPU0", cuda_ordinal=1)]
    meta["devices"] = [d.row() for d in devices]
"""
from ...store.devices import join
from .cudadriver import GpuClockError, check, driver, init_driver


def cuda_bus_ids(cu=None) -> dict:
    """{CUDA ordinal: "DDDDDDDD:BB:DD.0"} of every device CUDA sees.  GpuClockError."""
    count = init_driver() if cu is None else int(check(cu.cuDeviceGetCount(),
                                                         "cuDeviceGetCount"))
    cu = cu or driver()
    attr = cu.CUdevice_attribute
    out = {}
    for o in range(count):
        dev = check(cu.cuDeviceGet(o), "cuDeviceGet")
        dom, bus, slot = (int(check(cu.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute "
                                     f"on CUDA device {o}"))
                          for a in (attr.CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
                                    attr.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
                                    attr.CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID))
        out[o] = "%08X:%02X:%02X.0" % (dom, bus, slot)
    return out


def device_table(nvml_gpus, use_cuda=True, cu=None) -> tuple:
    """(devices, notes) for the run header; CUDA is not touched where ``use_cuda`` is off
    (no GPU clock probing), and a CUDA failure becomes a note (where NVML lists GPUs), not
    an error."""
    cuda, why = None, None
    if use_cuda:
        try:
            cuda = cuda_bus_ids(cu)
        except GpuClockError as e:
            why = str(e)
        except Exception as e:      # a broken cuda-bindings install must not stop a recording
            why = f"unexpected {type(e).__name__}: {e}"
    devices, notes = join(nvml_gpus, cuda)
    if why and nvml_gpus:           # no GPU at all is not news; GPUs CUDA cannot name are
        notes.insert(0, f"CUDA device ordinals unknown ({why}): GPU clocks are not probed")
    return devices, notes
