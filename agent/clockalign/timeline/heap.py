"""Give freed arrays back to the system as they are freed (glibc; a no-op elsewhere).

glibc serves an allocation of at least its mmap threshold with its own mapping, returned
to the system when freed; but each such free raises the threshold (up to 32 MiB), so a
reader that decodes chunk after chunk soon gets its arrays of a few hundred KiB from the
heap, where freed memory stays resident: on a run of 3 M GPU executions, 130 MB more peak
for the same live arrays.  A threshold set explicitly stays where it is.

    bounded_heap()      # once, before reading a large run (Timeline does)
    set_mmap_threshold(128 << 10)          # watch/session.py's fix_mmap_threshold
"""
import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 64 << 10       # an array of 8 k int64 values or more gets its own mapping
TRIM_THRESHOLD = 1 << 20       # free heap top beyond this goes back at once
_done = []


def set_mmap_threshold(nbytes: int, trim: int = None) -> bool:
    """Fix glibc's mmap threshold at ``nbytes`` (and its trim threshold at ``trim``) for
    this process; whether it could be set (False where the C library is not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, nbytes))
        if trim is not None:
            ok = bool(libc.mallopt(M_TRIM_THRESHOLD, trim)) and ok
        return ok
    except (OSError, AttributeError):     # not glibc: nothing to set
        return False


def bounded_heap() -> bool:
    """set_mmap_threshold for a reader of large runs, once a process."""
    if not _done:
        _done.append(set_mmap_threshold(MMAP_THRESHOLD, TRIM_THRESHOLD))
    return _done[0]
