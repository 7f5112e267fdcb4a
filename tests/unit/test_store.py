"""Run-file round trip, and the three distinct reader errors (foreign, version, truncated)."""
import json

import numpy as np
import pytest

from clockalign.cli.main import main
from clockalign.errors import NotARunFile, UnsupportedVersion
from clockalign.store.event_text import decode_sockaddr
from clockalign.store.kinds import event_dicts
from clockalign.store.reader import RunReader
from clockalign.store.schema import EVENT_DTYPE, FORMAT_VERSION, Chunk, Kind
from clockalign.store.writer import HEADER, HEADER_CRC, RunWriter


def make_events(n, kind=Kind.CUDA, t0=1_000_000):
    ev = np.zeros(n, dtype=EVENT_DTYPE)
    ev["ts"] = t0 + np.arange(n, dtype=np.uint64) * 1000
    ev["dur"] = 500
    ev["pid"] = 42
    ev["tid"] = 43
    ev["kind"] = kind
    ev["code"] = 1
    ev["ret"] = np.where(np.arange(n) % 7 == 0, 2, 0)
    return ev


def write_run(path, chunks=3, n=10, close=True):
    w = RunWriter(path, {"host": "h", "clocks": {"MONOTONIC": 1}})
    for c in range(chunks):
        ev = make_events(n, t0=1_000_000 + c * n * 1000)
        w.write_columns(Chunk.EVENTS, {k: ev[k] for k in EVENT_DTYPE.names})
    w.write_rows(Chunk.NOTICES, [{"t_ns": 5, "level": "info", "text": "hi"}])
    if close:
        w.close({"reason": "test", "counts": {"cuda": chunks * n}})
    else:
        w.flush()
    return w


def test_round_trip(tmp_path):
    p = tmp_path / "r.ca"
    write_run(p)
    r = RunReader(p)
    assert r.clean and r.truncated is None
    assert r.meta["host"] == "h"
    ev = r.events()
    assert len(ev) == 30 and ev.dtype == EVENT_DTYPE
    assert np.array_equal(ev["ts"], make_events(30)["ts"])
    assert r.trailer["reason"] == "test" and r.trailer["chunks"] == 4
    assert r.rows(Chunk.NOTICES)[0]["text"] == "hi"
    assert sum(len(b) for b in r.iter_events()) == 30


def test_foreign_file(tmp_path):
    p = tmp_path / "f.ca"
    p.write_bytes(b"PK\x03\x04 definitely a zip file")
    with pytest.raises(NotARunFile, match="is not a clockalign run"):
        RunReader(p)


def test_flip_magic_version_and_chunk(tmp_path):
    p = tmp_path / "r.ca"
    write_run(p)
    good = p.read_bytes()
    bad = bytearray(good)
    bad[0] ^= 0xFF
    p.write_bytes(bytes(bad))
    with pytest.raises(NotARunFile):
        RunReader(p)
    bad = bytearray(good)
    bad[8] ^= 0x07          # format version u16 after the magic
    p.write_bytes(bytes(bad))
    with pytest.raises(UnsupportedVersion, match=f"version {FORMAT_VERSION ^ 7}"):
        RunReader(p)
    # a byte flipped inside the second chunk's payload: that chunk alone is lost
    meta_len = int.from_bytes(good[12:16], "little")
    first = HEADER.size + meta_len + HEADER_CRC.size
    first_len = int.from_bytes(good[first + 4:first + 8], "little")
    second = first + 12 + first_len
    second_len = int.from_bytes(good[second + 4:second + 8], "little")
    third = second + 12 + second_len
    bad = bytearray(good)
    bad[second + 12 + 20] ^= 0x55
    p.write_bytes(bytes(bad))
    r = RunReader(p)
    assert r.truncated == f"damaged: 1 chunk skipped at byte {second} (to {third}) (4 chunks kept)"
    assert len(r.events()) == 20


@pytest.mark.parametrize("cut", [1, 7, 100, 300])
def test_truncation_keeps_whole_chunks(tmp_path, cut):
    p = tmp_path / "r.ca"
    write_run(p)
    data = p.read_bytes()
    p.write_bytes(data[:-cut])
    r = RunReader(p)
    assert not r.clean
    assert r.truncated.startswith("truncated at byte ")
    assert len(r.events()) in (10, 20, 30)


def test_unclosed_file_is_truncated_but_readable(tmp_path):
    p = tmp_path / "r.ca"
    w = write_run(p, close=False)
    r = RunReader(p)
    assert r.truncated == f"truncated at byte {p.stat().st_size} (4 chunks kept)"
    assert len(r.events()) == 30
    w.close()


def test_cli_errors_are_one_sentence(tmp_path, capsys):
    foreign = tmp_path / "foreign.bin"
    foreign.write_bytes(b"\x00" * 64)
    for args, code, text in [
        (["info", str(foreign)], 2, "is not a clockalign run"),
        (["info", str(tmp_path / "missing.ca")], 2, "does not exist"),
        (["dump", str(foreign)], 2, "is not a clockalign run"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code == code
        err = capsys.readouterr().err
        assert text in err and len(err.strip().splitlines()) == 1

    p = tmp_path / "t.ca"
    write_run(p)
    p.write_bytes(p.read_bytes()[:-40])
    with pytest.raises(SystemExit) as e:
        main(["info", str(p)])
    assert e.value.code == 3
    captured = capsys.readouterr()
    assert "truncated at byte" in captured.err and "events    cuda 30" in captured.out


def test_dump_schema(tmp_path, capsys):
    p = tmp_path / "r.ca"
    write_run(p, chunks=1, n=3)
    with pytest.raises(SystemExit) as e:
        main(["dump", str(p)])
    assert e.value.code == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(lines) == 3
    for d in lines:
        assert {"kind", "t_ns", "pid", "tid", "fn", "ret", "dur_ns"} <= set(d)
        assert d["kind"] == "cuda" and d["fn"] == "cuLaunchKernel"
        assert isinstance(d["t_ns"], int)
    assert [d["ret"] for d in lines] == [2, 0, 0]


def test_peer_decoding():
    v4 = bytes([2, 0, 0x1F, 0x90, 127, 0, 0, 1]) + bytes(8)
    assert decode_sockaddr(v4) == "127.0.0.1:8080"
    v6 = bytes([10, 0, 0x01, 0xBB]) + bytes(4) + bytes(15) + b"\x01" + bytes(4)
    assert decode_sockaddr(v6) == "[::1]:443"
    assert decode_sockaddr(b"\x01\x00/run/x.sock\x00") == "unix:/run/x.sock"
    assert decode_sockaddr(b"\x01\x00\x00abstract\x00") == "unix:@abstract"


def test_sched_and_connect_dicts():
    ev = np.zeros(2, dtype=EVENT_DTYPE)
    ev[0]["kind"] = Kind.SCHED
    ev[0]["dur"] = 5000
    ev[0]["ret"] = 0x100
    ev[0]["code"] = 1
    ev[1]["kind"] = Kind.CONNECT
    ev[1]["ret"] = -111
    ev[1]["a1"] = 16
    d0, d1 = list(event_dicts(ev))
    assert d0["off_cpu_ns"] == 5000 and d0["preempted"] and d0["prev_state"] == "R+"
    assert d1["errno"] == "ECONNREFUSED"


def _rss_file_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    return 0


def test_streaming_reader_does_not_keep_the_file_resident(tmp_path):
    """Decoded chunks' pages are given back, so reading a long run keeps RSS flat."""
    p = tmp_path / "big.ca"
    w = RunWriter(p, {"host": "h"})
    ev = make_events(100_000)
    cols = {k: ev[k] for k in EVENT_DTYPE.names}
    for _ in range(4):                      # 4 x 12.8 MB of events
        w.write_columns(Chunk.EVENTS, cols)
    w.close()
    before = _rss_file_kb()
    r = RunReader(p)
    assert sum(len(b) for b in r.iter_events()) == 400_000
    grown_mb = (_rss_file_kb() - before) / 1024
    assert grown_mb < 8, f"file-backed RSS grew {grown_mb:.1f} MB reading a 51 MB run"
