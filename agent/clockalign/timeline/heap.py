"""glibc malloc settings for clockalign's readers and writers (a no-op off glibc).

Reading (``bounded_heap``, Timeline does it once): glibc serves an allocation of at least
its mmap threshold with its own mapping, returned to the system when freed; but each such
free raises the threshold (up to 32 MiB), so a reader that decodes chunk after chunk soon
gets its arrays of a few hundred KiB from the heap, where freed memory stays resident: on a
run of 3 M GPU executions, 130 MB more peak for the same live arrays.  A threshold set
explicitly stays where it is.

Exporting (``reuse_heap``, export/pipeline.py, once the GPU executions are loaded): every
batch makes and frees dozens of numpy arrays of 64 k rows (0.5 MB each, and more).  With
the reading settings each is a fresh mmap, so the kernel zeroes and maps its pages anew on
every batch: on the 2-core VM about as much system time as the export's own work.  Serving
up to 32 MB from the heap, growing it 16 MB at a time, trimming it only past 64 MB free,
and one arena for all threads keeps those pages: the same memory, mapped once, bounded by
these settings, not by the run's size (results/export-bench.md measures the export with
them).  Applied from the start they would fragment the load phase instead (a 5 M-execution
run's peak grew by about 40 %).

    bounded_heap()      # once, before reading a large run (Timeline does)
    reuse_heap()        # once, before an export's batches
    set_mmap_threshold(128 << 10)          # watch/session.py's fix_mmap_threshold
"""
import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8     # malloc.h
MMAP_THRESHOLD = 64 << 10       # an array of 8 k int64 values or more gets its own mapping
TRIM_THRESHOLD = 1 << 20       # free heap top beyond this goes back at once
REUSE = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 64 << 20), (M_TOP_PAD, 16 << 20),
         (M_ARENA_MAX, 1))
_done = {}


def mallopt(settings) -> bool:
    """Each (parameter, value) through glibc's mallopt; False where that is not possible."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt
        fn.argtypes, fn.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        return all([fn(k, v) == 1 for k, v in settings])
    except (OSError, AttributeError):     # not glibc: nothing to set
        return False


def set_mmap_threshold(nbytes: int, trim: int = None) -> bool:
    """Fix glibc's mmap threshold at ``nbytes`` (and its trim threshold at ``trim``) for
    this process; whether it could be set."""
    return mallopt([(M_MMAP_THRESHOLD, nbytes)] +
                   ([(M_TRIM_THRESHOLD, trim)] if trim is not None else []))


def _once(key, settings) -> bool:
    if key not in _done:
        _done[key] = mallopt(settings)
    return _done[key]


def bounded_heap() -> bool:
    """The reading settings, once a process."""
    return _once("read", ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD)))


def reuse_heap() -> bool:
    """The export's settings (REUSE), once a process."""
    return _once("export", REUSE)
