"""What a recording says about itself while it runs and at its end: the status line on a
terminal and why records were lost.

    sys.stderr.write(status_line(elapsed, counts, drops, where, extra))
    notice("events lost: ... (" + drop_reason(drops, peak_fill) + ")")
"""


def status_line(elapsed: float, counts: dict, drops: int, extras) -> str:
    """The terminal's one line (redrawn in place): seconds, events per kind, drops, and
    the non-empty extras (the run file's size, a sink's or --follow's state)."""
    kinds = " ".join(f"{k}={v}" for k, v in counts.items() if v)
    return (f"\r{elapsed:7.1f}s  {kinds or 'no events yet'}  drops={drops}  "
            f"{'  '.join(t for t in extras if t)}\033[K")


def drop_reason(drops: dict, peak: float) -> str:
    """One clause on why records were lost, from which counters moved."""
    why = []
    gpu = ("cupti_dropped", "gpu_wire_bad_bytes", "gpu_wire_incomplete_bytes")
    if any(k not in ("state_map_full", "cuda_unpaired", "cuda_nested", "cuda_slot_busy") + gpu
           for k in drops):
        why.append(f"a CPU's event buffer filled up (at most {peak:.0%} full when read): "
                   "raise --ring-mb, or the recorder could not keep up")
    if "state_map_full" in drops:
        why.append("a state map was full (more live target threads than it holds)")
    if "cuda_slot_busy" in drops:
        why.append("two target threads in CUDA calls at once had tids equal modulo the "
                   "call slots")
    if "cuda_nested" in drops:
        why.append("a thread was inside more nested probed CUDA calls than are tracked")
    if "cupti_dropped" in drops:
        why.append("CUPTI dropped GPU activity records (its buffers were full)")
    if "gpu_wire_bad_bytes" in drops or "gpu_wire_incomplete_bytes" in drops:
        why.append("GPU activity bytes from the injected library were unreadable or cut off "
                   "(a target killed mid-write?)")
    if "cuda_unpaired" in drops:
        why.append("a CUDA call's return found another call on top (a return was missed)")
    return "; ".join(why)
