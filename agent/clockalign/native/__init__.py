"""Small C helpers, built with the host's C compiler on first use and loaded with ctypes: the
recorder's per-event work (batch.c), the GPU clock ping-pong's host loop (ca_pingpong.c), and
the CUPTI injection library of record --gpu-activity (ca_cupti.c, built against the CUPTI
headers of the libcupti it will load: capture/cupti.py).

A helper is compiled once per source text into a cache directory ($CLOCKALIGN_CACHE, else
/var/cache/clockalign when writable, else ~/.cache/clockalign, else a temporary directory) and
loaded from there afterwards.  Where no compiler is found, or it fails, ``load`` returns None
and ``why_not`` says why: callers fall back to numpy, which is correct but slower, and say so.
"""
import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
# helpers built from more than NAME.c (all of them hashed into the cache key)
SOURCES = {"reader": ["reader.c", "batch.c"]}
_loaded: dict = {}
_why: dict = {}


def _cache_dir() -> pathlib.Path:
    env = os.environ.get("CLOCKALIGN_CACHE")
    candidates = [pathlib.Path(env)] if env else []
    candidates += [pathlib.Path("/var/cache/clockalign"),
                   pathlib.Path.home() / ".cache" / "clockalign",
                   pathlib.Path(tempfile.gettempdir()) / f"clockalign-{os.getuid()}"]
    for d in candidates:
        try:
            d.mkdir(parents=True, exist_ok=True, mode=0o755)
            if os.access(d, os.W_OK | os.X_OK) and d.stat().st_uid == os.getuid():
                return d
        except OSError:
            continue
    raise OSError("no writable cache directory for the native helpers")


def _compiler():
    for cc in (os.environ.get("CC"), "cc", "gcc"):
        if cc and shutil.which(cc):
            return cc
    return None


def _deps(cc, srcs, args) -> list:
    """The headers the sources include (cc -M): part of the cache key of a build against
    outside headers (the CUPTI record layouts differ between versions)."""
    r = subprocess.run([cc, "-M", *args, *map(str, srcs)], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise OSError(f"{cc} cannot build {srcs[0].name}: {_first_error(r.stderr)}")
    words = r.stdout.replace("\\\n", " ").split()
    return sorted({w for w in words if not w.endswith(":")})


def _first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return next((ln for ln in lines if "error" in ln), lines[-1] if lines else "it failed")


def build(name: str, sources=None, include_dirs=(), libs=(), defines=(), cflags=()) -> str:
    """Path of the shared object NAME-<digest>.so built from ``sources`` (default NAME.c in
    this directory; names here or paths), cached by the source text, and, where
    ``include_dirs`` are given, the flags and every header included.  OSError saying why
    when there is no compiler or the build fails."""
    srcs = [HERE / f"{name}.c"] if sources is None else [
        pathlib.Path(s) if os.sep in str(s) else HERE / s for s in sources]
    args = [f"-I{d}" for d in include_dirs] + [f"-D{d}" for d in defines] + list(cflags)
    h = hashlib.sha256(b"".join(s.read_bytes() for s in srcs))
    cc = _compiler()
    if args or libs:
        if cc is None:
            raise OSError("no C compiler (cc or gcc) found")
        h.update(" ".join(args + [f"-l{lib}" for lib in libs]).encode())
        for dep in _deps(cc, srcs, args):
            try:
                h.update(dep.encode() + pathlib.Path(dep).read_bytes())
            except OSError:
                pass
    out = _cache_dir() / f"{name}-{h.hexdigest()[:16]}.so"
    if out.exists():
        return str(out)
    if cc is None:
        raise OSError("no C compiler (cc or gcc) found")
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so")
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


def load(name: str):
    """The ctypes library of helper ``name`` (agent/clockalign/native/NAME.c), or None."""
    if name in _loaded:
        return _loaded[name]
    lib = None
    if os.environ.get("CLOCKALIGN_NO_NATIVE"):
        _why[name] = "CLOCKALIGN_NO_NATIVE is set"
    else:
        try:
            lib = ctypes.CDLL(build(name, SOURCES.get(name)))
        except (OSError, subprocess.SubprocessError) as e:
            _why[name] = str(e)
    _loaded[name] = lib
    return lib


def why_not(name: str) -> str:
    """Why ``load(name)`` gave None ('' when it did not)."""
    return _why.get(name, "")
