#!/usr/bin/env python3
"""The summary of scripts/gpu/standby.sh: per engine x fault the cold restart beside the
standby switch, from each OUTDIR's lifecycle.json (rows "ENGINE" and "ENGINE + N standby"),
with how it was made (made.txt, commands.txt, host.txt, skipped.txt) and the segment tables
of `clockalign inject` (lifecycle.md) after it.

    python3 scripts/gpu/standby_summary.py OUTDIR [OUTDIR...]   # -> OUTDIR/fault-recovery-standby.md
"""
import json
import os
import sys

AIM_MS = 1000


def _read(out, name):
    try:
        with open(os.path.join(out, name)) as f:
            return f.read().strip()
    except OSError:
        return ""


def _pp(d):
    if not d or d.get("p50") is None:
        return "—"
    return f"{d['p50']:.1f} / {d['p99']:.1f}"


def pairs(rows) -> list:
    """[(engine, fault, cold row or None, standby row or None)] in the rows' order; where
    two rows are of the same kind, the first."""
    out, seen = [], {}
    for r in rows:
        n = r.get("standby") or 0
        engine = r["engine"][:-len(f" + {n} standby")] if n else r["engine"]
        key = (engine, r["fault"])
        if key not in seen:
            seen[key] = len(out)
            out.append([engine, r["fault"], None, None])
        k = 3 if n else 2
        if out[seen[key]][k] is None:        # the first OUTDIR's row where two have one
            out[seen[key]][k] = r
    return [tuple(p) for p in out]


def table(rows) -> list:
    lines = ["| engine | fault | cold: n | cold: total p50 / p99 ms | cold: recover p50 / p99 "
             "| standby: n | standby: total p50 / p99 ms | standby: recover p50 / p99 | "
             "standbys replenished p50 / p99 ms after the request | standby within "
             f"deadline | standby p99 ≤ {AIM_MS} ms | load requests failed: cold / standby |",
             "|---|---|---:|---|---|---:|---|---|---|---|---|---|"]
    for engine, fault, cold, warm in pairs(rows):
        def cell(r, k):
            return _pp(r[k]) if r else "—"
        ok = "—" if not warm else ("pass" if warm["pass"] else "**FAIL**")
        aim = "—" if not warm or warm["total_ms"]["p99"] is None else (
            "yes" if warm["total_ms"]["p99"] <= AIM_MS else "no")
        lines.append(f"| {engine} | {fault} | {cold['n'] if cold else '—'} | "
                     f"{cell(cold, 'total_ms')} | {cell(cold, 'recover_ms')} | "
                     f"{warm['n'] if warm else '—'} | {cell(warm, 'total_ms')} | "
                     f"{cell(warm, 'recover_ms')} | {cell(warm, 'replenish_ms')} | {ok} | "
                     f"{aim} | {_failed(cold)} / {_failed(warm)} |")
    return lines


def _rows(out) -> list:
    """The rows of OUTDIR/lifecycle.json, each with "load": its background load's summary
    (OUTDIR/ENGINE-FAULT[-standbyN]/load.json; None where there was none)."""
    try:
        with open(os.path.join(out, "lifecycle.json")) as f:
            rows = json.load(f)["rows"]
    except (OSError, ValueError, KeyError):
        return []
    for r in rows:
        n = r.get("standby") or 0
        engine = r["engine"][:-len(f" + {n} standby")] if n else r["engine"]
        stem = f"{engine}-{r['fault']}" + (f"-standby{n}" if n else "")
        try:
            with open(os.path.join(out, stem, "load.json")) as f:
                r["load"] = json.load(f)
        except (OSError, ValueError):
            r["load"] = None
    return rows


def _failed(r) -> str:
    """'failed of requests' of the row's background load."""
    ld = r and r.get("load")
    if not ld:
        return "—"
    return f"{sum(ld['failures'].values())} of {ld['requests']}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: standby_summary.py OUTDIR [OUTDIR...]", file=sys.stderr)
        return 2
    rows = [r for out in argv for r in _rows(out)]
    if not rows:
        print(f"standby_summary: no rows in {', '.join(argv)} (lifecycle.json)", file=sys.stderr)
        return 1
    deadline = rows[0]["deadline_ms"]
    lines = ["# Fault recovery: a warm standby against the cold restart", ""]
    for out in argv:
        lines += [f"Made by {_read(out, 'made.txt') or 'scripts/gpu/standby.sh'}; the commands:",
                  "", "```", _read(out, "commands.txt"), "```", "", "```",
                  _read(out, "host.txt"), "```", ""]
        lines += [f"- {s}" for s in _read(out, "skipped.txt").splitlines() if s.strip()]
        test = _read(out, "pytest-standby-torch.txt").splitlines()
        if test:
            lines += [f"- tests/gpu/test_inject_standby_torch.py (the standby serves through "
                      f"an illegal address): {test[-1].strip()}"]
        lines += [""]
    lines += [f"Times in ms on CLOCK_MONOTONIC (nearest-rank percentiles): total = the "
              f"request to the first ready answer (deadline {deadline} ms), recover = the "
              "error answer to the first ready answer (readiness polled every 50 ms). A "
              "standby row's repetition starts with its standbys ready and ends when the "
              "client sees them ready again (the replenish), which is not in its total. The "
              "background load's failed requests are mostly 503s while no worker was ready "
              "(each row's load.json).", ""]
    lines += table(rows)
    for out in argv:
        detail = _read(out, "lifecycle.md")
        if detail:
            lines += ["", f"## Segments of {os.path.basename(os.path.abspath(out))}/ "
                      "(`clockalign inject`'s lifecycle.md)", ""]
            lines += ["#" + ln if ln.startswith("## ") else ln
                      for ln in detail.splitlines()[1:]]
            lines += ["", f"![segments]({os.path.relpath(os.path.join(out, 'lifecycle.png'), argv[0])})"]
    with open(os.path.join(argv[0], "fault-recovery-standby.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
