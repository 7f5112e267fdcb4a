"""bpf/clockalign.h against its Python and C mirrors: every offset, size and constant.

A small C program includes the header (compiled with gcc, u8..u64 typedef'd as BCC's
headers do) and prints offsetof/sizeof of struct ca_event, ca_ring_ctl, ca_call and
ca_slot and the value of every CA_KIND_*, CA_DROP_*, CA_TCP_* and the other constants;
each is compared with store/schema.py, capture/probes/maps.py, capture/transport/slotring.py
and the offsets native/reader.c hard-codes.  The kinds and drop indices are read from the header
by name, so a new one without its Python twin fails here.
"""
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from clockalign.capture.probes import maps
from clockalign.capture.transport import perfbuf, slotring
from clockalign.native import HERE as NATIVE
from clockalign.store import schema
from clockalign.store.schema import EVENT_DTYPE, Kind, TcpCode

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "bpf" / "clockalign.h"
READER_C = Path(NATIVE) / "reader.c"
STRUCTS = {
    "ca_event": ["ts", "dur", "pid", "tid", "kind", "code", "ret", "a", "data"],
    "ca_ring_ctl": ["head", "pad0", "tail", "pad1"],
    "ca_call": ["ts", "fn", "pad", "a"],
    "ca_slot": ["tid", "depth", "c"],
}
DIMS = [(7, 3, 2), (0x7FFFFFFF, 0xFFFF, 0xFFFF), (1, 0, 1)]


def _defines(prefix: str) -> list:
    """Names of the header's ``#define <prefix>...`` constants."""
    return re.findall(rf"^#define ({prefix}\w+)\s", HEADER.read_text(), re.M)


def _c_program() -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <stdint.h>",
             "typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32;",
             "typedef uint64_t u64; typedef int32_t s32;", '#include "clockalign.h"',
             "int main(void) {"]
    for s, fields in STRUCTS.items():
        lines.append(f'printf("sizeof.{s} %zu\\n", sizeof(struct {s}));')
        for f in fields:
            lines.append(f'printf("{s}.{f} %zu %zu\\n", offsetof(struct {s}, {f}), '
                         f'sizeof(((struct {s} *)0)->{f}));')
    names = (_defines("CA_KIND_") + _defines("CA_DROP_") + _defines("CA_TCP_")
             + ["CA_NKINDS", "CA_NEST", "CA_DATA_LEN", "CA_XID_PART_LEN"])
    lines += [f'printf("{n} %lld\\n", (long long){n});' for n in names]
    lines += [f'printf("dims.{i} %llu\\n", (unsigned long long)CA_DIMS({x}, {y}, {z}));'
              for i, (x, y, z) in enumerate(DIMS)]
    return "\n".join(lines + ["return 0; }", ""])


def _run_c(tmp_path, source: str, include: Path) -> dict:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (needed to compile the header)")
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text(source)
    subprocess.run(["gcc", "-Wall", "-Werror", f"-I{include}", str(src), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {k: v for k, v in (line.split(" ", 1) for line in out.splitlines())}


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    return _run_c(tmp_path_factory.mktemp("layout"), _c_program(), HEADER.parent)


def _field(c, struct, name):
    return tuple(map(int, c[f"{struct}.{name}"].split()))


def test_event_struct_is_event_dtype(c):
    assert int(c["sizeof.ca_event"]) == EVENT_DTYPE.itemsize == 128
    for name in STRUCTS["ca_event"]:
        off, size = _field(c, "ca_event", name)
        if name == "a":
            assert size == 5 * 8
            for j in range(5):
                assert EVENT_DTYPE.fields[f"a{j}"][1] == off + 8 * j
                assert EVENT_DTYPE[f"a{j}"].itemsize == 8
        else:
            assert (EVENT_DTYPE.fields[name][1], EVENT_DTYPE[name].itemsize) == (off, size), name
    assert EVENT_DTYPE["data"].itemsize == int(c["CA_DATA_LEN"])
    # the signedness the header declares (ret is s32, the rest unsigned)
    assert EVENT_DTYPE["ret"].kind == "i"
    assert all(EVENT_DTYPE[n].kind == "u" for n in EVENT_DTYPE.names if n not in ("ret", "data"))


def test_kinds_are_the_headers(c):
    header = {n[len("CA_KIND_"):]: int(c[n]) for n in _defines("CA_KIND_")}
    assert header == {k.name: int(k) for k in Kind}
    assert int(c["CA_NKINDS"]) == maps.CA_NKINDS
    assert max(Kind) < maps.CA_NKINDS and maps.CA_NKINDS & (maps.CA_NKINDS - 1) == 0


def test_drop_indices_are_the_headers(c):
    """Every CA_DROP_* has a name in maps.DROP_NAMES and none is a record kind (drops[]
    counts both by index)."""
    drops = {n: int(c[n]) for n in _defines("CA_DROP_")}
    assert set(drops.values()) == set(maps.DROP_NAMES)
    assert len(set(drops.values())) == len(drops)
    assert not set(drops.values()) & {int(k) for k in Kind}
    assert all(0 <= v < maps.CA_NKINDS for v in drops.values())
    names = set(maps.DROP_NAMES.values()) | {k.name.lower() for k in Kind}
    assert len(names) == len(maps.DROP_NAMES) + len(Kind)


def test_constants(c):
    assert int(c["CA_NEST"]) == maps.CA_NEST
    assert {n[len("CA_TCP_"):]: int(c[n]) for n in _defines("CA_TCP_")} == \
        {k.name: int(k) for k in TcpCode}
    xid = int(c["CA_XID_PART_LEN"])
    assert xid == schema.XID_PART_LEN
    assert xid == int(c["sizeof.ca_event"]) - _field(c, "ca_event", "a")[0]   # a0.. to the end
    for i, (x, y, z) in enumerate(DIMS):
        got = schema.unpack_dims(np.array([int(c[f"dims.{i}"])], np.uint64))
        assert [int(v[0]) for v in got] == [x, y, z]


def test_call_slots_are_slot_dtype(c):
    for struct, dt in (("ca_call", maps.CALL_DTYPE), ("ca_slot", maps.SLOT_DTYPE)):
        assert int(c[f"sizeof.{struct}"]) == dt.itemsize, struct
        for name in STRUCTS[struct]:
            assert _field(c, struct, name) == (dt.fields[name][1], dt[name].itemsize), name


def _reader_c() -> dict:
    text = READER_C.read_text()
    head = re.search(r"HEAD_OFF\[2\] = \{(\d+), (\d+)\}", text)
    tail = re.search(r"TAIL_OFF\[2\] = \{(\d+), (\d+)\}", text)
    kind = re.search(r"#define SLOT_KIND_OFF (\d+)", text)
    mode = re.search(r"MODE_PERF = (\d+), MODE_SLOTS = (\d+)", text)
    assert head and tail and kind and mode, "native/reader.c's offsets moved; update this test"
    return {"head": tuple(map(int, head.groups())), "tail": tuple(map(int, tail.groups())),
            "kind": int(kind.group(1)), "modes": tuple(map(int, mode.groups()))}


def test_slot_ring_offsets(c):
    """capture/transport/slotring.py and native/reader.c read head, tail and a slot's kind where the
    header puts them."""
    head, tail = _field(c, "ca_ring_ctl", "head")[0], _field(c, "ca_ring_ctl", "tail")[0]
    assert int(c["sizeof.ca_ring_ctl"]) == slotring.CTL_BYTES
    assert (slotring.HEAD_WORD * 8, slotring.TAIL_WORD * 8) == (head, tail)
    assert slotring.KIND_OFF == _field(c, "ca_event", "kind")[0]
    r = _reader_c()
    assert r["modes"][1] == slotring.SlotRings.READER_MODE
    assert r["modes"][0] == perfbuf.PerfBuffers.READER_MODE
    slots = r["modes"][1]
    assert (r["head"][slots], r["tail"][slots]) == (head, tail)
    assert r["kind"] == slotring.KIND_OFF


def test_perf_page_offsets(tmp_path):
    """The perf mode's head/tail (reader.c, perfbuf.py) are perf_event_mmap_page's."""
    if not Path("/usr/include/linux/perf_event.h").exists():
        pytest.skip("no /usr/include/linux/perf_event.h (linux-libc-dev) to check against")
    c = _run_c(tmp_path, "#include <stdio.h>\n#include <stddef.h>\n#include <linux/perf_event.h>\n"
               "int main(void) { printf(\"head %zu\\ntail %zu\\n\", "
               "offsetof(struct perf_event_mmap_page, data_head), "
               "offsetof(struct perf_event_mmap_page, data_tail)); return 0; }\n", tmp_path)
    want = (int(c["head"]), int(c["tail"]))
    assert (perfbuf.HEAD_OFF, perfbuf.TAIL_OFF) == want
    r = _reader_c()
    perf = r["modes"][0]
    assert (r["head"][perf], r["tail"][perf]) == want
