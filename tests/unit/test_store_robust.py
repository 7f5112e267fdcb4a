"""Issue 10, one test per case: damaged chunks, resynchronisation, exit codes, output paths,
recording edge cases refused before any probe is armed, private files."""
import errno
import os
import stat

import msgpack
import pytest

from clockalign.capture.recorder import Recorder, RecordOptions
from clockalign.cli.main import main
from clockalign.errors import ClockalignError, RunFileWriteError
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk
from clockalign.store.writer import CHUNK, END, HEADER, RunWriter, check_output, chunk_crc

from .test_store import write_run


def run(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def chunk_starts(path):
    return [(c, off - CHUNK.size) for c, off, _ in RunReader(path)._order]


def test_flipped_chunk_type_is_one_sentence_and_keeps_the_other_chunks(tmp_path, capsys):
    p = tmp_path / "r.ca"
    write_run(p)
    starts = chunk_starts(p)
    data = bytearray(p.read_bytes())
    data[starts[1][1] + 2] = 250                 # second EVENTS chunk: type 1 -> 250
    p.write_bytes(bytes(data))
    code, out, err = run(["dump", str(p)], capsys)
    assert code == 3 and len(out.splitlines()) == 20
    assert "damaged: 1 chunk skipped at byte" in err and len(err.strip().splitlines()) == 1


def test_a_damaged_notices_chunk_does_not_cost_the_events_after_it(tmp_path, capsys):
    p = tmp_path / "r.ca"
    w = RunWriter(p, {"host": "h"})
    w.write_rows(Chunk.NOTICES, [{"t_ns": 1, "level": "info", "text": "first"}])
    from .test_store import make_events
    from clockalign.store.schema import EVENT_DTYPE
    for c in range(3):
        ev = make_events(10, t0=c * 10**6)
        w.write_columns(Chunk.EVENTS, {k: ev[k] for k in EVENT_DTYPE.names})
    w.close({"reason": "test"})
    notices = chunk_starts(p)[0][1]
    data = bytearray(p.read_bytes())
    data[notices + CHUNK.size + 5] ^= 0x01
    p.write_bytes(bytes(data))
    code, out, err = run(["dump", str(p)], capsys)
    assert code == 3 and len(out.splitlines()) == 30
    assert f"skipped at byte {notices}" in err


@pytest.mark.parametrize("payload", [[1, 2], {"rows": 5}, {"n": 3}, {"n": 1, "cols": {}},
                                     {"n": 1, "cols": {"ts": ["O", b"12345678"]}}])
def test_crafted_chunks_with_valid_checksums_are_skipped(tmp_path, capsys, payload):
    p = tmp_path / "r.ca"
    write_run(p)
    data = p.read_bytes()
    trailer = [s for c, s in chunk_starts(p) if c == Chunk.TRAILER][0]
    ctype = Chunk.EVENTS if isinstance(payload, dict) and "n" in payload else Chunk.NOTICES
    body = msgpack.packb(payload, use_bin_type=True)
    blob = CHUNK.pack(b"CK", ctype, len(body), chunk_crc(2, ctype, body)) + body
    bad = data[:trailer] + blob + data[trailer:-END.size] + END.pack(b"CAEND", trailer + len(blob))
    p.write_bytes(bad)
    for cmd in ("info", "dump"):
        code, out, err = run([cmd, str(p)], capsys)
        assert code == 3 and "damaged: 1 chunk skipped" in err
    assert len(RunReader(p).events()) == 30


def test_header_metadata_is_checksummed(tmp_path, capsys):
    p = tmp_path / "r.ca"
    write_run(p)
    data = bytearray(p.read_bytes())
    data[HEADER.size + 3] ^= 0x01
    p.write_bytes(bytes(data))
    code, out, err = run(["info", str(p)], capsys)
    assert code == 3 and "header metadata fails its checksum" in err
    assert "events    cuda 30" in out


def test_a_cut_inside_the_end_marker_reports_a_byte_inside_the_file(tmp_path):
    p = tmp_path / "r.ca"
    write_run(p)
    data = p.read_bytes()
    p.write_bytes(data[:-4])
    r = RunReader(p)
    assert r.truncated_at <= p.stat().st_size and not r.clean


def test_align_on_a_truncated_run_exits_3_with_the_note_on_stderr(tmp_path, capsys):
    src = os.path.join(os.path.dirname(__file__), "..", "data", "synthetic", "aligned.ca")
    p = tmp_path / "a.ca"
    p.write_bytes(open(src, "rb").read()[:-20])
    for extra in ([], ["--json"]):
        code, out, err = run(["align", str(p)] + extra, capsys)
        assert code == 3 and "truncated at byte" in err and "note:" not in out


def test_dump_into_an_unwritable_place_exits_2(tmp_path, capsys):
    p = tmp_path / "r.ca"
    write_run(p)
    code, _, err = run(["dump", str(p), "-o", str(tmp_path / "no" / "such" / "x")], capsys)
    assert code == 2 and "does not exist" in err


@pytest.mark.parametrize("where", ["/proc/x", "DIR", "FILE/x", "/dev/full", "NOTRUN", "LINK"])
def test_bad_output_paths_are_refused_before_arming(tmp_path, where):
    d = tmp_path / "DIR"
    d.mkdir()
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "NOTRUN").write_text("precious\n")
    os.symlink(tmp_path / "NOTRUN", tmp_path / "LINK")
    out = where if where.startswith("/") else str(tmp_path / where)
    with pytest.raises(ClockalignError) as e:
        check_output(out)                 # what Recorder.run() calls before arming
    assert "\n" not in str(e.value)
    assert (tmp_path / "NOTRUN").read_text() == "precious\n"


@pytest.mark.parametrize("duration", [0, -1])
def test_duration_zero_or_negative_is_refused(tmp_path, duration, capsys):
    code, _, err = run(["record", "-o", str(tmp_path / "r.ca"), "--duration", str(duration),
                        "--", "/bin/true"], capsys)
    assert code == 2 and "--duration" in err
    with pytest.raises(ClockalignError, match="--duration"):
        Recorder(RecordOptions(output=str(tmp_path / "r.ca"), command=["/bin/true"],
                               duration=duration)).run()


def test_a_command_exec_would_refuse_is_refused(tmp_path):
    script = tmp_path / "notes.txt"
    script.write_text("just text\n")
    script.chmod(0o755)
    with pytest.raises(ClockalignError, match="exec format error"):
        Recorder(RecordOptions(output=str(tmp_path / "r.ca"), command=[str(script)])).run()


def test_pid_of_a_non_main_thread_names_its_process(tmp_path):
    import threading
    tids, stop = [], threading.Event()
    t = threading.Thread(target=lambda: (tids.append(threading.get_native_id()), stop.wait(5)))
    t.start()
    try:
        while not tids:
            pass
        with pytest.raises(ClockalignError, match=f"thread of process {os.getpid()}"):
            Recorder(RecordOptions(output=str(tmp_path / "r.ca"), pids=[tids[0]])).run()
    finally:
        stop.set()
        t.join()


def test_ring_too_large_is_refused(capsys, tmp_path):
    code, _, err = run(["record", "-o", str(tmp_path / "r.ca"), "--ring-mb", "4096", "--",
                        "/bin/true"], capsys)
    assert code == 2 and "--ring-mb" in err


def test_run_files_are_private_and_owned_by_the_sudo_user(tmp_path, monkeypatch):
    p = tmp_path / "r.ca"
    p.write_bytes(b"")
    p.chmod(0o644)
    if os.geteuid() == 0:
        monkeypatch.setenv("SUDO_UID", "65534")
        monkeypatch.setenv("SUDO_GID", "65534")
    RunWriter(p, {"host": "h"}).close()
    st = p.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (65534, 65534)


class _FullDisk:
    def __init__(self, f):
        self.f = f

    def write(self, b):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_a_full_disk_is_one_sentence_and_leaves_a_readable_file(tmp_path):
    p = tmp_path / "r.ca"
    w = write_run(p, close=False)
    w._f = _FullDisk(w._f)
    with pytest.raises(RunFileWriteError, match="No space left on device.*stays readable"):
        w.write_rows(Chunk.NOTICES, [{"t_ns": 1, "level": "info", "text": "x"}])
    w.write_rows(Chunk.NOTICES, [{"t_ns": 2, "level": "info", "text": "y"}])   # a no-op now
    w.close({"reason": "test"})
    r = RunReader(p)
    assert len(r.events()) == 30 and not r.clean
