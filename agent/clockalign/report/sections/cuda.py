"""CUDA calls (latency per function, errors) and CUDA work (time by role, launches per
kernel, module and library loads)."""
from .. import analysis, figures
from ..render import Table, fmt_count, fmt_ns, fmt_t
from . import Section, figure

_NONE = ("  none recorded", "No CUDA calls were recorded.\n")
ROWS = 15         # rows of a table in report.md (the terminal: 10); report.json has all


def calls(ctx) -> Section:
    data = ctx.data
    ct = analysis.cuda_table(data.cuda, data.unfinished)
    t = Table(["function", "calls", "errors", "p50", "p99", "p99.9", "max"])
    for r in ct:
        t.add([r["function"], fmt_count(r["count"]), fmt_count(r["errors"]), fmt_ns(r["p50_ns"]),
               fmt_ns(r["p99_ns"]), fmt_ns(r["p999_ns"]), fmt_ns(r["max_ns"])])
    errs = [f"- {r['function']}: " + ", ".join(f"{k} x{v}" for k, v in r["error_names"].items())
            for r in ct if r["errors"]]
    errs_md = errs[:ROWS] + ([f"- ... {len(errs) - ROWS} more functions with errors"]
                             if len(errs) > ROWS else [])
    unf = len(data.unfinished["t"])
    fig = figures.cuda_latency(data.cuda, ct, ctx.out_dir)
    nums = {"cuda": ct}
    if not ct:
        return Section("CUDA calls", *_NONE, nums, figure(fig))
    extra = ("\nErrors (faults and benign notes: the Faults section):\n\n" + "\n".join(errs_md)
             + "\n" if errs else "") + (
        f"\n{unf} call(s) were still running when the recording stopped.\n" if unf else "")
    n_err = sum(r["errors"] for r in ct)
    return Section("CUDA calls",
                   t.text(limit=10, what="functions")
                   + (f"\n  {fmt_count(n_err)} calls of {len(errs)} functions returned an error "
                      "(see report.md)" if errs else ""),
                   t.markdown(ROWS, "functions") + extra
                   + (f"\n![CUDA latency]({fig})\n" if fig else ""), nums, figure(fig))


def work(ctx) -> Section:
    data, t0 = ctx.data, ctx.t0
    roles = analysis.role_table(data.cuda)
    kernels = analysis.kernel_table(data.cuda, data.kernels)
    loads = analysis.module_loads(data.cuda)
    nums = {"cuda_roles": roles, "kernels": kernels, "module_loads": loads}
    if not roles:
        return Section("CUDA work", *_NONE, nums)
    t = Table(["role", "calls", "errors", "time", "p50", "p99", "bytes"])
    for r in roles:
        t.add([r["role"], fmt_count(r["calls"]), fmt_count(r["errors"]), fmt_ns(r["total_ns"]),
               fmt_ns(r["p50_ns"]), fmt_ns(r["p99_ns"]),
               "-" if r["bytes"] is None else fmt_count(r["bytes"])])
    txt, mdx = [t.text()], [t.markdown()]
    if kernels:
        k = Table(["kernel", "func", "launches", "errors", "p50", "p99"])
        for r in kernels:
            k.add([r["kernel"] or "(not looked up while recording)", f"{r['func']:#x}",
                   fmt_count(r["launches"]), fmt_count(r["errors"]), fmt_ns(r["p50_ns"]),
                   fmt_ns(r["p99_ns"])])
        txt.append(k.text(limit=10, what="kernels"))
        mdx.append("Launches per kernel (names from cuModuleGetFunction / "
                   "cuLibraryGetKernel):\n\n" + k.markdown(ROWS, "kernels"))
    if loads:
        m = Table(["t", "function", "duration", "result"])
        for r in loads:
            m.add([fmt_t(r["t_ns"], t0), r["function"], fmt_ns(r["dur_ns"]), r["result"]])
        txt.append(m.text(limit=10, what="loads"))
        mdx.append("Module and library loads:\n\n" + m.markdown(ROWS, "loads"))
    return Section("CUDA work", "\n\n".join(txt), "\n\n".join(mdx) + "\n", nums)
