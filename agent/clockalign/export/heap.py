"""glibc malloc settings for the export: freed batch arrays are reused, not handed back.

Every batch makes and frees dozens of numpy arrays of 64 k rows (0.5 MB each, and more).
With glibc's defaults each is a fresh mmap (or the heap top is trimmed and grown again), so
the kernel zeroes and maps its pages anew on every batch: on the 2-core VM about as much
system time as the export's own work.  Serving up to 32 MB from the heap, growing it 16 MB
at a time, trimming it only past 64 MB free, and one arena for all threads (the encoder
threads' arenas would each hold that much) keeps those pages: the same memory, mapped once.
What is held is bounded by these settings, not by the run's size (results/export-bench.md
measures the export with them).

export() applies them once the GPU executions are loaded, before the batches stream:
reading those makes long-lived columns between short-lived temporaries, which kept in the
heap stay fragmented (a 5 M-execution run's peak grew by about 40 %).

    tune_heap()        # once per process, before the batches; a no-op off glibc
"""
import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8     # malloc.h
SETTINGS = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 64 << 20), (M_TOP_PAD, 16 << 20),
            (M_ARENA_MAX, 1))
_done = []


def tune_heap() -> bool:
    """Apply SETTINGS through glibc's mallopt (once); False where there is no mallopt."""
    if _done:
        return _done[0]
    ok = False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        ok = all(mallopt(k, v) == 1 for k, v in SETTINGS)
    except (OSError, AttributeError):
        pass
    _done.append(ok)
    return ok
