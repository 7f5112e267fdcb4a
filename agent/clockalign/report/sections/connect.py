"""connect() per peer: calls, errors by name, latency."""
import errno

from ...timeline import benign
from .. import analysis, figures
from ..render import Table, fmt_count, fmt_ns
from . import Section, figure


def _error(peer, name, n) -> str:
    """'ECONNREFUSED x2'; a known probe's failure says so (timeline/benign.py)."""
    rule = benign.match_connect(peer, getattr(errno, name, -1))
    return f"{name} x{n}" + (f", {rule.name}: not a fault" if rule else "")


def build(ctx) -> Section:
    data = ctx.data
    cn = analysis.connect_table(data.connect, data.peers)
    t = Table(["peer", "calls", "errors", "p50", "p99", "max"])
    for r in cn:
        t.add([r["peer"], fmt_count(r["count"]),
               f"{r['errors']}" + (" (" + ", ".join(_error(r["peer"], k, v) for k, v in
                                                     r["error_names"].items()) + ")"
                                   if r["errors"] else ""),
               fmt_ns(r["p50_ns"]), fmt_ns(r["p99_ns"]), fmt_ns(r["max_ns"])])
    nums = {"connect": [{k: v for k, v in r.items() if k != "_peer_id"} for r in cn]}
    fig = figures.connect_latency(data.connect, cn, ctx.out_dir)
    if not cn:
        return Section("connect()", "  none recorded", "No connect() calls were recorded.\n",
                       nums, figure(fig))
    return Section("connect()", t.text(limit=10, what="peers"),
                   t.markdown(15, "peers") + (f"\n![connect]({fig})\n" if fig else ""),
                   nums, figure(fig))
