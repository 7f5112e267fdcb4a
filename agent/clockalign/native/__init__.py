"""Small C helpers for the recorder's per-event work, built with the host's C compiler on first
use and loaded with ctypes.

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


def _build(name: str) -> pathlib.Path:
    src = HERE / f"{name}.c"
    text = src.read_bytes()
    digest = hashlib.sha256(text).hexdigest()[:16]
    out = _cache_dir() / f"{name}-{digest}.so"
    if out.exists():
        return out
    cc = _compiler()
    if cc is None:
        raise OSError("no C compiler (cc or gcc) found")
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so")
    os.close(fd)
    try:
        r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-std=c99", "-o", tmp, str(src)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise OSError(f"{cc} failed on {src.name}: {r.stderr.strip()[-300:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)            # atomic: a concurrent build leaves one good file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load(name: str):
    """The ctypes library of helper ``name`` (agent/clockalign/native/NAME.c), or None."""
    if name in _loaded:
        return _loaded[name]
    lib = None
    if os.environ.get("CLOCKALIGN_NO_NATIVE"):
        _why[name] = "CLOCKALIGN_NO_NATIVE is set"
    else:
        try:
            lib = ctypes.CDLL(str(_build(name)))
        except (OSError, subprocess.SubprocessError) as e:
            _why[name] = str(e)
    _loaded[name] = lib
    return lib


def why_not(name: str) -> str:
    """Why ``load(name)`` gave None ('' when it did not)."""
    return _why.get(name, "")
