"""Format 2's compact columns: lossless on any values, same dump as format 1, small on launches."""
import glob
import os

import numpy as np
import pytest

from clockalign.cli.main import main
from clockalign.store import codec
from clockalign.store.reader import RunReader
from clockalign.store.schema import EVENT_DTYPE, Chunk, Kind
from clockalign.store.writer import RunWriter

DATA = os.path.join(os.path.dirname(__file__), "..", "data")


def random_events(n, seed):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, n * EVENT_DTYPE.itemsize, dtype=np.uint8)
    ev = raw.view(EVENT_DTYPE).copy()
    ev["data"][rng.random(n) < 0.7] = np.zeros((), "V56")   # mostly empty, like real runs
    return ev


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 1000])
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


@pytest.mark.parametrize("src", sorted(glob.glob(os.path.join(DATA, "**", "*.ca"),
                                                 recursive=True)))
def test_v1_recordings_read_and_dump_the_same_after_rewriting_in_v2(src, tmp_path, capsys):
    r = RunReader(src)
    assert r.version == 1
    code1, out1 = _dump(src, capsys)
    p = tmp_path / "v2.ca"
    w = RunWriter(p, r.meta)
    for ctype, payload in r.iter_chunks():
        if ctype == Chunk.TRAILER:
            continue
        if "rows" in payload:
            w.write_rows(ctype, payload["rows"])
        else:
            w.write_columns(ctype, r.decode_payload(payload))
    if r.clean:
        w.close({k: v for k, v in r.trailer.items() if k != "chunks"})
    else:
        w.flush()
    assert RunReader(p).version == 2
    code2, out2 = _dump(p, capsys)
    assert out2 == out1 and code2 == code1
    if r.clean:
        assert code1 == 0
