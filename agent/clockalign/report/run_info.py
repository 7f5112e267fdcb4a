"""What a run file holds, as ``clockalign info`` shows it: header, span, targets, GPUs,
clocks, events per kind, other records, drops, how it ended, notices.

    for line in info_lines(RunReader("run.ca"), "run.ca"): print(line)
"""
import datetime

import numpy as np

from ..store.devices import Devices
from ..store.meta import target_label as container_label
from ..store.schema import KIND_NAMES, Chunk


def info_lines(r, file) -> list:
    """Text lines describing the run read by RunReader r (reading one events chunk at a
    time: memory stays flat)."""
    out = []
    m = r.meta
    counts = np.zeros(65536, np.int64)
    ts_max = None
    for cols in r.iter_columns(Chunk.EVENTS):       # one chunk at a time: memory stays flat
        counts += np.bincount(cols["kind"].astype(np.int64), minlength=65536)
        t = int(cols["ts"].max())
        ts_max = t if ts_max is None else max(ts_max, t)
    clocks = m.get("clocks") if isinstance(m.get("clocks"), dict) else {}
    start = _int(clocks.get("MONOTONIC"))
    end = _int((r.trailer or {}).get("t_ns"))
    if end is None:
        end = ts_max
    real = _int(clocks.get("REALTIME"))
    try:
        when = datetime.datetime.fromtimestamp(real / 1e9, datetime.timezone.utc).isoformat()
    except (TypeError, ValueError, OverflowError, OSError):
        when = "?"
    out.append(f"file      {file} ({r.size} bytes, format v{r.version}, {r.chunk_count} chunks)")
    out.append(f"state     {'clean' if r.clean else r.truncated}")
    out.append(f"host      {m.get('host')}  kernel {m.get('kernel')}  driver {m.get('driver')}")
    out.append(f"started   {when}  mode {m.get('mode')}")
    if start is not None and end is not None:
        out.append(f"duration  {(end - start) / 1e9:.3f} s")
    for t in _maps(m.get("targets")):
        cmd = t.get("cmdline")
        cmd = " ".join(map(str, cmd)) if isinstance(cmd, list) else str(cmd or "")
        where = container_label(t)
        lib = t.get("libcuda")
        if t.get("libcuda_in_target") and t.get("libcuda_in_target") != lib:
            lib = f"{t['libcuda_in_target']} (probed as {lib})"
        out.append(f"target    pid {t.get('pid')}{f' ({where})' if where else ''}: {cmd[:100]}"
                   f"  libcuda {lib}")
    devices = Devices.from_meta(m, r.rows(Chunk.CLOCK_INFO))
    for d in devices:
        out.append(f"gpu       {d.name}: {devices.describe(d.name)}"
                   + (f"  {d.uuid}" if d.uuid else ""))
    out.append("clocks    " + "  ".join(f"{k}={v}" for k, v in clocks.items()))
    if counts.any():
        out.append("events    " + ", ".join(f"{KIND_NAMES.get(k, k)} {n}"
                                            for k, n in enumerate(counts.tolist()) if n))
    else:
        out.append("events    none")
    other = {Chunk(c).name.lower(): r.count_rows(c) for c in r.chunk_types()
             if c != Chunk.EVENTS}
    if other:
        out.append("records   " + ", ".join(f"{k} {v}" for k, v in other.items()))
    if r.trailer:
        drops = drop_counts(r)
        peak = r.trailer.get("ring_peak_fill")
        reader = r.trailer.get("buffer_reader")
        kind = {"slots": " (slot rings)", "perf": " (perf buffers)"}.get(
            r.trailer.get("event_buffers"), "")
        skipped = r.trailer.get("bpf_skipped_runs")
        line = f"drops     {sum(drops.values())}"
        if drops:
            line += " (" + ", ".join(f"{k} {v}" for k, v in drops.items()) + ")"
        if isinstance(peak, (int, float)):
            line += f"; fullest event buffer {peak:.0%}{kind}"
        if reader:
            line += f", read by the {'C' if reader == 'native' else 'Python'} reader thread"
        if skipped:
            line += (f"; {skipped} probe runs skipped by the kernel (another BPF program on "
                     "that CPU)")
        out.append(line)
        out.append(f"stopped   {r.trailer.get('reason')}")
        out += cuda_probe_lines(m, r.trailer)
        helpers = _map(r.trailer.get("helpers"))
        out += activity_duty_lines(_map(_map(helpers.get("gpu_activity")).get("duty")))
        c = _map(helpers.get("counters"))
        if c and "samples" in c:
            out.append(f"counters  {c.get('backend', '?')}: {c['samples']} samples every "
                       f"{c.get('interval_s', '?')} s, {c.get('missed_deadlines', 0)} missed "
                       f"sampling deadlines, {c.get('errors', 0)} errors")
        k = _map(helpers.get("clocks"))
        if k and "bursts" in k:
            how = _probe_how(r)
            for dom, n in _map(k.get("bursts")).items():
                out.append(f"gpu clock {dom}: {n} bursts by {_map(k.get('method')).get(dom)}"
                           f"{how.get(dom, '')}, {_map(k.get('failures')).get(dom, 0)} failures")
        if r.trailer.get("child_exit"):
            out.append(f"command   {r.trailer['child_exit']}")
    for n in _maps(r.rows(Chunk.NOTICES)):
        out.append(f"notice    [{n.get('level')}] {n.get('text')}")
    return out


def cuda_probe_lines(meta, trailer) -> list:
    """What the CUDA probes left out by choice: entry-only functions (--cuda-returns
    blocking) and the armed windows of --cuda-duty."""
    out = []
    entry_only = meta.get("cuda_entry_only")
    if isinstance(entry_only, list) and entry_only:
        out.append(f"cuda      {len(entry_only)} enqueue functions recorded at entry only "
                   "(--cuda-returns blocking: no duration, no return code)")
    duty = _map(trailer.get("cuda_duty"))
    if duty:
        windows = duty.get("windows") if isinstance(duty.get("windows"), list) else []
        out.append(f"cuda      probes attached {duty.get('share', 0):.0%} of each "
                   f"{duty.get('period_s')} s (--cuda-duty): calls recorded only inside "
                   f"{len(windows)} windows, {_int(duty.get('armed_ns')) or 0:,} ns in all")
    return out


def activity_duty_lines(duty) -> list:
    """Sampled GPU activity (--gpu-activity-duty): the share and the windows."""
    if not duty:
        return []
    windows = duty.get("windows") if isinstance(duty.get("windows"), list) else []
    return [f"gpu       activity SAMPLED: CUPTI attached {duty.get('share', 0):.0%} of each "
            f"{duty.get('period_s')} s (--gpu-activity-duty): kernels, copies and memsets "
            f"recorded only inside {len(windows)} windows, "
            f"{(_int(duty.get('armed_ns')) or 0) / 1e9:.1f} s in all"]


def _probe_how(r) -> dict:
    """{GPU domain: " (C host loop, one-word answer)"} from the clock probe's CLOCK_INFO rows
    (runs recorded before the answer was chosen say only the loop, older ones nothing)."""
    how = {}
    for row in _maps(r.rows(Chunk.CLOCK_INFO)):
        dom = str(row.get("domain", ""))
        if not dom.startswith("GPU"):
            continue
        parts = [{"native": "C host loop", "python": "Python host loop"}.get(row.get("host_loop"))]
        if row.get("pingpong_answer"):
            parts.append(f"{str(row['pingpong_answer']).replace(' ', '-')} answer")
        parts = [p for p in parts if p]
        if parts:
            how[dom] = " (" + ", ".join(parts) + ")"
    return how


def drop_counts(r) -> dict:
    """{what: events lost} from the run's trailer (empty: none lost, or no trailer)."""
    return {k: v for k, v in _map((r.trailer or {}).get("drops")).items()
            if isinstance(v, int) and v}


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def _maps(v) -> list:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None
