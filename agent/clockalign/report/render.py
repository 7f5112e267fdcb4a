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

    def text(self, indent: str = "  ") -> str:
        widths = [max([len(h)] + [len(r[i]) for r in self.rows])
                  for i, h in enumerate(self.header)]

        def line(cells):
            return indent + "  ".join(c.ljust(w) if a == "l" else c.rjust(w)
                                      for c, w, a in zip(cells, widths, self.align)).rstrip()
        out = [line(self.header), indent + "  ".join("-" * w for w in widths)]
        out += [line(r) for r in self.rows]
        return "\n".join(out)

    def markdown(self) -> str:
        esc = [[c.replace("|", "\\|") for c in r] for r in [self.header] + self.rows]
        sep = ["---:" if a == "r" else "---" for a in self.align]
        lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join(sep) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
        return "\n".join(lines) + "\n"
