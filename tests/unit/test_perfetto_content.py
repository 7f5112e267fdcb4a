"""The Perfetto export's content is what it was before the compact encoding (issue 26):
each trace, decoded with Perfetto's classes (tests/unit/pftrace.py: compressed bundles
expanded, interning, incremental timestamps and track defaults resolved), gives the same
tracks, slices, instants, counters, flows and clock snapshot as the trace the previous
writer made, whose digests tests/data/perfetto-content.json keeps.

That file was made with the writer of commit 8fbee30 (one packet per event, absolute
MONOTONIC timestamps, a track_uuid on every event); regenerate it only for a change of
content made on purpose:

    PYTHONPATH=agent python -m tests.unit.test_perfetto_content --update
"""
import os

import pytest

from tests.unit import pftrace
from tests.unit import stored_content as sc

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
STORED = os.path.join(DATA, "perfetto-content.json")


def export_digests(name, workdir) -> dict:
    from clockalign.export.perfetto import write_perfetto
    return sc.export_digests(name, workdir, ".pftrace", write_perfetto,
                             lambda b: pftrace.digests(pftrace.content(pftrace.decode(b))))


@pytest.mark.parametrize("name", sorted(sc.runs()))
def test_same_content_as_before(name, tmp_path):
    sc.assert_same(name, export_digests(name, str(tmp_path)), STORED)


if __name__ == "__main__":
    sc.update(STORED, export_digests, __doc__)


def test_plain_and_bundled_give_the_same_content(tmp_path):
    """compress=False writes the same packets, not deflated; every bundle of the deflated
    trace is under trace_packet.proto's 512 KB and holds whole packets."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace
    from clockalign.export.perfetto import PerfettoWriter
    from clockalign.export.pipeline import export
    from clockalign.timeline import Timeline
    from tests.synthetic import make_run
    run = str(tmp_path / "run.ca")
    make_run(run, n_events=60_000, duration_s=4)
    blobs = {}
    for compress in (True, False):
        path = tmp_path / f"{compress}.pftrace"
        with open(path, "wb") as f:
            export(Timeline.open(run), PerfettoWriter(f, compress=compress))
        blobs[compress] = path.read_bytes()
    assert len(blobs[True]) * 3 < len(blobs[False])
    plain, packed = (pftrace.content(pftrace.decode(blobs[c])) for c in (False, True))
    assert plain == packed
    top = Trace()
    top.ParseFromString(blobs[True])
    bundles = [p for p in top.packet if p.HasField("compressed_packets")]
    assert len(bundles) > 3
    assert all(p.ByteSize() + 4 < 512 * 1024 for p in bundles)
    top.ParseFromString(blobs[False])
    assert not any(p.HasField("compressed_packets") for p in top.packet)
