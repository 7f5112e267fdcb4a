"""Small C helpers, loaded with ctypes: the event buffers' reader thread and the recorder's
per-event work (reader.c with batch.c), the GPU clock ping-pong's host loop (ca_pingpong.c),
the Perfetto export's packet layout (flatten.c),
and the CUPTI injection library of record --gpu-activity (ca_cupti.c, built against the CUPTI
headers of the libcupti it will load: capture/gpu/cupti.py).

They are built when clockalign is installed, never when a command runs: scripts/setup.sh,
scripts/install_bundle.sh and pip install run ``python3 -m clockalign.native.build``
(native/build.py), which compiles each into native/_built/, named by the digest of its
sources, so that an edited source is never run against an older build.  A helper that is not
built (or built from other sources) is a NativeMissing error naming what to run; `clockalign
doctor` checks each one.

    lib = load("reader")            # ctypes.CDLL, or NativeMissing
"""
import ctypes
import hashlib
import pathlib

from ..errors import ClockalignError

HERE = pathlib.Path(__file__).resolve().parent
BUILT = HERE / "_built"
# helper -> (what it does, its sources: all of them hashed into its file name)
HELPERS = {
    "reader": ("the event buffers' reader thread and batch work", ["reader.c", "batch.c"]),
    "ca_pingpong": ("the GPU clock's ping-pong loop", ["ca_pingpong.c"]),
    "flatten": ("the Perfetto export's record layout", ["flatten.c"]),
}
HOW_TO_BUILD = "run scripts/setup.sh (installed with pip: sudo python3 -m clockalign.native.build)"
_loaded: dict = {}


class NativeMissing(ClockalignError):
    """A C helper is not built for these sources (one sentence, naming what to run)."""


def source_paths(sources) -> list:
    """Paths of sources given as names in this directory or as paths."""
    return [pathlib.Path(s) if "/" in str(s) else HERE / s for s in sources]


def digest(sources, key: bytes = b"") -> str:
    """16 hex digits of the sources' text and key (what else the build depends on)."""
    h = hashlib.sha256(b"".join(p.read_bytes() for p in source_paths(sources)))
    h.update(key)
    return h.hexdigest()[:16]


def built_path(name: str, sources=None, key: bytes = b"", into=None) -> pathlib.Path:
    """Where helper ``name`` built from ``sources`` (default HELPERS[name]) lives."""
    sources = HELPERS[name][1] if sources is None else sources
    return pathlib.Path(into or BUILT) / f"{name}-{digest(sources, key)}.so"


def why_missing(name: str, sources) -> str:
    """'not built (sources)', or built from other sources, for a helper with no build."""
    stale = any(BUILT.glob(f"{name}-*.so"))
    srcs = ", ".join(pathlib.Path(s).name for s in sources)
    return ("built from other sources than this checkout's" if stale else "not built") + \
        f" ({srcs})"


def require(name: str) -> pathlib.Path:
    """The built file of helper ``name``; NativeMissing when there is none."""
    what, sources = HELPERS[name]
    path = built_path(name)
    if not path.is_file():
        raise NativeMissing(f"the C helper for {what} is {why_missing(name, sources)}: "
                            f"{HOW_TO_BUILD}")
    return path


def load(name: str):
    """The ctypes library of helper ``name`` (HELPERS); NativeMissing when it is not built."""
    if name not in _loaded:
        path = require(name)
        try:
            _loaded[name] = ctypes.CDLL(str(path))
        except OSError as e:
            raise NativeMissing(f"the C helper {path} does not load ({e}): "
                                f"{HOW_TO_BUILD}") from None
    return _loaded[name]


def check() -> list:
    """[(what, built path or None, why it is missing)] of every helper, for doctor."""
    out = []
    for name, (what, sources) in HELPERS.items():
        path = built_path(name)
        ok = path.is_file()
        out.append((what, path if ok else None, "" if ok else why_missing(name, sources)))
    return out
