"""The packets the CUPTI injection library writes to its FIFO, parsed a packet at a time.

Layout: native/ca_gpu_wire.h (a test compiles it and checks these offsets).  Each packet
is one write(2) of at most PIPE_BUF bytes, so packets of several target processes never
interleave; a packet of records is one ``np.frombuffer`` (no per-record Python work).

    p = WireParser()
    recs, names = p.feed(os.read(fd, 1 << 20))   # GPU_REC_DTYPE array, [(pid, space, id, name)]
    p.bad_bytes                                  # bytes skipped looking for a packet mark
"""
import struct

import numpy as np

from ...store.schema import GPU_REC_DTYPE

MAGIC = 0x31474143          # "CAG1"
PKT = struct.Struct("<IHHII")
NAME_HDR = struct.Struct("<IIII")
PKT_MAX = 4096
T_RECORDS, T_NAME = 1, 2
MAGIC_BYTES = struct.pack("<I", MAGIC)
RECS_PER_PKT = (PKT_MAX - PKT.size) // GPU_REC_DTYPE.itemsize
assert PKT.size == 16 and NAME_HDR.size == 16


class WireParser:
    """Bytes in, (records, completed names) out; a packet cut by a read waits for the rest."""

    def __init__(self):
        self._buf = bytearray()
        self._parts = {}          # (pid, space, id) -> (total, {offset: bytes})
        self.bad_bytes = 0
        self.packets = 0

    def feed(self, data: bytes):
        buf = self._buf
        buf += data
        recs, names = [], []
        pos = 0
        end = len(buf)
        mv = memoryview(buf)
        while end - pos >= PKT.size:
            magic, typ, n, pid, plen = PKT.unpack_from(buf, pos)
            if magic != MAGIC or plen > PKT_MAX - PKT.size or typ not in (T_RECORDS, T_NAME) \
                    or (typ == T_RECORDS and plen != n * GPU_REC_DTYPE.itemsize) \
                    or (typ == T_NAME and plen != NAME_HDR.size + n):
                nxt = buf.find(MAGIC_BYTES, pos + 1)
                nxt = max(pos + 1, end - 3) if nxt < 0 else nxt   # a mark may be cut
                self.bad_bytes += nxt - pos
                pos = nxt
                continue
            if end - pos < PKT.size + plen:
                break
            body = pos + PKT.size
            if typ == T_RECORDS:
                recs.append(np.frombuffer(mv[body:body + plen], dtype=GPU_REC_DTYPE).copy())
            else:
                nid, space, off, total = NAME_HDR.unpack_from(buf, body)
                text = bytes(mv[body + NAME_HDR.size: body + plen])
                done = self._name_part(pid, space, nid, off, total, text)
                if done is not None:
                    names.append(done)
            self.packets += 1
            pos += PKT.size + plen
        mv.release()
        del buf[:pos]
        out = np.concatenate(recs) if recs else np.zeros(0, dtype=GPU_REC_DTYPE)
        return out, names

    def _name_part(self, pid, space, nid, off, total, text):
        if off == 0 and len(text) == total:
            return (pid, space, nid, text.decode(errors="replace"))
        key = (pid, space, nid)
        tot, parts = self._parts.setdefault(key, (total, {}))
        parts[off] = text
        if sum(len(p) for p in parts.values()) < tot:
            return None
        del self._parts[key]
        whole = b"".join(parts[k] for k in sorted(parts))
        return (pid, space, nid, whole[:tot].decode(errors="replace"))

    @property
    def pending_names(self) -> int:
        """Names still missing parts (a target killed mid-name)."""
        return len(self._parts)

    @property
    def leftover(self) -> int:
        """Bytes of an incomplete packet kept for the next feed."""
        return len(self._buf)


def packet(typ: int, pid: int, payload: bytes, n: int) -> bytes:
    """One packet as the C library writes it (tests and the stand-in writer)."""
    return PKT.pack(MAGIC, typ, n, pid, len(payload)) + payload


def records_packets(recs: np.ndarray, pid: int) -> bytes:
    """GPU_REC_DTYPE rows as record packets of at most RECS_PER_PKT rows each."""
    out = []
    for a in range(0, len(recs), RECS_PER_PKT):
        part = np.ascontiguousarray(recs[a:a + RECS_PER_PKT], dtype=GPU_REC_DTYPE)
        out.append(packet(T_RECORDS, pid, part.tobytes(), len(part)))
    return b"".join(out)


def name_packets(pid: int, space: int, nid: int, name: str) -> bytes:
    """A name as the C library splits it: pieces of at most PKT_MAX - 32 bytes."""
    raw = name.encode()
    step = PKT_MAX - PKT.size - NAME_HDR.size
    out = []
    for off in range(0, max(len(raw), 1), step):
        piece = raw[off:off + step]
        out.append(packet(T_NAME, pid, NAME_HDR.pack(nid, space, off, len(raw)) + piece,
                          len(piece)))
    return b"".join(out)
