"""clockalign watch's command line and the recorder's sink hook (no root needed)."""
import socket
import subprocess
import sys

import numpy as np

from clockalign.capture.transport.sinks import ChunkTee, open_writer
from clockalign.store.reader import RunReader
from clockalign.store.schema import EVENT_DTYPE, Chunk
from clockalign.store.writer import RunWriter


def _watch(*args):
    return subprocess.run([sys.executable, "-m", "clockalign.cli.main", "watch", *args],
                          capture_output=True, text=True, timeout=60)


def one_sentence(p, code=2):
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(("clockalign: ", "Error: ", "Usage:")) \
        or "Error:" in p.stderr, p.stderr
    return p.stderr


def test_bad_listen_addresses_are_one_sentence():
    for bad, says in (("9464", "is not HOST:PORT"), (":9464", "names no address"),
                      ("127.0.0.1:99999", "is not HOST:PORT")):
        assert says in one_sentence(_watch("--listen", bad, "--pid", "1"))


def test_a_busy_port_is_refused_before_any_probe():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        err = one_sentence(_watch("--listen", f"127.0.0.1:{s.getsockname()[1]}", "--pid", "1"))
        assert "cannot listen on 127.0.0.1" in err and "in use" in err
    finally:
        s.close()


def test_nothing_to_watch():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    err = one_sentence(_watch("--listen", f"127.0.0.1:{port}"))
    assert "nothing to record" in err


def test_print_rules_and_dump_bpf():
    p = _watch("--print-rules", "--p99-factor", "4")
    assert p.returncode == 0 and "> 4 * quantile_over_time" in p.stdout
    assert "ClockalignXid" in p.stdout
    assert "more than 1" in one_sentence(_watch("--print-rules", "--p99-factor", "1"))
    p = _watch("--dump-bpf", "--libcuda", "/x/libcuda.so.1")
    assert p.returncode == 0 and "cflags" in p.stdout and "tcp_receive_reset" in p.stdout


class Sink:
    def __init__(self):
        self.calls = []

    def open(self, meta):
        self.calls.append(("open", meta["tool"]))

    def write_columns(self, ctype, cols):
        self.calls.append(("columns", int(ctype), len(next(iter(cols.values())))))

    def write_rows(self, ctype, rows):
        self.calls.append(("rows", int(ctype), len(rows)))

    def close(self, trailer):
        self.calls.append(("close", trailer["reason"]))


def test_tee_feeds_sinks_with_or_without_a_run_file(tmp_path):
    meta = {"tool": "clockalign"}
    ev = np.zeros(3, dtype=EVENT_DTYPE)
    cols = {n: ev[n] for n in EVENT_DTYPE.names}
    assert isinstance(open_writer(str(tmp_path / "plain.ca"), meta), RunWriter)
    for path in (str(tmp_path / "run.ca"), None):
        sink = Sink()
        w = open_writer(path, meta, [sink])
        assert isinstance(w, ChunkTee)
        w.write_columns(Chunk.EVENTS, cols)
        w.write_records(Chunk.EVENTS, ev[:2])
        w.write_rows(Chunk.NOTICES, [{"t_ns": 1, "level": "info", "text": "x"}])
        w.flush()
        w.close({"reason": "stopped"})
        assert sink.calls == [("open", "clockalign"), ("columns", Chunk.EVENTS, 3),
                              ("columns", Chunk.EVENTS, 2), ("rows", Chunk.NOTICES, 1),
                              ("close", "stopped")]
        if path:
            assert w.size > 0
            r = RunReader(path)
            assert r.clean and len(r.events()) == 5
        else:
            assert w.size == 0
            assert sorted(f.name for f in tmp_path.iterdir()) == ["plain.ca", "run.ca"]
