"""Build the C helpers with the host's C compiler: what installing clockalign runs.

scripts/setup.sh, scripts/install_bundle.sh and pip install (setup.py) run it once; commands
never compile (native/__init__.py loads what this built, or says to run this).  The CUPTI
injection library is built against the CUPTI that record --gpu-activity would find now
($CLOCKALIGN_CUPTI, the nvidia-cuda-cupti wheel, a CUDA toolkit); where none is found it is
left out, with a line saying so.

    sudo python3 -m clockalign.native.build            # reader, ca_pingpong, ca_cupti
    python3 -m clockalign.native.build --into DIR --no-cupti      # (pip's wheel build)

``build`` also compiles the tests' stand-in libraries into a temporary directory.
Exit 2 with one sentence when a helper cannot be built.
"""
import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from . import BUILT, HELPERS, built_path, source_paths


def compiler():
    for cc in (os.environ.get("CC"), "cc", "gcc"):
        if cc and shutil.which(cc):
            return cc
    return None


def _first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return next((ln for ln in lines if "error" in ln), lines[-1] if lines else "it failed")


def build(name: str, sources=None, include_dirs=(), libs=(), defines=(), cflags=(),
          into=None, key: bytes = None) -> str:
    """Path of the shared object NAME-<digest>.so built from ``sources`` (default NAME.c in
    this directory; names here or paths) into ``into`` (default: a temporary directory of
    this user's), kept there by the digest of the sources, the flags and ``key``: what the
    caller says the build depends on (given, it stands for the included headers, so the
    include directories' paths are left out of the digest).  OSError saying why when there
    is no compiler or the build fails."""
    sources = [f"{name}.c"] if sources is None else list(sources)
    srcs = [p for p in source_paths(sources) if p.suffix == ".c"]
    args = [f"-I{d}" for d in include_dirs] + [f"-D{d}" for d in defines] + list(cflags)
    keyed = [a for a in args if key is None or not a.startswith("-I")]
    key = (key or b"") + " ".join(keyed + [f"-l{lib}" for lib in libs]).encode()
    if into is None:
        into = pathlib.Path(tempfile.gettempdir()) / f"clockalign-build-{os.getuid()}"
    into = pathlib.Path(into)
    into.mkdir(parents=True, exist_ok=True, mode=0o755)
    out = built_path(name, sources, key, into)
    if out.exists():
        return str(out)
    cc = compiler()
    if cc is None:
        raise OSError("no C compiler (cc or gcc) found: install gcc")
    fd, tmp = tempfile.mkstemp(dir=into, suffix=".so")
    os.close(fd)
    try:
        r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-std=c99", *args, "-o", tmp,
                            *map(str, srcs), *[f"-l{lib}" for lib in libs]],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise OSError(f"{cc} failed on {srcs[0].name}: {_first_error(r.stderr)}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)            # atomic: a concurrent build leaves one good file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return str(out)


def _drop_older(into: pathlib.Path, name: str, keep: str) -> None:
    """Builds of name from other sources: never loaded again."""
    for old in into.glob(f"{name}-*.so"):
        if old.name != pathlib.Path(keep).name:
            old.unlink()


def build_all(into=None, cupti: bool = True) -> list:
    """Build every helper into ``into`` (default native/_built); the lines to print.
    OSError when one of HELPERS cannot be built; a missing CUPTI is a line, not an error."""
    into = pathlib.Path(into or BUILT)
    lines = []
    for name, (what, sources) in HELPERS.items():
        path = build(name, sources, into=into)
        _drop_older(into, name, path)
        lines.append(f"built {what}: {path}")
    if cupti:
        from ..capture.gpu.cupti import CuptiMissing, build_injection, find_cupti
        try:
            inst = find_cupti()
        except CuptiMissing as e:
            lines.append(f"not built: the CUPTI injection library of --gpu-activity ({e})")
        else:
            try:
                path = build_injection(inst, into=into)
            except CuptiMissing as e:
                lines.append(f"not built: {e}")
            else:
                _drop_older(into, "ca_cupti", path)
                lines.append(f"built the CUPTI injection library for {inst.where}: {path}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--into", help=f"directory for the built files (default {BUILT})")
    ap.add_argument("--no-cupti", action="store_true",
                    help="leave out the CUPTI injection library")
    a = ap.parse_args(argv)
    try:
        for line in build_all(a.into, cupti=not a.no_cupti):
            print(f"clockalign: {line}")
    except (OSError, subprocess.SubprocessError) as e:
        print(f"clockalign: the C helpers cannot be built: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
