"""The recorder's helper threads: the clock probe (CPU clocks, each GPU's %globaltimer),
the counter sampler and the GPU activity reader, started once the probes are armed; and
the imports they would make on first use, made before the probes fire.

    preload(opts, devices)           # before arming
    helpers = []; start_helpers(recorder, helpers)    # [(name, helper)], each has stop/stats
"""
from ..errors import ClockalignError


def preload(o, devices):
    """Import now what the helpers and sinks import on first use, before the probes
    fire: a module import holds the GIL in long stretches (an extension module's init
    is one C call; importing align, scipy.optimize, kept a sleeping thread from running
    for up to 26 ms on the VM).  The C reader thread does not need the GIL, but the
    recording thread takes no batch meanwhile.  Import errors are left for the helpers to
    report as they do now."""
    try:
        from .clocks import clockprobe  # noqa: F401
        if o.gpu_clock and any(d.cuda_ordinal is not None for d in devices):
            from .clocks.cudadriver import driver
            driver()                              # cuda.bindings, a large extension
    except Exception:
        pass
    if o.counters != "none":
        try:
            from .gpu import counters  # noqa: F401
        except ImportError:
            pass
    for sink in o.sinks:
        getattr(sink, "preload", lambda: None)()


def start_helpers(rec, helpers):
    """Start the clock probe, counter sampler and GPU activity reader, each appended to
    helpers once it runs (so a failure part-way still stops the ones started)."""
    o = rec.opts
    if rec.activity is not None:
        rec.activity.start_writing(rec.writer)
        helpers.append(("gpu_activity", rec.activity))
        for level, text in rec.activity.attach_live():    # --pid: probes armed now
            rec.notice(text, level)
    try:
        from .clocks.clockprobe import ClockProbeThread
        gpus = [d for d in rec.devices if d.cuda_ordinal is not None] \
            if o.gpu_clock else []
        cp = ClockProbeThread(rec.writer, gpus=gpus, gpu=bool(o.gpu_clock and gpus),
                              gpu_period_s=o.gpu_clock_period, pings=o.gpu_clock_pings)
        cp.start()
        helpers.append(("clocks", cp))
    except ImportError as e:
        rec.notice(f"clock probes unavailable ({e}); CPU/GPU clock domains not recorded",
                    "warning")
    if o.counters != "none":
        try:
            from .gpu.counters import CounterSampler, open_backend
            backend = open_backend(o.counters, interval_s=o.counter_interval)
            cs = CounterSampler(rec.writer, backend, interval_s=o.counter_interval)
            cs.start()
            helpers.append(("counters", cs))
            rec.closers.append(backend.close)
        except ClockalignError as e:
            if o.counters == "auto":
                rec.notice(f"GPU counters off: {e}")
            else:
                raise
        except ImportError as e:
            rec.notice(f"GPU counters off: backend not importable ({e})", "warning")
