"""How often each command decodes a chunk (RunReader.decodes), on a recording of ~300k calls.

dump decodes each EVENTS chunk once: the yardstick.  report decodes each about once (its
own pass carries the Timeline's span, names and fault events; the fault chains' second
pass decodes only the chunks that can end a chain).  export needs the fault chains and the
thread names before its first row, so it reads the events twice (the first pass, then the
output): the first pass keeps them decoded in a spool file (timeline/spool.py) that the
second reads back, so export too decodes each chunk about once (at most 1.25x dump, the
bar of issue 25).  Clock sandwiches and counters are decoded once a command.
"""
import pytest

from clockalign.cli import dump as dump_cmd
from clockalign.export import export_run
from clockalign.report import build_report
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk
from clockalign.timeline import Timeline

SIDE = (Chunk.CPU_CLOCK, Chunk.GPU_CLOCK, Chunk.COUNTERS)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from tests.synthetic import make_run
    path = str(tmp_path_factory.mktemp("decoding") / "run.ca")
    info = make_run(path, n_events=385_000, duration_s=20)
    assert 290_000 <= info["counts"]["cuda"] <= 310_000
    return path


@pytest.fixture(scope="module")
def chunks(run):
    r = RunReader(run)
    return {c: len(list(r.chunk_sizes(c))) for c in Chunk}


def _dump_decodes(run, out, monkeypatch) -> dict:
    readers = []

    class Counting(RunReader):
        def __init__(self, path):
            super().__init__(path)
            readers.append(self)
    monkeypatch.setattr(dump_cmd, "RunReader", Counting)
    dump_cmd.command.main([run, "-o", str(out)], standalone_mode=False)
    (r,) = readers
    return r.decodes


def test_dump_decodes_each_events_chunk_once(run, chunks, monkeypatch, tmp_path):
    d = _dump_decodes(run, tmp_path / "dump.jsonl", monkeypatch)
    assert dict(d) == {Chunk.EVENTS: chunks[Chunk.EVENTS]}


def test_report_decodes_each_chunk_about_once(run, chunks, tmp_path):
    tl = Timeline.open(run)
    build_report(tl, str(tmp_path / "rep"))
    d = tl.reader.decodes
    assert chunks[Chunk.EVENTS] <= d[Chunk.EVENTS] <= 1.25 * chunks[Chunk.EVENTS], dict(d)
    for c in SIDE:
        assert d[c] == chunks[c], (c, dict(d))


@pytest.mark.parametrize("fmt", ["perfetto", "chrome-json"])
def test_export_decodes_each_chunk_about_once(run, chunks, tmp_path, fmt):
    tl = Timeline.open(run)
    export_run(tl, str(tmp_path / "out"), fmt)
    d = tl.reader.decodes
    assert chunks[Chunk.EVENTS] <= d[Chunk.EVENTS] <= 1.25 * chunks[Chunk.EVENTS], dict(d)
    for c in SIDE:
        assert d[c] == chunks[c], (c, dict(d))
    assert tl._spool.reads >= chunks[Chunk.EVENTS]        # the output pass read the spool
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the spool is an unlinked file


def test_export_without_room_for_the_spool_decodes_twice_and_writes_the_same(
        run, chunks, tmp_path, monkeypatch):
    from clockalign.timeline import spool
    tl = Timeline.open(run)
    export_run(tl, str(tmp_path / "a.json"), "chrome-json")

    class Full:
        free = 0
    monkeypatch.setattr(spool.shutil, "disk_usage", lambda d: Full)
    tl2 = Timeline.open(run)
    export_run(tl2, str(tmp_path / "b.json"), "chrome-json")
    assert tl2._spool.state == "off"
    assert tl2.reader.decodes[Chunk.EVENTS] >= 2 * chunks[Chunk.EVENTS]
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_a_window_from_the_cli_spools_its_first_pass(run, chunks, tmp_path):
    """--from in seconds needs the run's start (the first pass) before export begins."""
    from clockalign.export.window import Selection
    tl = Timeline.open(run)
    sel = Selection.parse(tl, "2", "12")
    export_run(tl, str(tmp_path / "w.pftrace"), "perfetto", select=sel)
    assert tl.reader.decodes[Chunk.EVENTS] <= 1.25 * chunks[Chunk.EVENTS]


def test_an_early_stop_keeps_no_partial_index(run):
    """A pass left early (the caller breaks) must not leave a half-read span behind."""
    tl = Timeline.open(run)
    for _ in tl.iter_events():
        break
    n = tl.reader.decodes[Chunk.EVENTS]
    assert tl._index is None and tl._fault_data is None and n == 1
    assert tl.end_ns > tl.start_ns
    assert tl.reader.decodes[Chunk.EVENTS] == n + len(list(tl.reader.chunk_sizes(Chunk.EVENTS)))


def test_a_pass_left_early_spools_nothing_and_the_next_full_one_does(run, chunks, tmp_path):
    tl = Timeline.open(run)
    assert tl.spool(str(tmp_path))
    for _ in tl.iter_events():
        break
    assert not tl._spool.done
    first = [ev.copy() for ev in tl.iter_events()]         # the full pass: written
    assert tl._spool.done
    n = tl.reader.decodes[Chunk.EVENTS]
    again = list(tl.iter_events())                         # read back, not decoded
    assert tl.reader.decodes[Chunk.EVENTS] == n
    assert len(first) == len(again) and all(a.tobytes() == b.tobytes()
                                            for a, b in zip(first, again))


@pytest.mark.parametrize("command", ["report", "perfetto"])
def test_a_gpu_activity_run_decodes_each_chunk_once(tmp_path, command):
    """The join of executions to their launching calls takes the CUDA calls from the
    Timeline's first pass (Timeline.cuda_calls), not from a pass of its own."""
    from tests.unit.gpu_runs import make_bulk_gpu_run
    path = str(tmp_path / "gpu.ca")
    make_bulk_gpu_run(path, 30_000, chunk=2048, per_call=3)
    r = RunReader(path)
    n = {c: len(list(r.chunk_sizes(c))) for c in (Chunk.EVENTS, Chunk.GPU_ACTIVITY)}
    tl = Timeline.open(path)
    if command == "report":
        build_report(tl, str(tmp_path / "rep"))
    else:
        export_run(tl, str(tmp_path / "out"), command)
    assert tl.reader.decodes[Chunk.EVENTS] == n[Chunk.EVENTS] > 10, dict(tl.reader.decodes)
    assert tl.reader.decodes[Chunk.GPU_ACTIVITY] == n[Chunk.GPU_ACTIVITY]
