"""Which GPU is which: one name per device, keyed by its PCI bus id.

NVML and DCGM number GPUs in their own order; CUDA numbers them fastest first unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and ``CUDA_VISIBLE_DEVICES`` renumbers them in each
process.  So neither number names a device across tools; the PCI bus id does, and every
source gives it in its own spelling: the Xid tracepoint ``0000:18:00.0``, the kernel log
``0000:18:00``, NVML ``00000000:18:00.0``, CUDA ``0000:18:00.0``.  ``bus_id`` turns each
into NVML's form.  (An NVML Xid event names its device by handle, which the event watcher
turns into the NVML index; DCGM's GPU ids are matched to NVML indices by uuid.)  A device is named ``GPU<n>`` with n its NVML index (what nvidia-smi
shows, and the counters' gpu column); where NVML is missing, n is the device's place in
bus-id order, which is NVML's own order on the hosts seen.  The run file's header keeps
the table (capture/clocks/devices.py builds it):

    "devices": [{"name": "GPU0", "number": 0, "bus_id": "00000000:18:00.0",
                 "nvml_index": 0, "cuda_ordinal": 1, "uuid": "GPU-...", "model": "NVIDIA H200"}]

    devs = Devices.from_meta(reader.meta, reader.rows(Chunk.CLOCK_INFO))
    devs.by_bus("0000:18:00").name        # "GPU0"
    devs.label("GPU0")                    # "GPU0 00000000:18:00.0"
"""
import dataclasses
import re

_PCI = re.compile(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?$")


def bus_key(text):
    """(domain, bus, device, function) of a PCI address in any of the spellings above;
    None if ``text`` is not one."""
    m = _PCI.search(str(text).strip()) if text else None
    if not m:
        return None
    dom = int(m.group(1), 16) if m.group(1) else 0
    return dom, int(m.group(2), 16), int(m.group(3), 16), int(m.group(4) or 0)


def bus_id(text):
    """A PCI address in NVML's form, ``00000000:18:00.0`` (None if not an address)."""
    k = bus_key(text)
    return None if k is None else "%08X:%02X:%02X.%X" % k


@dataclasses.dataclass
class Device:
    name: str                       # "GPU0": the clock domain, counter and fault name
    number: int                     # n of GPU<n>; the gpu column of COUNTERS and GPU_CLOCK
    bus_id: str = None              # "00000000:18:00.0"
    nvml_index: int = None
    cuda_ordinal: int = None        # in the recorder's process (its CUDA_VISIBLE_DEVICES)
    uuid: str = None
    model: str = None

    def row(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def join(nvml_gpus, cuda_bus_ids) -> tuple:
    """(devices, notes): NVML's inventory (``[{"index", "pci_bus_id", ...}]``) joined with
    CUDA's ``{ordinal: bus id}`` on the bus id.  ``cuda_bus_ids`` None: CUDA was not asked."""
    devices, notes = [], []
    cuda = {bus_id(b): int(o) for o, b in (cuda_bus_ids or {}).items() if bus_id(b)}
    for i, g in enumerate(nvml_gpus or []):
        n = int(g.get("index", i))
        b = bus_id(g.get("pci_bus_id"))
        devices.append(Device(f"GPU{n}", n, b, n, cuda.pop(b, None) if b else None,
                              g.get("uuid"), g.get("name")))
        if cuda_bus_ids is not None and devices[-1].cuda_ordinal is None:
            notes.append(f"GPU{n} ({b or 'no bus id'}) is not visible to CUDA in the recorder "
                         "(CUDA_VISIBLE_DEVICES?): its clock is not probed")
    first = max((d.number for d in devices), default=-1) + 1
    for k, (b, o) in enumerate(sorted(cuda.items())):
        # CUDA sees a device NVML did not list (no NVML): numbered in bus-id order
        n = first + k
        devices.append(Device(f"GPU{n}", n, b, None, o))
        if nvml_gpus:
            notes.append(f"CUDA device {o} ({b}) is not in NVML's list: named GPU{n}")
    return devices, notes


class Devices:
    """The run's device table: look a device up by name, number or any bus-id spelling."""

    def __init__(self, devices):
        self.all = sorted(devices, key=lambda d: d.number)
        self._by_bus = {bus_key(d.bus_id): d for d in self.all if d.bus_id}
        self._by_number = {d.number: d for d in self.all}

    @classmethod
    def from_meta(cls, meta, clock_info=()) -> "Devices":
        """From the header's ``devices`` table; for a run from before it, from NVML's ``gpus``
        list and the GPU CLOCK_INFO rows (whose GPU<n> then was the CUDA ordinal)."""
        meta = meta or {}
        rows = [r for r in meta.get("devices") or [] if isinstance(r, dict) and "number" in r]
        if rows:
            fields = {f.name for f in dataclasses.fields(Device)}
            return cls([Device(**{k: v for k, v in r.items() if k in fields}) for r in rows])
        devs = {}
        for i, g in enumerate(meta.get("gpus") or []):
            if isinstance(g, dict):
                n = int(g.get("index", i))
                devs[n] = Device(f"GPU{n}", n, bus_id(g.get("pci_bus_id")), n, None,
                                 g.get("uuid"), g.get("name"))
        for r in clock_info or ():
            name = r.get("domain") if isinstance(r, dict) else None
            if not (isinstance(name, str) and name.startswith("GPU") and name[3:].isdigit()):
                continue
            n = int(name[3:])
            d = devs.setdefault(n, Device(name, n))
            d.bus_id = d.bus_id or bus_id(r.get("pci_bus_id"))
            d.cuda_ordinal = r.get("ordinal", d.cuda_ordinal)
            d.uuid, d.model = d.uuid or r.get("uuid"), d.model or r.get("device")
        return cls(devs.values())

    def __iter__(self):
        return iter(self.all)

    def __len__(self):
        return len(self.all)

    def by_bus(self, text):
        """The device at a PCI address in any spelling; the only one where the run has one
        device and ``text`` names none; else None."""
        k = bus_key(text)
        if k is not None:
            return self._by_bus.get(k)
        return self.all[0] if len(self.all) == 1 else None

    def by_number(self, n):
        return self._by_number.get(int(n)) if n is not None else None

    def by_name(self, name):
        if isinstance(name, str) and name.startswith("GPU") and name[3:].isdigit():
            return self.by_number(int(name[3:]))
        return None

    def label(self, name_or_number) -> str:
        """``GPU0 00000000:18:00.0``; the bare name where the bus id is unknown; a
        non-GPU domain (REALTIME) as it is."""
        if isinstance(name_or_number, str):
            d = self.by_name(name_or_number)
            name = name_or_number
        else:
            d = self.by_number(name_or_number)
            name = f"GPU{int(name_or_number)}"
        return f"{name} {d.bus_id}" if d is not None and d.bus_id else name

    def describe(self, name) -> str:
        """``00000000:18:00.0, NVML 0, CUDA 1, NVIDIA H200``: how the device is known."""
        d = self.by_name(name)
        if d is None:
            return ""
        parts = [d.bus_id or "bus id unknown",
                 f"NVML {d.nvml_index}" if d.nvml_index is not None else "not in NVML",
                 f"CUDA {d.cuda_ordinal}" if d.cuda_ordinal is not None else "CUDA ordinal unknown"]
        return ", ".join(parts + ([d.model] if d.model else []))
