"""The GPU executions of a --gpu-activity run in the export (export/gpu_tracks.py): read as
narrow columns and laid out on lanes a track and a block at a time, the trace is byte for
byte the one the whole ACTIVITY_DTYPE rows laid out in one call give."""
import numpy as np
import pytest

from clockalign.export import export_run, gpu_tracks
from clockalign.timeline import Timeline
from tests.unit.gpu_runs import make_bulk_gpu_run


@pytest.fixture(scope="module")
def overlapping(tmp_path_factory):
    """Executions 3 us apart on 3 streams, up to 4 us long: some overlap on their stream
    (overflow lanes); two launched per call."""
    path = tmp_path_factory.mktemp("gpu") / "overlap.ca"
    make_bulk_gpu_run(str(path), 6000, chunk=1000, streams=3, per_call=2, every_ns=3_000)
    return path


def _export(path, out, fmt):
    export_run(Timeline.open(path), str(out), fmt)
    return out.read_bytes()


def _whole_layout(model, r):
    """The layout before blocks: every row through one Lanes.assign call."""
    from clockalign.timeline.gpu_activity import row_keys
    tr = model.tracks
    gpu = np.where(r["gpu"] >= 0, r["gpu"], r["device"]).astype(np.int64)
    uniq, inv = row_keys(gpu, r["pid"], r["stream"])
    base = np.array([tr.gpu_stream(g, p, s).idx for g, p, s in uniq], dtype=np.int64)[inv]
    start = np.asarray(r["t_ns"], dtype=np.int64)
    end = np.maximum(np.asarray(r["end_ns"], dtype=np.int64), start)
    order = np.argsort(start, kind="stable")
    return order, model.lanes.assign(base, start, end, order)


@pytest.mark.parametrize("fmt,ext", [("perfetto", "pftrace"), ("chrome-json", "json")])
def test_narrow_columns_and_block_layout_give_the_same_trace(overlapping, tmp_path,
                                                             monkeypatch, fmt, ext):
    with monkeypatch.context() as m:
        m.setattr(gpu_tracks, "EXPORT_FIELDS", None)          # the whole rows
        m.setattr(gpu_tracks, "layout", _whole_layout)
        import clockalign.export.gpu_json as gj
        m.setattr(gj, "layout", _whole_layout)
        whole = _export(overlapping, tmp_path / f"whole.{ext}", fmt)
    monkeypatch.setattr(gpu_tracks, "LAYOUT_BLOCK", 100)     # many blocks a track
    narrow = _export(overlapping, tmp_path / f"narrow.{ext}", fmt)
    assert narrow == whole
    assert b"overlapping #1" in narrow                        # lanes were needed


def test_export_reads_narrow_columns(overlapping, tmp_path):
    tl = Timeline.open(overlapping)
    export_run(tl, str(tmp_path / "t.pftrace"))
    rows = tl.gpu_activity(fields=gpu_tracks.EXPORT_FIELDS).rows       # the cached one
    assert not isinstance(rows, np.ndarray) and len(rows) == 6000
    assert rows["pid"].itemsize == 2 and "end_ns" not in rows.cols      # pid 4242: uint16
