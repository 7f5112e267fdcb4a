"""PNG figures of the report: titled, with units, log scales where tails matter, faults
marked, time in seconds from the start of the run.  Each is a matplotlib Figure object
(no pyplot, no global state, no backend chosen at import: matplotlib loads only when a
figure is drawn), written 0600 like the run file.

    name = figures.alignment(analysis.alignment(tl), tl.start_ns, out_dir)  # "alignment.png"
"""
import os

import numpy as np

from ..align.stats import pct
from ..store.writer import open_private

DPI = 110
FAULT_COLORS = {"xid": "crimson", "cuda_error": "darkorange", "cuda_sticky_error": "orange",
                "connect_error": "purple", "throttle": "goldenrod", "exit": "black",
                "signal": "black"}


def _secs(t, t0):
    return (np.asarray(t, dtype=np.int64) - t0) / 1e9


def _mark_faults(ax, faults, t0, label=True):
    seen = set()
    for f in faults:
        if f.kind == "cuda_sticky_error":
            continue
        c = FAULT_COLORS.get(f.kind, "red")
        lab = f.kind if label and f.kind not in seen else None
        seen.add(f.kind)
        ax.axvline(_secs(f.t_ns, t0), color=c, lw=1.0, ls="--", alpha=0.8, label=lab)


def _subplots(nrows=1, ncols=1, figsize=None, **kw):
    """A new Figure and its axes (Figure.subplots: the arguments of pyplot.subplots)."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def _save(fig, out_dir, name) -> str:
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    with open_private(path, "wb") as fh:          # 0600, the sudo user's: like the run file
        fig.savefig(fh, dpi=DPI, format="png")
    return name


def _log_bins(values, n=60):
    v = np.asarray(values, dtype=np.float64)
    v = v[v > 0]
    if not len(v):
        return None
    lo, hi = v.min(), v.max()
    if hi <= lo:
        hi = lo * 1.5 + 1
    return np.logspace(np.log10(lo), np.log10(hi), n)


def alignment(rows, t0, out_dir):
    rows = [r for r in rows if "band_t" in r or "residual_t" in r]
    if not rows:
        return None
    fig, axes = _subplots(len(rows), 1, figsize=(10, 2.6 * len(rows)), squeeze=False)
    for ax, r in zip(axes[:, 0], rows):
        if "residual_t" in r:
            x = _secs(r["residual_t"], t0)
            step = max(1, len(x) // 3000)
            ax.errorbar(x[::step], r["residual_ns"][::step] / 1e3,
                        yerr=r["residual_half_rtt"][::step] / 1e3, fmt=".", ms=3, lw=0.3,
                        alpha=0.35, ecolor="lightsteelblue", color="tab:blue",
                        label="sandwich midpoint - fit (± half RTT)")
        if "band_t" in r:
            x = _secs(r["band_t"], t0)
            u = r["band_ns"] / 1e3
            ax.fill_between(x, -u, u, color="tab:green", alpha=0.25,
                            label="± band half-width + tick")
        for s in r["steps"]:
            ax.axvline(_secs(s.get("host_ns", t0), t0), color="red", ls=":", label="step")
        dev = (r.get("device") or "").split(",")[0]     # the bus id of a GPU domain
        ax.set_title(f"{r['domain']}{' ' + dev if dev else ''}: skew {r['skew_ppm']:+.3f} ppm, "
                     f"band half-width p50 {r['hw_p50']} ns / p99 {r['hw_p99']} ns, "
                     f"{r['segments']} segment(s)")
        ax.set_ylabel("µs")
        lim = max([float(np.max(np.abs(r[k]))) / 1e3 for k in ("residual_ns", "band_ns")
                   if k in r and len(r[k])] + [0.0]) * 1.3
        if np.isfinite(lim) and lim > 0:
            ax.set_ylim(-lim, lim)
        ax.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("time since start of run (s)")
    return _save(fig, out_dir, "alignment.png")


def cuda_latency(cuda, table, out_dir):
    if not len(cuda["t"]):
        return None
    bins = _log_bins(cuda["dur"])
    if bins is None:
        return None
    fig, ax = _subplots(figsize=(10, 4.5))
    fns = cuda["fn"].astype(np.int64)
    for row in table[:6]:
        d = cuda["dur"][fns == row["fn"]]
        ax.hist(np.maximum(d, 1), bins=bins, histtype="step", lw=1.5,
                label=f"{row['function']} (n={row['count']:,}, p99 {row['p99_ns'] / 1e3:.1f} µs)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("call duration (ns, log)")
    ax.set_ylabel("calls (log)")
    ax.set_title("CUDA driver call latency per function")
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "cuda_latency.png")


def wakeup_latency(sched, out_dir):
    w = sched["wake"][sched["wake"] > 0] if len(sched["t"]) else np.zeros(0)
    bins = _log_bins(w)
    if bins is None:
        return None
    fig, ax = _subplots(figsize=(10, 4))
    ax.hist(w, bins=bins, color="tab:purple", alpha=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for q, ls in ((50, "-"), (99, "--")):
        v = pct(w, q)
        ax.axvline(v, color="black", ls=ls, lw=1, label=f"p{q} {v / 1e3:.1f} µs")
    ax.set_xlabel("wakeup-to-run latency (ns, log)")
    ax.set_ylabel("wakeups (log)")
    ax.set_title("Run-queue latency: from wakeup to running again")
    ax.legend()
    return _save(fig, out_dir, "wakeup_latency.png")


def offcpu_heatmap(tids, edges, mat, names, t0, faults, out_dir):
    if not len(tids):
        return None
    fig, ax = _subplots(figsize=(11, 0.35 * len(tids) + 2))
    width = (edges[1] - edges[0]) if len(edges) > 1 else 1
    share = mat / width * 100
    im = ax.imshow(share, aspect="auto", interpolation="nearest", cmap="magma",
                   extent=[_secs(edges[0], t0), _secs(edges[-1], t0), len(tids) - 0.5, -0.5],
                   vmin=0, vmax=max(1.0, float(np.nanmax(share)) if share.size else 1.0))
    ax.set_yticks(range(len(tids)))
    ax.set_yticklabels([f"{t} {names.get(t, '')}" for t in tids.tolist()], fontsize=7)
    ax.set_xlabel("time since start of run (s)")
    ax.set_title(f"Off-CPU time per thread (% of each {width / 1e6:.0f} ms bin)")
    fig.colorbar(im, ax=ax, label="% of bin off-CPU")
    _mark_faults(ax, faults, t0, label=False)
    return _save(fig, out_dir, "offcpu_heatmap.png")


def connect_latency(conn, table, out_dir):
    if not len(conn["t"]):
        return None
    bins = _log_bins(conn["dur"], 40)
    if bins is None:
        return None
    fig, ax = _subplots(figsize=(10, 4))
    pid = conn["peer"].astype(np.int64)
    for row in table[:6]:
        m = pid == row["_peer_id"]
        ax.hist(conn["dur"][m], bins=bins, histtype="step", lw=1.5,
                label=f"{row['peer']} (n={row['count']}, errors {row['errors']})")
    ax.set_xscale("log")
    ax.set_xlabel("connect() latency (ns, log)")
    ax.set_ylabel("calls")
    ax.set_title("connect() latency per peer")
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "connect_latency.png")


COUNTER_PANELS = ["sm_clock", "mem_clock", "power", "gpu_util", "gpu_temp", "mem_used",
                  "clock_event_reasons"]


def counters(cnt, t0, faults, out_dir, label=lambda g: f"GPU{g}", fields=None) -> list:
    """One figure per GPU; ``label(n)`` names GPU n in its title (the run's devices);
    ``fields``: the (gpu, field) pairs to draw (None: all; a flat line says nothing)."""
    from ..store.counter_fields import FIELD_BY_NAME, FIELDS
    out = []
    if cnt is None or not len(cnt):
        return out
    for g in np.unique(cnt["gpu"]).tolist():
        present = set(np.unique(cnt["field"][cnt["gpu"] == g]).tolist())
        if fields is not None:
            present = {f for f in present if (g, f) in fields}
        fields = [FIELD_BY_NAME[n] for n in COUNTER_PANELS if FIELD_BY_NAME[n] in present]
        fields += sorted(present - set(fields))[:max(0, 8 - len(fields))]
        if not fields:
            continue
        fig, axes = _subplots(len(fields), 1, figsize=(11, 1.7 * len(fields) + 1),
                                 sharex=True, squeeze=False)
        gf = [f for f in faults if f.gpu in (None, g)]
        for ax, fid in zip(axes[:, 0], fields):
            m = (cnt["gpu"] == g) & (cnt["field"] == fid)
            name, unit = FIELDS.get(fid, (f"field {fid}", ""))[:2]
            y = cnt["value"][m]
            if unit == "bytes":
                y, unit = y / 2**30, "GiB"
            elif unit == "ns":
                y, unit = y / 1e9, "s"
            elif unit == "mJ":
                y, unit = y / 1e6, "kJ"
            ax.plot(_secs(cnt["t_ns"][m], t0), y, lw=1, drawstyle="steps-post")
            ax.set_ylabel(f"{name}\n({unit})" if unit else name, fontsize=8)
            _mark_faults(ax, gf, t0, label=ax is axes[0, 0])
        axes[0, 0].set_title(f"{label(g)} counters (dashed lines: faults)")
        if any(f.kind != "cuda_sticky_error" for f in gf):
            axes[0, 0].legend(loc="upper left", fontsize=7, ncol=4)
        axes[-1, 0].set_xlabel("time since start of run (s)")
        out.append(_save(fig, out_dir, f"counters_gpu{g}.png"))
    return out


ANOMALY_PANELS = 8        # signals drawn: those that left their band, largest |z| first


def anomalies(det, t0, faults, out_dir):
    """The robust z of the signals that left their band (flat or quiet ones say nothing),
    at most ANOMALY_PANELS of them, each panel titled inside its own axes."""
    def peak(s):
        return max(abs(e["peak_z"]) for e in s["episodes"])
    sigs = sorted((s for s in det["signals"] if np.isfinite(s["z"]).any() and s["episodes"]),
                  key=lambda s: -peak(s))[:ANOMALY_PANELS]
    if not sigs:
        return None
    fig, axes = _subplots(len(sigs), 1, figsize=(11, 1.8 * len(sigs) + 1.2), sharex=True,
                          squeeze=False)
    th = det["threshold"]
    for ax, s in zip(axes[:, 0], sigs):
        x = _secs(s["t"], t0)
        ax.plot(x, np.clip(s["z"], -50, 50), lw=0.8, color="tab:blue")
        ax.axhspan(-th, th, color="tab:green", alpha=0.12)
        for ex in s["excursions"]:
            ax.axvspan(_secs(ex["start_ns"], t0), _secs(ex["end_ns"], t0), color="red",
                       alpha=0.15)
        ax.set_ylabel("robust z", fontsize=7)
        ax.text(0.005, 0.95, s["name"] + (f" ({s['unit']})" if s.get("unit") else ""),
                transform=ax.transAxes, fontsize=8, va="top", ha="left",
                bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1})
        _mark_faults(ax, faults, t0, label=ax is axes[0, 0])
    if any(f.kind != "cuda_sticky_error" for f in faults):
        axes[0, 0].legend(loc="upper right", fontsize=7, ncol=4)
    fig.suptitle(f"Signals against their trailing {det['window']}-point median "
                 f"(green: |z| < {th:g}; red: outside)", fontsize=10)
    axes[-1, 0].set_xlabel("time since start of run (s)")
    return _save(fig, out_dir, "anomalies.png")
