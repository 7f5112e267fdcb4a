"""CPU clock sandwiches: REALTIME, BOOTTIME and MONOTONIC_RAW read between two MONOTONIC reads.

Each round takes ``reads`` sandwiches ``t0 = MONOTONIC, remote = other, t1 = MONOTONIC``
per domain and keeps the fastest (smallest ``t1 - t0``), as linuxptp's phc2sys does: a slow
sandwich was interrupted, and its extra width is noise, not information.  The align stage
fits ``MONOTONIC = a + b * remote`` through the kept sandwiches.

    rows = sample_round()            # {"domain": u1, "t0": i8, "remote": i8, "t1": i8}
    writer.write_columns(Chunk.CPU_CLOCK, rows)
"""
import time

import numpy as np

from ...store.schema import ClockDomain

MONOTONIC = time.CLOCK_MONOTONIC

# ClockDomain -> the clock_gettime id it names.
CLOCK_IDS = {
    ClockDomain.REALTIME: time.CLOCK_REALTIME,
    ClockDomain.BOOTTIME: time.CLOCK_BOOTTIME,
    ClockDomain.MONOTONIC_RAW: time.CLOCK_MONOTONIC_RAW,
}

DEFAULT_READS = 16


def sandwiches(clock_id: int, reads: int = DEFAULT_READS) -> np.ndarray:
    """``reads`` raw sandwiches (t0, remote, t1) of one clock as an (n, 3) int64 array."""
    get = time.clock_gettime_ns
    out = np.empty((reads, 3), dtype=np.int64)
    for i in range(reads):
        t0 = get(MONOTONIC)
        r = get(clock_id)
        t1 = get(MONOTONIC)
        out[i] = (t0, r, t1)
    return out


def fastest(sw: np.ndarray) -> np.ndarray:
    """The sandwich with the smallest width t1 - t0 (the first one on a tie)."""
    return sw[int(np.argmin(sw[:, 2] - sw[:, 0]))]


def sample_round(domains=tuple(CLOCK_IDS), reads: int = DEFAULT_READS) -> dict:
    """One fastest-of-``reads`` sandwich per domain, as CPU_CLOCK columns."""
    best = [fastest(sandwiches(CLOCK_IDS[d], reads)) for d in domains]
    arr = np.array(best, dtype=np.int64).reshape(-1, 3)
    return {"domain": np.array([int(d) for d in domains], dtype=np.uint8),
            "t0": arr[:, 0].copy(), "remote": arr[:, 1].copy(), "t1": arr[:, 2].copy()}


def concat_rounds(rounds: list) -> dict:
    """Join several sample_round() results into one set of CPU_CLOCK columns."""
    return {k: np.concatenate([r[k] for r in rounds]) for k in ("domain", "t0", "remote", "t1")}


def clock_info_rows(reads: int = DEFAULT_READS) -> list:
    """CLOCK_INFO rows for the CPU domains, MONOTONIC (the reference) included."""
    rows = []
    for name, cid in [("MONOTONIC", MONOTONIC)] + [(d.name, c) for d, c in CLOCK_IDS.items()]:
        res = time.clock_getres(cid)
        rows.append({"domain": name, "tick_ns": max(1, int(round(res * 1e9))),
                     "method": "reference" if cid == MONOTONIC
                     else f"sandwich, fastest of {reads}"})
    return rows
