"""Golden outputs: the sha256 of every output the reading commands make, on every run file
of tests/data and on a synthetic corpus, kept in tests/data/golden.json.  A refactor that
claims "behaviour unchanged" leaves them all equal (tests/unit/test_golden.py checks).

    PYTHONPATH=agent python -m tests.golden             # check: names each output that changed
    PYTHONPATH=agent python -m tests.golden --update    # regenerate golden.json (run twice,
                                                        # refused unless both agree)

Per run: ``dump`` (JSON lines), ``report`` (its terminal text, report.md, report.json and
each PNG figure), ``export`` as Perfetto protobuf and as Chrome JSON, and what each command
printed and its exit code.  The commands run in-process on a copy of the run named
``run.ca`` in a scratch directory that is the working directory, so no absolute path
reaches an output.  Figures are compared only under the matplotlib and FreeType versions
that drew the golden ones: rasterised text changes with them, nothing else does.
"""
import contextlib
import glob
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(ROOT, "data")
GOLDEN = os.path.join(DATA, "golden.json")


def _synthetic():
    from tests.synthetic import make_run
    from tests.unit.gpu_runs import make_bulk_gpu_run, make_gpu_run
    return {
        "corpus/synthetic": lambda p: make_run(p, n_events=20_000, duration_s=10, chunk_rows=2048),
        "corpus/synthetic-truncated": lambda p: make_run(p, n_events=8_000, duration_s=6,
                                                         chunk_rows=1024, seed=3, truncate=True),
        "corpus/gpu-activity": lambda p: make_gpu_run(p),
        "corpus/gpu-bulk": lambda p: make_bulk_gpu_run(p, 20_000, chunk=8192),
    }


def corpus() -> dict:
    """name -> a function writing that run to a path: tests/data's run files (copied) and
    the synthetic generators."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(DATA, "**", "*.ca"), recursive=True)):
        name = os.path.relpath(path, DATA)[:-3]
        runs[name] = lambda p, src=path: shutil.copyfile(src, p)
    runs.update(_synthetic())
    return runs


def figures_env() -> dict:
    import matplotlib
    from matplotlib import ft2font
    return {"matplotlib": matplotlib.__version__, "freetype": ft2font.__freetype_version__}


def _cli(args) -> tuple:
    """Run one clockalign command in-process: (exit code, what it printed)."""
    from clockalign.cli.main import cli
    from clockalign.errors import ClockalignError
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            r = cli.main(args=args, prog_name="clockalign", standalone_mode=False)
            code = r if isinstance(r, int) else 0
        except ClockalignError as e:
            print(f"clockalign: {e}", file=sys.stderr)
            code = e.exit_code
    return code, out.getvalue()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def outputs(write_run, workdir) -> dict:
    """{output name: sha256} for one run, made in ``workdir`` (created; left to the caller)."""
    os.makedirs(workdir)
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        write_run("run.ca")
        digests = {}
        for label, args, files in (
                ("dump", ["dump", "run.ca", "-o", "dump.jsonl"], ["dump.jsonl"]),
                ("report", ["report", "run.ca", "-o", "report"], None),
                ("perfetto", ["export", "run.ca", "-o", "trace.pftrace"], ["trace.pftrace"]),
                ("chrome-json", ["export", "run.ca", "-o", "trace.json", "--format",
                                 "chrome-json"], ["trace.json"])):
            code, printed = _cli(args)
            digests[f"{label}.exit"] = str(code)
            digests[f"{label}.out"] = _sha(printed.encode())
            if files is None:
                files = sorted(os.path.join("report", f) for f in os.listdir("report"))
            for f in files:
                with open(f, "rb") as fh:
                    digests[f] = _sha(fh.read())
        return digests
    finally:
        os.chdir(cwd)


def produce(names=None) -> dict:
    """{run name: {output: sha256}} for the corpus (or the runs named)."""
    runs = corpus()
    got = {}
    with tempfile.TemporaryDirectory(prefix="clockalign-golden-") as tmp:
        for i, (name, write_run) in enumerate(sorted(runs.items())):
            if names is None or name in names:
                got[name] = outputs(write_run, os.path.join(tmp, str(i)))
    return got


def is_figure(output: str) -> bool:
    return output.endswith(".png")


def compare(want: dict, got: dict, figures: bool = True) -> list:
    """Lines naming each run or output that differs (figures left out unless ``figures``)."""
    diffs = []
    for name in sorted(set(want["runs"]) | set(got)):
        w, g = want["runs"].get(name), got.get(name)
        if w is None or g is None:
            diffs.append(f"{name}: {'new run' if w is None else 'run missing'}")
            continue
        for out in sorted(set(w) | set(g)):
            if is_figure(out) and not figures:
                continue
            if w.get(out) != g.get(out):
                diffs.append(f"{name}: {out} " + ("missing" if out not in g else "new"
                                                  if out not in w else "differs"))
    return diffs


def load() -> dict:
    with open(GOLDEN) as f:
        return json.load(f)


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m tests.golden", description=__doc__.split("\n")[0])
    ap.add_argument("--update", action="store_true", help="rewrite tests/data/golden.json")
    a = ap.parse_args(argv)
    got = produce()
    if a.update:
        again = produce()
        unstable = compare({"runs": got}, again)
        if unstable:
            print("outputs differ between two runs (not deterministic):\n  "
                  + "\n  ".join(unstable), file=sys.stderr)
            return 1
        with open(GOLDEN, "w") as f:
            json.dump({"figures_env": figures_env(), "runs": got}, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {GOLDEN}: {len(got)} runs, {sum(map(len, got.values()))} outputs")
        return 0
    want = load()
    diffs = compare(want, got, figures=want["figures_env"] == figures_env())
    print("\n".join(diffs) or f"all outputs of {len(got)} runs as golden")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
