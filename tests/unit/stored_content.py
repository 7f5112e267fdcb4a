"""What the two same-content tests share (test_perfetto_content, test_chrome_content): the
runs they export, the export of one run to its digests, the comparison with the stored
digests and the --update that remakes them."""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")


def runs():
    """{name: (make(path), writer keyword arguments)}."""
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


def export_digests(name, workdir, suffix, write, digests) -> dict:
    """Run ``name`` made in workdir (once), exported by write(tl, f, **kw) to NAME+suffix,
    read back into digests(bytes)."""
    from clockalign.timeline import Timeline
    make, kw = runs()[name]
    run = os.path.join(workdir, f"{name}.ca")
    if not os.path.exists(run):
        make(run)
    out = os.path.join(workdir, f"{name}{suffix}")
    with open(out, "wb") as f:
        write(Timeline.open(run), f, **kw)
    with open(out, "rb") as f:
        return digests(f.read())


def assert_same(name, got, stored):
    with open(stored) as f:
        want = json.load(f)[name]
    assert {k: v["n"] for k, v in got.items()} == {k: v["n"] for k, v in want.items()}
    assert got == want, f"{name}: content changed in " + ", ".join(
        k for k in got if got[k] != want[k])


def update(stored, export, doc):
    """``python -m tests.unit.test_X --update``: remake the stored digests of every run."""
    if sys.argv[1:] != ["--update"]:
        sys.exit(doc)
    with tempfile.TemporaryDirectory() as tmp:
        out = {name: export(name, tmp) for name in sorted(runs())}
    with open(stored, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {stored}")
