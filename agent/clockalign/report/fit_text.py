"""A clock fit as text, for ``clockalign align``: segments, steps, the band's half-width.

    print(describe_fits(models, mapped=None))   # every domain, failed ones with why
"""
from ..align import ASSUMPTION


def describe(name, s, device: str = "") -> str:
    """One domain's AlignmentModel.summary() as lines of text; ``device`` says which GPU
    a GPU domain is (store/devices.Devices.describe)."""
    hw = s["halfwidth_ns"]
    lines = [f"{name}: {len(s['segments'])} segment(s), skew {s['skew_ppm']:+.3f} ppm, "
             f"offset {s['offset_ns']} ns (host - remote at the first sandwich)",
             f"  sandwiches used {s['samples_used']}/{s['samples_total']}, min round trip "
             f"{s['min_rtt_ns']} ns (floor +-{s['floor_ns']} ns), tick {s['tick_ns']} ns",
             f"  band half-width p50 {hw['p50']} ns, p99 {hw['p99']} ns, max {hw['max']} ns"]
    if device:
        lines.insert(1, f"  device: {device}")
    if not s["steps"]:
        lines.append("  steps: none found")
    for st in s["steps"]:
        w0, w1 = st["host_window_ns"]
        lines.append(f"  step: remote clock jumped {st['remote_jump_ns']:+d} ns at host "
                     f"{st['host_ns']} (between {w0} and {w1}), remote {st['remote_ns']}")
    lines.append("  segment  start_remote_ns       end_remote_ns         offset_ns             "
                 "skew_ppm   used/total  wander_ns")
    segs = s["segments"]
    shown = segs if len(segs) <= 12 else segs[:10]
    for i, g in enumerate(shown):
        lines.append(f"  {i:7d}  {g['start_remote_ns']:<20d}  {g['end_remote_ns']:<20d}  "
                     f"{g['offset_ns']:<20d}  {g['skew_ppm']:+9.3f}  "
                     f"{g['samples_used']:>5d}/{g['samples_total']:<5d}  {g['wander_ns']}")
    if len(shown) < len(segs):
        lines.append(f"  ... {len(segs) - len(shown)} more segments (--json lists all)")
    return "\n".join(lines)


def describe_fits(models, mapped=None, devices=None) -> str:
    """Every fitted domain (with the --map rows of ``mapped`` = (domain, rows)), then the
    domains whose fit failed (``models.failed``) and why, then the stated assumption.
    ``devices`` (store/devices.Devices) names the GPU behind each GPU domain."""
    out = []
    dev = devices.describe if devices is not None else (lambda name: "")
    for name, m in models.items():
        out.append(describe(name, m.summary(), dev(name)))
        if mapped and mapped[0] == name:
            out.extend(f"  {row['remote_ns']} -> {row['host_ns']} +- {row['unc_ns']} ns"
                       for row in mapped[1])
        out.append("")
    for name, why in getattr(models, "failed", {}).items():
        d = dev(name)
        out.append(f"{name}: the fit failed ({why}); its times are not mapped"
                   + (f"\n  device: {d}" if d else "") + "\n")
    out.append(f"assumption: {ASSUMPTION}")
    return "\n".join(out)
