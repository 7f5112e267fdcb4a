"""Tables as terminal text and as markdown, and numbers people read at a glance.

    t = Table(["function", "calls", "p50"], align="lrr")
    t.add(["cuLaunchKernel", "1,234", fmt_ns(5600)])
    print(t.text()); md += t.markdown()
"""


def fmt_ns(ns) -> str:
    """A duration for people: '750 ns', '12.5 µs', '50.100 ms', '2.000 s'; '-' if None."""
    if ns is None:
        return "-"
    ns = int(ns)
    a = abs(ns)
    sign = "-" if ns < 0 else ""
    if a < 1_000:
        return f"{sign}{a} ns"
    if a < 1_000_000:
        return f"{sign}{a / 1e3:.1f} µs"
    if a < 1_000_000_000:
        return f"{sign}{a / 1e6:.3f} ms"
    return f"{sign}{a / 1e9:.3f} s"


def fmt_bytes(b) -> str:
    """Bytes in binary units: '512 B', '3.50 KiB', '1.97 GiB'."""
    a = abs(float(b))
    for unit, k in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if a >= k:
            return f"{b / k:.2f} {unit}"
    return f"{b:.0f} B"


def fmt_value(v, unit: str) -> str:
    """A counter value in units people read: GiB, MiB/s, ms, J; MHz, W, % as they come;
    a bitmask in hex, counts as integers."""
    v = float(v)
    if v != v:
        return "-"
    if unit == "bytes":
        return fmt_bytes(v)
    if unit in ("B/s", "KB/s"):
        return fmt_bytes(v * (1000 if unit == "KB/s" else 1)) + "/s"
    if unit == "ns":
        return fmt_ns(v)
    if unit == "mJ":
        return f"{v / 1e6:,.2f} kJ" if abs(v) >= 1e6 else f"{v / 1e3:,.1f} J"
    if unit == "bitmask":
        return f"{int(v):#x}"
    if unit in ("count", "bool"):
        return f"{int(v):,}"
    if unit == "ratio":
        return fmt_pct(v)
    return f"{v:,.4g} {unit}".rstrip()


def fmt_z(z) -> str:
    """A robust z-score; one past ±999 means the signal was flat before it moved."""
    if abs(z) > 999:
        return f"{'+' if z > 0 else '-'}>999 (flat before)"
    return f"{z:+.1f}"


def fmt_t(t_ns, t0) -> str:
    """A time on the run's timeline: seconds since its start."""
    return f"{(int(t_ns) - int(t0)) / 1e9:+.6f} s"


def fmt_count(n) -> str:
    return f"{int(n):,}"


def fmt_pct(x) -> str:
    return f"{100 * x:.1f} %"


class Table:
    def __init__(self, header, align=None):
        self.header = [str(h) for h in header]
        self.align = align or "l" + "r" * (len(header) - 1)
        self.rows = []

    def add(self, row):
        self.rows.append(["" if c is None else str(c) for c in row])

    def __len__(self):
        return len(self.rows)

    def omitted(self, limit, what="rows") -> str:
        """The line saying how many rows a view of ``limit`` rows left out ('' if none)."""
        n = len(self.rows) - limit if limit is not None else 0
        return f"{n:,} more {what} not shown; report.json has all" if n > 0 else ""

    def text(self, indent: str = "  ", limit=None, what="rows") -> str:
        rows = self.rows if limit is None else self.rows[:limit]
        widths = [max([len(h)] + [len(r[i]) for r in rows])
                  for i, h in enumerate(self.header)]

        def line(cells):
            return indent + "  ".join(c.ljust(w) if a == "l" else c.rjust(w)
                                      for c, w, a in zip(cells, widths, self.align)).rstrip()
        out = [line(self.header), indent + "  ".join("-" * w for w in widths)]
        out += [line(r) for r in rows]
        more = self.omitted(limit, what)
        return "\n".join(out + ([f"{indent}... {more}"] if more else []))

    def markdown(self, limit=None, what="rows") -> str:
        """The table (its first ``limit`` rows, then a line saying how many are left out)."""
        rows = self.rows if limit is None else self.rows[:limit]
        esc = [[c.replace("|", "\\|") for c in r] for r in [self.header] + rows]
        sep = ["---:" if a == "r" else "---" for a in self.align]
        lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join(sep) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
        more = self.omitted(limit, what)
        return "\n".join(lines) + "\n" + (f"\n{more}.\n" if more else "")
