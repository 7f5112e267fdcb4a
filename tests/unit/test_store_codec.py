"""Format 2's compact columns: lossless on any values, same dump as format 1, small on launches."""
import glob
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from clockalign.cli.main import main
from clockalign.store import codec
from clockalign.store.reader import RunReader
from clockalign.store.schema import EVENT_DTYPE, Chunk, Kind
from clockalign.store.writer import HEADER, RunWriter

from .runfiles import copy_run

AGENT = pathlib.Path(__file__).resolve().parents[2] / "agent"

DATA = os.path.join(os.path.dirname(__file__), "..", "data")


def random_events(n, seed):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, n * EVENT_DTYPE.itemsize, dtype=np.uint8)
    ev = raw.view(EVENT_DTYPE).copy()
    ev["data"][rng.random(n) < 0.7] = np.zeros((), "V56")   # mostly empty, like real runs
    return ev


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 1000, 8192])
def test_events_round_trip_exactly_whatever_the_values(n):
    ev = random_events(n, n)
    payload = codec.encode_columns({k: ev[k] for k in EVENT_DTYPE.names})
    assert payload["layout"] == 1 and "cols" not in payload
    cols = codec.decode_columns(payload)
    for k in EVENT_DTYPE.names:
        assert cols[k].tobytes() == ev[k].tobytes(), k
    out = np.zeros(n, EVENT_DTYPE)
    codec.decode_columns(payload, into=out)
    assert out.tobytes() == ev.tobytes()


def test_other_columns_round_trip_with_a_spelled_out_layout():
    cols = {"domain": np.array([1, 2, 3], np.uint8),
            "t0": np.array([5, 3, 2**63 + 9], "<u8").view("<i8"),
            "value": np.array([1.5, -2.0, np.nan]), "big": np.array([1, 2, 3], ">u4")}
    payload = codec.encode_columns(cols)
    assert "cols" in payload
    back = codec.decode_columns(payload)
    assert back["t0"].tobytes() == cols["t0"].tobytes()
    assert np.array_equal(back["value"], cols["value"], equal_nan=True)
    assert back["big"].tolist() == [1, 2, 3] and back["domain"].tolist() == [1, 2, 3]


def test_damaged_payloads_raise_codec_error():
    ev = random_events(50, 1)
    good = codec.encode_columns({k: ev[k] for k in EVENT_DTYPE.names})
    for bad in [dict(good, n=51), dict(good, sizes=[]), dict(good, sizes=[1, 2]),
                dict(good, layout=99), dict(good, z=good["z"][:-5]), dict(good, codec=7),
                dict(good, z=b"not zstd"), dict(good, n=-1)]:
        with pytest.raises(codec.CodecError):
            codec.decode_columns(bad)


def frozen_events():
    """40 launch-like events with a reordered pair, a failing call and data in rows 0, 20, 39."""
    i = np.arange(40, dtype=np.uint64)
    ev = np.zeros(40, EVENT_DTYPE)
    ev["ts"] = 5_000_000_000 + i * 537 + (i % 3) * 11
    ev["ts"][[7, 8]] = ev["ts"][[8, 7]]                  # a reordered pair: a negative delta
    ev["dur"] = 2000 + (i * 97) % 1300
    ev["pid"] = 4242
    ev["tid"] = 4242 + (i % 4).astype(np.uint32)
    ev["kind"] = 1
    ev["code"] = 1 + (i % 5 == 0)
    ev["ret"] = np.where(i % 13 == 0, -11, 0)
    ev["a0"] = 0x7F3A_1C00_0000 + (i % 6) * 0x1A40
    ev["a1"] = np.uint64(108) | np.uint64(1) << np.uint64(32) | np.uint64(1) << np.uint64(48)
    ev["a2"] = 256 + (i % 2) * 256
    ev["a3"] = np.where(i % 4 == 0, 49152, 0)
    ev["a4"] = 0x55D0_4E20_0000 + (i % 4) * 0x2F0
    data = np.zeros((40, 56), np.uint8)
    data[0, :4] = [2, 0, 0x1F, 0x90]
    data[39, 50:] = np.arange(1, 7)
    data[20] = np.arange(56)
    ev["data"] = data.view("V56").reshape(-1)
    return ev


# frozen_events() as the format-2 encoder of commit 4e09726 wrote it: files written since
# must keep decoding to the same bytes, whatever the decoder is rewritten to.
FROZEN_PAYLOAD = {"n": 40, "codec": 1, "layout": 1, "sizes": [173], "z": bytes.fromhex(
    "28b52ffd60ed0ad50a00340e0048480648480690474ee404080408040b0054000200d03192f354b51677d839"
    "9afb5cbd0a6bcc2d8eef50b11273d43596e344a50667c8298aeb4cad0e6f0708080809090a0a0a0b0b0b0c0c"
    "09070a0b0b0c0c9210009293949510100000010002010101010000f5f5f5ff00ff00ff00ffff00ff00ff0040"
    "80c000401a344e69831c3a7f006c000100010001020000c0f0e0d0020508204ed05500010010008002001f90"
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b"
    "2c2d2e2f3031323334353637000102030405063b2050834d726804e344869e92590a95879205e9ec71b79479"
    "c92654db3c8da3a23c4a4629343d4bc650519e960c4a11061039008e164bd6054183196c06831934d8432077"
    "15e166b40f80a45ac9a0740b680fe5b12789a1c72543298f28d8c451cdcca730d8c20d857ff00fee1242c03c"
    "08c43e12")}


def test_a_chunk_written_by_the_first_format_2_encoder_decodes_to_the_same_events():
    ev = frozen_events()
    out = np.zeros(40, EVENT_DTYPE)
    assert codec.decode_columns(FROZEN_PAYLOAD, into=out) == {}
    assert out.tobytes() == ev.tobytes()
    cols = codec.decode_columns(FROZEN_PAYLOAD)
    assert list(cols) == list(EVENT_DTYPE.names)
    for k in EVENT_DTYPE.names:
        assert cols[k].dtype == EVENT_DTYPE[k] and cols[k].tobytes() == ev[k].tobytes(), k
    assert RunReader.as_events(cols).tobytes() == ev.tobytes()
    again = codec.encode_columns({k: ev[k] for k in EVENT_DTYPE.names})
    assert codec.decode_columns(again, into=np.zeros(40, EVENT_DTYPE)) == {}


SPELLED = [("t1", "<i8"), ("flag", "|u1"), ("dur", "<u8"), ("pid", "<u4"), ("ts", "<u8"),
           ("tag", "|V8"), ("ret", "<i2"), ("value", "<f8")]


@pytest.mark.parametrize("n", [1, codec.SMALL_ROWS, codec.SMALL_ROWS + 1, codec.BLOCK_ROWS + 1,
                               4096, 3 * codec.BLOCK_ROWS + 5])
@pytest.mark.parametrize("order", ["same", "reversed", "padded"])
def test_decoding_into_a_structured_array_matches_the_columns_whatever_its_layout(n, order):
    """Runs of byte-plane columns are transposed together only where they sit side by side in
    the output; a delta column between them, another field order, padding or extra fields
    must give the same bytes as decoding column by column, on both sides of SMALL_ROWS, at
    block boundaries and with planes 4096 bytes apart (copied apart before the transpose)."""
    rng = np.random.default_rng(n)
    cols = {}
    for name, dts in SPELLED:
        dt = np.dtype(dts)
        cols[name] = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)
    tag = np.zeros((n, 8), np.uint8)
    tag[0], tag[-1] = 0xAB, np.arange(8)            # sparse rows at both ends only
    cols["tag"] = tag.view("V8").reshape(-1)
    cols["ts"] = np.sort(cols["ts"])
    payload = codec.encode_columns(cols)
    back = codec.decode_columns(payload)
    fields = SPELLED[::-1] if order == "reversed" else SPELLED
    if order == "padded":
        fields = [("pad0", "|u1")] + SPELLED[:4] + [("pad1", "<u2")] + SPELLED[4:] + \
            [("extra", "<u4")]
    out = np.zeros(n, np.dtype(fields))
    assert codec.decode_columns(payload, into=out) == {}
    for name, _ in SPELLED:
        assert back[name].tobytes() == cols[name].tobytes(), name
        assert out[name].tobytes() == cols[name].tobytes(), name
    if order == "padded":
        assert not out["pad0"].any() and not out["pad1"].any() and not out["extra"].any()


def test_decoding_into_a_wrong_output_raises_codec_error():
    for bad in [np.zeros(39, EVENT_DTYPE), np.zeros(40, np.uint64),
                np.zeros(80, EVENT_DTYPE)[::2],
                np.zeros(40, [(k, "<u4" if k == "pid" else EVENT_DTYPE[k])
                              for k in EVENT_DTYPE.names if k != "tid"])]:
        with pytest.raises(codec.CodecError):
            codec.decode_columns(FROZEN_PAYLOAD, into=bad)
    wrong = np.zeros(40, [(k, "<u8" if k == "pid" else EVENT_DTYPE[k]) for k in EVENT_DTYPE.names])
    with pytest.raises(codec.CodecError):
        codec.decode_columns(FROZEN_PAYLOAD, into=wrong)


def launch_storm(n, seed=3):
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, EVENT_DTYPE)
    ev["ts"] = 10**12 + np.cumsum(rng.integers(200, 900, n)).astype(np.uint64)
    ev["dur"] = rng.integers(2000, 6000, n)
    ev["pid"] = 77
    ev["tid"] = 77 + rng.integers(0, 4, n)
    ev["kind"] = Kind.CUDA
    ev["code"] = 1
    ev["a0"] = 0x7F00_0000_0000 + rng.integers(0, 16, n) * 0x100
    ev["a1"] = np.uint64(108) | np.uint64(1) << np.uint64(32) | np.uint64(1) << np.uint64(48)
    ev["a2"] = np.uint64(256) | np.uint64(1) << np.uint64(32) | np.uint64(1) << np.uint64(48)
    ev["a4"] = 0x5500_0000_0000 + (ev["tid"].astype(np.uint64) - 77) * 0x10
    return ev


def test_launch_storm_is_at_most_16_bytes_per_event(tmp_path):
    p = tmp_path / "storm.ca"
    ev = launch_storm(100_000)
    with RunWriter(p, {"host": "h"}) as w:
        for i in range(0, len(ev), 20_000):
            b = ev[i:i + 20_000]
            w.write_columns(Chunk.EVENTS, {k: b[k] for k in EVENT_DTYPE.names})
    r = RunReader(p)
    assert r.version == 2
    size = sum(n for _, n in r.chunk_sizes(Chunk.EVENTS))
    assert size / len(ev) <= 16, size / len(ev)
    assert r.events().tobytes() == ev.tobytes()


def _dump(path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["dump", str(path)])
    return e.value.code, capsys.readouterr().out


def _format_1(path) -> bool:
    with open(path, "rb") as f:
        return HEADER.unpack_from(f.read(HEADER.size))[1] == 1


@pytest.mark.parametrize("src", [p for p in sorted(glob.glob(os.path.join(DATA, "**", "*.ca"),
                                                             recursive=True)) if _format_1(p)])
def test_v1_recordings_read_and_dump_the_same_after_rewriting_in_v2(src, tmp_path, capsys):
    r = RunReader(src)
    assert r.version == 1
    code1, out1 = _dump(src, capsys)
    p = tmp_path / "v2.ca"
    copy_run(src, p, 2)
    assert RunReader(p).version == 2
    code2, out2 = _dump(p, capsys)
    assert out2 == out1 and code2 == code1
    if r.clean:
        assert code1 == 0


def test_threads_encode_and_decode_at_once():
    """The recorder's loop, clock probe and counter sampler encode chunks at the same time: a
    zstd context shared between threads crashed the recorder (SIGSEGV, seen on the H200 storm).
    Run in a child so that a crash fails this test instead of ending pytest."""
    code = textwrap.dedent("""
        import threading, numpy as np
        from clockalign.store import codec
        from clockalign.store.schema import EVENT_DTYPE
        rng = np.random.default_rng(1)
        ev = np.zeros(200_000, EVENT_DTYPE)
        ev["ts"] = np.cumsum(rng.integers(1, 900, len(ev)))
        ev["a0"] = rng.integers(0, 1 << 40, len(ev))
        cols = {n: ev[n] for n in EVENT_DTYPE.names}
        want = codec.encode_columns(cols)
        bad = []
        def work():
            for _ in range(15):
                p = codec.encode_columns(cols)
                if p["z"] != want["z"]:
                    bad.append("encode")
                out = codec.decode_columns(p)
                if not np.array_equal(out["ts"], ev["ts"]):
                    bad.append("decode")
        ts = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print("bad", len(bad))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(AGENT)})
    assert r.returncode == 0, f"child ended {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout.split() == ["bad", "0"], r.stdout + r.stderr


def _random_events(n, seed):
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, EVENT_DTYPE)
    ev["ts"] = np.cumsum(rng.integers(0, 900, n)) + (1 << 62)
    if n > 3:
        ev["ts"][n // 3] = 5                       # a step back: a negative delta
    ev["dur"] = rng.integers(0, 1 << 40, n)
    ev["pid"], ev["tid"] = 4242, 4242 + rng.integers(0, 9, n)
    ev["kind"], ev["code"] = rng.integers(0, 16, n), rng.integers(0, 90, n)
    ev["ret"] = rng.integers(-(1 << 31), 1 << 31, n)
    for f in ("a0", "a1", "a2", "a3", "a4"):
        ev[f] = rng.integers(0, 1 << 63, n) * rng.integers(0, 2, n)
    data = ev.view(np.uint8).reshape(n, EVENT_DTYPE.itemsize)[:, 72:]
    some = rng.random(n) < 0.2
    data[some] = rng.integers(0, 256, (int(some.sum()), 56))
    data[rng.random(n) < 0.05, 55] = 1             # only the last byte set
    return ev


@pytest.mark.parametrize("n", [1, 7, 8, 9, 511, 512, 513, 5000])
def test_native_record_encoder_writes_the_numpy_encoders_bytes(n):
    ev = _random_events(n, n)
    want = codec.encode_columns({k: ev[k] for k in EVENT_DTYPE.names})
    assert codec.encode_records(ev) == want
    assert codec.decode_columns(want)["data"].tobytes() == ev["data"].tobytes()


def test_native_record_encoder_on_another_layout():
    """Padding between fields, a delta column of 4 bytes, a raw byte and a sparse field."""
    dt = np.dtype({"names": ["t_ns", "flag", "v", "blob"],
                   "formats": ["<i4", "u1", "<u2", "V5"], "offsets": [0, 4, 8, 12],
                   "itemsize": 20})
    rows = np.zeros(777, dt)
    rng = np.random.default_rng(9)
    rows["t_ns"] = rng.integers(-(1 << 31), 1 << 31, 777)
    rows["flag"], rows["v"] = rng.integers(0, 256, 777), rng.integers(0, 1 << 16, 777)
    blob = rows.view(np.uint8).reshape(777, 20)[:, 12:17]
    blob[::3] = rng.integers(0, 256, (259, 5))
    got = codec.encode_records(rows)
    assert got == codec.encode_columns({k: rows[k] for k in dt.names})
    back = codec.decode_columns(got)
    assert all(back[k].tobytes() == rows[k].tobytes() for k in dt.names)


def test_record_encoder_on_a_layout_batch_c_does_not_take(monkeypatch):
    ev = _random_events(300, 1)
    monkeypatch.setattr(codec.native_batch, "encode", lambda rows, spec: None)
    assert codec.encode_records(ev) == codec.encode_columns({k: ev[k] for k in EVENT_DTYPE.names})
