"""Clock sandwiches from a CSV file (t0_ns,remote_ns,t1_ns), for fitting any two clocks.

    t0, remote, t1 = read_pairs("pairs.csv")
    model = fit_sandwiches(t0, remote, t1)
"""
import csv
import os

import numpy as np

from ..errors import ClockalignError

COLUMNS = ("t0_ns", "remote_ns", "t1_ns")


def _int(text, what):
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ClockalignError(f"{what} {text!r} is not an integer number of nanoseconds") from None


def read_pairs(path):
    """(t0, remote, t1) int64 arrays from a CSV with a t0_ns,remote_ns,t1_ns header."""
    if not os.path.exists(path):
        raise ClockalignError(f"{path} does not exist")
    try:
        with open(path, newline="") as f:
            rows = csv.reader(f)
            header = [h.strip() for h in next(rows, [])]
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise ClockalignError(
                    f"{path} needs a header with columns t0_ns,remote_ns,t1_ns (missing "
                    f"{','.join(missing)}; found {','.join(header) or 'nothing'})")
            pos = [header.index(c) for c in COLUMNS]
            out = [[], [], []]
            for line, row in enumerate(rows, start=2):
                if not row or not "".join(row).strip():
                    continue
                for col, (p, name) in enumerate(zip(pos, COLUMNS)):
                    out[col].append(_int(row[p].strip() if p < len(row) else "",
                                         f"{path} line {line}: {name}"))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ClockalignError(f"{path} is not a readable CSV file ({e})") from None
    except IsADirectoryError:
        raise ClockalignError(f"{path} is a directory, not a CSV file") from None
    if len(out[0]) < 2:
        raise ClockalignError(f"{path} has {len(out[0])} sandwich rows; at least 2 are needed "
                              "to fit a line")
    try:
        t0, remote, t1 = (np.array(c, dtype=np.int64) for c in out)
    except OverflowError:
        raise ClockalignError(f"{path} has a value beyond int64 nanoseconds") from None
    bad = np.flatnonzero(t1 < t0)
    if bad.size:
        raise ClockalignError(f"{path} line {bad[0] + 2}: t1_ns is before t0_ns, so it is not "
                              "a sandwich")
    return t0, remote, t1


def map_stamps(model, stamps) -> list:
    """Remote timestamps given as text (--map) -> [{remote_ns, host_ns, unc_ns}]."""
    r = np.array([_int(t, "--map value") for t in stamps], dtype=np.int64)
    host, unc = model.map(r)
    return [{"remote_ns": int(a), "host_ns": int(b), "unc_ns": int(c)}
            for a, b, c in zip(r, host, unc)]
