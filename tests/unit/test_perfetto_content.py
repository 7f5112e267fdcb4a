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
import json
import os
import sys
import tempfile

import pytest

from tests.unit import pftrace

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
STORED = os.path.join(DATA, "perfetto-content.json")


def _runs():
    from tests.synthetic import make_run
    from tests.unit.gpu_runs import make_bulk_gpu_run, make_gpu_run
    copy = lambda src: lambda p: __import__("shutil").copyfile(src, p)   # noqa: E731
    return {
        "synthetic-report": (copy(os.path.join(DATA, "synthetic-report", "run.ca")), {}),
        "synthetic-report-small-batches": (
            copy(os.path.join(DATA, "synthetic-report", "run.ca")), {"batch_rows": 700}),
        "gpu-h200-reference": (copy(os.path.join(DATA, "gpu-h200", "reference.ca")), {}),
        "synthetic-faults": (lambda p: make_run(p, n_events=20_000, duration_s=10,
                                                chunk_rows=2048), {}),
        "gpu-activity": (lambda p: make_gpu_run(p), {}),
        "gpu-bulk": (lambda p: make_bulk_gpu_run(p, 20_000, chunk=8192), {}),
    }


def export_digests(name, workdir) -> dict:
    from clockalign.export.perfetto import write_perfetto
    from clockalign.timeline import Timeline
    make, kw = _runs()[name]
    run = os.path.join(workdir, f"{name}.ca")
    if not os.path.exists(run):
        make(run)
    out = os.path.join(workdir, f"{name}.pftrace")
    with open(out, "wb") as f:
        write_perfetto(Timeline.open(run), f, **kw)
    with open(out, "rb") as f:
        return pftrace.digests(pftrace.content(pftrace.decode(f.read())))


@pytest.mark.parametrize("name", sorted(_runs()))
def test_same_content_as_before(name, tmp_path):
    with open(STORED) as f:
        want = json.load(f)[name]
    got = export_digests(name, str(tmp_path))
    assert {k: v["n"] for k, v in got.items()} == {k: v["n"] for k, v in want.items()}
    assert got == want, f"{name}: content changed in " + ", ".join(
        k for k in got if got[k] != want[k])


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        doc = {name: export_digests(name, tmp) for name in sorted(_runs())}
    with open(STORED, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {STORED}")


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
