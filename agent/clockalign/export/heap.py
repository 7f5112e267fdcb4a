"""glibc malloc settings for the export: freed batch arrays are reused, not handed back.

Every batch makes and frees dozens of numpy arrays of 64 k rows (0.5 MB each, and more).
With glibc's defaults each is a fresh mmap (or the heap top is trimmed and grown again), so
the kernel zeroes and maps its pages anew on every batch: on the 2-core VM that was as much
system time as the export's own work (scripts/bench/export.py: 5 s of 7 s on a 2 M-event
GPU run).  Growing the heap 64 MB at a time, trimming it only past 128 MB free and serving
up to 32 MB from the heap keeps those pages: the same memory, mapped once.  The cost is that
much freed memory held (peak RSS a few tens of MB higher); nothing else changes.

    tune_heap()        # once per process, before the work; a no-op off glibc
"""
import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3     # malloc.h
SETTINGS = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 128 << 20), (M_TOP_PAD, 64 << 20))
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
