"""Build clockalign's small C helpers with gcc at first use, cached by content.

The recorder's native parts (the CUPTI injection library, the ping-pong host loop) are
plain C compiled on the host that runs them, against that host's headers (CUPTI's record
layouts change between versions, so the library must match the libcupti it loads).
A build is keyed by a hash of the sources, the flags and every header it included, and
kept under $CLOCKALIGN_CACHE (default ~/.cache/clockalign/native), 0700.

    so = build("ca_pingpong", ["ca_pingpong.c"])            # path of the shared object
    so = build("ca_cupti", ["ca_cupti.c"], include_dirs=[...], libs=["dl", "pthread"])
"""
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import ClockalignError

SOURCE_DIR = Path(__file__).with_name("native")
CFLAGS = ["-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall"]


class NativeBuildError(ClockalignError):
    """gcc, a header or the build itself is missing or failed (one sentence)."""


def cache_dir() -> Path:
    base = os.environ.get("CLOCKALIGN_CACHE")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "clockalign")
    return Path(base) / "native"


def compiler() -> str:
    cc = shutil.which(os.environ.get("CC") or "gcc")
    if not cc:
        raise NativeBuildError("gcc is not installed, so clockalign cannot build its native "
                               "helpers (apt-get install gcc libc6-dev)")
    return cc


def _deps(cc, sources, args) -> list:
    """Every header the sources include (gcc -M), for the cache key."""
    try:
        out = subprocess.run([cc, "-M"] + args + [str(s) for s in sources],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeBuildError(f"running {cc} failed: {e}") from None
    if out.returncode:
        raise NativeBuildError(f"cannot build {Path(sources[0]).name}: "
                               f"{_first_error(out.stderr)}")
    words = out.stdout.replace("\\\n", " ").split()
    return sorted({w for w in words if not w.endswith(":")})


def _first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln:
            return ln
    return lines[0] if lines else "the compiler failed"


def build(name: str, sources, include_dirs=(), libs=(), defines=()) -> str:
    """Path of ``name``.so built from ``sources`` (names in native/, or paths)."""
    cc = compiler()
    srcs = [Path(s) if os.sep in str(s) else SOURCE_DIR / s for s in sources]
    args = [f"-I{d}" for d in include_dirs] + [f"-D{d}" for d in defines]
    h = hashlib.sha256()
    h.update(" ".join(CFLAGS + args + [f"-l{lib}" for lib in libs]).encode())
    for dep in _deps(cc, srcs, args):
        h.update(dep.encode())
        try:
            h.update(Path(dep).read_bytes())
        except OSError:
            pass
    out_dir = cache_dir()
    out = out_dir / f"{name}-{h.hexdigest()[:16]}.so"
    if out.is_file():
        return str(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=out_dir)
        os.close(fd)
    except OSError as e:
        raise NativeBuildError(f"cannot write the native build cache {out_dir}: "
                               f"{e.strerror or e} (set CLOCKALIGN_CACHE)") from None
    try:
        res = subprocess.run([cc] + CFLAGS + args + [str(s) for s in srcs] + ["-o", tmp]
                             + [f"-l{lib}" for lib in libs],
                             capture_output=True, text=True, timeout=120)
        if res.returncode:
            raise NativeBuildError(f"building {name} failed: {_first_error(res.stderr)}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return str(out)
