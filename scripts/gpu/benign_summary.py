"""Which failures real workloads produce, and what clockalign makes of them (issue 27):
for each recording of scripts/gpu/benign_runs.sh, every failing CUDA call and connect()
grouped by (function or peer, code), then the faults clockalign lists and the notes
timeline/benign.py's rules made, so each rule can be checked against what was recorded.

    python3 scripts/gpu/benign_summary.py OUTDIR [COMMAND]   # reads OUTDIR/*.ca, writes
                                                             # summary.md (COMMAND: what made it)
"""
import collections
import glob
import json
import os
import sys


from clockalign.store import cuda_api
from clockalign.store.event_text import decode_sockaddr
from clockalign.store.reader import RunReader
from clockalign.store.schema import Kind
from clockalign.timeline import Timeline
from clockalign.timeline.codes import cuda_result_name, errno_name


def failures(path) -> dict:
    """{(what, code name): calls} of every failing CUDA call and connect() in the run."""
    ev = RunReader(path).events()
    out = collections.Counter()
    c = ev[(ev["kind"] == Kind.CUDA) & (ev["ret"] != 0)]
    for fn, ret in zip(c["code"].tolist(), c["ret"].tolist()):
        f = cuda_api.FUNCTIONS.get(fn)
        out[(f.symbol if f else str(fn), cuda_result_name(ret))] += 1
    k = ev[(ev["kind"] == Kind.CONNECT) & (ev["ret"] < 0)]
    for d, a1, ret in zip(k["data"], k["a1"].tolist(), k["ret"].tolist()):
        out[(f"connect {decode_sockaddr(d, a1)}", errno_name(ret))] += 1
    return out


def one(path) -> list:
    name = os.path.splitext(os.path.basename(path))[0]
    lines = [f"## {name}", ""]
    wl = path[:-3] + "-workload.json"
    if os.path.exists(wl):
        with open(wl) as fh:
            w = json.load(fh)
        lines.append(f"workload: ok={w.get('ok')}, {w.get('seconds')} s, libcuda mapped: "
                     f"{w.get('libcuda_mapped')}"
                     + (f", providers {w.get('providers')} of {w.get('available')}"
                        if "providers" in w else "")
                     + (f", error: {w['error']}" if w.get("error") else ""))
    else:
        lines.append("workload: no JSON (it did not finish)")
    r = RunReader(path)
    counts = {k: v for k, v in (r.trailer or {}).get("counts", {}).items() if v}
    lines.append(f"events: {counts}"
                 f"; drops: {(r.trailer or {}).get('drops')}")
    lines += ["", "| failing call or connect | code | calls |", "|---|---|---:|"]
    fl = failures(path)
    lines += [f"| {w} | {c} | {n} |" for (w, c), n in sorted(fl.items(), key=lambda x: -x[1])]
    if not fl:
        lines.append("| (none) | | |")
    tl = Timeline.open(path)
    faults = tl.faults()
    lines += ["", f"faults clockalign lists: {len(faults)}"]
    kinds = collections.Counter((f.kind, f.target or f.function or "", f.name) for f in faults)
    lines += [f"- {n} x {k} {w} {nm}" for (k, w, nm), n in kinds.most_common()]
    lines += ["", f"benign notes: {len(tl.benign)}"]
    lines += [f"- {d['count']} x {d['rule']}: {', '.join(d['examples'])} (pids {d['pids']})"
              for d in tl.benign]
    return lines + [""]


def main():
    out = sys.argv[1]
    command = sys.argv[2] if len(sys.argv) > 2 else "scripts/gpu/benign_runs.sh OUTDIR"
    runs = sorted(glob.glob(os.path.join(out, "*.ca")))
    lines = ["# Benign patterns on real workloads (issue 27)", ""]
    host = os.path.join(out, "host.txt")
    if os.path.exists(host):
        with open(host) as fh:
            lines += ["Host:", "", "```", fh.read().rstrip(), "```", ""]
    lines += [f"Command: `{command}` (it runs this summary at the end).",
              "Each run: `clockalign record` of a workload (NAME-record.txt says which); "
              "below, every failing call in the run file, the faults `clockalign faults` "
              "lists, and the notes timeline/benign.py's rules made.", ""]
    for p in runs:
        try:
            lines += one(p)
        except Exception as e:                  # one bad run does not hide the others
            lines += [f"## {os.path.basename(p)}", "", f"could not be read: {e}", ""]
    with open(os.path.join(out, "summary.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
